// SPDX-License-Identifier: MIT
// The per-GPU memory model the planner checks (parameters, optimizer state, activations of the
// in-flight micro-batches). The time costs are sched's cost model (sched/cost_model.hpp). No I/O.
#pragma once

#include "atlas/deck/config.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::sim {

using sched::DeviceProfile;

/// Bytes one rank of a TP group stores per block per in-flight micro-batch, with sequence
/// parallelism and selective recomputation (Korthikanti et al. 2022: 34 s b h / t, 16-bit).
double block_activation_bytes(const ModelCfg& m, int micro_batch_size, int tp, const DeviceProfile& p);

struct MemoryEstimate {
  int stage = 0;
  double params = 0.0;            ///< parameters one GPU holds
  double state_bytes = 0.0;       ///< weights + grads + optimizer state
  double activation_bytes = 0.0;  ///< stored activations of the in-flight micro-batches (+ logits)
  int in_flight = 0;              ///< micro-batches whose activations are held at once
  [[nodiscard]] double total() const { return state_bytes + activation_bytes; }
};

/// Memory of one GPU of `stage` (1F1B/atlas keep min(pp - stage, m) micro-batches in flight,
/// GPipe keeps all m). With `virtual_stages` v > 1 (interleaved 1F1B) the stage holds up to
/// min(v m, 2 (pp - stage - 1) + (v - 1) pp + 1) chunk passes (its warm-up forwards and one more,
/// all v m when m == pp), each of stage_layers / v blocks; in_flight counts those chunk passes.
/// `dp`: the stage's DP replicas, over which p.zero_stage splits the optimizer state
/// (DeviceProfile::state_bytes; 1 = no split).
MemoryEstimate stage_memory(const ModelCfg& m, int stage, int pp, int tp, int micro_batch_size,
                            int micro_batches, ScheduleKind kind, const DeviceProfile& p, int virtual_stages = 1,
                            int dp = 1);
/// The stage with the largest memory.
MemoryEstimate peak_memory(const ModelCfg& m, int pp, int tp, int micro_batch_size, int micro_batches,
                           ScheduleKind kind, const DeviceProfile& p, int virtual_stages = 1, int dp = 1);

}  // namespace atlas::sim
