// SPDX-License-Identifier: MIT
// Checkpoint/resume of real training: N steps straight vs N/2, checkpoint, a new job resumes and
// runs N/2 — the same loss at every step, bitwise; resuming under another layout matches to
// 1e-6; `run.resume = latest` skips a truncated newest checkpoint; an incompatible one is a
// clear, collective error; a bit flipped in a tensor, in adam_t or in the loader position is an
// I/O error naming the file and dataset, and `latest` skips such a file.
#include <fstream>

#include <gmock/gmock.h>

#include "support/flip_bit.hpp"
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

TEST(TrainResume, AFlippedBitInATensorAdamTOrTheLoaderIsAnIoErrorAndLatestSkipsTheFile) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "runs at np 2";
  const std::string dir = testing::shared_temp_dir(world, "atlas-bitflip");
  const auto cfg = [&](const std::string& resume) {
    return make_cfg(1, 1, {1, 1}, 2, {"ckpt.dir=" + dir, "ckpt.keep_last=5", "run.resume=" + resume});
  };
  (void)train(cfg(""), world, 1, 1);
  (void)train(cfg("latest"), world, 2, 2);
  // Copies of the step-2 checkpoint, each with one bit flipped (the file stays valid HDF5).
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {dir + "/tensor.h5", "/params/h.0.attn.qkv.weight"},
      {dir + "/adam_t.h5", "/state/adam_t"},
      {dir + "/loader.h5", "/state/loader"}};
  world.barrier();
  if (world.rank() == 0) {
    for (const auto& [file, dataset] : damaged) {
      std::filesystem::copy_file(io::checkpoint_path(dir, 2), file);
      atlas::test_support::flip_bit(file, dataset, dataset == "/state/loader" ? 8 : 1, 0);
    }
  }
  world.barrier();
  for (const auto& [file, dataset] : damaged) {
    try {
      (void)train(cfg(file), world, 3);
      ADD_FAILURE() << "resumed from " << file << " although " << dataset << " was damaged";
    } catch (const io::ChecksumMismatch& e) {
      EXPECT_EQ(e.code(), ExitCode::Io);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("checkpoint '" + file + "': dataset " + dataset));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("checksum mismatch"));
    }
  }
  // The newest checkpoint damaged in place: latest resumes from the one before.
  world.barrier();
  if (world.rank() == 0) atlas::test_support::flip_bit(io::checkpoint_path(dir, 2), "/params/wpe", 1, 0);
  world.barrier();
  EXPECT_EQ(train(cfg("latest"), world, 2).first_step, 1) << "fell back to step-000001.h5";
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atlas::runtime
