// SPDX-License-Identifier: MIT
// runs/NAME/profile.h5, format "atlas-profile" version 1 (docs/formats.md): every executed slot
// of every rank as columns under /events, the layout under /ranks, the WAN links under /links,
// per-step metrics under /steps and the run's schedule table as JSON. Written by one process
// (world rank 0, after Profiler::gather), atomically (temporary name, then rename).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atlas/runtime/profiler.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::runtime {

inline constexpr const char* kProfileFormatName = "atlas-profile";
inline constexpr std::int64_t kProfileFormatVersion = 1;

struct StepRow {
  std::int32_t step = 0;
  double loss = 0.0;
  double step_time_s = 0.0;
  double tokens_per_s = 0.0;
  double bubble_fraction = 0.0;
  std::int64_t prefill_tokens = 0;
};

struct ProfileMeta {
  std::string run_name;
  std::string deck;                    ///< resolved deck text
  std::vector<std::string> dc_names;
  std::vector<std::string> hosts;      ///< per world rank
  const sched::ScheduleTable* table = nullptr;
  const topo::Layout* layout = nullptr;
};

/// Writes `path` (not collective; one process). Throws atlas::Error (Io) naming the file.
void write_profile(const std::string& path, const ProfileMeta& meta, const std::vector<SlotEvent>& events,
                   const std::vector<StepRow>& steps);

}  // namespace atlas::runtime
