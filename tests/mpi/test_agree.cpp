// SPDX-License-Identifier: MIT
// mpi::agree: an error raised on some ranks reaches every rank as one verdict (the same exception
// class, exit code and messages), so no rank is left waiting in its next collective.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "atlas/core/error.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/mpi/agree.hpp"

namespace atlas::mpi {
namespace {

TEST(Agree, NoFailureReturnsEverywhereAndRunsTheWorkOnce) {
  const Comm world = Comm::world();
  int runs = 0;
  agree(world, "a step", [&] { ++runs; });
  EXPECT_EQ(runs, 1);
  // Still in step: a collective after it matches on every rank.
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());
}

TEST(Agree, AConfigErrorOnTheLastRankIsAConfigErrorOnEveryRank) {
  const Comm world = Comm::world();
  const int culprit = world.size() - 1;
  try {
    agree(world, "restoring the data loader", [&] {
      if (world.rank() == culprit) throw ConfigError("the saved data position was drawn with run.seed = 1");
    });
    FAIL() << "expected ConfigError on rank " << world.rank();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.code(), ExitCode::Config);
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0], "the saved data position was drawn with run.seed = 1");
  }
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());
}

TEST(Agree, TheSameProblemOnSeveralRanksIsListedOnceAndDistinctOnesEach) {
  const Comm world = Comm::world();
  try {
    agree(world, "a step", [&] {
      if (world.rank() % 2 == 0) throw ConfigError(std::vector<std::string>{"same", "rank-parity even"});
      throw ConfigError("odd " + std::to_string(world.rank()));
    });
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::vector<std::string> expect{"same", "rank-parity even"};
    for (int r = 1; r < world.size(); r += 2) expect.push_back("odd " + std::to_string(r));
    // Order: rank by rank, each distinct problem once.
    std::vector<std::string> sorted_expect = expect, got = e.problems();
    std::sort(sorted_expect.begin(), sorted_expect.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, sorted_expect);
  }
}

TEST(Agree, ALocalErrorBecomesACollectiveErrorWithItsClassAndRank) {
  const Comm world = Comm::world();
  const int culprit = world.size() / 2;
  try {
    agree(world, "writing the profile", [&] {
      if (world.rank() == culprit) throw Error(ExitCode::Io, "cannot write profile.h5");
    });
    FAIL() << "expected CollectiveError";
  } catch (const ConfigError&) {
    FAIL() << "a local I/O error must keep its class, not become a config error";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0], "rank " + std::to_string(culprit) + ": cannot write profile.h5");
  }
}

TEST(Agree, TheLowestFailingRankDecidesTheExitCode) {
  const Comm world = Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  try {
    agree(world, "a step", [&] {
      if (world.rank() == 0) throw Error(ExitCode::Comm, "peer gone");
      if (world.rank() == 1) throw std::runtime_error("bad_alloc-like");
    });
    FAIL() << "expected CollectiveError";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.code(), ExitCode::Comm);
    EXPECT_THAT(e.problems(), ::testing::Contains("rank 1: internal error: bad_alloc-like"));
  }
}

TEST(Agree, AnExceptionOfAnotherTypeStillReachesEveryRank) {
  // Not derived from std::exception: the throwing rank skipped the gather and the others waited
  // in it for ever.
  const Comm world = Comm::world();
  const int culprit = world.size() - 1;
  try {
    agree(world, "a step", [&] {
      if (world.rank() == culprit) throw 42;
    });
    FAIL() << "expected CollectiveError";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    EXPECT_THAT(e.problems(), ::testing::Contains("rank " + std::to_string(culprit) +
                                                   ": internal error: an exception of an unknown type"));
  }
  try {
    (void)agree_on_root(world, 0, []() -> std::string { throw 42; });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("an exception of an unknown type"));
  }
}

TEST(AgreeOnRoot, TheRootsResultReachesEveryRankAndTheWorkRunsOnlyThere) {
  const Comm world = Comm::world();
  int runs = 0;
  const std::string got = agree_on_root(world, 0, [&] {
    ++runs;
    return std::string("payload\x1f with a separator");
  });
  EXPECT_EQ(got, "payload\x1f with a separator");
  EXPECT_EQ(runs, world.rank() == 0 ? 1 : 0);
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());
}

TEST(AgreeOnRoot, WhatTheRootThrewIsRaisedOnEveryRankAsTheSameClass) {
  const Comm world = Comm::world();
  const int root = world.size() - 1;
  try {
    (void)agree_on_root(world, root, []() -> std::string { throw Error(ExitCode::Io, "cannot open 'x'"); });
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_STREQ(e.what(), "cannot open 'x'");
  }
  try {
    (void)agree_on_root(world, root, []() -> std::string { throw ConfigError(std::vector<std::string>{"a", "b"}); });
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems(), (std::vector<std::string>{"a", "b"}));
  }
  struct Mine : CollectiveError {
    explicit Mine(const std::vector<std::string>& p) : CollectiveError(ExitCode::Io, p) {}
  };
  try {
    (void)agree_on_root(
        world, root, []() -> std::string { throw Mine({"bits flipped"}); },
        [](const CollectiveError& e) { throw Mine(e.problems()); });
    FAIL() << "expected the caller's CollectiveError subclass";
  } catch (const Mine& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_EQ(e.problems(), std::vector<std::string>{"bits flipped"});
  }
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());
}

// The device profiles travel with the deck: rank 0 reads them once (here profiles/device/ of the
// source tree) and every rank ends with its files, byte for byte.
TEST(DeviceProfiles, RankZerosFilesReachEveryRank) {
  const Comm world = Comm::world();
  Config cfg;
  deck::read_device_profiles(world, cfg);
  ASSERT_TRUE(cfg.device_profiles.read);
  std::string all;
  for (const auto& f : cfg.device_profiles.files) all += f.path + "|" + f.text + "|";
  std::string root = all;
  world.bcast_string(root, 0);
  EXPECT_EQ(all, root);
  EXPECT_FALSE(cfg.device_profiles.files.empty()) << "no profiles/device/*.profile found from the build tree";
}

// A failure on rank 0 that is not a config error (its working directory is gone, so the search
// cannot start) reaches every rank as the same error instead of leaving them in the broadcast.
TEST(DeviceProfiles, ARootFailureThatIsNotAConfigErrorReachesEveryRank) {
  const Comm world = Comm::world();
  const std::filesystem::path back = std::filesystem::current_path();
  std::string gone;
  if (world.rank() == 0) {
    char tmpl[] = "/tmp/atlas-cwd-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    gone = tmpl;
    ASSERT_EQ(::chdir(tmpl), 0);
    ASSERT_EQ(::rmdir(tmpl), 0);
  }
  Config cfg;
  try {
    deck::read_device_profiles(world, cfg);
    ADD_FAILURE() << "rank " << world.rank() << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), testing::HasSubstr("cannot read the working directory to search profiles/device/"));
    EXPECT_THAT(e.what(), testing::HasSubstr("plan.profiles"));
  }
  if (world.rank() == 0) {
    ASSERT_EQ(::chdir(back.c_str()), 0);
  }
  EXPECT_EQ(world.allreduce(1, MPI_SUM), world.size());  // still in step
}

}  // namespace
}  // namespace atlas::mpi
