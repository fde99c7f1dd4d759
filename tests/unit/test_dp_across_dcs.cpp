// SPDX-License-Identifier: MIT
// parallel.dp_across_dcs (atlas bench ablation's row a): the DP sum's cost over the WAN (the
// runtime's ring over point-to-point, each step at its slowest edge's cost), the deck's checks, and the bar chart the
// benchmark writes (a PNG of the stated size).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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
  // 4 replicas, 2 per DC, the ring 0 -> 1 -> 2 -> 3 -> 0: edges 1 -> 2 and 3 -> 0 cross the WAN.
  // Each of the 6 steps takes at least a rendezvous round trip and the WAN transfer, at most one
  // more latency (a member both receives and sends over the WAN) and the intra-DC part.
  for (int s = 0; s < cdp.pp; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const double piece = cdp.grad_bytes[i] / 4;
    ASSERT_GT(piece, sched::kMpiEagerLimitBytes);
    const sched::LinkCost& l = cdp.link(0, 1);
    const double w = sched::flow_window_bytes(dp), share = l.capacity_bytes_per_ms / (cdp.pp * cdp.tp);
    const double x = sched::window_clocked_ms(piece - sched::kMpiEagerLimitBytes, share, 2 * l.latency_ms, w);
    const double ms = sched::wan_ring_allreduce_ms(cdp, 4 * piece, 4, 2, cdp.pp * cdp.tp, w);
    EXPECT_GE(ms, 6.0 * (2 * l.latency_ms + x) * (1 - 1e-12));
    EXPECT_LE(ms, 6.0 * (3 * l.latency_ms + x + 1.0 + cdp.wake_ms));
    EXPECT_EQ(cdp.allreduce_ms[i], ms);
  }
  // Hand-computed rings: 1e5 bytes/ms links, no wake-up.
  sched::CostModel four = cdp;
  four.dc_count = 4;
  four.wake_ms = 0.0;
  four.links.assign(16, sched::LinkCost{});
  const auto set = [&](int a, int b, double lat) {
    four.links[static_cast<std::size_t>(a * 4 + b)] = {lat, 1e5, 1e5};
    four.links[static_cast<std::size_t>(b * 4 + a)] = {lat, 1e5, 1e5};
  };
  set(0, 1, 20.0);
  // Two replicas in two DCs, 20 ms apart. Pieces of 2e4 bytes (eager): a step is the piece's
  // 0.2 ms and a latency; 2 steps.
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 4e4, 2, 1, 1, 1e12), 2 * 20.2, 1e-9);
  // Pieces of 1e6 (rendezvous), a 256 KiB window: the first 65536 bytes go with the request; the
  // receiver has posted, so its go-ahead leaves a latency later and is back at 40 ms; the other
  // 934464 bytes are 4 windows, 3 round trips and the last 148032 bytes at the link's rate:
  // 121.48032 ms; in 20 ms later. Each member receives as it sends: a step is 3 x 20 + 121.48032.
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 2e6, 2, 1, 1, 262144.0), 2 * 181.48032, 1e-6);
  // Four DCs, one replica each, ring edges 0 -> 1 -> 2 -> 3 -> 0 (never 0-2 or 1-3): eager pieces
  // of 1e4 (0.1 ms). A member's step k needs what the member before it received in step k - 1, so
  // a piece pays each edge's latency on its way round: in steady state a step lasts the ring's
  // mean edge, (10 + 15 + 40 + 25) / 4 + 0.1 = 22.6 ms; 6 steps. (A sum from a common start, the
  // job's first, is shorter: the replayed sums settle to this.)
  set(0, 1, 10.0);
  set(1, 2, 15.0);
  set(2, 3, 40.0);
  set(3, 0, 25.0);
  set(0, 2, 99.0);  // never an edge of the ring
  set(1, 3, 99.0);
  EXPECT_NEAR(sched::wan_ring_allreduce_ms(four, 4e4, 4, 1, 1, 1e12), 6 * 22.6, 1e-6);
  // Two sums sharing each link: the last window's bytes at half the rate.
  const double one = sched::wan_ring_allreduce_ms(four, 4e6, 4, 1, 1, 262144.0);
  EXPECT_GT(sched::wan_ring_allreduce_ms(four, 4e6, 4, 1, 2, 262144.0), one);
  // The pipeline-parallel layout sums inside each DC only.
  for (double ms : cpp.allreduce_ms) EXPECT_LT(ms, 5.0);
  // A shared window caps one TCP flow: a small window makes the WAN sum slower.
  const Config small = load({"parallel.dp_across_dcs=true", "parallel.dp_size=4", "wan.flow_window_bytes=64K"});
  EXPECT_GT(sched::cost_model(small, topo::Layout(small.parallel)).allreduce_ms[0], cdp.allreduce_ms[0]);
}

// A window-bound TCP transfer: a window a round trip (its acknowledgements release the next),
// the last one at the share; otherwise the share alone.
TEST(DpAcrossDcs, WindowClockedTransfersTakeWholeRoundTrips) {
  // 1e6 bytes, 256 KiB windows, 40 ms round trip, 1e5 bytes/ms: 4 windows, 3 round trips, then
  // 1e6 - 3 x 262144 = 213568 bytes in 2.13568 ms.
  EXPECT_NEAR(sched::window_clocked_ms(1e6, 1e5, 40.0, 262144.0), 122.13568, 1e-9);
  EXPECT_NEAR(sched::window_clocked_ms(1e5, 1e5, 40.0, 262144.0), 1.0, 1e-12);      // within one window
  EXPECT_NEAR(sched::window_clocked_ms(1e6, 1e5, 40.0, 0.0), 10.0, 1e-12);          // no window
  EXPECT_NEAR(sched::window_clocked_ms(1e6, 1e5, 40.0, 8e6), 10.0, 1e-12);          // outlasts the round trip
  EXPECT_EQ(sched::window_clocked_ms(0.0, 1e5, 40.0, 262144.0), 0.0);
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
  // A pipe (`--png >(display)`, /dev/stdout into a pipe) gets the same bytes in place.
  const auto fifo = std::filesystem::temp_directory_path() / ("atlas_test_bar_chart_fifo." + std::to_string(::getpid()));
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<unsigned char> piped;
  std::thread reader([&] { piped = slurp(fifo); });
  bool written = false;
  for (int i = 0; i < 500 && !written; ++i) {  // until the reader has opened its end
    try {
      bench::write_bar_chart_png(fifo.string(), c);
      written = true;
    } catch (const Error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) ::close(fd);  // never hang
  reader.join();
  EXPECT_TRUE(written);
  EXPECT_EQ(piped, b);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  std::filesystem::remove(fifo);
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
