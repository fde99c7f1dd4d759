// SPDX-License-Identifier: MIT
// The wake-up delay of ranks that share an oversubscribed CPU host: how long after a message
// arrives its receiver, waiting in the runtime's polling receive, runs again while the other
// ranks compute. The simulator's cluster.host_wake_us; `atlas bench fidelity` measures it.
#pragma once

#include "atlas/mpi/comm.hpp"

namespace atlas::runtime {

struct WakeProbe {
  double median_ms = 0.0;  ///< over every rank's samples
  double p90_ms = 0.0;
  int samples = 0;         ///< rounds in which the receiver was already waiting
};

/// Collective over `world`; every rank runs at once, so the host carries the job's load. The ranks
/// of each node (MPI_COMM_TYPE_SHARED; in the WAN emulation a DC's namespace) form a ring, so no
/// sample crosses a network and the clocks compared are one host's. `rounds` rounds: every rank
/// computes a pseudo-random amount of work around `work_ms`, sends its send time to the next rank
/// and waits for the previous rank's message polling as the runtime does (10 us sleeps doubling
/// to 200 us). A sample is the time from the sender's post to the receiver's return, taken only
/// when the receiver was already waiting. Zeros when no node has two ranks. Throws Comm if a
/// round waits more than 60 s.
WakeProbe probe_wake_delay(const mpi::Comm& world, int rounds = 60, double work_ms = 2.0);

}  // namespace atlas::runtime
