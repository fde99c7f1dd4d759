// SPDX-License-Identifier: MIT
// The simulator's cost model: per-block compute from a device profile (plus the TP all-reduces),
// boundary tensors, the intra-DC DP all-reduce from a bandwidth/latency ring model, WAN links with
// a per-TCP-flow cap of window / RTT times the flows of one transfer; and the per-GPU memory model
// the planner checks. It fills a sched::CostModel, so the schedule room times it. No I/O.
#pragma once

#include "atlas/deck/config.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sim/profile.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sim {

/// Time of one transformer block (one micro-batch, one rank of a TP group), and the LM head.
struct BlockCost {
  double fwd_ms = 0.0;       ///< compute + the forward TP all-reduces
  double bwd_ms = 0.0;       ///< compute (+ selective recompute) + the backward TP all-reduces
  double tp_comm_ms = 0.0;   ///< one TP all-reduce of the block's activations (inside fwd/bwd)
  double head_fwd_ms = 0.0;  ///< LM head + loss of one micro-batch (vocab-parallel over TP)
  double head_bwd_ms = 0.0;
  double flops_per_s = 0.0;  ///< achieved forward FLOP/s used
};

/// Per-block cost of the deck's model at `tp`. Precedence: schedule.fwd_ms_per_layer (measured,
/// backward = schedule.bwd_over_fwd times it), then schedule.device_tflops, then the profile.
BlockCost block_cost(const Config& cfg, int tp, const DeviceProfile& profile);

/// Parameters of pipeline stage `stage` of `pp` before the TP split (blocks, plus embeddings on
/// the first stage and the final norm and untied LM head copy on the last).
double stage_params(const ModelCfg& m, int stage, int pp);

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
/// GPipe keeps all m).
MemoryEstimate stage_memory(const ModelCfg& m, int stage, int pp, int tp, int micro_batch_size,
                            int micro_batches, ScheduleKind kind, const DeviceProfile& p);
/// The stage with the largest memory.
MemoryEstimate peak_memory(const ModelCfg& m, int pp, int tp, int micro_batch_size, int micro_batches,
                           ScheduleKind kind, const DeviceProfile& p);

/// Time of a ring all-reduce of `bytes` over `n` members: 2(n-1)/n * bytes / bandwidth plus
/// 2(n-1) latencies. 0 for n <= 1.
double ring_allreduce_ms(double bytes, int n, double bytes_per_ms, double latency_ms);

/// The rate of one WAN transfer on a link: min(capacity, flows * window / RTT).
double transfer_cap_bytes_per_ms(double capacity_bytes_per_ms, double one_way_latency_ms, int flows,
                                 double window_bytes);

/// TCP flows one transfer uses under the deck's wan.* keys (rails, or 1 for wan.transport = mpi).
int flows_per_transfer(const Config& cfg);
/// Per-flow window: wan.flow_window_bytes, or Linux's default tcp_rmem maximum.
double flow_window_bytes(const Config& cfg);

/// The simulator's cost model of the deck's job on `layout` under `profile`.
sched::CostModel cost_model(const Config& cfg, const topo::Layout& layout, const DeviceProfile& profile);

}  // namespace atlas::sim
