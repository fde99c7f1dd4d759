// SPDX-License-Identifier: MIT
// The atlas search over the in-flight depth per stage (1F1B's pp - stage ... GPipe's m) under the
// device's memory, and the memory per GPU of a table (sched/memory.hpp): atlas is never slower than
// gpipe or 1f1b at equal or lower memory, on every example deck and over a seeded sweep.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>

#include "support/cost_models.hpp"

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {
namespace {

namespace fs = std::filesystem;

ScheduleTable table(const CostModel& c, ScheduleKind k, int m, bool full = true) {
  ScheduleOptions o;
  o.kind = k;
  o.micro_batches = m;
  o.full_search = full;
  o.split = SplitBackward::Auto;  // as decks do: atlas may split its backward (never gpipe or 1f1b)
  return build_schedule(c, o);
}

/// A hand-built cost model with memory costs: `state` bytes of weights and optimizer state per
/// stage, `act` bytes per in-flight micro-batch, no limit.
CostModel with_memory(CostModel c, double state, double act) {
  c.state_bytes.assign(static_cast<std::size_t>(c.pp), state);
  c.act_bytes_per_micro.assign(static_cast<std::size_t>(c.pp), act);
  c.fixed_act_bytes.assign(static_cast<std::size_t>(c.pp), 0.0);
  c.fixed_act_bytes.back() = 0.5 * act;  // the last stage's logits
  c.memory_limit_bytes = 0.0;
  return c;
}

// The host profile's memory is the machine's: ranks sharing it (cluster.ranks_per_host) each get
// their share as their limit, which the atlas depth search and the memory checks use. A GPU's
// memory is its own whatever the ranks per node. BubbleTea's bubbletea.kv_cap_bytes is taken
// off (it holds up to that on every rank).
TEST(Depth, RanksSharingTheHostShareItsMemory) {
  const char* deck =
      "cluster.dcs = a b\ncluster.gpus_per_dc = 4 4\ncluster.latency_ms = 0 10 10 0\n"
      "cluster.bandwidth_gbps = 0 1 1 0\nparallel.stages_per_dc = 1 1\n";
  auto limit = [&](const std::vector<std::string>& o) {
    Config cfg = deck::parse_and_validate("m.deck", deck, o, {});
    deck::read_device_profiles(cfg);
    return sched::cost_model(cfg, topo::Layout(cfg.parallel)).memory_limit_bytes;
  };
  const double alone = limit({});
  ASSERT_GT(alone, 0.0);
  EXPECT_DOUBLE_EQ(limit({"cluster.ranks_per_host=8"}), alone / 8);
  EXPECT_DOUBLE_EQ(limit({"cluster.ranks_per_host=1"}), alone);
  // A cuda deck that leaves plan.gpu = host is costed with a GPU profile: its memory is its own.
  const double cuda = limit({"device.backend=cuda"});
  EXPECT_DOUBLE_EQ(limit({"device.backend=cuda", "cluster.ranks_per_host=8"}), cuda);
  const double h100 = limit({"plan.gpu=h100"});
  EXPECT_DOUBLE_EQ(limit({"plan.gpu=h100", "cluster.ranks_per_host=8"}), h100);
  // BubbleTea's cap on every rank comes off what training may use.
  EXPECT_DOUBLE_EQ(limit({"plan.gpu=h100", "bubbletea.enabled=true", "bubbletea.kv_cap_bytes=1G"}),
                   h100 - 1024.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(limit({"plan.gpu=h100", "bubbletea.enabled=true", "bubbletea.kv_cap_bytes=1024G"}), 1.0)
      << "a cap over the device's memory leaves nothing (not 'no limit')";
}

TEST(Depth, ClassicTablesHoldTheirTextbookDepth) {
  const CostModel c = with_memory(testing::uniform_cost_model({2, 2}, 2, 1.0, 2.0, 1000, 1000.0, 1000.0, 0.5), 1e9, 1e8);
  for (int m : {1, 3, 4, 8}) {
    const auto g = in_flight_depth(table(c, ScheduleKind::GPipe, m));
    const auto f = in_flight_depth(table(c, ScheduleKind::OneFOneB, m));
    for (int s = 0; s < c.pp; ++s) {
      EXPECT_EQ(g[static_cast<std::size_t>(s)], m) << "gpipe holds every micro-batch, m=" << m;
      EXPECT_EQ(f[static_cast<std::size_t>(s)], std::min(c.pp - s, m)) << "1f1b stage " << s << " m=" << m;
    }
    const ScheduleMemory mg = memory_per_gpu(c, table(c, ScheduleKind::GPipe, m));
    EXPECT_EQ(mg.peak_stage, c.pp - 1) << "the logits make the last stage the fullest";
    // Each of GPipe's m micro-batches keeps its logits (0.5e8) until its backward, as the
    // runtime's arenas do (they were counted once).
    EXPECT_EQ(mg.head_depth, m);
    EXPECT_DOUBLE_EQ(mg.peak_bytes, 1e9 + m * 1e8 + m * 0.5e8);
    const ScheduleMemory mf = memory_per_gpu(c, table(c, ScheduleKind::OneFOneB, m));
    EXPECT_EQ(mf.head_depth, 1) << "1f1b's last stage runs each backward right after its forward";
    EXPECT_DOUBLE_EQ(mf.bytes.back(), 1e9 + 1e8 + 0.5e8);
  }
}

TEST(Depth, AtlasChoosesADeeperDepthWhenTheWanLatencyDominatesAndRetimesIt) {
  // 2 DCs, 50 ms one way, 1 ms forward: 1F1B's depth stalls on every round trip; GPipe's does not.
  const CostModel c = with_memory(testing::uniform_cost_model({1, 1}, 1, 1.0, 2.0, 1000, 1e6, 1e6, 50.0), 1e9, 1e8);
  const ScheduleTable a = table(c, ScheduleKind::Atlas, 16);
  const ScheduleTable f = table(c, ScheduleKind::OneFOneB, 16);
  const ScheduleTable g = table(c, ScheduleKind::GPipe, 16);
  EXPECT_LT(a.step_ms, 0.5 * f.step_ms) << "atlas " << a.step_ms << " ms vs 1f1b " << f.step_ms << " ms";
  EXPECT_LE(a.step_ms, g.step_ms * (1 + 1e-9));
  EXPECT_EQ(in_flight_depth(a), a.atlas.depth) << "the table holds the depth the search chose";
  EXPECT_GT(a.atlas.depth[0], 2);
  // retime runs the chosen depth: same structure, same times under the same costs.
  const ScheduleTable r = retime(a, c);
  EXPECT_EQ(r.structure_hash(), a.structure_hash());
  EXPECT_NEAR(r.step_ms, a.step_ms, 1e-6);
}

TEST(Depth, TheMemoryLimitCapsTheDepth) {
  CostModel c = with_memory(testing::uniform_cost_model({1, 1}, 1, 1.0, 2.0, 1000, 1e6, 1e6, 50.0), 1e9, 1e8);
  c.memory_limit_bytes = 1e9 + 4.6e8;  // room for 4 micro-batches on either stage
  const ScheduleTable a = table(c, ScheduleKind::Atlas, 16);
  const ScheduleMemory mem = memory_per_gpu(c, a);
  EXPECT_TRUE(mem.fits()) << mem.peak_bytes << " > " << mem.limit_bytes;
  EXPECT_EQ(a.atlas.depth[0], 4) << "as deep as the memory allows: the WAN round trip dominates";
  EXPECT_LE(a.atlas.depth[1], 4);
  EXPECT_EQ(memory_misfit(mem, a, Config{}, "test"), "");
  // A limit below even one micro-batch: depth 1 everywhere, and the misfit names it.
  c.memory_limit_bytes = 1e9;
  const ScheduleTable tight = table(c, ScheduleKind::Atlas, 4);
  EXPECT_EQ(tight.atlas.depth, (std::vector<int>{1, 1}));
  Config deck;  // micro-batch size 1, tp 1 on nodes of 8, recompute auto
  const std::string why = memory_misfit(memory_per_gpu(c, tight), tight, deck, "tiny-gpu");
  EXPECT_NE(why.find("the atlas schedule needs 1.1 GiB per GPU (stage 1"), std::string::npos) << why;
  EXPECT_NE(why.find("more than the 0.9 GiB usable on tiny-gpu"), std::string::npos) << why;
  // The hint offers only what the deck has not done: no depth change for atlas (it searched its
  // depth) nor a smaller micro-batch of 1; recomputation, stages, tp and a larger device.
  EXPECT_NE(why.find("hint: train.recompute = full"), std::string::npos) << why;
  EXPECT_EQ(why.find("schedule.kind"), std::string::npos) << why;
  EXPECT_EQ(why.find("micro_batch_size"), std::string::npos) << why;
  EXPECT_NE(why.find("a larger parallel.tp_size"), std::string::npos) << why;
  // A GPipe table of micro-batches of 4 with full recomputation and tp at the node's size: the
  // depth and the micro-batch size are offered, recomputation and tp are not.
  deck.train.micro_batch_size = 4;
  deck.train.recompute = Recompute::Full;
  deck.parallel.tp_size = deck.cluster.gpus_per_node;
  const ScheduleTable g = table(c, ScheduleKind::GPipe, 4);
  const std::string gpipe = memory_misfit(memory_per_gpu(c, g), g, deck, "tiny-gpu");
  EXPECT_NE(gpipe.find("hint: fewer micro-batches in flight (schedule.kind = 1f1b"), std::string::npos) << gpipe;
  EXPECT_NE(gpipe.find("a smaller train.micro_batch_size"), std::string::npos) << gpipe;
  EXPECT_EQ(gpipe.find("recompute"), std::string::npos) << gpipe;
  EXPECT_EQ(gpipe.find("tp_size"), std::string::npos) << gpipe;
}

// The sweep (2-4 DCs x 2-16 stages x dp 1-8 x 1-64 micro-batches x 1-100 ms latency),
// sampled with a fixed seed to run in seconds. At each point: with the memory of GPipe (the most
// either classic needs) atlas is no slower than either; with only 1F1B's memory it is no slower
// than 1F1B and stays within that memory.
TEST(Depth, AtlasIsNeverSlowerThanGPipeOr1F1BAtEqualOrLowerMemoryOverASweep) {
  std::mt19937 rng(24);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0;
  while (cases < 40) {
    const int dcs = pick(2, 4);
    const int stages = pick(std::max(2, dcs), 16);
    const int dp = pick(1, 8);
    const int m = pick(1, 64);
    if (stages * dp * m > 1500) continue;  // keep the sweep in seconds
    const double lat = pick(1, 100);
    const double fwd = 0.5 * pick(1, 8);
    const bool capped = pick(0, 2) == 0;
    std::vector<int> spd(static_cast<std::size_t>(dcs), stages / dcs);
    for (int i = 0; i < stages % dcs; ++i) ++spd[static_cast<std::size_t>(i)];
    const CostModel base = with_memory(
        testing::uniform_cost_model(spd, dp, fwd, 2 * fwd, 200000, 50000.0, capped ? 20000.0 : 50000.0, lat), 2e9,
        1e8 * pick(1, 10));
    const std::string what = "dcs=" + std::to_string(dcs) + " stages=" + std::to_string(stages) +
                             " dp=" + std::to_string(dp) + " m=" + std::to_string(m) + " lat=" + std::to_string(lat) +
                             " fwd=" + std::to_string(fwd) + (capped ? " capped" : "");
    const ScheduleTable g = table(base, ScheduleKind::GPipe, m);
    const ScheduleTable f = table(base, ScheduleKind::OneFOneB, m);
    const double mem_g = memory_per_gpu(base, g).peak_bytes;
    const double mem_f = memory_per_gpu(base, f).peak_bytes;
    ASSERT_LE(mem_f, mem_g) << what;

    CostModel c = base;
    c.memory_limit_bytes = mem_g;
    const ScheduleTable a = table(c, ScheduleKind::Atlas, m);
    EXPECT_LE(a.step_ms, std::min(g.step_ms, f.step_ms) * (1 + 1e-9))
        << what << ": atlas " << a.step_ms << " gpipe " << g.step_ms << " 1f1b " << f.step_ms;
    EXPECT_LE(memory_per_gpu(c, a).peak_bytes, mem_g) << what;

    c.memory_limit_bytes = mem_f;
    const ScheduleTable a1 = table(c, ScheduleKind::Atlas, m);
    EXPECT_LE(a1.step_ms, f.step_ms * (1 + 1e-9)) << what << ": atlas " << a1.step_ms << " 1f1b " << f.step_ms;
    EXPECT_LE(memory_per_gpu(c, a1).peak_bytes, mem_f) << what;
    ++cases;
  }
}

// Every example deck under its own cost model (the deck's device profile): atlas is no slower than
// any classic schedule that fits the device, within the device's memory, and never holds more than
// GPipe.
TEST(Depth, AtlasIsNeverSlowerThanGPipeOr1F1BOnEveryExampleDeck) {
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  const fs::path here = fs::current_path();
  fs::current_path(root);  // decks name profiles and data relative to the checkout
  int decks = 0;
  for (const auto& entry : fs::directory_iterator(root / "inputs")) {
    if (entry.path().extension() != ".deck") continue;
    const std::string name = entry.path().filename().string();
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;  // the table does not depend on the backend
    Config cfg = deck::parse_and_validate(name, deck::read_text_file(entry.path().string()), {}, shape);
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
    const CostModel c = cost_model(cfg, layout);
    ASSERT_GT(c.memory_limit_bytes, 0) << name;
    const ScheduleTable g = build_schedule(c, schedule_options(cfg, ScheduleKind::GPipe));
    const ScheduleTable f = build_schedule(c, schedule_options(cfg, ScheduleKind::OneFOneB));
    const ScheduleTable a = build_schedule(c, schedule_options(cfg, ScheduleKind::Atlas));
    const ScheduleMemory mg = memory_per_gpu(c, g), mf = memory_per_gpu(c, f), ma = memory_per_gpu(c, a);
    double fastest = 1e300;
    if (mg.fits()) fastest = std::min(fastest, g.step_ms);
    if (mf.fits()) fastest = std::min(fastest, f.step_ms);
    EXPECT_LE(a.step_ms, fastest * (1 + 1e-9)) << name << ": atlas " << a.step_ms << " gpipe " << g.step_ms
                                                << " 1f1b " << f.step_ms;
    if (mf.fits()) {
      EXPECT_TRUE(ma.fits()) << name << ": " << memory_misfit(ma, a, cfg, "the deck's device");
    }
    EXPECT_LE(ma.peak_bytes, mg.peak_bytes) << name;
    ++decks;
  }
  fs::current_path(here);
  EXPECT_GE(decks, 10);
}

}  // namespace
}  // namespace atlas::sched
