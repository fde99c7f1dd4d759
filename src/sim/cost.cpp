// SPDX-License-Identifier: MIT
// The per-GPU memory model (see cost.hpp).
#include "atlas/sim/cost.hpp"

#include <algorithm>
#include <cmath>

namespace atlas::sim {

double block_activation_bytes(const ModelCfg& m, int micro_batch_size, int tp, const DeviceProfile& p) {
  const double sbh = static_cast<double>(m.seq_len) * micro_batch_size * m.hidden;
  const double t = tp;
  // Full recomputation keeps only each block's input (split over TP with sequence parallelism).
  if (p.full_recompute) return sbh * p.activation_bytes / (p.sequence_parallel ? t : 1.0);
  // Scores, softmax, dropout mask: none stored with selective recomputation or a fused kernel.
  const bool no_scores = p.selective_recompute || p.fused_attention;
  const double attn = no_scores ? 0.0 : 5.0 * m.heads * static_cast<double>(m.seq_len) / (m.hidden * t);
  double per = 0.0;
  if (p.sequence_parallel) per = 34.0 / t + attn;
  else per = 10.0 + 24.0 / t + attn;
  return sbh * per * p.activation_bytes / 2.0;  // the paper's coefficients are for 16-bit values
}

MemoryEstimate stage_memory(const ModelCfg& m, int stage, int pp, int tp, int micro_batch_size,
                            int micro_batches, ScheduleKind kind, const DeviceProfile& p, int virtual_stages) {
  MemoryEstimate e;
  e.stage = stage;
  e.params = sched::stage_params(m, stage, pp) / tp;
  e.state_bytes = e.params * p.state_bytes_per_param;
  e.in_flight = kind == ScheduleKind::GPipe ? micro_batches : std::min(pp - stage, micro_batches);
  e.activation_bytes = e.in_flight * m.stage_layers(stage, pp) * block_activation_bytes(m, micro_batch_size, tp, p);
  if (virtual_stages > 1 && kind != ScheduleKind::GPipe) {
    const int v = virtual_stages;
    const int total = v * micro_batches;
    e.in_flight = micro_batches == pp ? total : std::min(total, 2 * (pp - stage - 1) + (v - 1) * pp + 1);
    e.activation_bytes = e.in_flight * (m.stage_layers(stage, pp) / static_cast<double>(v)) *
                         block_activation_bytes(m, micro_batch_size, tp, p);
  }
  if (stage == pp - 1)  // fp32 logits of one micro-batch for the loss (vocab-parallel)
    e.activation_bytes += 4.0 * m.seq_len * micro_batch_size * static_cast<double>(m.vocab) / tp;
  return e;
}

MemoryEstimate peak_memory(const ModelCfg& m, int pp, int tp, int micro_batch_size, int micro_batches,
                           ScheduleKind kind, const DeviceProfile& p, int virtual_stages) {
  MemoryEstimate best;
  for (int s = 0; s < pp; ++s) {
    const MemoryEstimate e = stage_memory(m, s, pp, tp, micro_batch_size, micro_batches, kind, p, virtual_stages);
    if (s == 0 || e.total() > best.total()) best = e;
  }
  return best;
}

}  // namespace atlas::sim
