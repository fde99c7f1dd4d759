// SPDX-License-Identifier: MIT
// device::make_collective on the host backend (MPI directly on the buffers) and the staged
// collective (download, MPI_Allreduce, upload) that device backends fall back to: both sum
// rank-dependent values exactly over MPI_COMM_WORLD at any np, and refuse foreign buffers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  ASSERT_NE(dynamic_cast<model::MpiCollective*>(group.get()), nullptr);
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

TEST(DeviceCollective, HostKindCannotBeRegistered) {
  EXPECT_THROW(register_collective_factory(atlas::Backend::Host, nullptr), Error);
}

}  // namespace
}  // namespace atlas::device
