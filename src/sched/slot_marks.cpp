// SPDX-License-Identifier: MIT
// sched::mark_slots (declared in slot.hpp): the one place that says which slots are the atlas
// stagger and which waits BubbleTea may fill. No timing, no I/O.
#include "atlas/sched/schedule.hpp"

#include <cstddef>

namespace atlas::sched {

void mark_slots(ScheduleTable& table) {
  const int pp = table.pp;
  const auto dc_of = [&](int stage) {
    return stage < static_cast<int>(table.stage_dc.size()) ? table.stage_dc[static_cast<std::size_t>(stage)] : 0;
  };
  // The pipeline's first and last stage in different DCs: the tied-embedding exchange and the
  // gradient-norm sum (over every stage of a pipeline) cross the WAN.
  const bool spans_dcs = pp > 1 && dc_of(0) != dc_of(pp - 1);
  for (int stage = 0; stage < pp; ++stage) {
    const bool embed_end = stage == 0 || stage == pp - 1;
    for (int d = 0; d < table.dp; ++d) {
      std::vector<Slot>& row = table.rows[static_cast<std::size_t>(stage * table.dp + d)];
      for (std::size_t i = 0; i < row.size(); ++i) {
        Slot& s = row[i];
        s.marks = 0;
        if (is_recv(s.kind)) s.mark(SlotMark::FillableWait);
        if (spans_dcs && s.kind == SlotKind::Optimizer) s.mark(SlotMark::FillableWait);
        if (spans_dcs && embed_end && s.kind == SlotKind::AllReduce) s.mark(SlotMark::FillableWait);
        if (s.kind == SlotKind::Idle && spans_dcs && embed_end && i + 1 < row.size() &&
            row[i + 1].kind == SlotKind::AllReduce)
          s.mark(SlotMark::ExchangeBubble);
      }
      if (table.kind == ScheduleKind::Atlas && stage == 0 && !row.empty() && is_bubble(row[0].kind))
        row[0].mark(SlotMark::Stagger);
    }
  }
}

}  // namespace atlas::sched
