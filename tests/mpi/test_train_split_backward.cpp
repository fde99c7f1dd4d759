// SPDX-License-Identifier: MIT
// Real training on a split-backward table (the zero-bubble slot contract, docs/schedules.md):
// the built 1F1B, interleaved or atlas table is rewritten by the test-only split_backwards()
// (tests/support/split_backward.hpp: each Backward -> BackwardInput, its BackwardWeight deferred
// past the next B) and handed to the Trainer as any table; every step's loss, the first step's
// full gradient and parameters must equal the unsplit run's bit for bit. np 2: 2 stages in 2 DCs
// (1f1b v 1 and 2, atlas); np 4: dp 2 (the DP sums overlap the chunk's last W) and 2 stages per
// DC. Also an emulated run (device.backend = emulated) walks a split table, sleeping every
// slot's time.
#include "train_fixture.hpp"

#include <algorithm>

#include "support/split_backward.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::Outcome;

using Shape = testing::PipelineShape;

std::vector<Shape> shapes(int np) { return testing::two_dc_shapes(np); }

/// testing::train without checkpoints, on the deck's table or its split rewrite.
Outcome train(const Config& cfg, const mpi::Comm& world, int steps, bool split) {
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  const topo::Coord me = layout.coord(comms.world.rank());
  auto backend = device::make_backend(cfg.device);
  sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  if (split) {
    table = atlas::testing::split_backwards(std::move(table), 0.4);
    const auto& row = table.row(me.stage, me.dp);
    EXPECT_TRUE(std::any_of(row.begin(), row.end(), [](const sched::Slot& s) { return s.kind == sched::SlotKind::BackwardWeight; }));
  }
  const std::vector<int> peers = layout.wan_peers(me);
  auto wan = wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, peers);
  Profiler profiler(false, comms.world.rank(), 0);
  Trainer trainer(cfg, layout, comms, table, wan.get(), *backend, profiler);
  Outcome out;
  for (int s = 0; s < steps; ++s) {
    const StepReport r = trainer.train_step(s);
    out.losses.push_back(r.loss);
    out.reports.push_back(r);
    if (s == 0 && !trainer.emulated()) {
      out.grads = trainer.gather_full(true);
      out.params = trainer.gather_full(false);
    }
  }
  return out;
}

std::string name(const Shape& sh, int v) {
  return testing::shape_name(sh) + (v == 0 ? " atlas" : " 1f1b v " + std::to_string(v));
}

TEST(TrainSplitBackward, ASplitTableTrainsWithTheUnsplitLossesAndGradientsBitwise) {
  const mpi::Comm world = mpi::Comm::world();
  if (shapes(world.size()).empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const Shape& sh : shapes(world.size())) {
    int pp = 0;
    for (int x : sh.stages_per_dc) pp += x;
    for (int v : {0, 1, 2}) {  // v 0: atlas (ordered WAN links, a stagger), one chunk
      if (v > 1 && pp > 2) continue;  // one interleaved shape is enough
      const Config cfg = make_cfg(1, sh.dp, sh.stages_per_dc, 2 * pp,
                                  {"model.layers=8", "schedule.virtual_stages=" + std::to_string(std::max(v, 1)),
                                   v == 0 ? "schedule.kind=atlas" : "schedule.kind=1f1b",
                                   "train.dp_bucket_bytes=4096"});  // several buckets: some start early
      const Outcome whole = train(cfg, world, 3, false);
      const Outcome split = train(cfg, world, 3, true);
      if (world.rank() != 0) continue;
      const std::string what = name(sh, v);
      EXPECT_EQ(split.losses, whole.losses) << what << ": every step's loss (bitwise)";
      ASSERT_EQ(split.grads.size(), whole.grads.size()) << what;
      for (std::size_t i = 0; i < whole.grads.size(); ++i)
        EXPECT_EQ(split.grads[i], whole.grads[i]) << what << ": gradient of " << whole.grads[i].first << " (bitwise)";
      EXPECT_EQ(split.params, whole.params) << what << ": parameters after step 0 (bitwise)";
      EXPECT_LT(whole.losses.back(), whole.losses.front()) << what << ": the loss falls";
      if (sh.dp > 1) {
        EXPECT_GT(split.reports[0].dp_buckets_early, 0) << what << ": DP sums started during the last W";
        EXPECT_EQ(split.reports[0].dp_buckets_early, whole.reports[0].dp_buckets_early) << what;
        EXPECT_EQ(split.reports[0].dp_buckets, whole.reports[0].dp_buckets) << what;
      }
    }
  }
}

TEST(TrainSplitBackward, AnEmulatedRunSleepsEverySlotOfASplitTable) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at np 2";
  const Config cfg = make_cfg(1, 1, {1, 1}, 4, {"device.backend=emulated", "ckpt.final=false"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const sched::ScheduleTable table = atlas::testing::split_backwards(sched::build_schedule(cfg, layout), 0.4);
  const int stage = layout.coord(world.rank()).stage;
  double compute_ms = 0.0;
  int halves = 0;
  for (const sched::Slot& s : table.row(stage, 0)) {
    if (sched::is_compute(s.kind)) compute_ms += s.duration_ms;
    halves += s.kind == sched::SlotKind::BackwardInput || s.kind == sched::SlotKind::BackwardWeight;
  }
  const Outcome out = train(cfg, world, 2, true);
  EXPECT_EQ(halves, 2 * 4) << "a B and a W per micro-batch";
  for (const StepReport& r : out.reports) {
    EXPECT_TRUE(std::isnan(r.loss)) << "no loss is computed";
    EXPECT_GE(r.compute_s, 0.95 * compute_ms * 1e-3) << "every compute slot sleeps its predicted time";
  }
}

}  // namespace
}  // namespace atlas::runtime
