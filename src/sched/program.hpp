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

/// The zero-bubble split of the backward (schedule.split_backward) in an engine program: each
/// Backward becomes its BackwardInput (B: the gradient sent on at once) and BackwardWeight (W).
struct SplitSpec {
  /// Per stage: the most micro-batches whose activations a replica holds at once (a forward
  /// stores them, the W of the same micro-batch frees them): W(i) stands, deferred
  /// (EngineOp::deferred), right before the forward of micro-batch i + hold (or before the
  /// AllReduce), and runs earlier in the waits of the receives before it. At least the depth.
  std::vector<int> hold;
  /// Per worker (retime): its executed compute order from a table (Forward, BackwardInput,
  /// BackwardWeight, micro), W at fixed places. Non-empty: `hold` is not used.
  std::vector<std::vector<std::pair<SlotKind, int>>> fixed;
};

/// The engine program of one schedule kind under `c` with `m` micro-batches; fills `map`. With
/// `depth` (one per stage, depth.cpp) every stage runs depth_order(depth[stage], m) instead of
/// the kind's compute_order. With `split`, each backward is split (SplitSpec; one chunk only).
EngineProgram make_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map,
                           const std::vector<int>& depth = {}, const SplitSpec* split = nullptr);

/// A table's executed compute order per worker of a program with `program_dp` replicas per stage
/// (SplitSpec::fixed; one replica stands for all when program_dp < table.dp).
std::vector<std::vector<std::pair<SlotKind, int>>> table_compute_orders(const ScheduleTable& t, int program_dp);

// ---- in-flight depth (depth.cpp) ----

/// Compute order of a stage that holds at most `depth` micro-batches in flight: depth - 1 warm-up
/// forwards, then one forward one backward, then the cool-down backwards. Depth pp - stage is
/// 1F1B's order, depth m GPipe's.
std::vector<std::pair<SlotKind, int>> depth_order(int depth, int m);
/// The depths of a classic schedule: 1F1B (and atlas by default) min(pp - stage, m), GPipe m.
/// With v > 1 model chunks (kind != GPipe), in chunk passes: interleaved 1F1B's
/// min(v m, 2 (pp - stage - 1) + (v - 1) pp + 1), v m when m == pp.
std::vector<int> classic_depth(ScheduleKind kind, int pp, int m, int v = 1);
/// Per stage the most micro-batches (chunk passes when c.virtual_stages > 1) the device's memory
/// allows (c.memory_limit_bytes; all v m when the model has no memory costs), at least 1.
std::vector<int> memory_depth_cap(const CostModel& c, int m);
/// `want` capped per stage and made non-increasing along the pipeline (a deeper next stage would
/// deadlock), at least 1. With v > 1 chunks, also at least interleaved 1F1B's depth, at most v m,
/// and stage 0 at most 2 pp deeper than the last stage: the deadlock-free depths (docs/schedules.md).
std::vector<int> fit_depth(std::vector<int> want, const std::vector<int>& cap, int v = 1, int m = 0);
/// The atlas search's first depth: 1F1B's (interleaved 1F1B's with chunks) fitted to the memory.
std::vector<int> atlas_base_depth(const CostModel& c, int m);
/// Whether `depth` is GPipe's own order (every stage m deep, one chunk).
bool is_gpipe_depth(const CostModel& c, int m, const std::vector<int>& depth);
/// The depths the atlas search tries beyond 1F1B's (capped by memory, distinct, shallowest
/// first): 1F1B's + e for e = 1, 2, 4, ... (full search) and every forward first (GPipe's order
/// with one chunk); in chunk passes with c.virtual_stages > 1.
std::vector<std::vector<int>> depth_candidates(const CostModel& c, int m, bool full);
/// The compute order of a stage running v model chunks with `depth` chunk passes in flight:
/// Megatron-LM's interleaved order with depth - 1 warm-up forwards (interleaved.cpp).
std::vector<ChunkStep> interleaved_depth_order(int depth, int pp, int m, int v);

/// Interleaved 1F1B (c.virtual_stages > 1; src/sched/interleaved.cpp): the program of stages that
/// each run c.virtual_stages model chunks; message ids are message_id over the virtual
/// boundaries. make_program calls it when c.virtual_stages > 1. With `depth` (chunk passes per
/// stage) every stage runs interleaved_depth_order instead of the kind's compute_order.
EngineProgram make_interleaved_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map,
                                       const std::vector<int>& depth = {});

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
