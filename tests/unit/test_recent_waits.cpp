// SPDX-License-Identifier: MIT
// runtime::RecentWaits: the window BubbleTea's learned budgets read (receives, WAN waits, watched
// bubbles).
#include "atlas/runtime/recent_waits.hpp"

#include <gtest/gtest.h>

namespace atlas::runtime {
namespace {

TEST(RecentWaits, KeepsTheLastEightAndReadsTheirShortestAndQuantiles) {
  RecentWaits w;
  EXPECT_TRUE(w.empty());
  EXPECT_FALSE(w.full());
  EXPECT_EQ(w.shortest(), 0.0);
  EXPECT_EQ(w.quantile(0.5), 0.0);
  w.push(-1.0);  // a negative length (clock skew) counts as 0
  EXPECT_EQ(w.quantile(1.0), 0.0);
  // 0 12 30 14 40 13 35 18 25: the 9th push drops the 0 -> 12 30 14 40 13 35 18 25
  for (double v : {0.012, 0.030, 0.014, 0.040, 0.013, 0.035, 0.018}) w.push(v);
  EXPECT_TRUE(w.full());
  EXPECT_EQ(w.shortest(), 0.0);
  w.push(0.025);
  EXPECT_TRUE(w.full());
  // sorted 12 13 14 18 25 30 35 40; rank round(7 q)
  EXPECT_DOUBLE_EQ(w.shortest(), 0.012);
  EXPECT_DOUBLE_EQ(w.quantile(0.0), 0.012);
  EXPECT_DOUBLE_EQ(w.quantile(0.5), 0.025);
  EXPECT_DOUBLE_EQ(w.quantile(0.75), 0.030);  // round(5.25) = 5
  EXPECT_DOUBLE_EQ(w.quantile(1.0), 0.040);
}

TEST(RecentWaits, AQuantileOfFewIsOverThoseKnown) {
  RecentWaits w;
  w.push(0.020);
  EXPECT_DOUBLE_EQ(w.quantile(0.0), 0.020);
  EXPECT_DOUBLE_EQ(w.quantile(1.0), 0.020);
  w.push(0.010);
  w.push(0.040);
  EXPECT_FALSE(w.full());
  EXPECT_DOUBLE_EQ(w.quantile(0.5), 0.020);
  EXPECT_DOUBLE_EQ(w.quantile(1.0), 0.040);
}

}  // namespace
}  // namespace atlas::runtime
