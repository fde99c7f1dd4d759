// SPDX-License-Identifier: MIT
// The CUDA backend's intra-DC collective over MPI_COMM_WORLD: NCCL when every rank has its own
// GPU, MPI staged through host memory when ranks share one (a node with fewer GPUs than ranks).
// Both must sum exactly (small-integer data). Skips on every rank, with the reason, when some
// rank sees no CUDA device; the NCCL-only test skips when there are fewer GPUs than ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/mpi/comm.hpp"
#include "cuda_backend.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::device {
namespace {

std::string host_name() {
  char host[256] = {};
  return gethostname(host, sizeof host - 1) == 0 ? std::string(host) : std::string("?");
}

std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 101) - 50);
  return v;
}

class CudaCollective : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceProbe probe = cuda::probe_devices();
    const int mine = probe.error.empty() ? probe.count : 0;
    // Collective verdict: skip together, or an all-reduce below would wait for absent ranks.
    min_devices = world.allreduce(mine, MPI_MIN);
    if (min_devices == 0) {
      GTEST_SKIP() << "no CUDA device visible on some rank ("
                   << (probe.error.empty() ? std::to_string(probe.count) + " devices here"
                                           : "cudaGetDeviceCount returned " + probe.error)
                   << "): skipped";
    }
    DeviceCfg cfg;
    cfg.backend = atlas::Backend::Cuda;
    be = make_backend(cfg);
    const std::vector<std::string> where =
        world.allgather_strings(host_name() + " " + cuda::pci_bus_id_of(*be));
    distinct_gpus = std::set<std::string>(where.begin(), where.end()).size() == where.size();
  }

  void expect_sums(device::Collective& group) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
      Buffer buf = testutil::upload(*be, values(world.rank(), n));
      group.allreduce_sum(buf, n);
      std::vector<float> want = values(0, n);
      for (int r = 1; r < world.size(); ++r) {
        const auto v = values(r, n);
        for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
      }
      EXPECT_EQ(testutil::download(*be, buf), want) << "n = " << n;
    }
  }

  // Several sums in flight at once (start_allreduce_sum, as the trainer's overlapped DP buckets
  // use it), the buffers' owner computing meanwhile, waited for out of order.
  void expect_overlapped_sums(device::Collective& group) {
    const std::size_t sizes[] = {1, 1000, std::size_t{1} << 20};
    std::vector<Buffer> bufs;
    std::vector<std::unique_ptr<device::PendingSum>> sums;
    for (std::size_t n : sizes) {
      bufs.push_back(testutil::upload(*be, values(world.rank(), n)));
      sums.push_back(group.start_allreduce_sum(bufs.back(), n));
    }
    Buffer other = testutil::upload(*be, values(world.rank(), 4096));  // the backend's stream stays usable
    for (std::size_t k = sums.size(); k-- > 0;) sums[k]->wait();
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      const std::size_t n = sizes[k];
      std::vector<float> want = values(0, n);
      for (int r = 1; r < world.size(); ++r) {
        const auto v = values(r, n);
        for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
      }
      EXPECT_TRUE(sums[k]->test());
      EXPECT_EQ(testutil::download(*be, bufs[k]), want) << "overlapped, n = " << n;
    }
    EXPECT_EQ(testutil::download(*be, other), values(world.rank(), 4096));
  }

  mpi::Comm world = mpi::Comm::world();
  int min_devices = 0;
  bool distinct_gpus = false;
  std::unique_ptr<Backend> be;
};

// device.nccl_timeout_s (formerly ATLAS_NCCL_TIMEOUT_S) reaches the backend whose NCCL
// collectives it limits (make_cuda_collective passes it to nccl::Comm).
TEST_F(CudaCollective, DeckNcclTimeoutReachesTheBackend) {
  EXPECT_DOUBLE_EQ(cuda::nccl_timeout_s_of(*be), 300.0);
  DeviceCfg cfg;
  cfg.backend = atlas::Backend::Cuda;
  cfg.nccl_timeout_s = 42.5;
  const std::unique_ptr<Backend> other = make_backend(cfg);
  EXPECT_DOUBLE_EQ(cuda::nccl_timeout_s_of(*other), 42.5);
}

TEST_F(CudaCollective, MakeCollectivePicksNcclOnlyWithOneGpuPerRankAndSumsExactly) {
  auto group = make_collective(world, *be);
  EXPECT_EQ(cuda::uses_nccl(*group), distinct_gpus);
  EXPECT_EQ(group->size(), world.size());
  EXPECT_EQ(group->rank(), world.rank());
  expect_sums(*group);
}

TEST_F(CudaCollective, NcclAllReduceAtEveryRankOnItsOwnGpu) {
  if (!distinct_gpus) {
    GTEST_SKIP() << world.size() << " ranks but only " << min_devices
                 << " GPU(s) per node: NCCL needs one GPU per rank";
  }
  auto group = make_collective(world, *be);
  ASSERT_TRUE(cuda::uses_nccl(*group));
  expect_sums(*group);
  expect_overlapped_sums(*group);
  // A partial count leaves the tail alone.
  const std::size_t n = 4096, count = 1000;
  Buffer buf = testutil::upload(*be, values(world.rank(), n));
  group->allreduce_sum(buf, count);
  const auto got = testutil::download(*be, buf);
  const auto mine = values(world.rank(), n);
  for (std::size_t i = count; i < n; ++i) ASSERT_EQ(got[i], mine[i]) << i;
}

TEST_F(CudaCollective, StagedFallbackSumsExactly) {
  auto group = make_staged_collective(world, *be);
  expect_sums(*group);
  expect_overlapped_sums(*group);
}

}  // namespace
}  // namespace atlas::device
