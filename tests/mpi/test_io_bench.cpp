// SPDX-License-Identifier: MIT
// `atlas bench ckpt` at a tiny size: both writers run, the numbers are real and positive, the
// files are cleaned up, and bad options are a usage error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "atlas/io/bench.hpp"
#include "test_io_model.hpp"

namespace atlas::io {
namespace {

namespace fs = std::filesystem;

TEST(CkptBench, MeasuresBothWritersAndCleansUp) {
  const mpi::Comm world = mpi::Comm::world();
  testing::SharedTempDir tmp(world);
  CkptBenchOptions o;
  o.size_bytes = 3U << 20;
  o.tensors = 6;
  o.repeat = 2;
  o.dir = tmp.path() + "/bench";
  const CkptBenchReport r = bench_ckpt(world, o);
  // 3 MiB of tensors (rounded to whole 1024-column rows) plus a little HDF5 metadata.
  EXPECT_GE(r.bytes, (3U << 20) - 3U * 4096U);
  EXPECT_LE(r.bytes, (3U << 20) + (256U << 10));
  ASSERT_EQ(r.rounds.size(), 2U);
  for (const auto& round : r.rounds) {
    EXPECT_GT(round.ckpt_s, 0.0);
    EXPECT_GT(round.posix_s, 0.0);
    EXPECT_GT(round.data_s, 0.0);
    EXPECT_GT(round.sync_s, 0.0);
    // Each phase (slowest rank's) lies inside the barrier-to-barrier time of the whole call;
    // the sum need not, as different ranks may be slowest in different phases.
    for (const double phase : {round.data_s, round.close_s, round.sync_s}) {
      EXPECT_LE(phase, round.ckpt_s + 1e-3);
    }
  }
  EXPECT_GT(r.ckpt_mb_s, 0.0);
  EXPECT_GT(r.posix_mb_s, 0.0);
  EXPECT_EQ(r.tp_size * r.pp_size, world.size());
  world.barrier();
  EXPECT_TRUE(fs::is_empty(o.dir));
}

TEST(CkptBench, RejectsUnknownAndMalformedOptions) {
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  mpi::Environment env(argc, argv, mpi::ThreadLevel::Funneled);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_ckpt_bench(env, {"--sise", "1M"}), 1);
  EXPECT_EQ(run_ckpt_bench(env, {"--size", "lots"}), 1);
  EXPECT_EQ(run_ckpt_bench(env, {"--repeat"}), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (env.world_rank() == 0) {
    EXPECT_THAT(err, ::testing::HasSubstr("unknown option '--sise'"));
    EXPECT_THAT(err, ::testing::HasSubstr("--size 'lots': expected bytes"));
    EXPECT_THAT(err, ::testing::HasSubstr("option '--repeat' needs a value"));
  }
}

// The writer's MPI-IO transfers are the deck key ckpt.transfer (formerly --transfer): it reaches
// the writer the bench measures, and training's (io::transfer_of); a bad value is refused.
TEST(CkptBench, DeckKeyChoosesTheWritersTransfers) {
  EXPECT_EQ(transfer_of(CkptTransfer::Auto), Transfer::Auto);
  EXPECT_EQ(transfer_of(CkptTransfer::Collective), Transfer::Collective);
  EXPECT_EQ(transfer_of(CkptTransfer::Independent), Transfer::Independent);
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  mpi::Environment env(argc, argv, mpi::ThreadLevel::Funneled);
  const mpi::Comm world = mpi::Comm::world();
  testing::SharedTempDir tmp(world);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_ckpt_bench(env, {"--size", "1M", "--tensors", "2", "--repeat", "1", "--dir", tmp.path() + "/b",
                                 "ckpt.transfer=independent"}),
            0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  if (world.rank() == 0) {
    EXPECT_THAT(out, ::testing::HasSubstr("independent MPI-IO transfers"));
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_ckpt_bench(env, {"ckpt.transfer=sideways"}), 1);
  EXPECT_EQ(run_ckpt_bench(env, {"ckpt.keep_last=2"}), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (world.rank() == 0) {
    EXPECT_THAT(err, ::testing::HasSubstr("ckpt.transfer = \"sideways\": expected one of: auto, collective, independent"));
    EXPECT_THAT(err, ::testing::HasSubstr("only ckpt.transfer applies"));
  }
}

}  // namespace
}  // namespace atlas::io
