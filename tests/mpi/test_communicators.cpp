// SPDX-License-Identifier: MIT
// Communicators at np 1, 2, 4, 8: every communicator's members match Layout, and a sum over each
// proves the members talk to each other.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <vector>
#include <span>

#include "atlas/core/error.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/topo/communicators.hpp"

namespace atlas::topo {
namespace {

/// Layouts that fit `np` ranks, uneven DCs included.
std::vector<Layout> layouts_for(int np) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= np; tp *= 2)
    for (int dp = 1; dp * tp <= np; dp *= 2) {
      if (np % (dp * tp) != 0) continue;
      const int pp = np / (dp * tp);
      out.emplace_back(std::vector<int>{pp}, dp, tp);
      if (pp >= 2) out.emplace_back(std::vector<int>{pp - 1, 1}, dp, tp);
      if (pp >= 3) out.emplace_back(std::vector<int>{1, 0, pp - 1}, dp, tp);
    }
  return out;
}

void expect_matches(const mpi::Comm& comm, const Layout& l, Group g, int world_rank) {
  const auto members = l.members(g, l.coord(world_rank));
  ASSERT_EQ(comm.size(), static_cast<int>(members.size()));
  const auto gathered = comm.allgather(world_rank);
  EXPECT_EQ(gathered, members);
  EXPECT_EQ(members[static_cast<std::size_t>(comm.rank())], world_rank);
  int sum = world_rank;
  sum = comm.allreduce(sum, MPI_SUM);
  int expect = 0;
  for (int m : members) expect += m;
  EXPECT_EQ(sum, expect);
}

TEST(Communicators, MembersMatchLayoutForEveryShape) {
  const mpi::Comm world = mpi::Comm::world();
  for (const auto& l : layouts_for(world.size())) {
    const Communicators c = Communicators::create(world, l);
    const int me = c.world.rank();
    expect_matches(c.tp, l, Group::Tensor, me);
    expect_matches(c.dp, l, Group::Data, me);
    expect_matches(c.pp, l, Group::Pipeline, me);
    expect_matches(c.dc, l, Group::Dc, me);
    const std::string map = rank_map(c.world, l, {"east", "west", "south"});
    EXPECT_NE(map.find("# rank map: " + std::to_string(l.world_size()) + " ranks"), std::string::npos);
  }
}

// Request::wait_polling_for: false while the peer has not sent (after about the timeout), true
// once it has; the request stays usable in between.
TEST(Communicators, BoundedWaitTimesOutThenCompletes) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs a peer";
  constexpr int kTag = 4242;
  if (world.rank() == 0) {
    double v = 0.0;
    mpi::Request r = world.irecv(std::span<double>(&v, 1), 1, kTag);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(r.wait_polling_for(0.2));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.2);
    EXPECT_LT(waited, 5.0);
    EXPECT_TRUE(r.pending());
    world.barrier();  // now rank 1 sends
    EXPECT_TRUE(r.wait_polling_for(30.0));
    EXPECT_FALSE(r.pending());
    EXPECT_EQ(v, 2.5);
  } else {
    world.barrier();
    if (world.rank() == 1) {
      const double v = 2.5;
      world.send(std::span<const double>(&v, 1), 0, kTag);
    }
  }
}

// A receive dropped while an error unwinds is cancelled before its buffer (here a stack slot) is
// gone: a message sent afterwards goes to the next receive, not into the dead frame. With the
// request freed (MPI_Request_free), the stale receive took it and the next one never completed.
TEST(Communicators, ReceiveDroppedWhileUnwindingIsCancelledNotLeftToWriteItsBuffer) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs a peer";
  constexpr int kTag = 4243;
  if (world.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      double stale = 0.0;
      mpi::Request r = world.irecv(std::span<double>(&stale, 1), 1, kTag);
      if (!r.wait_polling_for(0.05)) throw std::runtime_error("timed out");
      FAIL() << "received before the peer sent";
    } catch (const std::runtime_error&) {
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              0.05 + mpi::Request::kSettleMs / 1000.0 + 2.0);
    world.barrier();  // now rank 1 sends
    double v = 0.0;
    mpi::Request next = world.irecv(std::span<double>(&v, 1), 1, kTag);
    EXPECT_TRUE(next.wait_polling_for(30.0)) << "the message went to the dropped receive";
    EXPECT_EQ(v, 7.5);
  } else {
    world.barrier();
    if (world.rank() == 1) {
      const double v = 7.5;
      world.send(std::span<const double>(&v, 1), 0, kTag);
    }
  }
}

// A send nobody receives, dropped while unwinding, costs a bounded moment, not a hang.
TEST(Communicators, SendDroppedWhileUnwindingIsBounded) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs a peer";
  constexpr int kTag = 4244;
  if (world.rank() == 1) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::vector<double> big(1 << 20, 1.0);  // past the eager limit: waits for a receive
      mpi::Request r = world.isend(std::span<const double>(big), 0, kTag);
      if (!r.wait_polling_for(0.05)) throw std::runtime_error("timed out");
    } catch (const std::runtime_error&) {
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              0.05 + mpi::Request::kSettleMs / 1000.0 + 2.0);
  }
  world.barrier();
}

// Strings whose total passes an MPI count (a BubbleTea report of a million requests from every
// rank of a pipeline) are one clear error on every rank; the int sum of the lengths wrapped.
// About 2.2 GB in all, whatever the rank count.
TEST(Comm, AllgatherStringsPastAnMpiCountIsOneErrorOnEveryRank) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string mine(static_cast<std::size_t>(INT32_MAX) / static_cast<std::size_t>(world.size()) + 1, 'x');
  try {
    (void)world.allgather_strings(mine);
    FAIL() << "gathered more than 2^31 - 1 bytes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Comm);
    EXPECT_NE(std::string(e.what()).find("more than one MPI message holds (2^31 - 1 bytes)"), std::string::npos)
        << e.what();
  }
  // And the collective still works after it (every rank threw at the same point).
  const auto back = world.allgather_strings(std::to_string(world.rank()));
  ASSERT_EQ(back.size(), static_cast<std::size_t>(world.size()));
  EXPECT_EQ(back.back(), std::to_string(world.size() - 1));
}

}  // namespace
}  // namespace atlas::topo
