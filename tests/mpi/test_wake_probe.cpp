// SPDX-License-Identifier: MIT
// runtime::probe_wake_delay: every rank of a node rings with the others and samples the time
// from a message's post to its waiting receiver's return; the result is gathered on all ranks.
#include <gtest/gtest.h>

#include "atlas/mpi/comm.hpp"
#include "atlas/runtime/wake_probe.hpp"

namespace atlas::runtime {
namespace {

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

}  // namespace
}  // namespace atlas::runtime
