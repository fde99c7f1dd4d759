// SPDX-License-Identifier: MIT
// Internal to the WAN benchmarks (src/wan/bench*.cpp): the measured link (deck, which rank sends
// and which receives, the emulated latency and rate) and waits that do not spin a shared core.
// Not a public header.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::wan::bench {

/// The pair the benchmarks measure: rank 0 (sender) and the first rank of another DC (receiver).
struct Link {
  Config cfg;
  int my_dc = 0;
  int receiver = -1;        ///< world rank; -1 when every rank is in one DC
  int dc_s = 0, dc_r = 0;   ///< DC indices of the sender and the receiver
  bool emulated = false;    ///< inside scripts/wan's namespaces (or the deck says wan.emulate = netns)
  double link_bps = 0;      ///< deck rate sender -> receiver, bits/s
  double one_way_ms = 0;    ///< deck latency sender -> receiver
  double rtt_ms = 0;        ///< both directions
  std::string host_r;       ///< the receiver's listen address
};

/// Reads DECK on rank 0 (or a built-in 2-DC deck when empty), broadcasts and parses it with
/// `overrides` on every rank, and finds the pair. Collective over `world`.
Link setup_link(const mpi::Comm& world, const std::string& deck,
                const std::vector<std::string>& overrides);

/// Waits for a non-blocking MPI request, sleeping 1 ms between tests (no busy core).
void idle_wait(MPI_Request& req);
/// Barrier / broadcast of one double that sleep while waiting. Collective over `world`.
void idle_barrier(const mpi::Comm& world);
void idle_bcast(const mpi::Comm& world, double& value, int root);

/// The 1-minute load average ("?" when unknown).
std::string loadavg();
/// The TCP congestion control new sockets of this process's network namespace get.
std::string tcp_congestion_control();

}  // namespace atlas::wan::bench
