// SPDX-License-Identifier: MIT
// device.precision in real training (docs/precision.md): at bf16 the pipeline boundary tensors
// travel as bf16, half the bytes of fp32, over the WAN transport and over intra-DC MPI alike, and
// the loss stays close to fp32's; a bf16 run's checkpoint (fp32 tensors) resumes under fp32 and an
// fp32 one under bf16, continuing the curve.
#include <cstdio>

#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::train;

/// Boundary bytes this rank sent over all steps of `o` (WAN and intra-DC), summed over `world`.
std::int64_t boundary_bytes(const testing::Outcome& o, const mpi::Comm& world, bool wan) {
  std::int64_t mine = 0;
  for (const StepReport& r : o.reports) mine += wan ? r.boundary.wan_bytes_sent : r.boundary.local_bytes_sent;
  return world.allreduce(mine, MPI_SUM);
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return worst;
}

TEST(TrainPrecision, Bf16BoundariesSendHalfTheBytesAndTheLossStaysClose) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at np 2";
  for (const bool wan : {true, false}) {
    // Two DCs of one stage each (WAN boundary), or one DC of two stages (MPI boundary).
    const std::vector<int> spd = wan ? std::vector<int>{1, 1} : std::vector<int>{2};
    const auto fp32 = train(make_cfg(1, 1, spd, 2, {"device.precision=fp32"}), world, 3);
    const auto bf16 = train(make_cfg(1, 1, spd, 2, {"device.precision=bf16"}), world, 3);
    const std::int64_t b32 = boundary_bytes(fp32, world, wan), b16 = boundary_bytes(bf16, world, wan);
    // 3 steps x 2 micro-batches x (activation + gradient) x 2 x 16 tokens x 32 hidden x 4 bytes.
    EXPECT_EQ(b32, 3 * 2 * 2 * 2 * 16 * 32 * 4) << (wan ? "WAN" : "intra-DC");
    EXPECT_EQ(b16 * 2, b32) << (wan ? "WAN" : "intra-DC") << ": bf16 boundaries travel as bf16";
    EXPECT_EQ(boundary_bytes(bf16, world, !wan), 0);
    if (world.rank() == 0) {
      ASSERT_EQ(bf16.losses.size(), 3u);
      for (double l : bf16.losses) ASSERT_TRUE(std::isfinite(l));
      EXPECT_NE(bf16.losses, fp32.losses) << "bf16 rounds its matmul inputs and boundaries";
      std::printf("precision: %s boundary, bf16 vs fp32 loss max relative deviation %.3g over 3 steps\n",
                  wan ? "WAN" : "intra-DC", max_rel(bf16.losses, fp32.losses));
      EXPECT_LE(max_rel(bf16.losses, fp32.losses), 5e-4) << (wan ? "WAN" : "intra-DC");
    }
  }
}

TEST(TrainPrecision, CheckpointsResumeAcrossPrecisions) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 1 && world.size() != 2) GTEST_SKIP() << "runs at np 1 and 2";
  const std::vector<int> spd = world.size() == 2 ? std::vector<int>{1, 1} : std::vector<int>{1};
  const std::string dir = testing::shared_temp_dir(world, "atlas-precision-resume");
  for (const auto& [from, to] : {std::pair{"bf16", "fp32"}, std::pair{"fp32", "bf16"}}) {
    const std::string d = dir + "/" + from;
    const auto straight = train(make_cfg(1, 1, spd, 2, {std::string("device.precision=") + from}), world, 4);
    (void)train(make_cfg(1, 1, spd, 2, {"ckpt.dir=" + d, std::string("device.precision=") + from}), world, 2,
                /*save_after=*/2);
    const auto resumed =
        train(make_cfg(1, 1, spd, 2, {"ckpt.dir=" + d, "run.resume=latest", std::string("device.precision=") + to}),
              world, 4);
    if (world.rank() == 0) {
      EXPECT_EQ(resumed.first_step, 2) << from << " -> " << to;
      ASSERT_EQ(resumed.losses.size(), 2u);
      std::printf("precision: resumed %s -> %s, relative deviation from the straight %s run %.3g, %.3g\n", from, to,
                  from, std::fabs(resumed.losses[0] / straight.losses[2] - 1), std::fabs(resumed.losses[1] / straight.losses[3] - 1));
      for (std::size_t s = 0; s < 2; ++s) {
        ASSERT_TRUE(std::isfinite(resumed.losses[s]));
        // The other precision continues the same curve: close (measured ~1e-5), not the same bits.
        EXPECT_NE(resumed.losses[s], straight.losses[s + 2]) << from << " -> " << to << " step " << s + 2;
        EXPECT_NEAR(resumed.losses[s], straight.losses[s + 2], 5e-4 * straight.losses[s + 2])
            << from << " -> " << to << " step " << s + 2;
      }
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atlas::runtime
