// SPDX-License-Identifier: MIT
// parallel.dp_across_dcs (atlas bench ablation's row a): the DP sum's cost over the WAN (the
// runtime's ring over point-to-point, each step at its slowest edge's cost), the deck's checks, and the bar chart the
// benchmark writes (a PNG of the stated size).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "atlas/app/bench_ablation.hpp"
#include "atlas/bench/chart.hpp"
#include "atlas/bench/harness.hpp"
#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas {
namespace {

const char* kDeck =
    "cluster.dcs = east west\n"
    "cluster.gpus_per_dc = 8 8\n"
    "cluster.latency_ms = 0 20   20 0\n"
    "cluster.bandwidth_gbps = 0 1   1 0\n"
    "parallel.stages_per_dc = 2 2\n"
    "parallel.dp_size = 2\n"
    "model.layers = 8\n"
    "model.hidden = 256\n"
    "train.micro_batches = 8\n"
    "schedule.fwd_ms_per_layer = 1\n";

Config load(const std::vector<std::string>& overrides) {
  Config cfg = deck::parse_and_validate("dp.deck", kDeck, overrides, {});
  deck::read_device_profiles(cfg);
  return cfg;
}

TEST(DpAcrossDcs, TheDpSumCrossesTheSlowestWanLink) {
  const Config pp = load({});
  const Config dp = load({"parallel.dp_across_dcs=true", "parallel.dp_size=4"});
  ASSERT_EQ(dp.parallel.pp_size(), 2);
  const sched::CostModel cpp = sched::cost_model(pp, topo::Layout(pp.parallel));
  const sched::CostModel cdp = sched::cost_model(dp, topo::Layout(dp.parallel));
  // 4 replicas, 2 per DC, the ring 0 -> 1 -> 2 -> 3 -> 0: edges 1 -> 2 and 3 -> 0 cross the WAN;
  // 6 steps of a quarter each, as long as a WAN edge (rendezvous, first window at the link's
  // share, the rest at one flow's rate), and the latency once.
  for (int s = 0; s < cdp.pp; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const double piece = cdp.grad_bytes[i] / 4;
    ASSERT_GT(piece, sched::kMpiEagerLimitBytes);
    const sched::LinkCost& l = cdp.link(0, 1);
    const double w = sched::flow_window_bytes(dp), share = l.capacity_bytes_per_ms / (cdp.pp * cdp.tp);
    const double burst = std::min(piece, w);
    const double edge = 2 * l.latency_ms + burst / share +
                        (piece - burst) / sched::transfer_cap_bytes_per_ms(share, l.latency_ms, 1, w);
    const double want = 6.0 * (edge + cdp.wake_ms) + l.latency_ms;
    EXPECT_NEAR(sched::wan_ring_allreduce_ms(cdp, 4 * piece, 4, 2, cdp.pp * cdp.tp, w), want, 1e-9 * want);
    EXPECT_NEAR(cdp.allreduce_ms[i], want, 1e-9 * want);
    EXPECT_GT(cdp.allreduce_ms[i], 6 * 40.0 + 20.0);  // a rendezvous round trip per step, a latency once
  }
  // Four DCs, one replica each: the ring's edges are 0 -> 1, 1 -> 2, 2 -> 3, 3 -> 0 (never 0-2 or
  // 1-3); each step as long as the slowest of them. Hand-computed: 1e5 bytes/ms links, no wake-up.
  sched::CostModel four = cdp;
  four.dc_count = 4;
  four.wake_ms = 0.0;
  four.links.assign(16, sched::LinkCost{});
  const auto set = [&](int a, int b, double lat) {
    four.links[static_cast<std::size_t>(a * 4 + b)] = {lat, 1e5, 1e5};
    four.links[static_cast<std::size_t>(b * 4 + a)] = {lat, 1e5, 1e5};
  };
  set(0, 1, 10.0);
  set(1, 2, 15.0);
  set(2, 3, 40.0);
  set(3, 0, 25.0);
  set(0, 2, 99.0);  // never an edge of the ring
  set(1, 3, 99.0);
  // 4e4 bytes: pieces of 1e4 under the eager limit, no window cap: 6 x 0.1 ms + the slowest
  // edge's latency (40, edge 2 -> 3) once.
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 4e4, 4, 1, 1, 1e12), 40.6, 1e-9);
  // 4e6 bytes, a 256 KiB window: pieces of 1e6; edge 2 -> 3 per step: 80 (rendezvous) +
  // 262144 / 1e5 + (1e6 - 262144) / (262144 / 80 ms) = 307.79722 ms; 6 steps + 40 = 1886.78332 ms.
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 4e6, 4, 1, 1, 262144.0), 1886.78332, 1e-4);
  // Two sums sharing the link halve the first window's rate only (the rest is window-bound).
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 4e6, 4, 1, 2, 262144.0), 1886.78332 + 6 * 2.62144, 1e-4);
  // The pipeline-parallel layout sums inside each DC only.
  for (double ms : cpp.allreduce_ms) EXPECT_LT(ms, 5.0);
  // A shared window caps one TCP flow: a small window makes the WAN sum slower.
  const Config small = load({"parallel.dp_across_dcs=true", "parallel.dp_size=4", "wan.flow_window_bytes=64K"});
  EXPECT_GT(sched::cost_model(small, topo::Layout(small.parallel)).allreduce_ms[0], cdp.allreduce_ms[0]);
}

TEST(DpAcrossDcs, DeckChecksNameTheKeyAndTheFix) {
  try {
    (void)deck::parse_and_validate("d.deck", kDeck, {"parallel.dp_across_dcs=true", "parallel.stages_per_dc=2 1"}, {});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("parallel.dp_across_dcs = true: parallel.stages_per_dc must give every "
                                               "DC the same stage count"));
  }
  try {
    (void)deck::parse_and_validate("d.deck", kDeck, {"parallel.dp_across_dcs=true", "parallel.dp_size=3"}, {});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("parallel.dp_size = 3 must be a multiple of the 2 DCs"));
  }
}

std::vector<unsigned char> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::uint32_t be32(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

TEST(BarChart, WritesAPngOfTheStatedSize) {
  const auto path = std::filesystem::temp_directory_path() / "atlas_test_bar_chart.png";
  bench::BarChart c;
  c.title = "ablation (test)";
  c.y_label = "step [ms]";
  c.series = {"measured", "predicted"};
  c.groups = {{"(a)", {812.5, 790.0}}, {"(b)", {120.0, 110.0}}, {"(e)", {-1.0, 90.0}}};
  c.width = 640;
  c.height = 360;
  bench::write_bar_chart_png(path.string(), c);
  const auto b = slurp(path);
  ASSERT_GT(b.size(), 33u);
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_TRUE(std::equal(sig, sig + 8, b.begin()));
  EXPECT_EQ(std::string(b.begin() + 12, b.begin() + 16), "IHDR");
  EXPECT_EQ(be32(b, 16), 640u);
  EXPECT_EQ(be32(b, 20), 360u);
  EXPECT_EQ(std::string(b.end() - 8, b.end() - 4), "IEND");
  std::filesystem::remove(path);
  c.groups[0].values = {1.0};
  EXPECT_THROW(bench::write_bar_chart_png(path.string(), c), ConfigError);  // one value for two series
  c.groups[0].values = {1.0, 2.0};
  c.width = 50;
  EXPECT_THROW(bench::write_bar_chart_png(path.string(), c), ConfigError);
  c.width = 640;
  EXPECT_THROW(bench::write_bar_chart_png("/nonexistent-dir/x.png", c), Error);
}

TEST(BenchAblationRows, DefaultIsEveryRowAndAListPicksSome) {
  const auto rows = [](std::vector<std::string> w) {
    w.insert(w.begin(), "inputs/ablation_2dc_16.deck");
    return app::ablation_rows(bench::parse(app::ablation_bench_spec(), w));
  };
  EXPECT_EQ(rows({}), "abcde");
  EXPECT_EQ(rows({"--rows", "a,d"}), "ad");
  EXPECT_EQ(rows({"--rows", "d,a"}), "ad");  // table order whatever the list's
  EXPECT_EQ(rows({"--rows", "c"}), "c");
  const auto bad = [&](const std::string& list, const std::string& why) {
    try {
      (void)rows({"--rows", list});
      ADD_FAILURE() << list << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(why)) << list;
    }
  };
  bad("a,f", "--rows a,f: 'f' is not a row; the rows are a, b, c, d, e (e.g. --rows a,d)");
  bad("ad", "--rows ad: 'ad' is not a row");
  bad("a,,d", "--rows a,,d: '' is not a row");
  bad("d,d", "--rows d,d: row d is named twice");
  bad("", "--rows: no row named");
}

}  // namespace
}  // namespace atlas
