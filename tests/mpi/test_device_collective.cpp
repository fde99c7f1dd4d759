// SPDX-License-Identifier: MIT
// device::make_collective on the host backend (MPI directly on the buffers) and the staged
// collective (download, MPI_Allreduce, upload) that device backends fall back to, and the ring
// over point-to-point (DP across DCs): all sum
// rank-dependent values exactly over MPI_COMM_WORLD at any np, and refuse foreign buffers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::device {
namespace {

// Small integers: every partial sum is exact in fp32, so any reduction order gives the same bits.
std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 97) - 40);
  return v;
}

std::vector<float> expected_sum(int ranks, std::size_t n, std::size_t count) {
  std::vector<float> want = values(0, n);
  for (int r = 1; r < ranks; ++r) {
    const auto v = values(r, n);
    for (std::size_t i = 0; i < count; ++i) want[i] += v[i];
  }
  return want;
}

TEST(DeviceCollective, HostBackendGetsMpiDirectlyOnItsBuffers) {
  const mpi::Comm world = mpi::Comm::world();
  auto be = make_host_backend(1);
  auto group = make_collective(world, *be);
  ASSERT_NE(dynamic_cast<device::MpiCollective*>(group.get()), nullptr);
  EXPECT_EQ(group->size(), world.size());
  EXPECT_EQ(group->rank(), world.rank());
  const std::size_t n = 1000, count = 777;  // only the first `count` floats are summed
  Buffer buf = testutil::upload(*be, values(world.rank(), n));
  group->allreduce_sum(buf, count);
  std::vector<float> want = expected_sum(world.size(), n, count);
  for (std::size_t i = count; i < n; ++i) want[i] = values(world.rank(), n)[i];
  EXPECT_EQ(testutil::download(*be, buf), want);
}

TEST(DeviceCollective, StagedCollectiveSumsThroughHostMemory) {
  const mpi::Comm world = mpi::Comm::world();
  auto be = make_host_backend(1);
  auto group = make_staged_collective(world, *be);
  EXPECT_EQ(group->size(), world.size());
  const std::size_t n = 4097;
  Buffer buf = testutil::upload(*be, values(world.rank(), n));
  group->allreduce_sum(buf, n);
  EXPECT_EQ(testutil::download(*be, buf), expected_sum(world.size(), n, n));
  group->allreduce_sum(buf, 0);  // a no-op, also collectively
}

TEST(DeviceCollective, StagedCollectiveRefusesAnotherBackendsBuffer) {
  const mpi::Comm world = mpi::Comm::world();
  auto be = make_host_backend(1);
  auto other = make_host_backend(1);
  auto group = make_staged_collective(world, *be);
  Buffer foreign = other->alloc_floats(8);
  try {
    group->allreduce_sum(foreign, 8);  // local check, before any communication
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("not to this collective's backend"));
  }
}

// The overlapped DP buckets: several sums in flight, waited out of order, all exact; the
// default (synchronous) start of a collective without a non-blocking one gives the same sums.
TEST(DeviceCollective, StartedSumsInFlightTogetherAreExact) {
  const mpi::Comm world = mpi::Comm::world();
  auto be = make_host_backend(1);
  std::vector<std::unique_ptr<device::Collective>> groups;
  groups.push_back(make_collective(world, *be));
  groups.push_back(make_staged_collective(world, *be));
  groups.push_back(make_ring_collective(world));  // several in flight: each sum its own tag
  for (auto& group : groups) {
    const std::size_t sizes[] = {1, 1000, 100000};
    std::vector<Buffer> bufs;
    std::vector<std::unique_ptr<device::PendingSum>> sums;
    for (std::size_t n : sizes) {
      bufs.push_back(testutil::upload(*be, values(world.rank(), n)));
      sums.push_back(group->start_allreduce_sum(bufs.back(), n));
    }
    for (std::size_t k = sums.size(); k-- > 0;) sums[k]->wait();
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      EXPECT_TRUE(sums[k]->test());
      EXPECT_EQ(testutil::download(*be, bufs[k]), expected_sum(world.size(), sizes[k], sizes[k])) << sizes[k];
    }
  }
}

// The ring over point-to-point (DP across DCs): exact sums for counts below, at and above the
// member count, the remainder in the last member's piece, and only the first `count` floats.
TEST(DeviceCollective, RingCollectiveSumsExactly) {
  const mpi::Comm world = mpi::Comm::world();
  auto be = make_host_backend(1);
  auto ring = make_ring_collective(world);
  EXPECT_EQ(ring->size(), world.size());
  EXPECT_EQ(ring->rank(), world.rank());
  for (std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{777}, std::size_t{1000}}) {
    const std::size_t n = 1000;
    Buffer buf = testutil::upload(*be, values(world.rank(), n));
    ring->allreduce_sum(buf, count);
    std::vector<float> want = expected_sum(world.size(), n, count);
    for (std::size_t i = count; i < n; ++i) want[i] = values(world.rank(), n)[i];
    EXPECT_EQ(testutil::download(*be, buf), want) << count;
  }
}

// Unwinding after an error while a sum is in flight: when a peer never joins, settle() gives up
// after its time limit (false, logged) instead of hanging the error path.
TEST(DeviceCollective, SettleGivesUpOnASumAPeerNeverJoins) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs a peer";
  const mpi::Comm comm = world.dup();
  auto be = make_host_backend(1);
  device::MpiCollective group(comm);
  Buffer buf = testutil::upload(*be, values(world.rank(), 64));
  if (world.rank() == 1) {
    auto sum = group.start_allreduce_sum(buf, 64);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(sum->settle(0.3)) << "the other ranks have not joined";
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.3);
    EXPECT_LT(waited, 5.0);
    EXPECT_TRUE(sum->settle(0.0)) << "an abandoned sum is not waited on again";
  }
  world.barrier();
  // The others join late, so the abandoned sum on rank 1 completes inside MPI (it keeps `buf`).
  if (world.rank() != 1) {
    auto sum = group.start_allreduce_sum(buf, 64);
    sum->wait();
  }
  world.barrier();
}

TEST(DeviceCollective, HostKindCannotBeRegistered) {
  EXPECT_THROW(register_collective_factory(atlas::Backend::Host, nullptr), Error);
}

}  // namespace
}  // namespace atlas::device
