// SPDX-License-Identifier: MIT
// Schedule programs: the compute order of each schedule kind, and the engine program (workers,
// messages, WAN channels, collectives' wake-ups) that build_schedule and retime time with the
// engine, turned back into a table. Internal to sched/ (program.cpp, build.cpp).
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "atlas/sched/schedule.hpp"

namespace atlas::sched::detail {

/// Where the table's pieces sit inside the engine program.
struct ProgramMap {
  // message id -> (link index in table, or -1)
  std::vector<int> msg_link;
  std::vector<int> msg_src_stage;
  std::vector<int> msg_dst_stage;
  std::vector<int> link_src_dc, link_dst_dc;
  // channel per (src_dc, dst_dc)
  std::map<std::pair<int, int>, int> channel_of;
};

/// The engine's message id of a boundary transfer: two (activation, gradient) per (boundary,
/// dp replica, micro-batch).
int message_id(int boundary, int dp_index, int micro, Flow flow, int dp, int m);

/// The engine program of one schedule kind under `c` with `m` micro-batches; fills `map`. With
/// `depth` (one per stage, depth.cpp) every stage runs depth_order(depth[stage], m) instead of
/// the kind's compute_order.
EngineProgram make_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map,
                           const std::vector<int>& depth = {});

// ---- in-flight depth (depth.cpp) ----

/// Compute order of a stage that holds at most `depth` micro-batches in flight: depth - 1 warm-up
/// forwards, then one forward one backward, then the cool-down backwards. Depth pp - stage is
/// 1F1B's order, depth m GPipe's.
std::vector<std::pair<SlotKind, int>> depth_order(int depth, int m);
/// The depths of a classic schedule: 1F1B (and atlas by default) min(pp - stage, m), GPipe m.
std::vector<int> classic_depth(ScheduleKind kind, int pp, int m);
/// Per stage the most micro-batches the device's memory allows (c.memory_limit_bytes; m when the
/// model has no memory costs), at least 1.
std::vector<int> memory_depth_cap(const CostModel& c, int m);
/// `want` capped per stage and made non-increasing along the pipeline (a deeper next stage would
/// deadlock), at least 1.
std::vector<int> fit_depth(std::vector<int> want, const std::vector<int>& cap);
/// The depths the atlas search tries beyond 1F1B's (capped by memory, distinct, shallowest
/// first): 1F1B's + e for e = 1, 2, 4, ... (full search) and GPipe's.
std::vector<std::vector<int>> depth_candidates(const CostModel& c, int m, bool full);

/// Interleaved 1F1B (c.virtual_stages > 1; src/sched/interleaved.cpp): the program of stages that
/// each run c.virtual_stages model chunks; message ids are message_id over the virtual
/// boundaries. make_program calls it when c.virtual_stages > 1.
EngineProgram make_interleaved_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map);

/// The wake-ups, WAN channels and boundary messages of pp x v virtual stages (v = 1: the stages).
void add_boundaries(const CostModel& c, int v, int m, EngineProgram& p, ProgramMap& map);

/// Shared hosts (CPU backend, c.ranks_per_host > 0): which host each worker's compute shares.
void add_shared_hosts(const CostModel& c, EngineProgram& p);

/// Fills p.sync_delay_ms (the collectives that cross DCs) for p's sync groups as make_program
/// builds them (group 0 = the first and last stage, then one per stage, then pp + d per pipeline).
void add_sync_delays(const CostModel& c, EngineProgram& p);

/// The table of a finished run `r` of `p` (its messages' and channels' results filled).
ScheduleTable to_table(const CostModel& c, ScheduleKind kind, int m, const EngineProgram& p, const EngineResult& r,
                       const ProgramMap& map);

/// Runs the engine on `p` and turns its times into a table. Internal error if it deadlocks.
ScheduleTable time_program(const CostModel& c, ScheduleKind kind, int m, EngineProgram& p, const ProgramMap& map);

}  // namespace atlas::sched::detail
