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

/// The engine program of one schedule kind under `c` with `m` micro-batches; fills `map`.
EngineProgram make_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map);

/// Interleaved 1F1B (c.virtual_stages > 1; src/sched/interleaved.cpp): the program of stages that
/// each run c.virtual_stages model chunks; message ids are message_id over the virtual
/// boundaries. make_program calls it when c.virtual_stages > 1.
EngineProgram make_interleaved_program(const CostModel& c, ScheduleKind kind, int m, ProgramMap& map);

/// Fills p.sync_delay_ms (the collectives that cross DCs) for p's sync groups as make_program
/// builds them (group 0 = the first and last stage, then one per stage, then pp + d per pipeline).
void add_sync_delays(const CostModel& c, EngineProgram& p);

/// Runs the engine on `p` and turns its times into a table. Internal error if it deadlocks.
ScheduleTable time_program(const CostModel& c, ScheduleKind kind, int m, EngineProgram& p, const ProgramMap& map);

}  // namespace atlas::sched::detail
