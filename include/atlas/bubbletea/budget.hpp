// SPDX-License-Identifier: MIT
// BubbleTea's one budget learner: how long each bubble or wait of this rank's row may be filled,
// learned from its real lengths. RecentWaits keeps the last few lengths of one recurring wait (a
// receive, a WAN sum, a watched bubble); BudgetLearner keeps them per slot, with the allowance of
// the bubbles nobody watches, and holds every budget rule. No clock, no I/O: callers measure.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <map>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::bubbletea {

class RecentWaits {
 public:
  /// How many of the last lengths are kept (steps, for a slot that recurs once a step).
  static constexpr std::size_t kCapacity = 8;

  /// Keeps `seconds` (negative: 0), dropping the oldest beyond kCapacity.
  void push(double seconds) {
    m_v.push_back(std::max(0.0, seconds));
    if (m_v.size() > kCapacity) m_v.pop_front();
  }
  [[nodiscard]] bool empty() const { return m_v.empty(); }
  [[nodiscard]] bool full() const { return m_v.size() == kCapacity; }
  /// The shortest kept; 0 when none.
  [[nodiscard]] double shortest() const { return m_v.empty() ? 0.0 : *std::min_element(m_v.begin(), m_v.end()); }
  /// The kept lengths' q quantile (q in [0, 1]): the sorted value at rank round(q (n - 1)), so 0
  /// is the shortest and 1 the longest; 0 when none.
  [[nodiscard]] double quantile(double q) const {
    if (m_v.empty()) return 0.0;
    std::vector<double> v(m_v.begin(), m_v.end());
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(std::lround(q * static_cast<double>(v.size() - 1)))];
  }

 private:
  std::deque<double> m_v;
};

/// Every budget BubbleTea fills by, per slot index of this rank's row (one slot recurs once a
/// step), and what it learns from. The rules (bubbletea.* keys):
///  - a receive waiting outside a bubble: the recv_wait_quantile (default 0: the shortest) of its
///    last kCapacity waits, 0 until there are kCapacity of them (at 0 a receive that is sometimes
///    on time is never filled);
///  - a WAN wait inside a training slot: the deck's prediction x max_stretch or, when longer, the
///    wan_wait_quantile of its last waits (from the first one on);
///  - a watched bubble (its end is tested): the table's length until a real length is known,
///    then the stretch_quantile of its last real lengths within [table, max_stretch x table];
///  - an unwatched bubble: the table's length until the wait after it was measured, then an
///    allowance that goes down to a guard short of the real bubble at once and up half-way.
class BudgetLearner {
 public:
  explicit BudgetLearner(const BubbleTeaCfg& bt)
      : m_max_stretch(bt.max_stretch),
        m_stretch_quantile(bt.stretch_quantile),
        m_wan_wait_quantile(bt.wan_wait_quantile),
        m_recv_wait_quantile(bt.recv_wait_quantile),
        m_guard_s(bt.guard_ms * 1e-3) {}

  /// One real length of slot `index`'s wait or watched bubble.
  void record(int index, double seconds) { m_waits[index].push(seconds); }
  /// The budget of receive slot `index` waiting outside a bubble (0: do not fill).
  [[nodiscard]] double receive_budget(int index) const;
  /// The budget of the WAN wait inside training slot `index`, predicted `predicted_s` by the deck.
  [[nodiscard]] double wan_wait_budget(int index, double predicted_s) const;
  /// The budget of watched bubble `index`, `table_s` long in the table.
  [[nodiscard]] double watched_bubble_budget(int index, double table_s) const;
  /// The budget of unwatched bubble `index`, `table_s` long in the table.
  [[nodiscard]] double bubble_allowance(int index, double table_s) const;
  /// Unwatched bubble `index` (`table_s` in the table) was filled `spent_s`, and the slot after it
  /// then waited `wait_s`: updates its allowance.
  void learn_bubble(int index, double table_s, double spent_s, double wait_s);

 private:
  [[nodiscard]] const RecentWaits* waits(int index) const;

  double m_max_stretch, m_stretch_quantile, m_wan_wait_quantile, m_recv_wait_quantile, m_guard_s;
  std::map<int, RecentWaits> m_waits;   ///< receives, WAN waits and watched bubbles
  std::map<int, double> m_allowance;    ///< unwatched bubbles: seconds
};

}  // namespace atlas::bubbletea
