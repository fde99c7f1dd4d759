// SPDX-License-Identifier: MIT
// sched::mark_slots: the table, not the runtime, says where the atlas stagger is and which waits
// BubbleTea may fill; the marks leave the structure hash alone.
#include <gtest/gtest.h>

#include "atlas/sched/schedule.hpp"

namespace atlas::sched {
namespace {

using K = SlotKind;

/// Two stages in two DCs (or one), one or two pipelines: each row opens with an Idle slot, then
/// a receive (stage 1) or forward, a bubble before the AllReduce, the Optimizer.
ScheduleTable two_stage_table(ScheduleKind kind, int dp, bool two_dcs) {
  ScheduleTable t;
  t.kind = kind;
  t.pp = 2;
  t.dp = dp;
  t.stage_dc = {0, two_dcs ? 1 : 0};
  for (int stage = 0; stage < 2; ++stage)
    for (int d = 0; d < dp; ++d) {
      std::vector<Slot> row;
      row.push_back(Slot{K::Idle, -1, 0.0, 1.0 * d});
      row.push_back(Slot{stage == 0 ? K::Forward : K::WanRecv, 0, 1.0, 1.0});
      row.push_back(Slot{K::Idle, -1, 2.0, 1.0});
      row.push_back(Slot{K::AllReduce, -1, 3.0, 1.0});
      row.push_back(Slot{K::Optimizer, -1, 4.0, 1.0});
      t.rows.push_back(row);
    }
  return t;
}

TEST(SlotMarks, TheStaggerIsTheIdleSlotOpeningAnAtlasFirstStageRow) {
  ScheduleTable atlas = two_stage_table(ScheduleKind::Atlas, 2, true);
  const std::uint64_t hash = atlas.structure_hash();
  mark_slots(atlas);
  EXPECT_EQ(atlas.structure_hash(), hash);
  for (int d = 0; d < 2; ++d) {
    EXPECT_TRUE(atlas.row(0, d)[0].has(SlotMark::Stagger)) << "dp " << d;
    EXPECT_FALSE(atlas.row(1, d)[0].has(SlotMark::Stagger)) << "only the first stage is staggered";
    EXPECT_FALSE(atlas.row(0, d)[2].has(SlotMark::Stagger)) << "a later bubble is a wait, not a delay";
  }
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
    ScheduleTable t = two_stage_table(k, 2, true);
    mark_slots(t);
    EXPECT_FALSE(t.row(0, 1)[0].has(SlotMark::Stagger)) << to_string(k);
  }
}

TEST(SlotMarks, FillableWaitsAreReceivesAndTheWanSumsOfAPipelineAcrossDcs) {
  ScheduleTable t = two_stage_table(ScheduleKind::OneFOneB, 1, true);
  mark_slots(t);
  mark_slots(t);  // idempotent
  EXPECT_TRUE(t.row(1, 0)[1].has(SlotMark::FillableWait)) << "a receive";
  EXPECT_FALSE(t.row(0, 0)[1].has(SlotMark::FillableWait)) << "a forward";
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_TRUE(t.row(stage, 0)[3].has(SlotMark::FillableWait)) << "the tied-embedding exchange crosses the WAN";
    EXPECT_TRUE(t.row(stage, 0)[4].has(SlotMark::FillableWait)) << "the norm sum crosses the WAN";
    EXPECT_TRUE(t.row(stage, 0)[2].has(SlotMark::ExchangeBubble));
    EXPECT_FALSE(t.row(stage, 0)[0].has(SlotMark::ExchangeBubble));
  }
  ScheduleTable one_dc = two_stage_table(ScheduleKind::OneFOneB, 1, false);
  mark_slots(one_dc);
  EXPECT_TRUE(one_dc.row(1, 0)[1].has(SlotMark::FillableWait)) << "a receive waits in one DC too";
  for (int stage = 0; stage < 2; ++stage)
    for (std::size_t i : {2U, 3U, 4U}) EXPECT_EQ(one_dc.row(stage, 0)[i].marks, 0) << "no WAN wait in one DC";
}

// The builder marks every table it times.
TEST(SlotMarks, TheBuilderMarksItsTables) {
  CostModel c;
  c.pp = 2;
  c.dc_count = 2;
  c.stage_dc = {0, 1};
  c.fwd_ms = {1.0, 1.0};
  c.bwd_ms = {2.0, 2.0};
  c.allreduce_ms = {0.5, 0.5};
  c.optimizer_ms = {0.5, 0.5};
  c.act_bytes = 1 << 20;
  c.links.assign(4, LinkCost{5.0, 1.25e5, 1.25e5});
  ScheduleOptions opt;
  opt.kind = ScheduleKind::OneFOneB;
  opt.micro_batches = 4;
  const ScheduleTable t = build_schedule(c, opt);
  int receives = 0;
  for (const auto& row : t.rows)
    for (const Slot& s : row) {
      if (is_recv(s.kind)) {
        ++receives;
        EXPECT_TRUE(s.has(SlotMark::FillableWait));
      }
      if (s.kind == SlotKind::Optimizer) {
        EXPECT_TRUE(s.has(SlotMark::FillableWait));
      }
    }
  EXPECT_EQ(receives, 2 * 4);  // activations into stage 1, gradients into stage 0
}

}  // namespace
}  // namespace atlas::sched
