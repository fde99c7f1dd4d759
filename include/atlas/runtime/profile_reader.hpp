// SPDX-License-Identifier: MIT
// Reading a profile.h5 back (docs/profile-format.md): the slot columns and the ranks' stages and
// hosts, for the in-situ compute costs of `atlas simulate --compute-from RUN`. (The report and
// its Gantt chart read profiles in Python: scripts/report/atlas_report.py.)
#pragma once

#include <string>
#include <vector>

#include "atlas/runtime/profiler.hpp"

namespace atlas::runtime {

struct ProfileSlots {
  /// Every row of /events with world_rank, step, kind, micro, start_s and end_s (the other fields
  /// are left at their defaults).
  std::vector<SlotEvent> events;
  std::vector<int> rank_stage;         ///< /ranks/stage, index = world rank
  std::vector<std::string> rank_host;  ///< /ranks/host
  std::string source;                  ///< root attribute `source`: "measured" or "simulated"
  std::string run_name;
};

/// Reads `path` (a profile.h5, or a run directory holding one). Throws atlas::Error (ExitCode::Io)
/// naming the file when it cannot be read, is not an atlas profile, or its columns disagree.
ProfileSlots read_profile_slots(const std::string& path);

}  // namespace atlas::runtime
