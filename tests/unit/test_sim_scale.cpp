// SPDX-License-Identifier: MIT
// Scale (issue #25): the atlas search is skipped where no WAN link exists (one DC: one
// candidate, timed exactly as 1F1B is), and the guards on results that cannot be real.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/cost_models.hpp"

#include "atlas/sched/schedule.hpp"

namespace atlas::sched {
namespace {

TEST(AtlasScale, OneDcHasNoLinkToShareSoTheSearchTriesOneLinkPolicy) {
  // 4 stages x dp 4 in one DC: forward 2 ms, backward 4 ms, no WAN channel at all; the same
  // stages over two DCs (one WAN link) for comparison.
  const CostModel c = testing::uniform_cost_model({4}, 4, 2.0, 4.0, 1 << 20, 1e6, 1e6, 0.0);
  const CostModel wan = testing::uniform_cost_model({2, 2}, 4, 2.0, 4.0, 1 << 20, 1e6, 1e6, 10.0);
  for (bool full : {false, true}) {
    ScheduleOptions o;
    o.kind = ScheduleKind::Atlas;
    o.micro_batches = 8;
    o.full_search = full;
    const ScheduleTable t = build_schedule(c, o);
    // One link policy (slots 1, pipeline order, no stagger) per in-flight depth tried: the
    // stagger x tie-break x slots grid (3 x 5 x 5 with full search) is the WAN case's alone.
    const ScheduleTable w = build_schedule(wan, o);
    EXPECT_LT(t.atlas.candidates_tried, full ? w.atlas.candidates_tried / 5 : w.atlas.candidates_tried + 1)
        << t.atlas.candidates_tried << " vs " << w.atlas.candidates_tried;
    EXPECT_EQ(t.atlas.slots, 1);
    EXPECT_EQ(t.atlas.stagger_ms, 0.0);
    // Nothing to share: the atlas table times as 1F1B does.
    EXPECT_DOUBLE_EQ(t.step_ms, t.atlas.baseline_1f1b_ms);
    o.kind = ScheduleKind::OneFOneB;
    EXPECT_DOUBLE_EQ(build_schedule(c, o).step_ms, t.step_ms);
  }
}

}  // namespace
}  // namespace atlas::sched
