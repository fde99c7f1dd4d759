// SPDX-License-Identifier: MIT
// Parallel equivalence of real training: for a fixed seed, the loss and the full gradient after
// one step of a (tp, dp, pp) layout, and the losses of the next steps, equal a single-rank run of
// the same global batch (to 1e-5 relative); the loss curve is the same under gpipe, 1f1b and
// atlas, and over the multirail and the MPI WAN transport. (Parameters after an AdamW step are
// not compared element-wise: Adam's first update is ~lr * sign(g), which turns rounding noise in
// a gradient that is zero in exact arithmetic, e.g. the key bias's, into +-lr.)
#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::Outcome;
using testing::train;

void expect_close(const std::vector<std::pair<std::string, std::vector<float>>>& got,
                  const std::vector<std::pair<std::string, std::vector<float>>>& ref, const std::string& what,
                  double rel = 1e-5) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i].first, ref[i].first);
    ASSERT_EQ(got[i].second.size(), ref[i].second.size()) << ref[i].first;
    double max_ref = 0.0, max_diff = 0.0;
    for (std::size_t k = 0; k < ref[i].second.size(); ++k) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i].second[k])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i].second[k]) - ref[i].second[k]));
    }
    EXPECT_LE(max_diff, rel * std::max(max_ref, 1e-12)) << what << ": " << ref[i].first << " max|diff| " << max_diff
                                                         << " vs max|ref| " << max_ref;
  }
}

struct Shape {
  int tp, dp;
  std::vector<int> stages_per_dc;
};

TEST(TrainEquivalence, LayoutsMatchTheSingleRankRun) {
  const mpi::Comm world = mpi::Comm::world();
  std::vector<Shape> shapes;
  switch (world.size()) {
    case 1: shapes = {{1, 1, {1}}}; break;
    case 2: shapes = {{2, 1, {1}}, {1, 2, {1}}, {1, 1, {1, 1}}}; break;
    case 3: shapes = {{1, 1, {2, 1}}}; break;
    case 8: shapes = {{2, 2, {1, 1}}}; break;
    default: GTEST_SKIP() << "no layout registered for np " << world.size();
  }
  constexpr int kMicro = 2;
  for (const auto& sh : shapes) {
    const std::string what = "tp " + std::to_string(sh.tp) + " dp " + std::to_string(sh.dp) + " pp " +
                             std::to_string(sh.stages_per_dc.size() == 1 ? sh.stages_per_dc[0] : sh.stages_per_dc[0] + sh.stages_per_dc[1]);
    // Reference: one rank, the same global batch (dp * micro-batches micro-batches).
    Outcome ref;
    constexpr int kSteps = 3;
    if (world.rank() == 0) ref = train(make_cfg(1, 1, {1}, kMicro * sh.dp), mpi::Comm::self(), kSteps);
    const Outcome got = train(make_cfg(sh.tp, sh.dp, sh.stages_per_dc, kMicro), world, kSteps);
    if (world.rank() != 0) continue;
    ASSERT_EQ(got.losses.size(), static_cast<std::size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s)
      EXPECT_NEAR(got.losses[static_cast<std::size_t>(s)], ref.losses[static_cast<std::size_t>(s)],
                  1e-5 * std::fabs(ref.losses[static_cast<std::size_t>(s)])) << what << " step " << s;
    EXPECT_GT(ref.losses[0], 4.0) << "an untrained byte model starts near ln(256) = 5.5";
    EXPECT_LT(ref.losses[kSteps - 1], ref.losses[0]) << "the loss falls";
    expect_close(got.grads, ref.grads, what + " gradients of step 0");
    // Initial parameters are identical by construction (layout-independent init): check a few.
    expect_close(got.params, ref.params, what + " parameters after step 0 (loose)", 1e-2);
  }
}

TEST(TrainEquivalence, LossCurveIsTheSameForEverySchedule) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4 (2 DCs x dp 2)";
  std::vector<std::vector<double>> curves;
  for (const char* kind : {"schedule.kind=gpipe", "schedule.kind=1f1b", "schedule.kind=atlas"})
    curves.push_back(train(make_cfg(1, 2, {1, 1}, 4, {kind}), world, 3).losses);
  if (world.rank() != 0) return;
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(curves[0][s], curves[1][s]) << "gpipe vs 1f1b at step " << s;
    EXPECT_EQ(curves[1][s], curves[2][s]) << "1f1b vs atlas at step " << s;
  }
  EXPECT_LT(curves[0][2], curves[0][0]) << "the loss falls";
}

TEST(TrainEquivalence, LossCurveIsTheSameOverMultirailAndMpi) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4 (2 DCs x dp 2)";
  const auto a = train(make_cfg(1, 2, {1, 1}, 3, {"wan.transport=multirail", "wan.rails=3", "wan.chunk_bytes=1000"}), world, 3).losses;
  const auto b = train(make_cfg(1, 2, {1, 1}, 3, {"wan.transport=mpi"}), world, 3).losses;
  if (world.rank() != 0) return;
  EXPECT_EQ(a, b);
}

// train.dp_overlap: the DP bucket sums start during the last backward, as each group of layers
// finishes, instead of all at the AllReduce slot. Same sums, so with dp 2 (a + b = b + a) the
// losses and gradients are bitwise those of the synchronous path. Small buckets split tensors
// over several buckets and leave several sums in flight at once.
TEST(TrainEquivalence, OverlappedGradientSumsEqualTheSynchronousOnes) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4 (2 DCs x dp 2)";
  for (const char* kind : {"schedule.kind=1f1b", "schedule.kind=gpipe"}) {
    const auto off = train(make_cfg(1, 2, {1, 1}, 3, {kind, "train.dp_bucket_bytes=4K", "train.dp_overlap=false"}), world, 3);
    const auto on = train(make_cfg(1, 2, {1, 1}, 3, {kind, "train.dp_bucket_bytes=4K", "train.dp_overlap=true"}), world, 3);
    ASSERT_EQ(on.reports.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      // Every step uses the same buckets; without overlap none starts early, with it all but the
      // last (which the AllReduce slot closes unless it filled up) start during the backward.
      EXPECT_EQ(on.reports[s].dp_buckets, off.reports[s].dp_buckets) << kind;
      EXPECT_GT(on.reports[s].dp_buckets, 3) << kind << ": 4 KiB buckets split the stage's gradients";
      EXPECT_EQ(off.reports[s].dp_buckets_early, 0) << kind;
      EXPECT_GE(on.reports[s].dp_buckets_early, on.reports[s].dp_buckets - 1) << kind << " step " << s;
    }
    if (world.rank() != 0) continue;
    EXPECT_EQ(on.losses, off.losses) << kind;
    ASSERT_EQ(on.grads.size(), off.grads.size());
    for (std::size_t i = 0; i < on.grads.size(); ++i) EXPECT_EQ(on.grads[i].second, off.grads[i].second) << on.grads[i].first;
  }
  // 128-byte buckets: every tensor size here is a multiple of 32 floats, so every bucket ends
  // full and the last one has started before the AllReduce slot, which then has none to close.
  const auto off = train(make_cfg(1, 2, {1, 1}, 3, {"train.dp_bucket_bytes=128", "train.dp_overlap=false"}), world, 2);
  const auto on = train(make_cfg(1, 2, {1, 1}, 3, {"train.dp_bucket_bytes=128"}), world, 2);
  for (const StepReport& r : on.reports) EXPECT_EQ(r.dp_buckets_early, r.dp_buckets) << "exact fit";
  if (world.rank() != 0) return;
  EXPECT_EQ(on.losses, off.losses);
  ASSERT_EQ(on.grads.size(), off.grads.size());
  for (std::size_t i = 0; i < on.grads.size(); ++i) EXPECT_EQ(on.grads[i].second, off.grads[i].second) << on.grads[i].first;
}

// The DP ring across DCs (parallel.dp_across_dcs) tells its open sums apart by 1024 tags: with
// 16-byte buckets a stage's gradients make thousands of them, which the trainer keeps at most 512
// open (it waits for the oldest first); the overlapped sums still equal the synchronous ones.
TEST(TrainEquivalence, ThousandsOfRingBucketsEqualTheSynchronousSums) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4 (2 DCs x 2 stages, dp 2 across them)";
  const std::vector<std::string> ring = {"parallel.dp_across_dcs=true", "train.dp_bucket_bytes=16"};
  auto with = [&](const char* overlap) {
    std::vector<std::string> o = ring;
    o.emplace_back(overlap);
    return train(make_cfg(1, 2, {2, 2}, 2, o), world, 2);
  };
  const auto off = with("train.dp_overlap=false");
  const auto on = with("train.dp_overlap=true");
  for (const StepReport& r : on.reports) EXPECT_GT(r.dp_buckets, 1024) << "rank " << world.rank();
  if (world.rank() != 0) return;
  EXPECT_EQ(on.losses, off.losses);
  ASSERT_EQ(on.grads.size(), off.grads.size());
  for (std::size_t i = 0; i < on.grads.size(); ++i) EXPECT_EQ(on.grads[i].second, off.grads[i].second) << on.grads[i].first;
}

}  // namespace
}  // namespace atlas::runtime
