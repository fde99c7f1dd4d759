// SPDX-License-Identifier: MIT
// Checkpoint/resume of real training: N steps straight vs N/2, checkpoint, a new job resumes and
// runs N/2 — the same loss at every step, bitwise; resuming under another layout matches to
// 1e-6; `run.resume = latest` skips a truncated newest checkpoint; an incompatible one is a
// clear, collective error.
#include <fstream>

#include <gmock/gmock.h>

#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using testing::train;

TEST(TrainResume, HalfwayResumeIsBitwiseIdentical) {
  const mpi::Comm world = mpi::Comm::world();
  const std::vector<int> spd = world.size() >= 2 ? std::vector<int>{1, 1} : std::vector<int>{1};
  const int dp = world.size() >= 4 ? 2 : 1;
  if (world.size() != 1 && world.size() != 2 && world.size() != 4) GTEST_SKIP();
  const std::string dir = testing::shared_temp_dir(world, "atlas-resume");
  const Config straight = make_cfg(1, dp, spd, 2, {"ckpt.dir=" + dir + "/a"});
  const auto full = train(straight, world, 4);
  (void)train(make_cfg(1, dp, spd, 2, {"ckpt.dir=" + dir + "/b"}), world, 2, /*save_after=*/2);
  const auto resumed = train(make_cfg(1, dp, spd, 2, {"ckpt.dir=" + dir + "/b", "run.resume=latest"}), world, 4);
  if (world.rank() == 0) {
    EXPECT_EQ(resumed.first_step, 2);
    ASSERT_EQ(resumed.losses.size(), 2u);
    EXPECT_EQ(resumed.losses[0], full.losses[2]);  // bitwise
    EXPECT_EQ(resumed.losses[1], full.losses[3]);
    std::filesystem::remove_all(dir);
  }
}

TEST(TrainResume, AnotherLayoutReadsItsShardsOutOfTheFullTensors) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4";
  const std::string dir = testing::shared_temp_dir(world, "atlas-reshard");
  // Written by tp 2 x pp 2 (2 DCs), 4 micro-batches; resumed by tp 1 x dp 2 x pp 2, 2 micro-batches
  // per pipeline: the same global batch.
  const auto full = train(make_cfg(2, 1, {1, 1}, 4, {"ckpt.dir=" + dir}), world, 4, /*save_after=*/2);
  const auto resumed = train(make_cfg(1, 2, {1, 1}, 2, {"ckpt.dir=" + dir, "run.resume=latest"}), world, 4);
  if (world.rank() == 0) {
    EXPECT_EQ(resumed.first_step, 2);
    ASSERT_EQ(resumed.losses.size(), 2u);
    for (std::size_t s = 0; s < 2; ++s)
      EXPECT_NEAR(resumed.losses[s], full.losses[s + 2], 1e-6 * std::fabs(full.losses[s + 2])) << "step " << s + 2;
    std::filesystem::remove_all(dir);
  }
}

TEST(TrainResume, LatestSkipsATruncatedCheckpointAndAMismatchIsACollectiveError) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at np 2";
  const std::string dir = testing::shared_temp_dir(world, "atlas-latest");
  const Config cfg = make_cfg(1, 1, {1, 1}, 2, {"ckpt.dir=" + dir, "ckpt.keep_last=5"});
  (void)train(cfg, world, 1, 1);
  (void)train(make_cfg(1, 1, {1, 1}, 2, {"ckpt.dir=" + dir, "ckpt.keep_last=5", "run.resume=latest"}), world, 2, 2);
  world.barrier();
  if (world.rank() == 0) {  // cut the newest file in half, as a crash mid-copy would
    const auto p = io::checkpoint_path(dir, 2);
    std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
  }
  world.barrier();
  const auto r = train(make_cfg(1, 1, {1, 1}, 2, {"ckpt.dir=" + dir, "run.resume=latest"}), world, 1);
  EXPECT_EQ(r.first_step, 1) << "fell back to step-000001.h5";
  // A deck with another model shape cannot read it: every rank throws the same ConfigError.
  try {
    (void)train(make_cfg(1, 1, {1, 1}, 2, {"ckpt.dir=" + dir, "run.resume=" + io::checkpoint_path(dir, 1), "model.hidden=64"}),
                world, 2);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("model.hidden is 32 in the checkpoint but 64 in the deck"));
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atlas::runtime
