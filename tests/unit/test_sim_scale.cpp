// SPDX-License-Identifier: MIT
// Scale (issue #25): the atlas search is skipped where no WAN link exists (one DC: one
// candidate, timed exactly as 1F1B is); one DP replica per stage is timed where replicas are
// alike (the same tables to the bit as timing every replica); the atlas search times only the
// candidates that may win; a 100,352-GPU table is built within a bound of engine work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "support/cost_models.hpp"

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {
namespace {

namespace fs = std::filesystem;

TEST(AtlasScale, OneDcHasNoLinkToShareSoTheSearchTriesOneLinkPolicy) {
  // 4 stages x dp 4 in one DC: forward 2 ms, backward 4 ms, no WAN channel at all; the same
  // stages over two DCs (one WAN link) for comparison.
  const CostModel c = testing::uniform_cost_model({4}, 4, 2.0, 4.0, 1 << 20, 1e6, 1e6, 0.0);
  const CostModel wan = testing::uniform_cost_model({2, 2}, 4, 2.0, 4.0, 1 << 20, 1e6, 1e6, 10.0);
  for (bool full : {false, true}) {
    ScheduleOptions o;
    o.kind = ScheduleKind::Atlas;
    o.micro_batches = 8;
    o.full_search = full;
    const ScheduleTable t = build_schedule(c, o);
    // One link policy (slots 1, pipeline order, no stagger) per in-flight depth tried: the
    // stagger x tie-break x slots grid (3 x 5 x 5 with full search) is the WAN case's alone.
    const ScheduleTable w = build_schedule(wan, o);
    EXPECT_LT(t.atlas.candidates_tried, full ? w.atlas.candidates_tried / 5 : w.atlas.candidates_tried + 1)
        << t.atlas.candidates_tried << " vs " << w.atlas.candidates_tried;
    EXPECT_EQ(t.atlas.slots, 1);
    EXPECT_EQ(t.atlas.stagger_ms, 0.0);
    // Nothing to share: the atlas table times as 1F1B does.
    EXPECT_DOUBLE_EQ(t.step_ms, t.atlas.baseline_1f1b_ms);
    o.kind = ScheduleKind::OneFOneB;
    EXPECT_DOUBLE_EQ(build_schedule(c, o).step_ms, t.step_ms);
  }
}

/// Every slot, link transfer and choice of two tables, to the bit.
void expect_same_table(const ScheduleTable& a, const ScheduleTable& b, const std::string& what) {
  ASSERT_EQ(a.rows.size(), b.rows.size()) << what;
  EXPECT_EQ(a.step_ms, b.step_ms) << what;
  EXPECT_EQ(a.dp, b.dp) << what;
  EXPECT_EQ(a.structure_hash(), b.structure_hash()) << what;
  for (std::size_t r = 0; r < a.rows.size(); ++r) {
    ASSERT_EQ(a.rows[r].size(), b.rows[r].size()) << what << " row " << r;
    for (std::size_t i = 0; i < a.rows[r].size(); ++i) {
      const Slot& x = a.rows[r][i];
      const Slot& y = b.rows[r][i];
      ASSERT_TRUE(x.kind == y.kind && x.micro == y.micro && x.start_ms == y.start_ms && x.duration_ms == y.duration_ms &&
                  x.peer_stage == y.peer_stage && x.link == y.link && x.link_pos == y.link_pos && x.marks == y.marks &&
                  x.chunk == y.chunk && x.bytes == y.bytes)
          << what << " row " << r << " slot " << i << ": " << to_string(x.kind) << " at " << x.start_ms << " vs "
          << to_string(y.kind) << " at " << y.start_ms;
    }
  }
  EXPECT_EQ(a.links.size(), b.links.size()) << what;
  EXPECT_EQ(a.atlas.depth, b.atlas.depth) << what;
  EXPECT_EQ(a.atlas.slots, b.atlas.slots) << what;
  EXPECT_EQ(a.atlas.stagger_ms, b.atlas.stagger_ms) << what;
  EXPECT_EQ(a.atlas.tie_break, b.atlas.tie_break) << what;
  EXPECT_EQ(a.atlas.candidates_tried, b.atlas.candidates_tried) << what;
  EXPECT_EQ(a.atlas.baseline_1f1b_ms, b.atlas.baseline_1f1b_ms) << what;
}

/// One DC's stages with the costs a real deck has beyond compute: DP all-reduce and optimizer per
/// stage, the tied-embedding exchange, wake-ups, intra-DC latency and bandwidth, a memory cap.
CostModel one_dc_model(int pp, int dp, int v) {
  CostModel c = testing::uniform_cost_model({pp}, dp, 3.0, 6.5, 1 << 20, 1e6, 1e6, 0.0);
  c.virtual_stages = v;
  for (int s = 0; s < pp; ++s) {
    c.allreduce_ms[static_cast<std::size_t>(s)] = 1.25 + 0.1 * s;
    c.optimizer_ms[static_cast<std::size_t>(s)] = 0.7 + 0.05 * s;
  }
  c.fwd_ms.back() += 0.9;  // the LM head
  c.bwd_ms.back() += 1.7;
  c.embed_sync_ms = 0.4;
  c.wake_ms = 0.02;
  c.intra_latency_ms = 0.005;
  c.intra_bytes_per_ms = 5e7;
  return c;
}

TEST(OneReplicaPerStage, EqualsTimingEveryReplicaToTheBit) {
  int compared = 0;
  for (int pp : {1, 2, 4})
    for (int dp : {2, 3, 8})
      for (int v : {1, 2})
        for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas})
          for (bool full : {false, true}) {
            if (v > 1 && pp == 1) continue;
            const CostModel c = one_dc_model(pp, dp, v);
            ASSERT_TRUE(one_replica_per_stage(c));
            ScheduleOptions o;
            o.kind = kind;
            o.micro_batches = 4 * pp;
            o.full_search = full;
            const std::string what = std::string(to_string(kind)) + " pp " + std::to_string(pp) + " dp " +
                                     std::to_string(dp) + " v " + std::to_string(v) + (full ? " full" : " quick");
            const ScheduleTable fast = build_schedule(c, o, true);
            const ScheduleTable every = build_schedule(c, o, false);
            expect_same_table(fast, every, what);
            // The fast path's engine work: one replica's, less than every replica's.
            EXPECT_LT(fast.atlas.engine_events, every.atlas.engine_events) << what;
            // Re-timed under other costs (slower compute, as the simulator's profiles do).
            CostModel slower = c;
            for (double& ms : slower.fwd_ms) ms *= 1.37;
            for (double& ms : slower.bwd_ms) ms *= 0.91;
            expect_same_table(retime(fast, slower, true), retime(every, slower, false), what + " retimed");
            ++compared;
          }
  EXPECT_EQ(compared, 3 * 3 * 3 * 2 + 2 * 3 * 3 * 2);
}

TEST(OneReplicaPerStage, EqualsTimingEveryReplicaOnDecksInOneDc) {
  // Example decks with their own cost models (profiles, all-reduce, memory), every stage moved
  // into one DC: 175B at dp 8 (1,024 GPUs) and 70B at dp 4.
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  const fs::path here = fs::current_path();
  fs::current_path(root);  // decks name profiles relative to the checkout
  struct Case {
    const char* deck;
    std::vector<std::string> overrides;
  };
  const std::vector<Case> cases = {
      {"inputs/sim_gpt175b_4dc.deck",
       {"cluster.dcs=dc0", "cluster.gpus_per_dc=1024", "cluster.latency_ms=0", "cluster.bandwidth_gbps=100",
        "cluster.price_per_gpu_hour=2.5", "parallel.stages_per_dc=16", "parallel.dp_size=8", "train.micro_batches=16"}},
      {"inputs/plan_70b_4dc.deck",
       {"cluster.dcs=dc0", "cluster.gpus_per_dc=128", "cluster.latency_ms=0", "cluster.bandwidth_gbps=100",
        "cluster.price_per_gpu_hour=2.5", "parallel.stages_per_dc=4", "parallel.dp_size=4", "train.micro_batches=16"}},
  };
  for (const Case& k : cases) {
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;
    Config cfg = deck::parse_and_validate(k.deck, deck::read_text_file(k.deck), k.overrides, shape);
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
    const CostModel c = cost_model(cfg, layout);
    ASSERT_TRUE(one_replica_per_stage(c)) << k.deck;
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
      const ScheduleOptions o = schedule_options(cfg, kind);
      expect_same_table(build_schedule(c, o, true), build_schedule(c, o, false),
                        std::string(k.deck) + " " + to_string(kind));
    }
  }
  fs::current_path(here);
}

TEST(OneReplicaPerStage, EveryReplicaIsTimedWhereReplicasShareALinkOrAHost) {
  // 2-4 DCs: the replicas share the WAN links (and wait for one another), so each is timed.
  for (const std::vector<int>& spd : {std::vector<int>{2, 2}, std::vector<int>{1, 1, 2}, std::vector<int>{1, 1, 1, 1}})
    for (int dp : {1, 2, 8}) {
      const CostModel c = testing::uniform_cost_model(spd, dp, 2.0, 4.0, 1 << 20, 1e5, 5e4, 10.0);
      EXPECT_FALSE(one_replica_per_stage(c)) << spd.size() << " DCs, dp " << dp;
      ScheduleOptions o;
      o.kind = ScheduleKind::Atlas;
      o.micro_batches = 4;
      o.full_search = false;
      EXPECT_THROW((void)build_schedule(c, o, true), Error) << "replicas that share a link timed as one";
      // The default path is the full one there: the table has every replica's row and the links.
      const ScheduleTable t = build_schedule(c, o);
      EXPECT_EQ(static_cast<int>(t.rows.size()), c.pp * dp);
      EXPECT_FALSE(t.links.empty());
    }
  // One replica: nothing to copy. Shared hosts (CPU backend): replicas share a host's cores unevenly.
  EXPECT_FALSE(one_replica_per_stage(one_dc_model(4, 1, 1)));
  CostModel hosts = one_dc_model(4, 4, 1);
  hosts.ranks_per_host = 2;
  hosts.cores_per_host = 2.0;
  EXPECT_FALSE(one_replica_per_stage(hosts));
}

TEST(AtlasSearch, TimesOnlyTheCandidatesThatMayWin) {
  // A WAN-bound 4-DC deck at dp 16: one transfer at a time cannot carry the step's transfers in
  // time (the links' lower bound skips it), and where no tie-break decided anything one run
  // stands for the three rules. The choice is the one every candidate's run would give (the
  // other tests and the example decks' tables, byte-identical, hold that).
  const CostModel c = testing::uniform_cost_model({1, 1, 1, 1}, 16, 2.0, 4.0, 4 << 20, 1e5, 2.5e4, 20.0);
  ScheduleOptions o;
  o.kind = ScheduleKind::Atlas;
  o.micro_batches = 8;
  const ScheduleTable t = build_schedule(c, o);
  EXPECT_GT(t.atlas.candidates_tried, 40);
  EXPECT_LT(t.atlas.candidates_timed, t.atlas.candidates_tried * 2 / 3)
      << t.atlas.candidates_timed << " of " << t.atlas.candidates_tried << " timed";
  EXPECT_GT(t.atlas.candidates_timed, 0);
}

/// WAN-bound cases for the atlas search tests: three synthetic multi-DC cost models (links,
/// stagger, tie-breaks, deeper depths), then each of `decks` (example decks, read from the checkout).
std::vector<std::pair<std::string, CostModel>> wan_search_cases(std::initializer_list<const char*> decks) {
  std::vector<std::pair<std::string, CostModel>> cases;
  cases.emplace_back("4 DCs dp 16", testing::uniform_cost_model({1, 1, 1, 1}, 16, 2.0, 4.0, 4 << 20, 1e5, 2.5e4, 20.0));
  cases.emplace_back("2 DCs dp 4", testing::uniform_cost_model({2, 2}, 4, 2.0, 4.0, 1 << 20, 1e5, 5e4, 10.0));
  cases.emplace_back("3 DCs dp 8", testing::uniform_cost_model({1, 1, 2}, 8, 2.0, 4.0, 1 << 20, 1e6, 1e5, 30.0));
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  const fs::path here = fs::current_path();
  fs::current_path(root);  // decks name profiles relative to the checkout
  for (const char* deck : decks) {
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;
    Config cfg = deck::parse_and_validate(deck, deck::read_text_file(deck), {}, shape);
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
    cases.emplace_back(deck, cost_model(cfg, layout));
  }
  fs::current_path(here);
  return cases;
}

TEST(AtlasSearch, CandidatesOnThreadsChooseAsTheSerialSearch) {
  // Speculative runs on 2 and 4 threads (timed ahead under a looser stop bound, taken as the run
  // the serial search would make): the same choice, counts and table as one thread, on WAN-bound
  // synthetic decks (links, stagger, tie-breaks, deeper depths) and the multi-DC example decks.
  std::vector<std::pair<std::string, CostModel>> cases =
      wan_search_cases({"inputs/sim_gpt175b_4dc.deck", "inputs/plan_70b_4dc.deck", "inputs/atlas_wan_bound.deck",
                        "inputs/three_dc_cpu.deck"});
  int speculated = 0;
  for (const auto& [what, c] : cases) {
    ScheduleOptions o;
    o.kind = ScheduleKind::Atlas;
    o.micro_batches = 8;
    o.search_threads = 1;
    const ScheduleTable serial = build_schedule(c, o);
    for (int threads : {2, 4}) {
      o.search_threads = threads;
      const ScheduleTable t = build_schedule(c, o);
      expect_same_table(serial, t, what + ", " + std::to_string(threads) + " threads");
      EXPECT_EQ(serial.atlas.candidates_timed, t.atlas.candidates_timed) << what;
      // Speculation only adds runs (those the serial search would have skipped).
      EXPECT_GE(t.atlas.engine_events, serial.atlas.engine_events) << what;
      speculated += t.atlas.engine_events > serial.atlas.engine_events ? 1 : 0;
    }
  }
  // Some runs were made ahead under a looser bound (the conversion above was exercised).
  EXPECT_GT(speculated, 2);
}

TEST(EngineShortcuts, EqualTheReferenceEngineToTheBit) {
  // The engine's shortcuts (the WAN flows that finish are a prefix of the active ones when all
  // have one size; the atlas table from the winner's own run, not a run of its frozen orders)
  // against the engine without them (ScheduleOptions::reference_engine): the same tables and
  // choices, no more engine events, for every kind on WAN-bound synthetic decks, an interleaved
  // one and the multi-DC example decks.
  std::vector<std::pair<std::string, CostModel>> cases =
      wan_search_cases({"inputs/sim_gpt175b_4dc.deck", "inputs/plan_70b_4dc.deck", "inputs/atlas_wan_bound.deck",
                        "inputs/three_dc_cpu.deck"});
  CostModel chunks = testing::uniform_cost_model({2, 2}, 3, 2.0, 4.0, 1 << 20, 1e5, 5e4, 10.0);
  chunks.virtual_stages = 2;
  cases.emplace_back("2 DCs dp 3 v 2", chunks);
  for (const auto& [what, c] : cases)
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
      ScheduleOptions o;
      o.kind = kind;
      o.micro_batches = 8;
      o.search_threads = 1;
      const ScheduleTable fast = build_schedule(c, o);
      o.reference_engine = true;
      const ScheduleTable reference = build_schedule(c, o);
      const std::string label = what + ", " + to_string(kind);
      expect_same_table(fast, reference, label);
      EXPECT_EQ(fast.atlas.candidates_timed, reference.atlas.candidates_timed) << label;
      if (kind == ScheduleKind::Atlas) {
        EXPECT_LT(fast.atlas.engine_events, reference.atlas.engine_events) << label;  // no frozen re-run
      } else {
        EXPECT_EQ(fast.atlas.engine_events, reference.atlas.engine_events) << label;  // the same events
      }
      for (std::size_t l = 0; l < fast.links.size() && l < reference.links.size(); ++l) {
        const auto& x = fast.links[l].order;
        const auto& y = reference.links[l].order;
        ASSERT_EQ(x.size(), y.size()) << label;
        for (std::size_t i = 0; i < x.size(); ++i)
          ASSERT_TRUE(x[i].start_ms == y[i].start_ms && x[i].end_ms == y[i].end_ms && x[i].arrive_ms == y[i].arrive_ms &&
                      x[i].post_ms == y[i].post_ms && x[i].micro == y[i].micro && x[i].dp == y[i].dp)
              << label << " link " << l << " transfer " << i;
      }
    }
}

TEST(AtlasSearch, RunsOfAnEarlierSearchChooseAsWithout) {
  // The planner's quick timing of a plan, then its whole search, sharing their engine runs
  // (ScheduleOptions::runs): the whole search takes the quick one's runs (their stop bounds are
  // at or above its own, or they are timed again) and chooses, counts and times as without them.
  std::vector<std::pair<std::string, CostModel>> cases =
      wan_search_cases({"inputs/sim_gpt175b_4dc.deck", "inputs/plan_70b_4dc.deck", "inputs/atlas_wan_bound.deck"});
  int taken = 0;
  for (const auto& [what, c] : cases)
    for (int threads : {1, 2}) {
      ScheduleOptions o;
      o.kind = ScheduleKind::Atlas;
      o.micro_batches = 8;
      o.baseline_1f1b = false;
      o.search_threads = threads;
      const ScheduleTable alone = build_schedule(c, o);
      o.runs = new_search_runs();
      o.full_search = false;
      const ScheduleTable quick = build_schedule(c, o);
      o.full_search = true;
      const ScheduleTable full = build_schedule(c, o);
      const std::string label = what + ", " + std::to_string(threads) + " threads";
      expect_same_table(alone, full, label);
      EXPECT_EQ(alone.atlas.candidates_timed, full.atlas.candidates_timed) << label;
      EXPECT_EQ(quick.atlas.candidates_earlier, 0) << label;
      EXPECT_LE(full.atlas.candidates_earlier, quick.atlas.candidates_timed) << label;
      taken += full.atlas.candidates_earlier;
      // A store of another cost model is cleared, not used.
      CostModel other = c;
      other.fwd_ms.back() *= 1.5;
      o.runs = new_search_runs();
      (void)build_schedule(c, o);
      expect_same_table(build_schedule(other, o), [&] {
        ScheduleOptions p = o;
        p.runs = nullptr;
        return build_schedule(other, p);
      }(), label + ", another model");
    }
  EXPECT_GT(taken, 6);
}

TEST(AtlasScale, A100kGpuDeckInOneDcIsBuiltWithOneReplicaPerStage) {
  // 175B on 100,352 GPUs in one DC (16 stages x dp 784 x tp 8, 16 micro-batches of 4): the
  // engine's work is that of one replica per stage (not a wall-clock bound): the whole atlas
  // build, search included, within 64 events per compute slot of one replica per stage.
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  const fs::path here = fs::current_path();
  fs::current_path(root);
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = true;
  Config cfg = deck::parse_and_validate(
      "sim_gpt175b_4dc.deck", deck::read_text_file("inputs/sim_gpt175b_4dc.deck"),
      {"cluster.dcs=dc0", "cluster.gpus_per_dc=100352", "cluster.latency_ms=0", "cluster.bandwidth_gbps=100",
       "cluster.price_per_gpu_hour=2.5", "parallel.stages_per_dc=16", "parallel.dp_size=784", "train.micro_batches=16",
       "train.micro_batch_size=4"},
      shape);
  deck::read_device_profiles(cfg);
  fs::current_path(here);
  const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
  const CostModel c = cost_model(cfg, layout);
  ASSERT_EQ(c.pp * c.dp * c.tp, 100352);
  ASSERT_TRUE(one_replica_per_stage(c));
  const ScheduleTable t = build_schedule(c, schedule_options(cfg, ScheduleKind::Atlas));
  ASSERT_EQ(static_cast<int>(t.rows.size()), 16 * 784);
  const std::uint64_t compute_slots_one_replica = 16ULL * 2 * 16;
  EXPECT_GT(t.atlas.engine_events, 0U);
  EXPECT_LT(t.atlas.engine_events, 64 * compute_slots_one_replica * 8)
      << t.atlas.engine_events << " engine events for " << t.atlas.candidates_timed << " timed candidates";
  // Replica 783 of the last stage is replica 0's row.
  EXPECT_EQ(t.row(15, 783).size(), t.row(15, 0).size());
  EXPECT_EQ(t.row(15, 783).back().end_ms(), t.row(15, 0).back().end_ms());
}

}  // namespace
}  // namespace atlas::sched
