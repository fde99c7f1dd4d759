// SPDX-License-Identifier: MIT
// Layout is pure arithmetic: checked exhaustively over many shapes, uneven DCs included.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "atlas/core/error.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::topo {
namespace {

std::vector<Layout> shapes() {
  std::vector<Layout> out;
  const std::vector<std::vector<int>> dcs = {{1}, {3}, {1, 1}, {2, 1, 1}, {0, 2, 3}, {1, 0, 1, 2}, {4, 4}};
  for (const auto& spd : dcs)
    for (int dp : {1, 2, 3})
      for (int tp : {1, 2, 4}) out.emplace_back(spd, dp, tp);
  return out;
}

TEST(Layout, EveryRankRoundTripsThroughItsCoordinate) {
  for (const auto& l : shapes()) {
    for (int r = 0; r < l.world_size(); ++r) {
      const Coord c = l.coord(r);
      EXPECT_EQ(l.world_rank(c), r);
      EXPECT_EQ(c.dc, l.dc_of_stage(c.stage));
      EXPECT_GE(c.dp, 0);
      EXPECT_LT(c.tp, l.tp_size());
    }
  }
}

TEST(Layout, RanksAreOrderedDcStageDpTpWithTpFastest) {
  const Layout l({2, 1, 1}, 2, 2);
  ASSERT_EQ(l.world_size(), 16);
  Coord prev = l.coord(0);
  for (int r = 1; r < 16; ++r) {
    const Coord c = l.coord(r);
    const auto key = [](const Coord& x) { return std::tuple(x.dc, x.stage, x.dp, x.tp); };
    EXPECT_LT(key(prev), key(c));
    prev = c;
  }
  EXPECT_EQ(l.coord(5), (Coord{0, 1, 0, 1}));
  EXPECT_EQ(l.coord(8), (Coord{1, 2, 0, 0}));
  EXPECT_EQ(l.coord(15), (Coord{2, 3, 1, 1}));
}

TEST(Layout, GroupsPartitionTheJobAndRespectDcs) {
  for (const auto& l : shapes()) {
    for (Group g : {Group::Tensor, Group::Data, Group::Pipeline, Group::Dc}) {
      std::set<int> seen;
      std::set<int> colors;
      for (int r = 0; r < l.world_size(); ++r) {
        const Coord c = l.coord(r);
        const auto m = l.members(g, c);
        EXPECT_TRUE(std::find(m.begin(), m.end(), r) != m.end());
        EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
        for (int peer : m) {
          const Coord pc = l.coord(peer);
          EXPECT_EQ(l.color(g, pc), l.color(g, c));  // same group <=> same color
          if (g == Group::Tensor) { EXPECT_TRUE(pc.stage == c.stage && pc.dp == c.dp); }
          if (g == Group::Data) { EXPECT_TRUE(pc.stage == c.stage && pc.tp == c.tp && pc.dc == c.dc); }
          if (g == Group::Pipeline) { EXPECT_TRUE(pc.dp == c.dp && pc.tp == c.tp); }
          if (g == Group::Dc) { EXPECT_EQ(pc.dc, c.dc); }
        }
        const std::size_t expect = g == Group::Tensor ? static_cast<std::size_t>(l.tp_size())
                                 : g == Group::Data   ? static_cast<std::size_t>(l.dp_size())
                                 : g == Group::Pipeline ? static_cast<std::size_t>(l.pp_size())
                                                        : static_cast<std::size_t>(l.ranks_in_dc(c.dc));
        EXPECT_EQ(m.size(), expect);
        if (m.front() == r) seen.insert(m.begin(), m.end());
        colors.insert(l.color(g, c));
      }
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(l.world_size()));
    }
  }
}

TEST(Layout, CrossingsAreExactlyTheDcBoundaries) {
  const Layout l({0, 2, 1, 0, 3}, 1, 1);
  std::vector<bool> crosses;
  for (int s = 0; s < l.pp_size(); ++s) crosses.push_back(l.crosses_dc(s));
  EXPECT_EQ(crosses, (std::vector<bool>{false, true, true, false, false, false}));
  EXPECT_EQ(l.first_stage_of_dc(4), 3);
  EXPECT_EQ(l.dc_of_stage(3), 4);
}

TEST(Layout, WanPeersAreTheCrossDcPipelineNeighboursAndSymmetric) {
  for (const auto& l : shapes()) {
    for (int r = 0; r < l.world_size(); ++r) {
      const Coord c = l.coord(r);
      for (int p : l.wan_peers(c)) {
        const Coord pc = l.coord(p);
        EXPECT_NE(pc.dc, c.dc);
        const bool neighbour = std::abs(pc.stage - c.stage) == 1;
        const bool partner = l.embedding_partner(c) == p;
        EXPECT_TRUE(neighbour || partner);
        EXPECT_TRUE(pc.dp == c.dp && pc.tp == c.tp);
        const auto back = l.wan_peers(pc);
        EXPECT_TRUE(std::find(back.begin(), back.end(), r) != back.end());
      }
    }
  }
  const Layout l({1, 1, 1}, 1, 1);
  EXPECT_EQ(l.wan_peers(l.coord(1)), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.wan_peers(l.coord(0)), (std::vector<int>{1, 2}));  // neighbour + embedding partner
  EXPECT_EQ(Layout({2, 0}, 1, 1).wan_peers(Coord{0, 0, 0, 0}), std::vector<int>{});
}

TEST(Layout, RejectsShapeThatDoesNotFillTheJob) {
  ParallelCfg p;
  p.stages_per_dc = {2, 2};
  p.dp_size = 2;
  p.tp_size = 2;
  try {
    Layout(12, p);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("= 16 ranks, but the job has 12"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("mpirun -np 16"));
  }
  EXPECT_THROW(Layout({0, 0}, 1, 1), ConfigError);
}

// parallel.dp_across_dcs: every DC holds whole pipelines of a contiguous range of replicas; the
// DP group crosses DCs, the pipeline never does.
TEST(Layout, DpAcrossDcsHoldsWholePipelinesPerDc) {
  for (const std::vector<int>& spd : {std::vector<int>{1, 1}, {2, 2}, {3, 3, 3}, {2, 2, 2, 2}})
    for (int dpl : {1, 2, 3})
      for (int tp : {1, 2}) {
        const int ndc = static_cast<int>(spd.size());
        const Layout l(spd, dpl * ndc, tp, true);
        ASSERT_TRUE(l.dp_across_dcs());
        EXPECT_EQ(l.pp_size(), spd[0]);
        EXPECT_EQ(l.dp_per_dc(), dpl);
        EXPECT_EQ(l.world_size(), spd[0] * dpl * ndc * tp);
        int prev_dc = 0;
        for (int r = 0; r < l.world_size(); ++r) {
          const Coord c = l.coord(r);
          EXPECT_EQ(l.world_rank(c), r);
          EXPECT_EQ(c.dc, c.dp / dpl);              // replica d lives in DC d / dpl
          EXPECT_EQ(c.dc, l.dc_of(c.stage, c.dp));
          EXPECT_GE(c.dc, prev_dc);                 // DCs hold contiguous rank ranges
          prev_dc = c.dc;
          EXPECT_TRUE(l.wan_peers(c).empty());      // no pipeline boundary crosses a DC
          for (int m : l.members(Group::Pipeline, c)) EXPECT_EQ(l.coord(m).dc, c.dc);
          for (int m : l.members(Group::Dc, c)) EXPECT_EQ(l.coord(m).dc, c.dc);
          EXPECT_EQ(static_cast<int>(l.members(Group::Dc, c).size()), l.ranks_in_dc(c.dc));
          std::set<int> dcs;
          for (int m : l.members(Group::Data, c)) dcs.insert(l.coord(m).dc);
          EXPECT_EQ(static_cast<int>(dcs.size()), ndc);  // the DP sum crosses every DC
        }
        for (int s = 0; s + 1 < l.pp_size(); ++s) EXPECT_FALSE(l.crosses_dc(s));
      }
  ParallelCfg p;
  p.stages_per_dc = {2, 2};
  p.dp_size = 4;
  p.dp_across_dcs = true;
  EXPECT_EQ(p.pp_size(), 2);
  EXPECT_EQ(p.world_size(), 8);
  EXPECT_EQ(p.ranks_in_dc(1), 4);
  EXPECT_EQ(Layout(8, p).ranks_in_dc(0), 4);
  EXPECT_THROW(Layout({2, 1}, 2, 1, true), ConfigError);  // unequal stage counts
  EXPECT_THROW(Layout({1, 1}, 3, 1, true), ConfigError);  // dp not a multiple of the DCs
}

}  // namespace
}  // namespace atlas::topo
