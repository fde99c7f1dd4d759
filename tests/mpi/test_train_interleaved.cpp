// SPDX-License-Identifier: MIT
// Interleaved 1F1B in real training (schedule.virtual_stages): the trainer holds v model chunks
// per rank and routes the boundary tensors per chunk, and
//  - the first step's loss and full gradient are bitwise those of v = 1 (every parameter
//    accumulates its micro-batches in the same order, the DP buckets are packed in the same
//    order), and the later losses equal v = 1 to 1e-6 relative: a stage holds other layers with
//    chunks, so the global gradient norm (clipping) adds its per-stage sums in another order;
//  - a v = 2 run's checkpoint resumes under v = 1 and the other way round (the same full tensors);
//  - atlas (ordered WAN links, one transfer at a time: link-order tokens between the senders, which
//    with chunks are ranks of several stages of a DC) runs it with the same losses.
// np 2: 2 DCs x 1 stage; np 4: 2 DCs x 1 stage x dp 2, and 2 DCs x 2 stages (the last stage hands
// a micro-batch back to the first across the WAN).
#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::Outcome;
using testing::train;

using Shape = testing::PipelineShape;

std::vector<Shape> shapes(int np) { return testing::two_dc_shapes(np); }

std::string name(const Shape& sh) { return testing::shape_name(sh); }

void expect_same_curves(const Outcome& got, const Outcome& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  EXPECT_EQ(got.losses[0], ref.losses[0]) << what << ": step 0 (bitwise)";
  for (std::size_t s = 1; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-6 * std::fabs(ref.losses[s])) << what << " step " << s;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (std::size_t i = 0; i < ref.grads.size(); ++i) {
    EXPECT_EQ(got.grads[i].first, ref.grads[i].first) << what;
    EXPECT_EQ(got.grads[i].second, ref.grads[i].second) << what << ": gradient of " << ref.grads[i].first << " (bitwise)";
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the loss falls";
}

TEST(TrainInterleaved, ChunksGiveTheLossesAndGradientsOfOneChunk) {
  const mpi::Comm world = mpi::Comm::world();
  if (shapes(world.size()).empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const Shape& sh : shapes(world.size())) {
    int pp = 0;
    for (int x : sh.stages_per_dc) pp += x;
    const int m = 2 * pp;
    const std::vector<std::string> base{"model.layers=8"};
    const Outcome one = train(make_cfg(1, sh.dp, sh.stages_per_dc, m, base), world, 3);
    for (int v : {2, 4}) {
      if (8 / pp % v != 0) continue;
      std::vector<std::string> extra = base;
      extra.push_back("schedule.virtual_stages=" + std::to_string(v));
      const Outcome got = train(make_cfg(1, sh.dp, sh.stages_per_dc, m, extra), world, 3);
      if (world.rank() == 0) expect_same_curves(got, one, name(sh) + " v " + std::to_string(v));
    }
  }
}

TEST(TrainInterleaved, AtlasOverChunksRunsWithTheSameLosses) {
  const mpi::Comm world = mpi::Comm::world();
  if (shapes(world.size()).empty()) GTEST_SKIP() << "runs at np 2 and 4";
  for (const Shape& sh : shapes(world.size())) {
    int pp = 0;
    for (int x : sh.stages_per_dc) pp += x;
    const int m = 2 * pp;
    const Outcome one = train(make_cfg(1, sh.dp, sh.stages_per_dc, m, {"model.layers=8"}), world, 3);
    const Outcome got = train(make_cfg(1, sh.dp, sh.stages_per_dc, m,
                                       {"model.layers=8", "schedule.kind=atlas", "schedule.virtual_stages=2",
                                        "schedule.atlas_slots=1"}),
                              world, 3);
    if (world.rank() == 0) expect_same_curves(got, one, name(sh) + " atlas v 2");
  }
}

// A WAN of 5 ms one way (in the cost model; the run itself is local): the atlas search goes deeper
// than interleaved 1F1B (more chunk passes in flight, sched/depth.cpp), and the runtime walks that
// order with the same losses and gradients as one chunk.
TEST(TrainInterleaved, AtlasOverChunksAtADeeperDepthRunsWithTheSameLosses) {
  const mpi::Comm world = mpi::Comm::world();
  if (shapes(world.size()).empty()) GTEST_SKIP() << "runs at np 2 and 4";
  const Shape sh = shapes(world.size()).back();
  int pp = 0;
  for (int x : sh.stages_per_dc) pp += x;
  const int m = 2 * pp;
  const std::vector<std::string> base{"model.layers=8", "cluster.latency_ms=0 5 5 0"};
  const Outcome one = train(make_cfg(1, sh.dp, sh.stages_per_dc, m, base), world, 3);
  std::vector<std::string> extra = base;
  extra.insert(extra.end(), {"schedule.kind=atlas", "schedule.virtual_stages=2"});
  const Config cfg = make_cfg(1, sh.dp, sh.stages_per_dc, m, extra);
  const sched::ScheduleTable table = sched::build_schedule(cfg, topo::Layout(world.size(), cfg.parallel));
  ASSERT_EQ(table.virtual_stages, 2);
  // Interleaved 1F1B holds 2 (pp - 1) + pp + 1 chunk passes on stage 0; atlas chose more.
  EXPECT_GT(table.atlas.depth.front(), 2 * (pp - 1) + pp + 1) << name(sh);
  const Outcome got = train(cfg, world, 3);
  if (world.rank() == 0) expect_same_curves(got, one, name(sh) + " atlas v 2, deeper");
}

TEST(TrainInterleaved, ACheckpointMovesBetweenChunkCounts) {
  const mpi::Comm world = mpi::Comm::world();
  if (shapes(world.size()).empty()) GTEST_SKIP() << "runs at np 2 and 4";
  const Shape sh = shapes(world.size()).back();
  int pp = 0;
  for (int x : sh.stages_per_dc) pp += x;
  const int m = 2 * pp;
  const std::string dir = testing::shared_temp_dir(world, "atlas-interleaved");
  auto cfg = [&](int v, const std::string& sub, bool resume) {
    std::vector<std::string> extra{"model.layers=8", "schedule.virtual_stages=" + std::to_string(v),
                                   "ckpt.dir=" + dir + "/" + sub};
    if (resume) extra.emplace_back("run.resume=latest");
    return make_cfg(1, sh.dp, sh.stages_per_dc, m, extra);
  };
  for (const auto& [write_v, read_v] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const std::string sub = "w" + std::to_string(write_v);
    const Outcome straight = train(cfg(read_v, "straight" + sub, false), world, 4);
    (void)train(cfg(write_v, sub, false), world, 2, /*save_after=*/2);
    const Outcome resumed = train(cfg(read_v, sub, true), world, 4);
    if (world.rank() != 0) continue;
    EXPECT_EQ(resumed.first_step, 2);
    ASSERT_EQ(resumed.losses.size(), 2u);
    for (std::size_t s = 0; s < 2; ++s)
      EXPECT_NEAR(resumed.losses[s], straight.losses[s + 2], 1e-6 * std::fabs(straight.losses[s + 2]))
          << "written with v " << write_v << ", read with v " << read_v << ", step " << s + 2;
  }
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atlas::runtime
