// SPDX-License-Identifier: MIT
// Interleaved 1F1B (schedule.virtual_stages): Megatron-LM's compute order, the bubble's closed
// form (p-1)/(v*m) of the ideal with free communication, the table's invariants (every micro-batch
// through every chunk once, dependencies across virtual stages, the last stage's hand-back to the
// first), atlas over it (never slower than 1F1B), retime, and the deck's checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/cost_models.hpp"
#include "support/deck_error.hpp"

#include <map>
#include <set>
#include <tuple>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/mpi/tags.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/sim/cost.hpp"
#include "atlas/sim/simulator.hpp"

namespace atlas::sched {
namespace {

ScheduleTable table(CostModel c, ScheduleKind k, int m, int v) {
  c.virtual_stages = v;
  ScheduleOptions o;
  o.kind = k;
  o.micro_batches = m;
  return build_schedule(c, o);
}

TEST(InterleavedOrder, OneChunkIsThePlainOrder) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int s = 0; s < 4; ++s) {
      const auto plain = compute_order(k, s, 4, 6);
      const auto chunked = compute_order(k, s, 4, 6, 1);
      ASSERT_EQ(plain.size(), chunked.size());
      for (std::size_t i = 0; i < plain.size(); ++i) {
        EXPECT_EQ(plain[i].first, chunked[i].kind);
        EXPECT_EQ(plain[i].second, chunked[i].micro);
        EXPECT_EQ(chunked[i].chunk, 0);
      }
    }
}

TEST(InterleavedOrder, MegatronOrderForTwoStagesTwoChunks) {
  // pp 2, v 2, m 4, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards: F0c0 F1c0 F0c1 F1c1, then
  // 1F1B: F2c0 B0c1, F3c0 B1c1, F2c1 B0c0, F3c1 B1c0, then B2c1 B3c1 B2c0 B3c0.
  const auto o = compute_order(ScheduleKind::OneFOneB, 0, 2, 4, 2);
  std::string got;
  for (const auto& st : o)
    got += std::string(st.kind == SlotKind::Forward ? "F" : "B") + std::to_string(st.micro) + "c" +
           std::to_string(st.chunk) + " ";
  EXPECT_EQ(got, "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0 ");
}

TEST(InterleavedOrder, EveryChunkRunsItsMicroBatchesInOrder) {
  // The gradient of every parameter accumulates over micro-batches 0..m-1 in order, as with one
  // chunk: the loss curve does not depend on the chunk count.
  for (int pp : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {pp, 2 * pp, 3 * pp})
        for (int s = 0; s < pp; ++s) {
          std::map<std::pair<int, int>, int> next;  // (kind, chunk) -> next micro
          for (const auto& st : compute_order(ScheduleKind::OneFOneB, s, pp, m, v)) {
            int& n = next[{static_cast<int>(st.kind), st.chunk}];
            ASSERT_EQ(st.micro, n) << "pp " << pp << " v " << v << " m " << m << " stage " << s;
            ++n;
          }
          ASSERT_EQ(next.size(), static_cast<std::size_t>(2 * v));
          for (const auto& [key, n] : next) ASSERT_EQ(n, m);
        }
}

TEST(InterleavedSchedule, BubbleDropsByTheChunkCountWithFreeCommunication) {
  // Free WAN and LAN; forward 1 ms and backward 2 ms per stage, so one chunk's pass is 1/v, 2/v.
  // Megatron's interleaved schedule: step = m (f + b) + (p - 1)(f + b) / v, i.e. the bubble is
  // (p-1)/(v m) of the ideal time m (f + b). Checked for m a multiple of p above p (with m == p
  // Megatron runs all forwards first, a longer bubble we only bound).
  for (int p : {2, 3, 4, 6})
    for (int v : {1, 2, 3, 4})
      for (int m : {2 * p, 3 * p, 4 * p}) {
        const std::vector<int> spd{p / 2, p - p / 2};
        const CostModel c = testing::uniform_cost_model(spd, 1, 1.0, 2.0, 1024, 1e18, 1e18, 0.0);
        const ScheduleTable t = table(c, ScheduleKind::OneFOneB, m, v);
        const double ideal = m * 3.0;
        EXPECT_NEAR((t.step_ms - ideal) / ideal, (p - 1.0) / (v * m), 1e-9) << "p " << p << " v " << v << " m " << m;
      }
  for (int p : {2, 4}) {
    const CostModel c = testing::uniform_cost_model({p / 2, p - p / 2}, 1, 1.0, 2.0, 1024, 1e18, 1e18, 0.0);
    EXPECT_LT(table(c, ScheduleKind::OneFOneB, p, 2).step_ms, table(c, ScheduleKind::OneFOneB, p, 1).step_ms);
  }
}

/// Every row runs every (micro, chunk) forward and backward once, in time order; a receive starts
/// after its tensor arrived from the right virtual stage; a link carries each boundary crossing once.
void check_interleaved(const ScheduleTable& t, const std::string& what) {
  constexpr double kEps = 1e-6;
  const int v = t.virtual_stages;
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      std::map<std::tuple<int, int, int>, int> seen;  // (kind, micro, chunk)
      std::map<std::pair<int, int>, double> fwd_end;
      double cursor = 0.0;
      for (const auto& sl : t.row(s, d)) {
        ASSERT_GE(sl.start_ms, cursor - kEps) << what;
        cursor = sl.end_ms();
        ASSERT_GE(sl.chunk, 0);
        ASSERT_LT(sl.chunk, v);
        if (is_compute(sl.kind)) ++seen[{static_cast<int>(sl.kind), sl.micro, sl.chunk}];
        if (sl.kind == SlotKind::Forward) fwd_end[{sl.micro, sl.chunk}] = sl.end_ms();
        if (sl.kind == SlotKind::Backward) {
          const auto key = std::make_pair(sl.micro, sl.chunk);
          ASSERT_TRUE(fwd_end.count(key)) << what << ": backward before forward";
          ASSERT_GE(sl.start_ms, fwd_end[key] - kEps);
        }
        if ((is_send(sl.kind) || is_recv(sl.kind))) {
          const int b = virtual_boundary(sl, s, t.pp);
          ASSERT_GE(b, 0) << what;
          ASSERT_LT(b, v * t.pp - 1) << what;
          // The peer is the other end of the virtual boundary.
          const int other = (b == sl.chunk * t.pp + s) ? b + 1 : b;
          ASSERT_EQ(sl.peer_stage, other % t.pp) << what;
          if (sl.link >= 0) {
            const auto& x = t.links[static_cast<std::size_t>(sl.link)].order[static_cast<std::size_t>(sl.link_pos)];
            ASSERT_EQ(x.micro, sl.micro);
            ASSERT_EQ(x.dp, d);
            ASSERT_EQ(virtual_boundary(x, t.pp), b) << what;
            if (is_recv(sl.kind)) {
              ASSERT_GE(sl.start_ms, x.arrive_ms - kEps) << what;
            } else {
              ASSERT_LE(sl.start_ms, x.start_ms + kEps) << what;
            }
          }
        }
      }
      ASSERT_EQ(seen.size(), static_cast<std::size_t>(2 * t.micro_batches * v)) << what;
      for (const auto& [k, n] : seen) ASSERT_EQ(n, 1) << what;
      ASSERT_NEAR(cursor, t.step_ms, kEps);
    }
  for (const auto& l : t.links) {
    if (t.kind != ScheduleKind::Atlas) continue;
    for (std::size_t k = static_cast<std::size_t>(l.slots); k < l.order.size(); ++k)
      ASSERT_GE(l.order[k].start_ms, l.order[k - static_cast<std::size_t>(l.slots)].end_ms - kEps)
          << what << ": more than " << l.slots << " transfers on a link at once";
  }
}

TEST(InterleavedSchedule, InvariantsAndAtlasNeverSlowerThan1F1B) {
  int cases = 0;
  for (const std::vector<int>& spd : {std::vector<int>{1, 1}, {2, 2}, {1, 1, 1}, {2, 1, 1}})
    for (int dp : {1, 2, 4})
      for (int v : {2, 3})
        for (int mult : {1, 2}) {
          const int pp = [&] { int n = 0; for (int x : spd) n += x; return n; }();
          const int m = mult * pp;
          const CostModel c = testing::uniform_cost_model(spd, dp, 1.0, 2.0, 1000, 1000.0, 600.0, 0.5);
          const std::string what = "stages " + std::to_string(pp) + " dcs " + std::to_string(spd.size()) +
                                   " dp " + std::to_string(dp) + " v " + std::to_string(v) + " m " +
                                   std::to_string(m);
          const ScheduleTable a = table(c, ScheduleKind::Atlas, m, v);
          const ScheduleTable b = table(c, ScheduleKind::OneFOneB, m, v);
          check_interleaved(a, what + " atlas");
          check_interleaved(b, what + " 1f1b");
          EXPECT_LE(a.step_ms, b.step_ms * (1 + 1e-9)) << what;
          EXPECT_NEAR(a.atlas.baseline_1f1b_ms, b.step_ms, 1e-9) << what;
          // The hand-back from the last stage to the first crosses the WAN between their DCs.
          if (spd.size() > 2) {
            EXPECT_GE(a.link_index(static_cast<int>(spd.size()) - 1, 0), 0) << what;
          }
          // v chunks: v x the boundary transfers.
          std::size_t transfers = 0;
          for (const auto& l : b.links) transfers += l.order.size();
          const ScheduleTable one = table(c, ScheduleKind::OneFOneB, m, 1);
          std::size_t transfers_one = 0;
          for (const auto& l : one.links) transfers_one += l.order.size();
          EXPECT_GT(transfers, transfers_one * static_cast<std::size_t>(v) - 1) << what;
          ++cases;
        }
  EXPECT_EQ(cases, 48);
}

TEST(InterleavedSchedule, RetimeKeepsTheStructureAndTheTimesUnderTheSameCosts) {
  CostModel c = testing::uniform_cost_model({1, 1, 1}, 2, 1.0, 2.0, 1000, 1000.0, 600.0, 0.5);
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
    const ScheduleTable t = table(c, k, 6, 2);
    // The simulator's cost models know nothing of chunks: retime takes them from the table.
    const ScheduleTable r = retime(t, c);
    EXPECT_EQ(r.virtual_stages, 2);
    EXPECT_EQ(r.structure_hash(), t.structure_hash()) << to_string(k);
    EXPECT_NEAR(r.step_ms, t.step_ms, 1e-9) << to_string(k);
    EXPECT_NE(table(c, k, 6, 1).structure_hash(), t.structure_hash());
  }
}

// ---- the simulator and the memory model ----

TEST(InterleavedSim, TheDecksChunksCutTheBubbleAtTheSameComputeAndHoldMoreChunkPasses) {
  // One DC of 4 stages x 8 GPUs (tp 8), 8 layers, 8 micro-batches: the simulator times the deck's
  // own table (deck mode) and the search (search mode) with the chunks.
  const std::string text =
      "cluster.dcs = a\ncluster.gpus_per_dc = 32\ncluster.latency_ms = 0\ncluster.bandwidth_gbps = 100\n"
      "parallel.stages_per_dc = 4\nparallel.tp_size = 8\nmodel.layers = 24\nmodel.hidden = 4096\n"
      "model.heads = 32\nmodel.seq_len = 2048\nmodel.vocab = 51200\ntrain.micro_batches = 8\nplan.gpu = a100\n";
  double bubble_one = 1.0;
  double compute_one = 0.0;
  for (int v : {1, 2, 3}) {
    deck::JobShape shape;
    const std::vector<std::string> over{"schedule.virtual_stages=" + std::to_string(v)};
    Config cfg = deck::parse_and_validate("test.deck", text, over, shape);
    deck::read_device_profiles(cfg);
    for (sim::TableSource src : {sim::TableSource::Deck, sim::TableSource::Search}) {
      sim::SimOptions opt;
      opt.source = src;
      const sim::SimResult r = sim::simulate(cfg, opt);
      EXPECT_EQ(r.table.virtual_stages, v);
      // Below one chunk's bubble (not monotone in v: each chunk adds its boundary transfers).
      if (src == sim::TableSource::Deck) {
        if (v == 1) bubble_one = r.bubble_fraction;
        else EXPECT_LT(r.bubble_fraction, bubble_one - 0.05) << "v " << v;
      }
      double compute = 0.0;
      for (const auto& sl : r.table.row(0, 0))
        if (is_compute(sl.kind)) compute += sl.duration_ms;
      if (v == 1) compute_one = compute;
      EXPECT_NEAR(compute, compute_one, 1e-6 * compute_one) << "v " << v << ": the same work, cut in chunks";
    }
    // Memory: stage 0 holds 2 (pp - 1) + (v - 1) pp + 1 chunk passes of layers / (pp v) blocks.
    const sched::DeviceProfile prof = sched::device_profile(cfg);
    const sim::MemoryEstimate e =
        sim::stage_memory(cfg.model, 0, 4, 8, 1, 8, ScheduleKind::OneFOneB, prof, v);
    const int want = v == 1 ? 4 : 2 * 3 + (v - 1) * 4 + 1;
    EXPECT_EQ(e.in_flight, want);
    EXPECT_NEAR(e.activation_bytes,
                want * (6.0 / v) * sim::block_activation_bytes(cfg.model, 1, 8, prof), 1.0);
  }
}

// ---- MPI tags ----

TEST(InterleavedTags, EveryChunkHasItsOwnBoundaryTagsAndTheBoundIsChecked) {
  namespace tags = mpi::tags;
  // One chunk: the range as before.
  EXPECT_EQ(tags::boundary(1, 3, 8), tags::boundary(1, 3, 8, 0, 1));
  EXPECT_EQ(tags::pipeline_max(8, 2), tags::pipeline_max(8, 2, 1));
  // v chunks: 2 v m boundary tags, all distinct, then the eval tags, all below pipeline_max.
  std::set<int> seen;
  const int m = 5, v = 3, eval = 2;
  for (int flow : {0, 1})
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < m; ++i) EXPECT_TRUE(seen.insert(tags::boundary(flow, i, m, c, v)).second);
  for (int b = 0; b < eval; ++b)
    for (int c = 0; c < v; ++c) EXPECT_TRUE(seen.insert(tags::eval(b, m, c, v)).second);
  EXPECT_EQ(*seen.begin(), tags::kBoundaryBase);
  EXPECT_EQ(*seen.rbegin(), tags::pipeline_max(m, eval, v));
  // A deck whose chunks push the tags past MPI_TAG_UB is a config error naming the keys.
  EXPECT_NO_THROW(tags::check_pipeline(8000, 10, 32767, 2));
  try {
    tags::check_pipeline(8000, 10, 32767, 3);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::AllOf(::testing::HasSubstr("schedule.virtual_stages = 3"),
                                           ::testing::HasSubstr("lower train.micro_batches to at most 5453")));
  }
}

// ---- the deck ----

std::string deck_error(const std::vector<std::string>& overrides) {
  return atlas::testing::two_dc_deck_error(overrides);
}

TEST(InterleavedDeck, AcceptsAValidDeckAndNamesTheKeyAndTheFixOtherwise) {
  EXPECT_EQ(deck_error({"schedule.virtual_stages=2"}), "");
  EXPECT_THAT(deck_error({"schedule.virtual_stages=2", "schedule.kind=gpipe"}),
              ::testing::AllOf(::testing::HasSubstr("schedule.virtual_stages = 2 needs an interleaved 1F1B"),
                               ::testing::HasSubstr("hint: set schedule.kind = 1f1b")));
  EXPECT_THAT(deck_error({"schedule.virtual_stages=3"}),
              ::testing::AllOf(::testing::HasSubstr("stage 0 holds 2 layers, which do not split into 3"),
                               ::testing::HasSubstr("hint: make every stage's layers")));
  EXPECT_THAT(deck_error({"schedule.virtual_stages=2", "train.micro_batches=6"}),
              ::testing::AllOf(::testing::HasSubstr("a multiple of the 4 pipeline stages"),
                               ::testing::HasSubstr("hint: set train.micro_batches = 8")));
  EXPECT_THAT(deck_error({"schedule.virtual_stages=0"}), ::testing::HasSubstr("schedule.virtual_stages"));
}

// A deck that is only modelled may split a stage's layers unevenly over its chunks (Llama 3's
// layout: 7 layers over 8 chunks on the first and last stage, whose embedding or head fills one);
// a launched job may not, the runtime builds equal chunks.
TEST(InterleavedDeck, UnevenChunksAreModelledNotLaunched) {
  const std::vector<std::string> uneven{"schedule.virtual_stages=2", "model.layers_per_stage=1 3 3 1"};
  EXPECT_EQ(atlas::testing::two_dc_deck_error(uneven, -1), "");
  EXPECT_THAT(atlas::testing::two_dc_deck_error(uneven),
              ::testing::AllOf(::testing::HasSubstr("stage 0 holds 1 layers, which do not split into 2 equal chunks "
                                                    "(the runtime builds equal ones; simulate and plan model uneven"),
                               ::testing::HasSubstr("hint: make every stage's layers")));
  // Modelled: every stage at least v layers, the first and the last v - 1.
  EXPECT_THAT(atlas::testing::two_dc_deck_error({"schedule.virtual_stages=3"}, -1),
              ::testing::AllOf(::testing::HasSubstr("stage 1 holds 2 layers, fewer than its 3 model chunks can hold "
                                                    "(at least 3)"),
                               ::testing::HasSubstr("hint: lower schedule.virtual_stages")));
  EXPECT_THAT(atlas::testing::two_dc_deck_error({"schedule.virtual_stages=4", "model.layers_per_stage=2 2 2 2"}, -1),
              ::testing::HasSubstr("stage 0 holds 2 layers, fewer than its 4 model chunks can hold (at least 3: the "
                                   "embedding or the head may fill one chunk)"));
}

// The cost model's block (GQA, a SwiGLU MLP of any width) is modelled, not built: a launched job
// is refused naming the keys; a modelled deck takes it; kv heads must divide the heads.
TEST(ModelDeck, ALlamaBlockIsModelledNotLaunched) {
  const std::vector<std::string> llama{"model.kv_heads=2", "model.ffn_hidden=192", "model.mlp=swiglu",
                                       "model.dropout=false"};
  EXPECT_EQ(atlas::testing::two_dc_deck_error(llama, -1), "");
  EXPECT_THAT(atlas::testing::two_dc_deck_error(llama),
              ::testing::AllOf(::testing::HasSubstr("model.kv_heads = 2, model.ffn_hidden = 192 and model.mlp = swiglu "
                                                    "describe a block the runtime does not build"),
                               ::testing::HasSubstr("hint: remove those keys to run the deck")));
  // Only the keys that differ from the runtime's block are named.
  EXPECT_THAT(atlas::testing::two_dc_deck_error({"model.mlp=swiglu"}),
              ::testing::AllOf(::testing::HasSubstr("model.mlp = swiglu describes a block the runtime does not build"),
                               ::testing::HasSubstr("hint: remove that key")));
  // Tensor parallelism splits whole key/value heads or replicates one.
  EXPECT_THAT(atlas::testing::two_dc_deck_error({"cluster.gpus_per_dc=8 8", "parallel.tp_size=2", "model.heads=6",
                                                 "model.hidden=96", "model.kv_heads=3"},
                                                -1),
              ::testing::HasSubstr("model.kv_heads = 3 neither divides into nor divides parallel.tp_size = 2"));
  EXPECT_EQ(atlas::testing::two_dc_deck_error({"cluster.gpus_per_dc=8 8", "parallel.tp_size=4", "model.heads=8",
                                               "model.hidden=96", "model.kv_heads=2"},
                                              -1),
            "")
      << "2 key/value heads over tp 4: each replicated on 2 ranks";
  EXPECT_EQ(atlas::testing::two_dc_deck_error({"model.dropout=false", "model.kv_heads=4", "model.ffn_hidden=256"}), "")
      << "the runtime's own block, spelt out";
  EXPECT_THAT(atlas::testing::two_dc_deck_error({"model.kv_heads=3"}, -1),
              ::testing::HasSubstr("model.kv_heads = 3 does not divide model.heads = 4"));
}

TEST(InterleavedDeck, OneStageCannotInterleave) {
  const std::string text =
      "cluster.dcs = a\ncluster.gpus_per_dc = 1\nparallel.stages_per_dc = 1\nmodel.layers = 4\n"
      "model.hidden = 64\nmodel.heads = 4\nmodel.seq_len = 16\nmodel.vocab = 256\nschedule.virtual_stages = 2\n";
  try {
    deck::JobShape shape;
    shape.world_size = 1;
    (void)deck::parse_and_validate("test.deck", text, {}, shape);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("needs more than one pipeline stage"));
  }
}

}  // namespace
}  // namespace atlas::sched
