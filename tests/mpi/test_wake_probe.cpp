// SPDX-License-Identifier: MIT
// The probes of the host a CPU job runs on (the simulator's machine model in atlas bench
// fidelity): runtime::probe_wake_delay (every rank of a node rings with the others and samples
// the time from a message's post to its waiting receiver's return), runtime::probe_net_cpu (CPU
// per byte sent between DCs) and the profiler's common clock on one machine; and the costed deck
// every rank builds its table from (rank 0's device and host, runtime::costed_run).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "atlas/mpi/comm.hpp"
#include "atlas/runtime/costing.hpp"
#include "atlas/runtime/net_cpu_probe.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/runtime/wake_probe.hpp"

namespace atlas::runtime {
namespace {

TEST(CostedRun, EveryRankCostsRankZerosDeviceAndHostCores) {
  // Ranks on hosts of other kinds and sizes (each rank gives its own device name and core count)
  // must cost one table: every rank gets rank 0's (cluster.cores_per_host = 0 used each rank's
  // own hardware threads, and tables differed across hosts of different sizes).
  const mpi::Comm world = mpi::Comm::world();
  Config cfg;
  cfg.device.backend = Backend::Cuda;
  cfg.plan.gpu = GpuKind::Host;
  cfg.cluster.cores_per_host = 0;
  const bool r0 = world.rank() == 0;
  const CostedRun c = costed_run(world, cfg, r0 ? "NVIDIA H200" : "NVIDIA A100-SXM4-80GB", r0 ? 4 : 64 + world.rank());
  EXPECT_EQ(c.cfg.plan.gpu, GpuKind::H200);
  EXPECT_EQ(c.cfg.cluster.cores_per_host, 4.0);
  EXPECT_NE(c.note.find("h200"), std::string::npos) << c.note;
  // A deck's own core count stays; without a local count, this machine's threads (one machine here).
  cfg.cluster.cores_per_host = 3;
  EXPECT_EQ(costed_run(world, cfg, "", r0 ? 4 : 64).cfg.cluster.cores_per_host, 3.0);
  cfg.cluster.cores_per_host = 0;
  EXPECT_EQ(costed_run(world, cfg, "").cfg.cluster.cores_per_host,
            static_cast<double>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(WakeProbe, SamplesOnlyWaitingReceiversOfOneNodeAndAgreesOnEveryRank) {
  const mpi::Comm world = mpi::Comm::world();
  const int rounds = 20;
  const WakeProbe p = probe_wake_delay(world, rounds, 0.5);
  const int node = world.split_shared().size();
  if (node < 2) {
    EXPECT_EQ(p.samples, 0);  // nobody to ring with: no sample, zeros
    EXPECT_EQ(p.median_ms, 0.0);
    return;
  }
  // At most one sample per rank and round (only rounds where the receiver already waited); with
  // pseudo-random work some rank waits in most rounds.
  EXPECT_GT(p.samples, 0);
  EXPECT_LE(p.samples, rounds * world.size());
  EXPECT_GE(p.median_ms, 0.0);
  EXPECT_GE(p.p90_ms, p.median_ms);
  EXPECT_LT(p.p90_ms, 60e3);  // a round that waited 60 s would have thrown
  // Every rank got the same figures (one gather).
  EXPECT_EQ(world.allreduce(p.samples, MPI_MAX), world.allreduce(p.samples, MPI_MIN));
  EXPECT_EQ(world.allreduce(p.median_ms, MPI_MAX), world.allreduce(p.median_ms, MPI_MIN));
}

TEST(NetCpuProbe, RankZeroSendsBurstsToAnotherDcAndEveryRankGetsTheMedianRound) {
  const mpi::Comm world = mpi::Comm::world();
  Config cfg;
  cfg.cluster.dcs = {"east", "west"};
  cfg.cluster.bind_hosts = {"127.0.0.1", "127.0.0.2"};
  cfg.cluster.latency_ms = {0, 0, 0, 0};
  cfg.cluster.bandwidth_gbps = {0, 0.8, 0.8, 0};  // 0.1 GB/s for 0.08 s: 8 MB, 7 whole 1 MiB messages
  cfg.wan.transport = WanTransport::Multirail;
  cfg.wan.rails = 2;
  cfg.wan.chunk_bytes = 64 * 1024;
  cfg.wan.max_frame_bytes = 64u << 20;
  cfg.wan.recv_timeout_s = 30;
  cfg.wan.connect_timeout_s = 10;
  const int my_dc = world.rank() % 2;
  const NetCpuProbe p = probe_net_cpu(world, cfg, my_dc, 3, 0.08);
  if (world.size() < 2) {
    // Every rank in one DC: nothing to send, nothing measured.
    EXPECT_EQ(p.rounds, 0);
    EXPECT_EQ(p.bytes, 0);
    EXPECT_EQ(p.ns_per_byte, 0.0);
    return;
  }
  EXPECT_EQ(p.bytes, std::int64_t{7} << 20);
  EXPECT_EQ(p.rounds, 3);
  EXPECT_GT(p.mbit_per_s, 0.0);  // loopback is not rate-limited: any positive rate
  EXPECT_GE(p.ns_per_byte, 0.0);
  EXPECT_LT(p.ns_per_byte, 1e4);  // 10 us a byte would be 100 kB/s of CPU: not a TCP stack
  EXPECT_GE(p.busy_cores, 0.0);
  EXPECT_GE(p.idle_cores, 0.0);
  // One broadcast: every rank has rank 0's figures.
  EXPECT_EQ(world.allreduce(p.ns_per_byte, MPI_MAX), world.allreduce(p.ns_per_byte, MPI_MIN));
  EXPECT_EQ(world.allreduce(p.mbit_per_s, MPI_MAX), world.allreduce(p.mbit_per_s, MPI_MIN));
}

TEST(MachineBusy, ReadsTheMachinesBusyCpuTimeWhichGrowsWithWork) {
  const double a = machine_busy_core_seconds();
  ASSERT_GE(a, 0.0) << "/proc/stat unreadable";
  volatile double x = 1.0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(60);
  while (std::chrono::steady_clock::now() < until) x = x * 1.0000001 + 1e-9;
  EXPECT_GT(machine_busy_core_seconds(), a);  // 60 ms of spinning: at least one 10 ms tick
}

TEST(ProfilerEpoch, RanksOnOneMachineShareOneClockExactly) {
  const mpi::Comm world = mpi::Comm::world();
  // Rank 0 arrives late, so the others wait in the barrier and leave it at slightly different
  // instants: taking each rank's own now() after it would differ by that skew.
  if (world.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  Profiler prof(true, world.rank(), 16);
  prof.sync_epoch(world);
  const auto t0 = static_cast<long long>(prof.epoch().time_since_epoch().count());
  // One kernel, one CLOCK_MONOTONIC: every rank counts from rank 0's instant, to the tick.
  EXPECT_EQ(world.allreduce(t0, MPI_MAX), world.allreduce(t0, MPI_MIN));
  // And it is an instant of this run: at most the 30 ms wait plus a barrier before now.
  EXPECT_GE(prof.now(), 0.0);
  EXPECT_LT(prof.now(), 10.0);
}

}  // namespace
}  // namespace atlas::runtime
