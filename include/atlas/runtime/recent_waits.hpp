// SPDX-License-Identifier: MIT
// The last few lengths of one recurring wait (a receive, a WAN sum, a watched bubble), from which
// BubbleTea's budgets are learned: the trainer's receive and WAN-wait slots, the service's
// watched bubbles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <vector>

namespace atlas::runtime {

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

}  // namespace atlas::runtime
