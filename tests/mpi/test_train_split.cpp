// SPDX-License-Identifier: MIT
// The zero-bubble split of the backward (schedule.split_backward) end to end: `atlas train` of a
// small 2-stage deck (2 DCs, np 2) with the split on gives bitwise the losses of the split off,
// for every schedule kind: each W sums its micro-batch into the gradients in the same order as the
// unsplit backward (docs/schedules.md, the slot contract). Needs the runtime to execute the
// BackwardInput / BackwardWeight slots (issue 24 item 5, model and runtime side).
#include "train_fixture.hpp"

#include "atlas/sched/schedule.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::train;

TEST(TrainSplit, SplitBackwardGivesBitwiseTheLossesOfTheUnsplitOne) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at np 2 (2 DCs, one stage each)";
  for (const char* kind : {"schedule.kind=gpipe", "schedule.kind=1f1b", "schedule.kind=atlas"}) {
    const Config on_cfg = make_cfg(1, 1, {1, 1}, 4, {kind, "schedule.split_backward=on"});
    // The table the run walks is split (B and W slots), the other one is not.
    const topo::Layout layout(world.size(), on_cfg.parallel);
    ASSERT_TRUE(sched::is_split(sched::build_schedule(on_cfg, layout))) << kind;
    const auto off = train(make_cfg(1, 1, {1, 1}, 4, {kind, "schedule.split_backward=off"}), world, 3);
    const auto on = train(on_cfg, world, 3);
    if (world.rank() != 0) continue;
    ASSERT_EQ(on.losses.size(), 3u) << kind;
    EXPECT_EQ(on.losses, off.losses) << kind;
    ASSERT_EQ(on.grads.size(), off.grads.size()) << kind;
    for (std::size_t i = 0; i < on.grads.size(); ++i) EXPECT_EQ(on.grads[i].second, off.grads[i].second) << kind << " " << on.grads[i].first;
  }
}

}  // namespace
}  // namespace atlas::runtime
