// SPDX-License-Identifier: MIT
// In-flight depth per stage (how many micro-batches' activations a stage holds at once): the
// compute order of a stage at a given depth, the classic schedules' depths (1F1B: pp - stage,
// GPipe: m), the cap the device's memory puts on it, and the depths the atlas search tries.
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

std::vector<int> classic_depth(ScheduleKind kind, int pp, int m) {
  std::vector<int> d(static_cast<std::size_t>(pp), m);
  if (kind != ScheduleKind::GPipe)
    for (int s = 0; s < pp; ++s) d[static_cast<std::size_t>(s)] = std::min(pp - s, m);
  return d;
}

std::vector<int> memory_depth_cap(const CostModel& c, int m) {
  std::vector<int> cap(static_cast<std::size_t>(c.pp), m);
  if (!(c.memory_limit_bytes > 0)) return cap;
  for (int s = 0; s < c.pp; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (i >= c.act_bytes_per_micro.size() || !(c.act_bytes_per_micro[i] > 0)) continue;
    const double room = c.memory_limit_bytes - stage_memory_bytes(c, s, 0);
    const double fit = std::floor(room / c.act_bytes_per_micro[i]);
    cap[i] = static_cast<int>(std::clamp(fit, 1.0, static_cast<double>(m)));
  }
  return cap;
}

std::vector<int> fit_depth(std::vector<int> want, const std::vector<int>& cap) {
  // A stage may not hold more than the stage before it: stage s's first backward waits for stage
  // s + 1's, which comes after stage s + 1's first depth forwards (a deeper next stage deadlocks).
  for (std::size_t s = 0; s < want.size(); ++s) {
    want[s] = std::max(1, std::min(want[s], cap[s]));
    if (s > 0) want[s] = std::min(want[s], want[s - 1]);
  }
  return want;
}

std::vector<std::vector<int>> depth_candidates(const CostModel& c, int m, bool full) {
  // 1F1B's depth plus e more micro-batches on every stage (capped at m): e = 1, 2, 4, ... and
  // m - 1 (GPipe's order): log2(m) candidates, each under the memory cap, deepest last.
  const std::vector<int> cap = memory_depth_cap(c, m);
  std::vector<int> extra;
  if (full)
    for (int e = 1; e < m - 1; e *= 2) extra.push_back(e);
  extra.push_back(std::max(m - 1, 0));
  std::vector<std::vector<int>> out;
  const std::vector<int> base = fit_depth(classic_depth(ScheduleKind::OneFOneB, c.pp, m), cap);
  for (int e : extra) {
    std::vector<int> d(static_cast<std::size_t>(c.pp));
    for (int s = 0; s < c.pp; ++s) d[static_cast<std::size_t>(s)] = std::min(c.pp - s + e, m);
    d = fit_depth(d, cap);
    if (d != base && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

}  // namespace atlas::sched::detail
