// SPDX-License-Identifier: MIT
// core/stats.hpp: the median the benchmarks report over repeats.
#include <gtest/gtest.h>

#include <vector>

#include "atlas/core/stats.hpp"

namespace atlas {
namespace {

TEST(Stats, MedianOfAnOddCountIsTheMiddleValue) { EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0); }

// Two repeats: their mean, not the slower one (v[n/2] alone reported 4 here).
TEST(Stats, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  EXPECT_EQ(median({4.0, 2.0}), 3.0);
  EXPECT_EQ(median({1.0, 9.0, 3.0, 5.0}), 4.0);
}

TEST(Stats, MedianOfNoSampleIsZero) { EXPECT_EQ(median({}), 0.0); }

}  // namespace
}  // namespace atlas
