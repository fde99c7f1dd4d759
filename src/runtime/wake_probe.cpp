// SPDX-License-Identifier: MIT
// Wake-up delay probe (see the header).
#include "atlas/runtime/wake_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::runtime {

namespace {

double now_ms() {
  // CLOCK_MONOTONIC: one clock for every process of a host.
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Fixed arithmetic work (not a wall-clock spin: on a shared core it takes longer, as a block does).
double spin(std::int64_t iters) {
  double x = 1.0;
  for (std::int64_t i = 0; i < iters; ++i) x = x * 1.0000001 + 1e-9;
  return x;
}

/// `rounds` rounds of the ring over `comm` (see probe_wake_delay); appends this rank's samples.
void ring(const mpi::Comm& comm, int rounds, double work_ms, std::int64_t per_ms, std::vector<double>& samples) {
  const int n = comm.size();
  volatile double sink = 0.0;
  const int next = (comm.rank() + 1) % n;
  const int prev = (comm.rank() + n - 1) % n;
  std::uint64_t lcg = 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(comm.rank() + 1);
  for (int r = 0; r < rounds; ++r) {
    double theirs = 0.0;
    mpi::Request in = comm.irecv(std::span<double>(&theirs, 1), prev, mpi::tags::kWakeProbe);
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    const double scale = 0.25 + 1.5 * static_cast<double>(lcg >> 11) / static_cast<double>(1ULL << 53);
    sink = sink + spin(static_cast<std::int64_t>(scale * work_ms * static_cast<double>(per_ms)));
    const double mine = now_ms();
    mpi::Request sent = comm.isend(std::span<const double>(&mine, 1), next, mpi::tags::kWakeProbe);
    const double wait_start = now_ms();
    if (!in.wait_polling_for(60.0, 200))
      ATLAS_THROW(Comm, "wake probe: no message from rank " << prev << " in 60 s");
    const double done = now_ms();
    if (theirs >= wait_start) samples.push_back(done - theirs);
    if (!sent.wait_polling_for(60.0, 200))
      ATLAS_THROW(Comm, "wake probe: the message to rank " << next << " was not taken in 60 s");
  }
}

}  // namespace

WakeProbe probe_wake_delay(const mpi::Comm& world, int rounds, double work_ms) {
  WakeProbe out;
  // The ring stays on a node (MPI's shared-memory ranks; in the WAN emulation a DC's namespace):
  // a message between nodes would add its network's latency. Every rank of `world` runs at once.
  const mpi::Comm comm = world.split_shared();
  const int n = comm.size();
  // Iterations per ms of work: every rank times the loop at once; the fastest rate is the least
  // disturbed by the others (the work only needs to be about work_ms).
  volatile double sink = 0.0;
  world.barrier();
  const std::int64_t calib = 200000;
  const double c0 = now_ms();
  sink = sink + spin(calib);
  const double rate = static_cast<double>(calib) / std::max(now_ms() - c0, 1e-3);
  const auto per_ms = static_cast<std::int64_t>(world.allreduce(rate, MPI_MAX));
  std::vector<double> samples;
  if (n >= 2) ring(comm, rounds, work_ms, per_ms, samples);
  // Every rank's samples (at most `rounds` each, padded with -1).
  std::vector<double> mine(static_cast<std::size_t>(rounds), -1.0);
  std::copy(samples.begin(), samples.end(), mine.begin());
  std::vector<double> all(mine.size() * static_cast<std::size_t>(world.size()));
  ATLAS_MPI_CHECK(MPI_Allgather(mine.data(), rounds, MPI_DOUBLE, all.data(), rounds, MPI_DOUBLE, world.get()));
  std::vector<double> s;
  for (double v : all)
    if (v >= 0.0) s.push_back(v);
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  out.samples = static_cast<int>(s.size());
  out.median_ms = s[s.size() / 2];
  out.p90_ms = s[std::min(s.size() - 1, static_cast<std::size_t>(std::floor(0.9 * static_cast<double>(s.size()))))];
  return out;
}

}  // namespace atlas::runtime
