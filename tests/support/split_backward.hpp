// SPDX-License-Identifier: MIT
// Test-only stand-in for the schedule side of the zero-bubble split (schedule.split_backward):
// rewrites a built table's Backward slots into the slot contract (docs/schedules.md, "split
// backward"), so the runtime and the model can be tested before, and apart from, the real
// builder. It makes no attempt to place W's well; the real builder replaces it.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "atlas/sched/schedule.hpp"

namespace atlas::testing {

/// Each Backward becomes a BackwardInput (B) with `input_fraction` of its duration, in its place;
/// its BackwardWeight (W, the rest of the duration, no marks) waits for the row's next B and the
/// sends right after that B, and goes there (so every W but the last is deferred past a later B,
/// and W's keep B order: per chunk, increasing micro order). The W's still pending go before
/// the row's first AllReduce or Optimizer slot or ExchangeBubble bubble, else at the row's end.
/// Start times are left as they were (the rewritten table is for real runs, not for timing).
inline sched::ScheduleTable split_backwards(sched::ScheduleTable table, double input_fraction = 0.5) {
  using sched::Slot;
  using sched::SlotKind;
  for (std::vector<Slot>& row : table.rows) {
    std::vector<Slot> out;
    std::deque<Slot> pending;  // W's in B order
    bool after_b = false;      // a B was just placed: the older W's go after its sends
    bool sums_reached = false;
    auto place = [&](std::size_t keep) {
      while (pending.size() > keep) {
        out.push_back(pending.front());
        pending.pop_front();
      }
    };
    for (const Slot& s : row) {
      if (after_b && !sched::is_send(s.kind)) {
        place(1);
        after_b = false;
      }
      if (!sums_reached && (s.kind == SlotKind::AllReduce || s.kind == SlotKind::Optimizer ||
                            s.has(sched::SlotMark::ExchangeBubble))) {
        place(0);
        sums_reached = true;
      }
      if (s.kind != SlotKind::Backward) {
        out.push_back(s);
        continue;
      }
      Slot b = s;
      b.kind = SlotKind::BackwardInput;
      b.duration_ms = s.duration_ms * input_fraction;
      Slot w = s;
      w.kind = SlotKind::BackwardWeight;
      w.duration_ms = s.duration_ms - b.duration_ms;
      w.marks = 0;
      out.push_back(b);
      pending.push_back(w);
      after_b = true;
    }
    place(0);
    row = std::move(out);
  }
  return table;
}

}  // namespace atlas::testing
