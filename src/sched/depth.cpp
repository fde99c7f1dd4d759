// SPDX-License-Identifier: MIT
// In-flight depth per stage (how many micro-batches' activations a stage holds at once): the
// compute order of a stage at a given depth, the classic schedules' depths (1F1B: pp - stage,
// GPipe: m), the cap the device's memory puts on it, and the depths the atlas search tries.
// With model chunks (interleaved 1F1B, v = CostModel::virtual_stages > 1) a depth counts chunk
// passes (one micro-batch through one chunk: layers / v blocks), from interleaved 1F1B's up to
// all v m (every forward first); the order at a depth is interleaved.cpp's.
#include <algorithm>
#include <cmath>

#include "atlas/sched/memory.hpp"
#include "program.hpp"

namespace atlas::sched::detail {

std::vector<std::pair<SlotKind, int>> depth_order(int depth, int m) {
  // Warm-up forwards up to the depth, steady one-forward-one-backward, cool-down backwards: the
  // 1F1B pattern with `depth` in place of pp - stage (depth m is GPipe's order). Backwards run in
  // micro-batch order, so gradients accumulate in the same order whatever the depth.
  std::vector<std::pair<SlotKind, int>> out;
  out.reserve(static_cast<std::size_t>(2 * m));
  const int warmup = std::clamp(depth - 1, 0, m);
  for (int i = 0; i < warmup; ++i) out.emplace_back(SlotKind::Forward, i);
  for (int i = 0; i < m - warmup; ++i) {
    out.emplace_back(SlotKind::Forward, warmup + i);
    out.emplace_back(SlotKind::Backward, i);
  }
  for (int i = std::max(m - warmup, 0); i < m; ++i) out.emplace_back(SlotKind::Backward, i);
  return out;
}

std::vector<int> classic_depth(ScheduleKind kind, int pp, int m, int v) {
  std::vector<int> d(static_cast<std::size_t>(pp), m);
  if (kind == ScheduleKind::GPipe) return d;
  if (v <= 1) {
    for (int s = 0; s < pp; ++s) d[static_cast<std::size_t>(s)] = std::min(pp - s, m);
    return d;
  }
  // Interleaved 1F1B: Megatron-LM's 2 (pp - s - 1) + (v - 1) pp warm-up chunk forwards and the
  // first steady one; every chunk pass when m == pp (compute_order in interleaved.cpp).
  const int total = v * m;
  for (int s = 0; s < pp; ++s)
    d[static_cast<std::size_t>(s)] = m == pp ? total : std::min(total, 2 * (pp - s - 1) + (v - 1) * pp + 1);
  return d;
}

std::vector<int> memory_depth_cap(const CostModel& c, int m) {
  // In chunk passes (v > 1): each holds 1/v of the stage's activations per micro-batch.
  const int v = std::max(c.virtual_stages, 1);
  std::vector<int> cap(static_cast<std::size_t>(c.pp), v * m);
  if (!(c.memory_limit_bytes > 0)) return cap;
  for (int s = 0; s < c.pp; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (i >= c.act_bytes_per_micro.size() || !(c.act_bytes_per_micro[i] > 0)) continue;
    // Each micro-batch through the stage also holds the last stage's logits (fixed_act_bytes: 0
    // elsewhere); with chunks, about one chunk pass in v runs the head.
    const double fixed = i < c.fixed_act_bytes.size() ? c.fixed_act_bytes[i] : 0.0;
    const double room = c.memory_limit_bytes - stage_memory_bytes(c, s, 0);
    const double fit = std::floor(room / ((c.act_bytes_per_micro[i] + fixed) / v));
    cap[i] = static_cast<int>(std::clamp(fit, 1.0, static_cast<double>(v * m)));
  }
  return cap;
}

std::vector<int> fit_depth(std::vector<int> want, const std::vector<int>& cap, int v, int m) {
  // A stage may not hold more than the stage before it: stage s's first backward waits for stage
  // s + 1's, which comes after stage s + 1's first depth forwards (a deeper next stage deadlocks).
  if (v <= 1) {
    for (std::size_t s = 0; s < want.size(); ++s) {
      want[s] = std::max(1, std::min(want[s], cap[s]));
      if (s > 0) want[s] = std::min(want[s], want[s - 1]);
    }
    return want;
  }
  // Model chunks (docs/schedules.md, "deadlock-freedom"): never below interleaved 1F1B's depth (a
  // shallower stage can reach the backward of a chunk pass before its own forward), at most v m,
  // non-increasing along the pipeline as above, and stage 0 at most 2 pp deeper than the last
  // stage, whose hand-back feeds stage 0's next chunk (a deeper first stage waits, past its
  // warm-up, for a forward the last stage runs only after a backward that waits for stage 0).
  const int pp = static_cast<int>(want.size());
  const int total = v * m;
  const std::vector<int> least = classic_depth(ScheduleKind::OneFOneB, pp, m, v);
  for (std::size_t s = 0; s < want.size(); ++s) {
    want[s] = std::max(least[s], std::min({want[s], cap[s], total}));
    if (s > 0) want[s] = std::min(want[s], want[s - 1]);
  }
  const int most = want.back() + 2 * pp;
  for (int& d : want) d = std::min(d, most);
  return want;
}

std::vector<int> atlas_base_depth(const CostModel& c, int m) {
  const int v = std::max(c.virtual_stages, 1);
  return fit_depth(classic_depth(ScheduleKind::OneFOneB, c.pp, m, v), memory_depth_cap(c, m), v, m);
}

bool is_gpipe_depth(const CostModel& c, int m, const std::vector<int>& depth) {
  // GPipe does not interleave: with chunks no depth is GPipe's own program.
  return c.virtual_stages <= 1 && depth == classic_depth(ScheduleKind::GPipe, c.pp, m);
}

std::vector<std::vector<int>> depth_candidates(const CostModel& c, int m, bool full) {
  // 1F1B's depth plus e more micro-batches (chunk passes with v > 1) on every stage, capped at
  // v m: e = 1, 2, 4, ... and v m - 1 (every forward first: GPipe's order when v = 1): log2(v m)
  // candidates, each under the memory cap, deepest last.
  const int v = std::max(c.virtual_stages, 1);
  const int total = v * m;
  const std::vector<int> cap = memory_depth_cap(c, m);
  std::vector<int> extra;
  if (full)
    for (int e = 1; e < total - 1; e *= 2) extra.push_back(e);
  extra.push_back(std::max(total - 1, 0));
  std::vector<std::vector<int>> out;
  const std::vector<int> classic = classic_depth(ScheduleKind::OneFOneB, c.pp, m, v);
  const std::vector<int> base = fit_depth(classic, cap, v, m);
  for (int e : extra) {
    std::vector<int> d(static_cast<std::size_t>(c.pp));
    for (std::size_t s = 0; s < d.size(); ++s) d[s] = std::min(classic[s] + e, total);
    d = fit_depth(d, cap, v, m);
    if (d != base && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

}  // namespace atlas::sched::detail
