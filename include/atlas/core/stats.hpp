// SPDX-License-Identifier: MIT
// Small statistics over samples (benchmarks' repeats, measured costs).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace atlas {

/// The median of `v`: the middle value, or for an even count the mean of the two middle ones; 0
/// for no sample.
[[nodiscard]] inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace atlas
