// SPDX-License-Identifier: MIT
// bubbletea::RecentWaits: the window BubbleTea's learned budgets read (receives, WAN waits, watched
// bubbles), and the BudgetLearner's rules over it.
#include "atlas/bubbletea/budget.hpp"

#include <gtest/gtest.h>

namespace atlas::bubbletea {
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

// One learner, every rule: receives (shortest of a full window), WAN waits (a quantile past the
// stretched prediction), watched bubbles (a quantile within [table, max_stretch x table]) and the
// allowance of unwatched bubbles (down at once, up half-way, halved when no wait followed).
TEST(BudgetLearner, EveryBudgetRuleReadsItsSlotsRealLengths) {
  BubbleTeaCfg bt;
  bt.max_stretch = 3.0;
  bt.stretch_quantile = 1.0;
  bt.wan_wait_quantile = 0.5;
  bt.guard_ms = 1.0;
  BudgetLearner b(bt);
  EXPECT_EQ(b.receive_budget(4), 0.0);
  for (int k = 0; k < 7; ++k) b.record(4, 0.010 + 0.001 * k);
  EXPECT_EQ(b.receive_budget(4), 0.0) << "seven waits: not yet a full window";
  b.record(4, 0.020);
  EXPECT_DOUBLE_EQ(b.receive_budget(4), 0.010);
  // bubbletea.recv_wait_quantile: the same waits (0.010 ... 0.016, 0.020) at the median and the top.
  BubbleTeaCfg median = bt, top = bt;
  median.recv_wait_quantile = 0.5;
  top.recv_wait_quantile = 1.0;
  BudgetLearner bm(median), bt1(top);
  for (int k = 0; k < 7; ++k) bm.record(4, 0.010 + 0.001 * k), bt1.record(4, 0.010 + 0.001 * k);
  bm.record(4, 0.020);
  bt1.record(4, 0.020);
  EXPECT_DOUBLE_EQ(bm.receive_budget(4), 0.014) << "sorted rank round(0.5 x 7) = 4";
  EXPECT_DOUBLE_EQ(bt1.receive_budget(4), 0.020);
  EXPECT_DOUBLE_EQ(b.wan_wait_budget(7, 0.001), 0.003) << "no wait yet: the prediction x max_stretch";
  b.record(7, 0.050);
  EXPECT_DOUBLE_EQ(b.wan_wait_budget(7, 0.001), 0.050);
  EXPECT_DOUBLE_EQ(b.watched_bubble_budget(2, 0.010), 0.010) << "no real length yet: the table's";
  b.record(2, 0.015);
  EXPECT_DOUBLE_EQ(b.watched_bubble_budget(2, 0.010), 0.015);
  b.record(2, 0.100);
  EXPECT_DOUBLE_EQ(b.watched_bubble_budget(2, 0.010), 0.030) << "at most max_stretch x the table";
  EXPECT_DOUBLE_EQ(b.bubble_allowance(9, 0.010), 0.010);
  b.learn_bubble(9, 0.010, 0.008, 0.0);  // no wait after it: halve
  EXPECT_DOUBLE_EQ(b.bubble_allowance(9, 0.010), 0.004);
  b.learn_bubble(9, 0.010, 0.004, 0.007);  // a real bubble of 11 ms: up half-way to 10 ms
  EXPECT_DOUBLE_EQ(b.bubble_allowance(9, 0.010), 0.007);
  b.learn_bubble(9, 0.010, 0.004, 0.002);  // a real bubble of 6 ms: down to 5 ms at once
  EXPECT_DOUBLE_EQ(b.bubble_allowance(9, 0.010), 0.005);
}

}  // namespace
}  // namespace atlas::bubbletea
