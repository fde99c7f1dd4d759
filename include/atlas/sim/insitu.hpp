// SPDX-License-Identifier: MIT
// Compute costs measured in situ: the forward and backward slots of a real run (its profile),
// taken where they ran without processor sharing, as per-stage costs for the simulator. The
// device profile is a block timed alone on a quiet machine; inside a job the same block also
// pays for what runs beside it (the WAN's progress threads, MPI, the emulated WAN's packet path,
// timers) and runs the stage's whole slot (embedding, head and loss on the end stages).
// `atlas bench fidelity` measures them in a held-out warm-up run and predicts the timed run with
// them (SimOptions::stage_fwd_ms / stage_bwd_ms); the simulator's processor sharing then
// stretches them where ranks share cores, as it does the profile's.
#pragma once

#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/slot.hpp"
#include "atlas/sim/simulator.hpp"

namespace atlas::sim {

/// One executed slot of a rank (seconds on a clock common to the ranks of a host).
struct ComputeSpan {
  int rank = 0;   ///< world rank
  int stage = 0;
  int step = 0;   ///< BubbleTea's prefill rows have -1 (they nest in a slot of some step)
  sched::SlotKind kind = sched::SlotKind::Forward;
  double start_s = 0.0;
  double end_s = 0.0;
};

struct InSituCompute {
  std::vector<double> fwd_ms;    ///< per stage: median forward slot that ran unshared
  std::vector<double> bwd_ms;    ///< per stage: median backward slot that ran unshared
  std::vector<int> fwd_samples;  ///< unshared forward slots per stage (0: fwd_ms is the shortest slot)
  std::vector<int> bwd_samples;
  int slots = 0;                 ///< forward and backward slots looked at
};

/// The first step measured when the first `skip` recorded steps of `spans` are left out (their
/// warm-up): the smallest step recorded + skip, so a resumed run's profile (steps from its
/// checkpoint's on) skips its own first steps; `skip` when `spans` is empty.
[[nodiscard]] int first_step_after(const std::vector<ComputeSpan>& spans, int skip);

/// Per stage of `pp`, the forward and backward slots of `spans` from step `first_step` on during
/// which no more ranks of the slot's host computed (Forward, Backward or Prefill slots, of any
/// step) than it has cores: `rank_host[r]` = host of world rank r, empty = every rank on a device
/// of its own (every slot is unshared). A stage or kind without such a slot takes its shortest
/// slot. Throws atlas::Error (ExitCode::Config) when a stage has no forward or backward slot at all.
InSituCompute insitu_compute(const std::vector<ComputeSpan>& spans, int pp, const std::vector<int>& rank_host,
                             double cores_per_host, int first_step = 1);

/// In-situ costs carry the host CPU the run's WAN transfers took beside its slots (on a WAN-bound
/// deck most slots run while a transfer does), and the simulation's network term
/// (`cluster.host_net_ns_per_byte` of `machine`) takes that CPU from the slots again. Returns
/// `in_situ` with each stage's forward and backward cost divided by the stretch the network term
/// gives that stage's slots when the table is simulated with them (the median over the slots of
/// a slot's length with the term over its length without it, as the in-situ cost is the median
/// slot), so that the simulated slots carry it once. Unchanged where the term is 0, no host is
/// shared, or `in_situ` holds no per-stage costs.
SimOptions without_network_share(const Config& deck, const Config& machine, const SimOptions& in_situ);

}  // namespace atlas::sim
