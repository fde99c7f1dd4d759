// SPDX-License-Identifier: MIT
// The host CPU a byte sent between DCs costs: TCP on both ends and, inside the emulated WAN, the
// kernel's packet path through the namespaces' links and queues. On a CPU host that runs every
// rank this is taken from the ranks' compute; the simulator's cluster.host_net_ns_per_byte.
// `atlas bench fidelity` measures it inside the emulation.
#pragma once

#include <cstdint>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::runtime {

struct NetCpuProbe {
  double ns_per_byte = 0.0;      ///< median over the rounds; 0 when nothing was measured
  double busy_cores = 0.0;       ///< cores busy during the transfers (median round)
  double idle_cores = 0.0;       ///< cores busy while nothing was sent (same round)
  std::int64_t bytes = 0;        ///< sent per round
  double mbit_per_s = 0.0;       ///< rate reached (median round)
  int rounds = 0;
};

/// Collective over `world`. World rank 0 sends `cfg.wan`'s transport a burst to the first rank of
/// another DC (`my_dc` per rank; nothing is measured when every rank is in one DC) while the
/// others wait asleep. The machine's busy CPU time (/proc/stat: user, nice, system, irq, softirq;
/// not steal) is read around the burst and around an equal pause with nothing sent; the
/// difference over the bytes is one round. Bursts are sized for about `seconds` at the deck's
/// link rate (1-96 MiB: /proc/stat counts 10 ms ticks, so a round should last most of a second).
/// Meaningful when every rank runs on this one machine (the emulation). Throws Comm if a burst
/// does not complete within wan.recv_timeout_s.
NetCpuProbe probe_net_cpu(const mpi::Comm& world, const Config& cfg, int my_dc, int rounds = 3,
                          double seconds = 0.8);

/// The machine's busy CPU time so far, in core-seconds (/proc/stat's first line); -1 if unreadable.
double machine_busy_core_seconds();

}  // namespace atlas::runtime
