// SPDX-License-Identifier: MIT
// The atlas search's in-flight depth with model chunks (interleaved 1F1B, v > 1; sched/depth.cpp):
// Megatron-LM's depth per stage, the deadlock-free depths (checked exhaustively on small shapes
// with a dependency walk, and by the engine over a sweep), a WAN-bound case where the search must
// go deeper, the memory cap in chunk passes, and the memory per GPU with chunks (each chunk pass
// holds 1/v of the stage's activations, the last stage's logits once), hand-computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "support/cost_models.hpp"

#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"
#include "program.hpp"  // src/sched: detail:: depth functions

namespace atlas::sched {
namespace {

ScheduleTable table(CostModel c, ScheduleKind k, int m, int v) {
  c.virtual_stages = v;
  ScheduleOptions o;
  o.kind = k;
  o.micro_batches = m;
  return build_schedule(c, o);
}

/// A hand-built cost model with memory costs: `state` bytes per stage, `act` bytes per in-flight
/// micro-batch (all the stage's layers), the last stage's logits `act / 2` once, no limit.
CostModel with_memory(CostModel c, double state, double act) {
  c.state_bytes.assign(static_cast<std::size_t>(c.pp), state);
  c.act_bytes_per_micro.assign(static_cast<std::size_t>(c.pp), act);
  c.fixed_act_bytes.assign(static_cast<std::size_t>(c.pp), 0.0);
  c.fixed_act_bytes.back() = 0.5 * act;
  c.memory_limit_bytes = 0.0;
  return c;
}

/// Whether stages running interleaved_depth_order(depth[s]) all finish, each running its passes
/// in order as soon as their inputs exist (sends never block, as in the engine): a forward of
/// (micro, chunk) on stage s needs the forward of virtual stage chunk * pp + s - 1 (the last
/// stage's previous chunk for s = 0), a backward its own forward and the backward of the virtual
/// stage above. No timing: only the order decides.
bool completes(const std::vector<int>& depth, int pp, int m, int v) {
  std::vector<std::vector<ChunkStep>> order;
  for (int s = 0; s < pp; ++s) order.push_back(detail::interleaved_depth_order(depth[static_cast<std::size_t>(s)], pp, m, v));
  std::set<std::tuple<int, int, int>> done;  // (forward 0 / backward 1, micro, virtual stage)
  std::vector<std::size_t> at(static_cast<std::size_t>(pp), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < pp; ++s) {
      auto& i = at[static_cast<std::size_t>(s)];
      const auto& o = order[static_cast<std::size_t>(s)];
      for (; i < o.size(); ++i) {
        const ChunkStep& st = o[i];
        const int vs = st.chunk * pp + s;
        const bool fwd = st.kind == SlotKind::Forward;
        const bool ready = fwd ? (vs == 0 || done.count({0, st.micro, vs - 1}) > 0)
                               : done.count({0, st.micro, vs}) > 0 &&
                                     (vs == pp * v - 1 || done.count({1, st.micro, vs + 1}) > 0);
        if (!ready) break;
        done.insert({fwd ? 0 : 1, st.micro, vs});
        moved = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s)
    if (at[static_cast<std::size_t>(s)] != order[static_cast<std::size_t>(s)].size()) return false;
  return true;
}

TEST(DepthChunks, InterleavedOneFOneBHoldsMegatronsDepth) {
  // pp 4, v 2, m 8: stage s holds 2 (4 - s - 1) + 4 warm-up chunk passes and its first steady one.
  EXPECT_EQ(detail::classic_depth(ScheduleKind::OneFOneB, 4, 8, 2), (std::vector<int>{11, 9, 7, 5}));
  // m == pp: every forward first.
  EXPECT_EQ(detail::classic_depth(ScheduleKind::OneFOneB, 2, 2, 3), (std::vector<int>{6, 6}));
  // One chunk: 1F1B's pp - s.
  EXPECT_EQ(detail::classic_depth(ScheduleKind::OneFOneB, 3, 8), (std::vector<int>{3, 2, 1}));
  const CostModel c = testing::uniform_cost_model({2, 2}, 1, 1.0, 2.0, 1000, 1000.0, 1000.0, 0.5);
  for (int v : {2, 3}) {
    const ScheduleTable f = table(c, ScheduleKind::OneFOneB, 8, v);
    EXPECT_EQ(in_flight_depth(f), detail::classic_depth(ScheduleKind::OneFOneB, 4, 8, v)) << "v " << v;
    // The order at Megatron's depth is compute_order's.
    for (int s = 0; s < 4; ++s) {
      const auto a = compute_order(ScheduleKind::OneFOneB, s, 4, 8, v);
      const auto b = detail::interleaved_depth_order(detail::classic_depth(ScheduleKind::OneFOneB, 4, 8, v)[static_cast<std::size_t>(s)], 4, 8, v);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(a[i].kind == b[i].kind && a[i].micro == b[i].micro && a[i].chunk == b[i].chunk) << s << " " << i;
    }
  }
}

// The condition fit_depth enforces (docs/schedules.md): from interleaved 1F1B's depth D0 up to
// v m, non-increasing along the pipeline, stage 0 at most 2 pp deeper than the last. Every depth
// vector between D0 and v m that meets it completes, exhaustively for pp 2-3 (m = pp, 2 pp, 3 pp)
// and pp 4 (m = 4, 8); and the condition is needed in the two ways it restricts: a deeper next
// stage, or a first stage more than 2 pp deeper than the last, can deadlock.
TEST(DepthChunks, TheDepthsFitDepthKeepsAreDeadlockFreeExhaustively) {
  int checked = 0;
  for (int pp : {2, 3, 4})
    for (int v : {2, 3})
      for (int mult : {1, 2, 3}) {
        const int m = mult * pp;
        if (pp == 4 && (mult == 3 || v == 3)) continue;  // keep it in a second
        const int total = v * m;
        const std::vector<int> d0 = detail::classic_depth(ScheduleKind::OneFOneB, pp, m, v);
        const std::vector<int> no_cap(static_cast<std::size_t>(pp), total);
        std::vector<int> d = d0;
        while (true) {
          const bool kept = detail::fit_depth(d, no_cap, v, m) == d;
          if (kept) {
            ASSERT_TRUE(completes(d, pp, m, v)) << "pp " << pp << " v " << v << " m " << m << " depth " << d[0] << ".." << d.back();
            ++checked;
          }
          // Next vector, odometer-style, each stage from d0[s] to total.
          int s = pp - 1;
          while (s >= 0 && d[static_cast<std::size_t>(s)] == total) {
            d[static_cast<std::size_t>(s)] = d0[static_cast<std::size_t>(s)];
            --s;
          }
          if (s < 0) break;
          ++d[static_cast<std::size_t>(s)];
        }
      }
  EXPECT_GT(checked, 1000);
  // Larger shapes, sampled: whatever the search wants (any depths, or D0 + e everywhere), what
  // fit_depth keeps completes (pp 2-8, v 2-4, m = pp ... 4 pp).
  std::mt19937 rng(2);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 500; ++i) {
    const int pp = pick(2, 8), v = pick(2, 4), m = pp * pick(1, 4), total = v * m;
    const std::vector<int> d0 = detail::classic_depth(ScheduleKind::OneFOneB, pp, m, v);
    std::vector<int> want(static_cast<std::size_t>(pp));
    const int e = pick(0, total);
    const bool uniform = pick(0, 1) == 0;
    for (int s = 0; s < pp; ++s)
      want[static_cast<std::size_t>(s)] = uniform ? d0[static_cast<std::size_t>(s)] + e : pick(1, total);
    const std::vector<int> cap(static_cast<std::size_t>(pp), pick(1, total));
    const std::vector<int> d = detail::fit_depth(want, cap, v, m);
    ASSERT_TRUE(completes(d, pp, m, v)) << "pp " << pp << " v " << v << " m " << m << " depth " << d[0] << ".." << d.back();
  }
  // pp 2, v 2, m 4 (D0 = 5, 3): a last stage deeper than the first, or a first stage 5 deeper
  // than the last, deadlocks; fit_depth turns both into deadlock-free ones.
  EXPECT_FALSE(completes({5, 6}, 2, 4, 2));
  EXPECT_FALSE(completes({8, 3}, 2, 4, 2));
  EXPECT_EQ(detail::fit_depth({5, 6}, {8, 8}, 2, 4), (std::vector<int>{5, 5}));
  EXPECT_EQ(detail::fit_depth({8, 3}, {8, 8}, 2, 4), (std::vector<int>{7, 3}));
  EXPECT_TRUE(completes({7, 3}, 2, 4, 2));
  // Below interleaved 1F1B's depth a stage can reach a backward before its own forward.
  EXPECT_FALSE(completes({5, 2}, 2, 4, 2));
  EXPECT_EQ(detail::fit_depth({1, 1}, {1, 1}, 2, 4), (std::vector<int>{5, 3})) << "never below D0, whatever the cap";
}

// The sweep for chunks: pp 2-4, v 2-3, m multiples of pp, latency 1-100 ms, dp 1-2,
// memory room for 1F1B's depth only or for more. Every depth the search may try runs to the end
// in the engine; atlas is no slower than interleaved 1F1B and within the memory 1F1B needs (or
// the limit); its table holds the depth it chose.
TEST(DepthChunks, EveryCandidateCompletesAndAtlasIsNeverSlowerThanInterleaved1F1BOverASweep) {
  std::mt19937 rng(25);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, deeper = 0;
  for (int pp : {2, 3, 4})
    for (int v : {2, 3})
      for (int mult : {1, 2})
        for (double lat : {1.0, 10.0, 100.0}) {
          const int m = mult * pp;
          const int dp = pick(1, 2);
          std::vector<int> spd{pp / 2, pp - pp / 2};
          CostModel c = with_memory(testing::uniform_cost_model(spd, dp, 0.5 * pick(1, 4), 1.0 * pick(1, 4), 200000,
                                                                50000.0, 20000.0 * pick(1, 2), lat),
                                    2e9, 1e8 * pick(1, 4));
          c.virtual_stages = v;
          const std::string what = "pp " + std::to_string(pp) + " v " + std::to_string(v) + " m " +
                                   std::to_string(m) + " dp " + std::to_string(dp) + " lat " + std::to_string(lat);
          const ScheduleTable f = table(c, ScheduleKind::OneFOneB, m, v);
          const double mem_f = memory_per_gpu(c, f).peak_bytes;
          for (double room : {0.0, 4.0}) {
            c.memory_limit_bytes = mem_f + room * c.act_bytes_per_micro[0];
            for (const auto& depth : detail::depth_candidates(c, m, true)) {
              detail::ProgramMap map;
              EngineProgram p = detail::make_program(c, ScheduleKind::Atlas, m, map, depth);
              const EngineResult r = run_engine(p);
              ASSERT_FALSE(r.deadlock) << what << ": " << r.deadlock_reason;
            }
            const ScheduleTable a = table(c, ScheduleKind::Atlas, m, v);
            EXPECT_LE(a.step_ms, f.step_ms * (1 + 1e-9)) << what << " room " << room;
            const ScheduleMemory mem = memory_per_gpu(c, a);
            EXPECT_LE(mem.peak_bytes, c.memory_limit_bytes * (1 + 1e-12)) << what << " room " << room;
            EXPECT_EQ(in_flight_depth(a), a.atlas.depth) << what;
            if (room == 0.0) {
              EXPECT_LE(mem.peak_bytes, mem_f * (1 + 1e-12)) << what;
            }
            if (a.atlas.depth != in_flight_depth(f)) ++deeper;
            ++cases;
          }
        }
  EXPECT_EQ(cases, 72);
  EXPECT_GT(deeper, 0) << "the sweep has cases where a deeper depth wins";
}

TEST(DepthChunks, AWanBoundPipelineGoesDeeperWithinTheMemoryLimit) {
  // 2 DCs of one stage, v 2, m 4, forward 1 ms and backward 2 ms per stage (0.5 and 1 per chunk
  // pass), 50 ms one way, tiny tensors: the WAN's round trips (100 ms) decide the step. Every
  // micro-batch crosses the WAN 6 times (chunk 0 up, the hand-back, chunk 1 up, and the same
  // down), 300 ms at the least. Interleaved 1F1B (D0 = 5, 3) lets the last stage run only 2 chunk
  // passes ahead, then one forward per backward: its forward of micro-batch 2 through chunk 0
  // waits for stage 0, which sends it only after its own warm-up of 4 passes (two of them behind
  // the hand-back's round trip), and so on: about 6 round trips end to end (611 ms). One more
  // chunk pass in flight per stage (6, 4) lets each stage send the next micro-batch before it
  // waits for a gradient: one round trip fewer (512.5 ms). Deeper still is no better: every
  // forward first (8, 8) puts micro-batches 2 and 3 through both chunks before the first
  // backward, which then waits a round trip more (613.5 ms). The search must find the middle.
  CostModel c = with_memory(testing::uniform_cost_model({1, 1}, 1, 1.0, 2.0, 1000, 1e6, 1e6, 50.0), 1e9, 1e8);
  const ScheduleTable f = table(c, ScheduleKind::OneFOneB, 4, 2);
  const ScheduleTable a = table(c, ScheduleKind::Atlas, 4, 2);
  EXPECT_EQ(in_flight_depth(f), (std::vector<int>{5, 3}));
  EXPECT_LT(a.step_ms, f.step_ms - 90.0) << "atlas " << a.step_ms << " ms vs interleaved 1f1b " << f.step_ms
                                         << " ms: one round trip (100 ms) fewer";
  EXPECT_GT(a.atlas.depth[0], 5);
  EXPECT_GT(a.atlas.depth[1], 3);
  EXPECT_LT(a.atlas.depth[1], 8) << "not every forward first";
  EXPECT_EQ(in_flight_depth(a), a.atlas.depth);
  // retime runs the chosen depth: same structure, same times.
  const ScheduleTable r = retime(a, c);
  EXPECT_EQ(r.structure_hash(), a.structure_hash());
  EXPECT_NEAR(r.step_ms, a.step_ms, 1e-6);
  // Memory for 6 chunk passes on stage 0 (each half the stage's 1e8) and 4 on stage 1 (each
  // charged half its 0.5e8 logits too: about one pass in two runs the head): the cap stops the
  // depth there and the table fits.
  c.memory_limit_bytes = 1e9 + 3e8;
  EXPECT_EQ(detail::memory_depth_cap(c, 4), (std::vector<int>{3, 2})) << "one chunk: whole micro-batches";
  c.virtual_stages = 2;
  EXPECT_EQ(detail::memory_depth_cap(c, 4), (std::vector<int>{6, 4}));
  const ScheduleTable capped = table(c, ScheduleKind::Atlas, 4, 2);
  EXPECT_LE(capped.atlas.depth[0], 6);
  EXPECT_LE(capped.atlas.depth[1], 4);
  EXPECT_TRUE(memory_per_gpu(c, capped).fits());
  EXPECT_LE(capped.step_ms, f.step_ms * (1 + 1e-9));
}

TEST(DepthChunks, MemoryPerGpuCountsChunkPassesAndTheLogitsPerHeadPass) {
  // state 1e9, a micro-batch's activations 1e8 (over all the stage's layers), logits 0.5e8 on
  // the last stage. pp 2, m 4.
  const CostModel c = with_memory(testing::uniform_cost_model({1, 1}, 1, 1.0, 2.0, 1000, 1e6, 1e6, 1.0), 1e9, 1e8);
  // v 1, 1F1B: depth 2, 1: stage 0 1e9 + 2e8, stage 1 1e9 + 1e8 + 0.5e8.
  const ScheduleMemory one = memory_per_gpu(c, table(c, ScheduleKind::OneFOneB, 4, 1));
  EXPECT_DOUBLE_EQ(one.bytes[0], 1.2e9);
  EXPECT_DOUBLE_EQ(one.bytes[1], 1.15e9);
  // v 2, interleaved 1F1B: depth 5, 3 chunk passes of 0.5e8: stage 0 1e9 + 2.5e8, stage 1
  // 1e9 + 1.5e8 + 0.5e8 (the logits of one pass: only chunk 1 of the last stage holds the LM
  // head, and it runs each backward before its next forward).
  const ScheduleMemory two = memory_per_gpu(c, table(c, ScheduleKind::OneFOneB, 4, 2));
  EXPECT_EQ(two.depth, (std::vector<int>{5, 3}));
  EXPECT_DOUBLE_EQ(two.bytes[0], 1.25e9);
  EXPECT_DOUBLE_EQ(two.bytes[1], 1.2e9);
  EXPECT_EQ(two.peak_stage, 0);
  EXPECT_EQ(two.head_depth, 1);
  EXPECT_EQ(head_depth(table(c, ScheduleKind::OneFOneB, 2, 2)), 2) << "m == pp: every forward first, so both hold logits";
  EXPECT_DOUBLE_EQ(stage_memory_bytes(c, 1, 3, 2, 1), 1.2e9);
  EXPECT_DOUBLE_EQ(stage_memory_bytes(c, 1, 3, 2), 1.25e9) << "without the table: ceil(3 / 2) passes through the head";
  EXPECT_DOUBLE_EQ(stage_memory_bytes(c, 1, 3), 1.45e9) << "one chunk: 3 whole micro-batches, each with its logits";
  // GPipe does not interleave: its table has one chunk whatever the cost model says.
  CostModel chunked = c;
  chunked.virtual_stages = 2;
  const ScheduleTable g = table(chunked, ScheduleKind::GPipe, 4, 2);
  EXPECT_EQ(g.virtual_stages, 1);
  EXPECT_DOUBLE_EQ(memory_per_gpu(chunked, g).bytes[0], 1.4e9);
}


// Every example deck that allows schedule.virtual_stages = 2 (layers divisible, 1f1b or atlas,
// micro-batches a multiple of pp), under its own cost model: atlas over chunks is no slower than
// interleaved 1F1B and holds no more memory per GPU (its depth search stays within 1F1B's memory
// where 1F1B fits, within the device where only deeper fits). The 100k-GPU-class decks are left
// to the sweep above (seconds each).
TEST(DepthChunks, AtlasIsNeverSlowerThanInterleaved1F1BOnTheExampleDecks) {
  namespace fs = std::filesystem;
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
    Config cfg;
    try {
      cfg = deck::parse_and_validate(name, deck::read_text_file(entry.path().string()),
                                     {"schedule.virtual_stages=2", "schedule.kind=1f1b"}, shape);
    } catch (const std::exception&) {
      continue;  // the deck does not split into 2 chunks (the message is test_schedule_interleaved's)
    }
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
    const CostModel c = cost_model(cfg, layout);
    if (static_cast<long>(c.pp) * c.dp * cfg.train.micro_batches > 4096) continue;
    ASSERT_EQ(c.virtual_stages, 2) << name;
    const ScheduleTable f = build_schedule(c, schedule_options(cfg, ScheduleKind::OneFOneB));
    const ScheduleTable a = build_schedule(c, schedule_options(cfg, ScheduleKind::Atlas));
    ASSERT_EQ(a.virtual_stages, 2) << name;
    const ScheduleMemory mf = memory_per_gpu(c, f), ma = memory_per_gpu(c, a);
    EXPECT_LE(a.step_ms, f.step_ms * (1 + 1e-9)) << name << ": atlas " << a.step_ms << " 1f1b " << f.step_ms;
    EXPECT_EQ(in_flight_depth(a), a.atlas.depth) << name;
    if (mf.fits()) {
      EXPECT_TRUE(ma.fits()) << name << ": " << memory_misfit(ma, a, cfg, "the deck's device");
    } else {
      EXPECT_LE(ma.peak_bytes, mf.peak_bytes) << name;
    }
    ++decks;
  }
  fs::current_path(here);
  EXPECT_GE(decks, 8);
}

}  // namespace
}  // namespace atlas::sched

namespace atlas::sched {
namespace {

// Shared hosts: each row's host is the one its world ranks sit on (topo::Layout::world_rank /
// cluster.ranks_per_host), with the DP replicas within a DC or across DCs (their numbering runs
// DC by DC, then stage, then replica: the program assumed stage-major numbering for both and put
// ranks of different hosts together).
TEST(SharedHosts, EveryRowIsOnItsRanksHost) {
  const std::string deck =
      "cluster.dcs = a b\ncluster.latency_ms = 0 10 10 0\ncluster.bandwidth_gbps = 0 1 1 0\n"
      "parallel.stages_per_dc = 2 2\nparallel.dp_size = 4\ncluster.ranks_per_host = 4\ncluster.cores_per_host = 2\n";
  // 4 stages x dp 4 within DCs (16 ranks); 2 stages x dp 4 with 2 replicas in each DC (8 ranks).
  for (const char* across : {"false", "true"}) {
    const std::vector<std::string> over{std::string("parallel.dp_across_dcs=") + across,
                                        across == std::string("true") ? "cluster.gpus_per_dc=4 4" : "cluster.gpus_per_dc=8 8"};
    Config cfg = deck::parse_and_validate("h.deck", deck, over, {});
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel);
    const CostModel c = cost_model(cfg, layout);
    EngineProgram p;
    detail::add_shared_hosts(c, p);
    ASSERT_EQ(p.worker_host.size(), static_cast<std::size_t>(c.pp * c.dp)) << across;
    for (int s = 0; s < c.pp; ++s)
      for (int d = 0; d < c.dp; ++d)
        EXPECT_EQ(p.worker_host[static_cast<std::size_t>(s * c.dp + d)], layout.world_rank(s, d, 0) / 4)
            << across << ": stage " << s << " replica " << d;
  }
}

}  // namespace
}  // namespace atlas::sched

namespace atlas::sched {
namespace {

// Every pipeline's gradient-norm sum has the same delays: the program keeps one pp x pp matrix for
// all dp of them (each had its own copy: 11 GB at pp 4096 x dp 81), and the tables are the ones of
// the separate copies (the engine reads the shared one through EngineProgram::sync_delay_of).
TEST(SyncDelays, OneMatrixServesEveryPipelinesNormSum) {
  const CostModel c = testing::uniform_cost_model({4, 4}, 8, 1.0, 2.0, 1000, 1e6, 1e6, 5.0);
  detail::ProgramMap map;
  const EngineProgram p = detail::make_program(c, ScheduleKind::OneFOneB, 8, map);
  ASSERT_EQ(c.pp, 8);
  std::size_t doubles = 0;
  for (const auto& d : p.sync_delay_ms) doubles += d.size();
  const std::size_t pp = 8;
  EXPECT_LE(doubles, pp * pp + 4) << "one norm matrix and group 0's 2 x 2 blocks";
  ASSERT_GE(p.sync_delay_of.size(), pp + 8);
  for (std::size_t d = 1; d < 8; ++d) EXPECT_EQ(p.sync_delay_of[pp + d], static_cast<int>(pp));
  // The same times as with a copy per pipeline.
  EngineProgram copies = p;
  for (std::size_t d = 1; d < 8; ++d) copies.sync_delay_ms[pp + d] = copies.sync_delay_ms[pp];
  copies.sync_delay_of.clear();
  EngineProgram first = p;
  const ScheduleTable shared = detail::time_program(c, ScheduleKind::OneFOneB, 8, first, map);
  const ScheduleTable own = detail::time_program(c, ScheduleKind::OneFOneB, 8, copies, map);
  EXPECT_EQ(shared.step_ms, own.step_ms);
  EXPECT_EQ(shared.structure_hash(), own.structure_hash());
}

}  // namespace
}  // namespace atlas::sched
