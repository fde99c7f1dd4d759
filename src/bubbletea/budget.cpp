// SPDX-License-Identifier: MIT
// BubbleTea's budget rules (see budget.hpp): the one place a fill's budget is computed or learned.
#include "atlas/bubbletea/budget.hpp"

#include <algorithm>

namespace atlas::bubbletea {

const RecentWaits* BudgetLearner::waits(int index) const {
  auto it = m_waits.find(index);
  return it == m_waits.end() ? nullptr : &it->second;
}

double BudgetLearner::receive_budget(int index) const {
  // Training first by default (quantile 0): the shortest wait of the last steps, so a chunk that
  // fits it ends before the data comes unless this wait is the shortest yet. The wait is watched
  // (the data stops a chunk between its blocks), so a higher quantile costs at most a block.
  const RecentWaits* w = waits(index);
  return w != nullptr && w->full() ? w->quantile(m_recv_wait_quantile) : 0.0;
}

double BudgetLearner::wan_wait_budget(int index, double predicted_s) const {
  // The wait the deck's WAN predicts (x max_stretch), not the slot, so on a LAN-like "WAN" no
  // chunk fits and the sum is not delayed by one; or, when longer, what this slot's real waits
  // say (a host slower than the deck, an emulated WAN). The wait is watched (tested before every
  // chunk and between its blocks), so a budget past the real wait costs at most a block; but both
  // partners of the sum wait on it, so the default quantile is the median, not the longest.
  const RecentWaits* w = waits(index);
  const double learned = w != nullptr ? w->quantile(m_wan_wait_quantile) : 0.0;  // 0: none yet
  return std::max(predicted_s * m_max_stretch, learned);
}

double BudgetLearner::watched_bubble_budget(int index, double table_s) const {
  // From the first real length on (a job's first steps are a bench run's large share).
  const RecentWaits* w = waits(index);
  if (w == nullptr || w->empty()) return table_s;
  return std::clamp(w->quantile(m_stretch_quantile), table_s, table_s * m_max_stretch);
}

double BudgetLearner::bubble_allowance(int index, double table_s) const {
  auto it = m_allowance.find(index);
  return it == m_allowance.end() ? table_s : std::min(table_s * m_max_stretch, it->second);
}

void BudgetLearner::learn_bubble(int index, double table_s, double spent_s, double wait_s) {
  const double threshold_s = std::max(2e-5, 0.5 * m_guard_s);
  double& allowance = m_allowance.try_emplace(index, table_s).first->second;
  if (wait_s > threshold_s) {
    // The real bubble was (time in the bubble + the wait): aim a guard short of its end; go down
    // to it at once, up only half-way (training first: a noisy long wait must not make the next
    // bubble overrun).
    const double target = std::clamp(spent_s + wait_s - m_guard_s, 0.0, table_s * m_max_stretch);
    allowance = target < allowance ? target : allowance + 0.5 * (target - allowance);
  } else if (spent_s > 0.0) {
    // No wait: the real bubble ended before the prefill did (or just with it); halve (a
    // bisection: the next wait, if any, measures the real length).
    allowance = 0.5 * std::min(allowance, spent_s);
  }
}

}  // namespace atlas::bubbletea
