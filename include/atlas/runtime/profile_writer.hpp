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
  std::string source = "measured";     ///< root attribute `source`: "measured" (a run) or "simulated"
};

/// The profile of `steps` steps in which every slot takes exactly the table's time (step k starts at
/// k * table.step_ms): one event per slot of every TP lane of every row, with the same fields a run
/// records (a WanSend is posted at its transfer's start and completes at its end; other sends
/// complete when posted; Idle and Prefill slots as rows of their own). `atlas simulate --profile` writes these, so a simulated and a
/// measured run read alike (`atlas report`). Steps are numbered from 0.
std::vector<SlotEvent> table_events(const sched::ScheduleTable& table, const topo::Layout& layout, int steps);

/// The /steps rows of table_events: the table's step time, tokens/s for `tokens_per_step`, world
/// rank 0's row bubble fraction, the prompt tokens of the Prefill slots; loss is NaN (not simulated).
std::vector<StepRow> table_steps(const sched::ScheduleTable& table, const topo::Layout& layout, int steps,
                                 double tokens_per_step);

/// The trace's track names for a job: "rank R: <layout.describe>" per rank, "WAN a>b" per link.
TraceLabels trace_labels(const topo::Layout& layout, const sched::ScheduleTable& table,
                         const std::vector<std::string>& dc_names);

/// Writes `path` (not collective; one process). Throws atlas::Error (Io) naming the file.
void write_profile(const std::string& path, const ProfileMeta& meta, const std::vector<SlotEvent>& events,
                   const std::vector<StepRow>& steps);

}  // namespace atlas::runtime
