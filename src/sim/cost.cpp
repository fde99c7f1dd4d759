// SPDX-License-Identifier: MIT
// The per-GPU memory model (see cost.hpp).
#include "atlas/sim/cost.hpp"

#include <algorithm>
#include <cmath>

#include "atlas/sched/memory.hpp"

namespace atlas::sim {

double block_activation_bytes(const ModelCfg& m, int micro_batch_size, int tp, const DeviceProfile& p) {
  return sched::block_activation_bytes(m, micro_batch_size, tp, p);  // the one formula (sched/memory.hpp)
}

MemoryEstimate stage_memory(const ModelCfg& m, int stage, int pp, int tp, int micro_batch_size,
                            int micro_batches, ScheduleKind kind, const DeviceProfile& p, int virtual_stages,
                            int dp) {
  MemoryEstimate e;
  e.stage = stage;
  e.params = sched::stage_params_per_gpu(m, stage, pp, tp);
  e.state_bytes = p.state_bytes(e.params, dp);
  e.in_flight = kind == ScheduleKind::GPipe ? micro_batches : std::min(pp - stage, micro_batches);
  e.activation_bytes = e.in_flight * m.stage_layers(stage, pp) * sched::block_activation_bytes(m, micro_batch_size, tp, p);
  if (virtual_stages > 1 && kind != ScheduleKind::GPipe) {
    const int v = virtual_stages;
    const int total = v * micro_batches;
    e.in_flight = micro_batches == pp ? total : std::min(total, 2 * (pp - stage - 1) + (v - 1) * pp + 1);
    e.activation_bytes = e.in_flight * (m.stage_layers(stage, pp) / static_cast<double>(v)) *
                         sched::block_activation_bytes(m, micro_batch_size, tp, p);
  }
  if (stage == pp - 1) {
    // fp32 logits of a micro-batch for the loss (vocab-parallel), held by each micro-batch in
    // flight through the LM head (sched::head_depth): all m under GPipe and under interleaved 1F1B
    // with m == pp (every forward first), one under 1F1B.
    const bool all = kind == ScheduleKind::GPipe || (virtual_stages > 1 && micro_batches == pp);
    const double logits = 4.0 * m.seq_len * micro_batch_size * static_cast<double>(m.vocab) / tp;
    e.activation_bytes += (all ? micro_batches : 1) * logits;
  }
  return e;
}

MemoryEstimate peak_memory(const ModelCfg& m, int pp, int tp, int micro_batch_size, int micro_batches,
                           ScheduleKind kind, const DeviceProfile& p, int virtual_stages, int dp) {
  MemoryEstimate best;
  for (int s = 0; s < pp; ++s) {
    const MemoryEstimate e = stage_memory(m, s, pp, tp, micro_batch_size, micro_batches, kind, p, virtual_stages, dp);
    if (s == 0 || e.total() > best.total()) best = e;
  }
  return best;
}

}  // namespace atlas::sim
