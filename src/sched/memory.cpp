// SPDX-License-Identifier: MIT
// Memory per GPU of a schedule table (see memory.hpp): the stage's state plus the activations of
// its in-flight micro-batches, read off the table's rows.
#include "atlas/sched/memory.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/sched/schedule.hpp"

namespace atlas::sched {

double block_activation_bytes(const ModelCfg& m, int micro_batch_size, int tp, const DeviceProfile& p) {
  const double sbh = static_cast<double>(m.seq_len) * micro_batch_size * m.hidden;
  const double t = tp;
  // Full recomputation keeps only each block's input (split over TP with sequence parallelism).
  if (p.full_recompute) return sbh * p.activation_bytes / (p.sequence_parallel ? t : 1.0);
  // Scores, softmax, dropout mask: none stored with selective recomputation or a fused kernel.
  const bool no_scores = p.selective_recompute || p.fused_attention;
  // 5 a s / h: the scores and the softmax (2 bytes each), the dropout mask (1) and its output (2).
  const double score_bytes = m.dropout ? 5.0 : 2.0;
  const double attn = no_scores ? 0.0 : score_bytes * m.heads * static_cast<double>(m.seq_len) / (m.hidden * t);
  // Korthikanti et al.'s 34 s b h per block, term by term (16-bit values, 1-byte masks), for any
  // block: LayerNorm inputs 2 + 2, the QKV and MLP inputs 2 + 2, the dropout masks 1 + 1 (none
  // without dropout) replicate over TP without sequence parallelism; q 2, k and v 2 x 2 kv/heads,
  // the projection's input 2, the MLP's GELU and down-projection inputs 2 x 2 ffn/h (SwiGLU: gate,
  // up and their product, 3 x 2 ffn/h) split over TP. GPT's block: 10 + 24 = 34.
  const double h = m.hidden;
  const double kv = m.kv_share(tp);
  const double ffn = static_cast<double>(m.ffn()) / h;
  const double replicated = 8.0 + (m.dropout ? 2.0 : 0.0);
  const double split = 2.0 + 4.0 * kv + 2.0 + (m.mlp == MlpKind::SwiGlu ? 6.0 : 4.0) * ffn;
  double per = 0.0;
  if (p.sequence_parallel) per = (replicated + split) / t + attn;
  else per = replicated + split / t + attn;
  return sbh * per * p.activation_bytes / 2.0;  // the paper's coefficients are for 16-bit values
}

void apply_memory(CostModel& c, const Config& cfg, const DeviceProfile& p) {
  const ModelCfg& m = cfg.model;
  const int mbs = cfg.train.micro_batch_size;
  const double block = block_activation_bytes(m, mbs, c.tp, p);
  c.state_bytes.clear();
  c.act_bytes_per_micro.clear();
  c.fixed_act_bytes.clear();
  for (int s = 0; s < c.pp; ++s) {
    c.state_bytes.push_back(p.state_bytes(stage_params_per_gpu(m, s, c.pp, c.tp), c.dp));
    c.act_bytes_per_micro.push_back(m.stage_layers(s, c.pp) * block);
    // fp32 logits of one micro-batch for the loss (vocab-parallel) on the last stage, held by each
    // micro-batch in flight through the head (stage_memory_bytes).
    c.fixed_act_bytes.push_back(s == c.pp - 1 ? 4.0 * m.seq_len * mbs * static_cast<double>(m.vocab) / c.tp : 0.0);
  }
  c.memory_limit_bytes = memory_limit_bytes(cfg, p);
}

namespace {

/// The deck is costed with the host profile, whose memory is the machine's: plan.gpu = host,
/// except on a cuda deck (costed with a GPU profile, sched::device_profile).
bool host_memory(const Config& cfg) { return cfg.plan.gpu == GpuKind::Host && cfg.device.backend != Backend::Cuda; }

}  // namespace

double memory_limit_bytes(const Config& cfg, const DeviceProfile& p) {
  double limit = p.usable_bytes();
  // The host profile's memory is the machine's (MemTotal), which the ranks placed on it share
  // (cluster.ranks_per_host); a GPU's is its own, whatever the ranks per node.
  if (host_memory(cfg) && cfg.cluster.ranks_per_host > 1) limit /= cfg.cluster.ranks_per_host;
  // BubbleTea holds up to bubbletea.kv_cap_bytes on every rank (its weights, scratch and KV):
  // training has the rest. (At least a byte: a limit of 0 means "unknown, no limit".)
  if (cfg.bubbletea.enabled) limit = std::max(1.0, limit - static_cast<double>(cfg.bubbletea.kv_cap_bytes));
  return limit;
}

std::vector<int> in_flight_depth(const ScheduleTable& t) {
  std::vector<int> depth(static_cast<std::size_t>(t.pp), 0);
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      int held = 0;
      for (const Slot& sl : t.row(s, d)) {
        if (sl.kind == SlotKind::Forward) ++held;
        // A backward frees them; split, its W does (its B still needs the layers' inputs for W).
        else if (sl.kind == SlotKind::Backward || sl.kind == SlotKind::BackwardWeight) --held;
        depth[static_cast<std::size_t>(s)] = std::max(depth[static_cast<std::size_t>(s)], held);
      }
    }
  return depth;
}

int head_depth(const ScheduleTable& t) {
  int depth = 0;
  const int s = t.pp - 1;
  const int head_chunk = std::max(t.virtual_stages, 1) - 1;
  for (int d = 0; d < t.dp && s >= 0; ++d) {
    int held = 0;
    for (const Slot& sl : t.row(s, d)) {
      if (sl.chunk != head_chunk) continue;
      // Each micro-batch's arena holds its logits (their gradient after the forward's loss) until
      // its backward frees it; split, until its W (in_flight_depth's rule).
      if (sl.kind == SlotKind::Forward) ++held;
      else if (sl.kind == SlotKind::Backward || sl.kind == SlotKind::BackwardWeight) --held;
      depth = std::max(depth, held);
    }
  }
  return depth;
}

double stage_memory_bytes(const CostModel& c, int stage, int depth, int chunks, int head) {
  const auto s = static_cast<std::size_t>(stage);
  if (s >= c.state_bytes.size() || s >= c.act_bytes_per_micro.size()) return 0.0;
  const int v = std::max(chunks, 1);
  if (head < 0) head = (depth + v - 1) / v;
  // The logits of every micro-batch in flight through the LM head: the runtime keeps them in that
  // micro-batch's arena (StageModel::arena_floats) from its forward to its backward.
  const double fixed = s < c.fixed_act_bytes.size() ? c.fixed_act_bytes[s] : 0.0;
  return c.state_bytes[s] + depth * c.act_bytes_per_micro[s] / v + head * fixed;
}

ScheduleMemory memory_per_gpu(const CostModel& c, const ScheduleTable& table) {
  ScheduleMemory mem;
  mem.depth = in_flight_depth(table);
  mem.head_depth = head_depth(table);
  mem.limit_bytes = c.memory_limit_bytes;
  for (int s = 0; s < table.pp; ++s) {
    mem.bytes.push_back(stage_memory_bytes(c, s, mem.depth[static_cast<std::size_t>(s)], table.virtual_stages,
                                           s == table.pp - 1 ? mem.head_depth : 0));
    if (mem.bytes.back() > mem.peak_bytes) {
      mem.peak_bytes = mem.bytes.back();
      mem.peak_stage = s;
    }
  }
  mem.peak_state_bytes = static_cast<std::size_t>(mem.peak_stage) < c.state_bytes.size()
                             ? c.state_bytes[static_cast<std::size_t>(mem.peak_stage)]
                             : 0.0;
  return mem;
}

ScheduleMemory memory_per_gpu(const Config& cfg, const topo::Layout& layout, const ScheduleTable& table) {
  return memory_per_gpu(cost_model(cfg, layout), table);
}

std::string memory_misfit(const ScheduleMemory& mem, const ScheduleTable& table, const Config& cfg,
                          const std::string& device_name) {
  if (mem.fits()) return {};
  const auto gib = [](double b) { return b / static_cast<double>(units::kGiB); };
  const int depth = mem.depth[static_cast<std::size_t>(mem.peak_stage)];
  // Only fixes the deck has not taken already.
  std::vector<std::string> fixes;
  if (table.kind == ScheduleKind::GPipe)
    fixes.emplace_back("fewer micro-batches in flight (schedule.kind = 1f1b, or atlas, which searches its depth under "
                       "the limit)");
  if (cfg.train.micro_batch_size > 1) fixes.emplace_back("a smaller train.micro_batch_size");
  if (cfg.train.recompute != Recompute::Full)
    fixes.emplace_back("train.recompute = full (each block keeps only its input and runs its forward again)");
  if (cfg.train.zero_stage < 2 && table.dp > 1)
    fixes.push_back(fmt::format("train.zero_stage = {} (the optimizer state{} split over the stage's {} DP replicas)",
                                cfg.train.zero_stage + 1, cfg.train.zero_stage == 1 ? " and the gradients" : "",
                                table.dp));
  fixes.emplace_back("more pipeline stages (parallel.stages_per_dc)");
  if (cfg.parallel.tp_size < cfg.cluster.gpus_per_node) fixes.emplace_back("a larger parallel.tp_size");
  fixes.emplace_back("a device with more memory (plan.gpu, or memory_gib in its profile)");
  const std::string hint = either(fixes);
  return fmt::format(
      "the {} schedule needs {:.1f} GiB per GPU (stage {}: {:.1f} GiB of weights, gradients and optimizer state + "
      "{:.1f} GiB of activations for {} {}{} in flight), more than the {:.1f} GiB usable on {}\n  hint: {}",
      to_string(table.kind), gib(mem.peak_bytes), mem.peak_stage, gib(mem.peak_state_bytes),
      gib(mem.peak_bytes - mem.peak_state_bytes), depth, table.virtual_stages > 1 ? "chunk pass" : "micro-batch",
      depth == 1 ? "" : "es", gib(mem.limit_bytes), memory_owner(cfg, device_name), hint);
}

std::string memory_owner(const Config& cfg, const std::string& device_name) {
  return device_name + memory_sharing(cfg);
}

std::string memory_sharing(const Config& cfg) {
  std::string out;
  if (host_memory(cfg) && cfg.cluster.ranks_per_host > 1)
    out += fmt::format(", whose memory the cluster.ranks_per_host = {} ranks share", cfg.cluster.ranks_per_host);
  if (cfg.bubbletea.enabled)
    out += fmt::format(", less bubbletea.kv_cap_bytes = {} for BubbleTea",
                       units::format_bytes_human(static_cast<double>(cfg.bubbletea.kv_cap_bytes)));
  return out;
}

}  // namespace atlas::sched
