// SPDX-License-Identifier: MIT
// The planner: the memory model against hand-computed numbers, the ATLAS placement heuristic,
// the chain order, the constant global batch, the ranking by simulated step time, the deadline
// choice, the emitted deck, the four designs' WAN all-reduce, and every "no plan" error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/plan/designs.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/sim/cost.hpp"

namespace atlas::plan {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

Config deck(const std::string& text, const std::vector<std::string>& overrides = {}) {
  deck::JobShape shape;
  shape.world_size = -1;
  Config cfg = deck::parse_and_validate("plan.deck", text, overrides, shape);
  deck::read_device_profiles(cfg);
  return cfg;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const Error& e) {  // ATLAS_THROW(Config, ...)
    return e.code() == ExitCode::Config ? e.what() : std::string("(not a config error)");
  }
  return "(no ConfigError)";
}

const char* kCluster = R"(
cluster.dcs = big mid small
cluster.gpus_per_dc = 64 32 16
cluster.gpus_per_node = 8
cluster.latency_ms = 0 10 30  10 0 15  30 15 0
cluster.bandwidth_gbps = 0 100 100  100 0 100  100 100 0
cluster.intra_bandwidth_gbps = 400
cluster.price_per_gpu_hour = 3 2 1
parallel.stages_per_dc = 2 0 0
parallel.dp_size = 4
parallel.tp_size = 8
model.layers = 32
model.hidden = 4096
model.heads = 32
model.seq_len = 2048
model.vocab = 50304
train.micro_batch_size = 1
train.micro_batches = 16
schedule.kind = atlas
wan.rails = 16
plan.gpu = h100
plan.top = 4
)";

// ---- memory ----

TEST(PlanMemory, StateAndActivationsFollowTheStatedFormulas) {
  const sched::DeviceProfile h100 = sched::builtin_device_profile(GpuKind::H100);
  ModelCfg m = model_preset("7b");
  // Stage 1 of 4 (no embedding, no head): 8 blocks of 12 h^2 + 13 h parameters, over tp 8.
  const sim::MemoryEstimate e = sim::stage_memory(m, 1, 4, 8, 2, 16, ScheduleKind::OneFOneB, h100);
  const double params = 8 * (12.0 * 4096 * 4096 + 13.0 * 4096) / 8;
  EXPECT_DOUBLE_EQ(e.params, params);
  EXPECT_DOUBLE_EQ(e.state_bytes, params * 16);
  // 1F1B keeps pp - stage = 3 micro-batches in flight; 34 s b h / t bytes per block (SP +
  // selective recompute, bf16).
  EXPECT_EQ(e.in_flight, 3);
  EXPECT_DOUBLE_EQ(e.activation_bytes, 3 * 8 * 34.0 * 2048 * 2 * 4096 / 8);
  // GPipe keeps all 16.
  EXPECT_EQ(sim::stage_memory(m, 1, 4, 8, 2, 16, ScheduleKind::GPipe, h100).in_flight, 16);
  // The host profile stores everything in fp32 without recomputation: s b h (34 + 5 a s / h) x 2.
  const sched::DeviceProfile host = sched::builtin_device_profile(GpuKind::Host);
  m = model_preset("7b");
  EXPECT_DOUBLE_EQ(sim::block_activation_bytes(m, 1, 1, host),
                   2048.0 * 4096 * (34.0 + 5.0 * 32 * 2048 / 4096) * 2);
  // The last stage adds the fp32 logits of one micro-batch (vocab-parallel).
  const auto last = sim::stage_memory(m, 3, 4, 8, 1, 16, ScheduleKind::OneFOneB, h100);
  EXPECT_DOUBLE_EQ(last.activation_bytes, 1 * 8 * 34.0 * 2048 * 4096 / 8 + 4.0 * 2048 * 50304 / 8);
}

// train.zero_stage: ZeRO-1 splits the optimizer state (Adam moments, fp32 master weights: 12 of
// the 16 bytes a parameter) over the stage's DP replicas, ZeRO-2 the gradients too; the weights'
// bf16 copy stays whole. The optimizer step then updates 1 / dp of the stage.
TEST(PlanMemory, ZeroStagesSplitTheOptimizerStateAndTheGradientsOverDp) {
  sched::DeviceProfile h100 = sched::builtin_device_profile(GpuKind::H100);
  ASSERT_DOUBLE_EQ(h100.state_bytes_per_param, 16.0);
  ASSERT_DOUBLE_EQ(h100.activation_bytes, 2.0);
  ASSERT_DOUBLE_EQ(h100.grad_bytes, 2.0);
  const double params = 1e9;
  EXPECT_DOUBLE_EQ(h100.state_bytes(params, 8), 16e9);  // zero_stage 0: dp changes nothing
  EXPECT_DOUBLE_EQ(h100.optimizer_share(8), 1.0);
  h100.zero_stage = 1;
  EXPECT_DOUBLE_EQ(h100.state_bytes(params, 8), (2 + 2 + 12.0 / 8) * 1e9);
  EXPECT_DOUBLE_EQ(h100.state_bytes(params, 1), 16e9);  // one replica: nothing to split
  EXPECT_DOUBLE_EQ(h100.optimizer_share(8), 1.0 / 8);
  h100.zero_stage = 2;
  EXPECT_DOUBLE_EQ(h100.state_bytes(params, 8), (2 + 14.0 / 8) * 1e9);
  // sim::stage_memory takes the stage's replicas: stage 1 of 4 of the 7B preset at tp 8, dp 16.
  const ModelCfg m = model_preset("7b");
  const double stage_params = 8 * (12.0 * 4096 * 4096 + 13.0 * 4096) / 8;
  const sim::MemoryEstimate e = sim::stage_memory(m, 1, 4, 8, 2, 16, ScheduleKind::OneFOneB, h100, 1, 16);
  EXPECT_DOUBLE_EQ(e.state_bytes, stage_params * (2 + 14.0 / 16));
  // The host profile (fp32 everything: weights 4, grads 4, Adam 8 bytes).
  sched::DeviceProfile host = sched::builtin_device_profile(GpuKind::Host);
  host.zero_stage = 2;
  EXPECT_DOUBLE_EQ(host.state_bytes(params, 4), (4 + 12.0 / 4) * 1e9);
}

// ZeRO-2's sharded gradients cost a reduce-scatter after every micro-batch's backward: the m - 1
// extra ones overlap the stage's next micro-batch, and only what each takes beyond it is added to
// the step's DP sync (an all-reduce of 10 ms is a 5 ms reduce-scatter). Stages 0 and 1 leave it
// unchanged.
TEST(PlanMemory, ZeroStageTwoReduceScattersEveryMicroBatch) {
  EXPECT_DOUBLE_EQ(sched::dp_sync_ms(10.0, 3.0, 8, 0), 10.0);
  EXPECT_DOUBLE_EQ(sched::dp_sync_ms(10.0, 3.0, 8, 1), 10.0);
  EXPECT_DOUBLE_EQ(sched::dp_sync_ms(10.0, 3.0, 8, 2), 10.0 + 7 * (5.0 - 3.0));
  EXPECT_DOUBLE_EQ(sched::dp_sync_ms(10.0, 6.0, 8, 2), 10.0);  // hidden behind the compute
  EXPECT_DOUBLE_EQ(sched::dp_sync_ms(10.0, 3.0, 1, 2), 10.0);  // one micro-batch: one sum
  // In the cost model: 70B's plan deck with a slow DC network (1 Gbit/s inside a DC), where a
  // stage's gradients take far longer than a micro-batch's compute.
  const std::string text = deck::read_text_file("inputs/plan_70b_4dc.deck");
  Config one = deck(text, {"cluster.intra_bandwidth_gbps=1", "train.zero_stage=1"});
  Config two = deck(text, {"cluster.intra_bandwidth_gbps=1", "train.zero_stage=2"});
  const topo::Layout layout(one.parallel.stages_per_dc, one.parallel.dp_size, one.parallel.tp_size);
  const sched::CostModel a = sched::cost_model(one, layout, sched::device_profile(one));
  const sched::CostModel b = sched::cost_model(two, layout, sched::device_profile(two));
  ASSERT_EQ(a.allreduce_ms.size(), b.allreduce_ms.size());
  const int m = one.train.micro_batches;
  for (std::size_t s = 0; s < a.allreduce_ms.size(); ++s) {
    const double extra = (m - 1) * (0.5 * a.allreduce_ms[s] - (a.fwd_ms[s] + a.bwd_ms[s]));
    ASSERT_GT(extra, 0.0) << "stage " << s;
    EXPECT_NEAR(b.allreduce_ms[s], a.allreduce_ms[s] + extra, 1e-9 * b.allreduce_ms[s]) << "stage " << s;
  }
}

// ---- placement ----

TEST(PlanPlacement, FillsTheDcsWithTheMostFreeGpusFirst) {
  EXPECT_EQ(place_stages({8, 32, 16}, 3, 8), (std::vector<int>{0, 3, 0}));
  EXPECT_EQ(place_stages({8, 32, 16}, 5, 8), (std::vector<int>{0, 4, 1}));
  EXPECT_EQ(place_stages({8, 32, 16}, 7, 8), (std::vector<int>{1, 4, 2}));
  EXPECT_FALSE(place_stages({8, 32, 16}, 8, 8).has_value());
  EXPECT_EQ(place_stages({0, 20, 20}, 2, 16), (std::vector<int>{0, 1, 1}));  // a zero-GPU DC is skipped
  EXPECT_FALSE(place_stages({0, 0}, 1, 1).has_value());
  EXPECT_EQ(place_stages({16, 16}, 2, 8), (std::vector<int>{2, 0}));          // ties: deck order
}

TEST(PlanPlacement, ChainOrderMinimisesLatencyAlongThePipeline) {
  Config cfg = deck(kCluster);
  // All three DCs used: big(64) mid(32) small(16); big-mid 10, mid-small 15, big-small 30.
  EXPECT_EQ(chain_order(cfg, {1, 1, 1}), (std::vector<int>{0, 1, 2}));
  // Make big-small the short hop: small must sit between... mid-big-small costs 10 + 5 = 15.
  cfg.cluster.latency_ms = {0, 10, 5, 10, 0, 15, 5, 15, 0};
  EXPECT_EQ(chain_order(cfg, {1, 1, 1}), (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(chain_order(cfg, {0, 2, 1}), (std::vector<int>{1, 2}));  // two DCs: placement order
}

TEST(PlanPlacement, SplitLayersPutsTheExtraBlocksInTheMiddle) {
  EXPECT_EQ(split_layers(10, 4), (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(split_layers(96, 30).front(), 3);
  const auto v = split_layers(96, 30);
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 96);
  EXPECT_EQ(split_layers(5, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(split_layers(7, 1), (std::vector<int>{7}));
}

// ---- search ----

TEST(PlanSearch, KeepsTheGlobalBatchRanksBySimulatedTimeAndFitsMemory) {
  const Config cfg = deck(kCluster);
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult r = search(cfg, prof);
  EXPECT_EQ(r.global_batch, 64);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_EQ(r.best, 0);
  EXPECT_GT(r.shapes, r.fit_memory);
  EXPECT_GE(r.fit_memory, r.placed);
  for (std::size_t i = 0; i < r.plans.size(); ++i) {
    const Plan& p = r.plans[i];
    EXPECT_TRUE(p.simulated);
    EXPECT_EQ(p.dp * p.micro_batches * p.micro_batch_size, 64) << "plan " << i;
    EXPECT_EQ(p.gpus, p.tp * p.pp * p.dp);
    EXPECT_LE(p.mem_bytes, prof.usable_bytes());
    EXPECT_EQ(std::accumulate(p.stages_per_dc.begin(), p.stages_per_dc.end(), 0), p.pp);
    for (std::size_t dc = 0; dc < 3; ++dc)
      EXPECT_LE(p.stages_per_dc[dc] * p.dp * p.tp, cfg.cluster.gpus_per_dc[dc]) << "plan " << i;
    EXPECT_NEAR(p.tokens_per_s, 64.0 * 2048 / (p.step_ms / 1e3), 1e-6 * p.tokens_per_s);
    if (i > 0) {
      EXPECT_GE(p.step_ms, r.plans[i - 1].step_ms);
    }
  }
  // The fastest plan's deck is valid, and re-simulating it gives its predicted step.
  const Config out = plan_config(cfg, r.plans[0]);
  EXPECT_EQ(out.parallel.world_size(), r.plans[0].gpus);
  EXPECT_EQ(out.schedule.kind, ScheduleKind::Atlas);
  EXPECT_EQ(out.cluster.dcs.front(), cfg.cluster.dcs[static_cast<std::size_t>(r.plans[0].dc_order.front())]);
  const Config back = deck(deck::resolved_deck(out));
  EXPECT_EQ(back.parallel.stages_per_dc, out.parallel.stages_per_dc);
  EXPECT_EQ(back.cluster.dcs, out.cluster.dcs);
  EXPECT_EQ(back.cluster.latency_ms, out.cluster.latency_ms);
  const std::string table = what_if_table(r, cfg, 4);
  EXPECT_THAT(table, HasSubstr("fastest"));
  EXPECT_THAT(table, HasSubstr("cost/step"));
}

TEST(PlanSearch, DeadlinePicksTheCheapestPlanThatMeetsIt) {
  Config cfg = deck(kCluster);
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult fastest = search(cfg, prof);
  // A deadline 1.5x the fastest step: several plans meet it, the cheapest is chosen.
  cfg.plan.deadline_s = fastest.plans[0].step_ms * 1.5 / 1e3;
  const PlanResult r = search(cfg, prof);
  ASSERT_TRUE(r.deadline_met);
  const Plan& chosen = r.plans[static_cast<std::size_t>(r.chosen)];
  EXPECT_LE(chosen.step_ms, cfg.plan.deadline_s * 1e3);
  for (const Plan& p : r.plans)
    if (p.step_ms <= cfg.plan.deadline_s * 1e3) {
      EXPECT_GE(p.cost_per_step, chosen.cost_per_step - 1e-12);
    }
  EXPECT_THAT(what_if_table(r, cfg, 100), HasSubstr("cheapest within deadline"));
  // An impossible deadline: reported, and the fastest plan is kept.
  cfg.plan.deadline_s = 1e-6;
  const PlanResult none = search(cfg, prof);
  EXPECT_FALSE(none.deadline_met);
  EXPECT_EQ(none.chosen, none.best);
}

TEST(PlanSearch, ADeadlineNeverLosesTheFastestPlan) {
  // Issue #25: with a deadline, cheap plans crowded the fastest one out of the full re-timing and
  // the planner reported that no plan met a deadline the fastest plan meets.
  Config cfg = deck(kCluster);
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult free_run = search(cfg, prof);
  const Plan& fastest = free_run.plans[0];
  EXPECT_TRUE(fastest.fully_timed);
  cfg.plan.deadline_s = fastest.step_ms * 1.0001 / 1e3;  // only the fastest few meet it
  const PlanResult r = search(cfg, prof);
  ASSERT_TRUE(r.deadline_met);
  EXPECT_DOUBLE_EQ(r.plans[0].step_ms, fastest.step_ms);
  EXPECT_LE(r.plans[static_cast<std::size_t>(r.chosen)].step_ms, cfg.plan.deadline_s * 1e3);
  // Every plan fully timed without the deadline is fully timed, with the same step, with it.
  for (const Plan& p : free_run.plans) {
    if (!p.fully_timed) continue;
    const auto same = std::find_if(r.plans.begin(), r.plans.end(), [&](const Plan& q) {
      return q.tp == p.tp && q.pp == p.pp && q.dp == p.dp && q.micro_batch_size == p.micro_batch_size &&
             q.stages_per_dc == p.stages_per_dc;
    });
    ASSERT_NE(same, r.plans.end());
    EXPECT_TRUE(same->fully_timed);
    EXPECT_DOUBLE_EQ(same->step_ms, p.step_ms);
  }
}

TEST(PlanSearch, SingleDcPlansAndPlansWithoutTheLargestDcAreCandidates) {
  // 'big' (64 GPUs) sits behind a 1 Gbit/s, 150 ms link. One 7B activation (2048 x 4096 bf16 =
  // 16 MiB) takes 16.8e6 B / 125e6 B/s = 134 ms on that link, so a pipeline through 'big' pays
  // 2 x 16 micro-batches x 134 ms > 4 s of transfers a step at dp 1 alone, while mid + small
  // (48 GPUs) never touch it. "Largest DC first" could only ever start with 'big'.
  Config cfg = deck(kCluster, {"cluster.latency_ms=0 150 150  150 0 15  150 15 0",
                               "cluster.bandwidth_gbps=0 1 1  1 0 100  1 100 0"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult r = search(cfg, prof);
  auto alone = [&](int dc) {
    return std::find_if(r.plans.begin(), r.plans.end(), [&](const Plan& p) {
      return p.dc_order == std::vector<int>{dc};
    }) != r.plans.end();
  };
  EXPECT_TRUE(alone(0));
  EXPECT_TRUE(alone(1));
  EXPECT_TRUE(alone(2));
  const Plan& best = r.plans[0];
  EXPECT_EQ(best.stages_per_dc[0] > 0 && best.dc_order.size() > 1, false)
      << "the fastest plan crosses the slow link: " << what_if_table(r, cfg, 8);
  const std::string table = what_if_table(r, cfg, 1);
  EXPECT_THAT(table, HasSubstr("fastest in big alone"));
  EXPECT_THAT(table, HasSubstr("fastest in mid alone"));
  EXPECT_THAT(table, HasSubstr("fastest in small alone"));
  // The fastest plan without 'big' is labelled so, also when it is a single-DC plan (both labels).
  EXPECT_THAT(table, HasSubstr("fastest without big"));
  const auto without = std::find_if(r.plans.begin(), r.plans.end(), [](const Plan& p) { return p.stages_per_dc[0] == 0; });
  ASSERT_NE(without, r.plans.end());
  if (without->dc_order.size() == 1) {
    EXPECT_THAT(table, ContainsRegex("fastest in (mid|small) alone, fastest without big"));
  }
  // With fast links everywhere the set of all DCs is still tried (the classic placement).
  const PlanResult all = search(deck(kCluster), prof);
  EXPECT_TRUE(std::any_of(all.plans.begin(), all.plans.end(), [](const Plan& p) { return p.dc_order.size() == 3; }));
}

TEST(PlanSearch, TheFastestOfEachSetOfDcsIsReTimedOnlyWhereItCouldWin) {
  // The fastest plan of every set of DCs is always timed (the what-if table shows it), but the
  // whole atlas search re-times it only where that could make it the fastest or the chosen plan:
  // where its floor (its busiest WAN link's bytes at capacity, its busiest row's work; no table
  // beats it) is behind the best quick timing, its quick timing stands. Behind kCluster's slow
  // links every set with 'big' in a pipeline is WAN-bound, far behind the plans in one DC.
  Config cfg = deck(kCluster, {"cluster.latency_ms=0 150 150  150 0 15  150 15 0",
                               "cluster.bandwidth_gbps=0 1 1  1 0 100  1 100 0"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult r = search(cfg, prof);
  const double fastest = r.plans[static_cast<std::size_t>(r.best)].step_ms;
  EXPECT_TRUE(r.plans[static_cast<std::size_t>(r.best)].fully_timed);
  int kept_quick = 0;
  std::map<std::vector<int>, bool> seen;  // the first (fastest) plan of each set
  for (const Plan& p : r.plans) {
    std::vector<int> set = p.dc_order;
    std::sort(set.begin(), set.end());
    if (seen[set]) continue;
    seen[set] = true;
    ASSERT_GE(p.step_ms, p.step_floor_ms * (1 - 1e-9));
    if (p.fully_timed) continue;
    ++kept_quick;
    EXPECT_GE(p.step_floor_ms, fastest * (1 - 1e-4))
        << "a set's fastest plan that could still win was not re-timed: " << what_if_table(r, cfg, 40);
  }
  EXPECT_GE(kept_quick, 1) << "no set's plan was left quick-timed: " << what_if_table(r, cfg, 40);
  // Every set was timed: its fastest plan is in the table.
  EXPECT_EQ(seen.size(), 7U) << what_if_table(r, cfg, 40);
}

TEST(PlanSearch, TriesTheSplitBackwardAndOffKeepsTheUnsplitPlan) {
  // kCluster's fastest plan (big:4, tp 4 x pp 4 x dp 4, 16 micro-batches) has bubbles that the
  // zero-bubble split fills with W: with schedule.split_backward = auto (the default) the planner
  // tries it and its table splits; with off the planner picks the plan it picked before the split
  // was tried (0.264 s a step, same shape), and no table splits.
  const Config on_cfg = deck(kCluster);
  ASSERT_EQ(on_cfg.schedule.split_backward, SplitBackward::Auto);
  const sched::DeviceProfile prof = sched::device_profile(on_cfg);
  const PlanResult split = search(on_cfg, prof);
  const Plan& a = split.plans[static_cast<std::size_t>(split.chosen)];
  const Config off_cfg = deck(kCluster, {"schedule.split_backward=off"});
  const PlanResult plain = search(off_cfg, prof);
  const Plan& b = plain.plans[static_cast<std::size_t>(plain.chosen)];

  EXPECT_TRUE(a.split_backward) << what_if_table(split, on_cfg, 4);
  EXPECT_LT(a.step_ms, b.step_ms * (1 - 1e-4)) << "the split must gain to be kept";
  EXPECT_GE(a.step_ms, a.step_floor_ms);
  const std::string table = what_if_table(split, on_cfg, 4);
  EXPECT_THAT(table, ContainsRegex("  1 big:4 [^\n]* fastest, fastest in big alone, split backward"));

  EXPECT_FALSE(b.split_backward);
  EXPECT_EQ(b.dc_order, std::vector<int>{0});
  EXPECT_EQ(b.stages_per_dc, (std::vector<int>{4, 0, 0}));
  EXPECT_EQ(std::vector<int>({b.tp, b.pp, b.dp, b.micro_batch_size, b.micro_batches}),
            std::vector<int>({4, 4, 4, 1, 16}));
  EXPECT_NEAR(b.step_ms, 264.0, 0.5);
  for (const Plan& p : plain.plans) EXPECT_FALSE(p.split_backward);
  EXPECT_THAT(what_if_table(plain, off_cfg, 4), Not(HasSubstr("split backward")));
  // With auto only the plans that could be chosen get the split's timing: the table says which
  // rows did, so a row timed unsplit is not read as the split's verdict.
  EXPECT_TRUE(a.split_tried);
  const std::string all_rows = what_if_table(split, on_cfg, 100);
  if (std::any_of(split.plans.begin(), split.plans.end(), [](const Plan& p) { return !p.split_tried; })) {
    EXPECT_THAT(all_rows, ContainsRegex("# the split backward \\(B \\+ W\\) was timed for rows 1(, [0-9]+)* \\(the plans that could "
                                        "be chosen\\) and kept where faster; the other rows are timed unsplit"));
  }
  EXPECT_THAT(what_if_table(plain, off_cfg, 100), Not(HasSubstr("was timed for")));
  // The plan's deck keeps the deck's setting, so `atlas simulate` of it searches the split too.
  EXPECT_EQ(plan_config(on_cfg, a).schedule.split_backward, SplitBackward::Auto);
}

TEST(PlanSearch, APlanThatDoesNotFitMemoryIsNeverSimulated) {
  // 64 blocks of 4096 (12.9B parameters): the deck's own shape, tp 1 x pp 2 x dp 4, holds 6.4B
  // parameters a GPU x 16 bytes = 103 GB = 96 GiB of weights, gradients and Adam state alone, more
  // than an H100's 72 GiB usable. It must not be simulated (it used to be, as "the deck's shape").
  Config cfg = deck(kCluster, {"model.layers=64", "parallel.tp_size=1"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  ModelCfg mm = cfg.model;
  mm.layers_per_stage = split_layers(64, 2);
  EXPECT_GT(sim::peak_memory(mm, 2, 1, 1, 16, ScheduleKind::Atlas, prof).state_bytes, 96.0 * (1ull << 30));
  const PlanResult r = search(cfg, prof);
  for (const Plan& p : r.plans) {
    EXPECT_FALSE(p.tp == 1 && p.pp == 2 && p.dp == 4);
    ModelCfg m = cfg.model;
    m.layers_per_stage = p.layers_per_stage;
    // The memory shown is at least the shape's estimate (sim::peak_memory: 1F1B's depth) and is
    // the timed table's (sched::memory_per_gpu, deeper when the depth search holds more), and it fits.
    EXPECT_GE(p.mem_bytes,
              sim::peak_memory(m, p.pp, p.tp, p.micro_batch_size, p.micro_batches, ScheduleKind::Atlas, prof).total() *
                  (1 - 1e-12));
    EXPECT_LE(p.mem_bytes, prof.usable_bytes());
  }
  EXPECT_THAT(what_if_table(r, cfg, 100), Not(HasSubstr("the deck's shape")));
}

// ---- errors ----

TEST(PlanErrors, AModelThatFitsNoPlanSaysHowMuchItNeeds) {
  // 175B on 16 H100s: even tp 8 x pp 2 cannot hold the weights and Adam state.
  const std::string msg = error_of([] {
    Config cfg = deck(kCluster, {"cluster.gpus_per_dc=8 8 0", "parallel.stages_per_dc=1 0 0", "parallel.dp_size=1",
                                 "model.layers=96", "model.hidden=12288", "model.heads=96"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(msg, ContainsRegex("no plan fits: the model \\(17[0-9]\\.[0-9]B parameters\\) needs [0-9.]+ GiB per GPU at "
                                 "the largest tp\\*pp \\(tp 8 x pp 2"));
  EXPECT_THAT(msg, HasSubstr("h100 has 80 GiB (72.0 GiB usable)"));
  EXPECT_THAT(msg, HasSubstr("hint: add GPUs (pp is limited to the free GPUs / tp) or use a larger-memory plan.gpu"));
  EXPECT_THAT(msg, Not(HasSubstr("recompute")));  // the weights and Adam state alone are 163 GiB
  EXPECT_THAT(msg, Not(HasSubstr("plan.max_tp")));  // tp 8 is the node's size already
  // A plan.max_tp past the node's size cannot help (tp stays inside a node): said, not suggested.
  EXPECT_THAT(error_of([] {
                Config cfg = deck(kCluster, {"cluster.gpus_per_dc=8 8 0", "parallel.stages_per_dc=1 0 0", "parallel.dp_size=1",
                                             "model.layers=96", "model.hidden=12288", "model.heads=96", "plan.max_tp=64"});
                (void)search(cfg, sched::device_profile(cfg));
              }),
              HasSubstr("(tp stays inside a node: cluster.gpus_per_node = 8 caps it, so plan.max_tp above that adds nothing)"));
  // Below the node's size, raising plan.max_tp is the hint.
  EXPECT_THAT(error_of([] {
                Config cfg = deck(kCluster, {"cluster.gpus_per_dc=8 8 0", "parallel.stages_per_dc=1 0 0", "parallel.dp_size=1",
                                             "parallel.tp_size=1", "model.layers=96", "model.hidden=12288", "model.heads=96",
                                             "plan.max_tp=2"});
                (void)search(cfg, sched::device_profile(cfg));
              }),
              HasSubstr("raise plan.max_tp (up to cluster.gpus_per_node = 8)"));
}

TEST(PlanErrors, DcsTooSmallForOneStageGetAHintThatHelps) {
  // 64.9B parameters on four DCs of 4 H100s: the smallest shape that fits memory is tp 8 x pp 2
  // x dp 1; a stage of 8 GPUs fits no DC. Lowering the global batch cannot help a dp-1 shape.
  const std::string msg = error_of([] {
    Config cfg = deck(kCluster, {"cluster.dcs=a b c d", "cluster.gpus_per_dc=4 4 4 4",
                                 "cluster.latency_ms=0 10 10 10  10 0 10 10  10 10 0 10  10 10 10 0",
                                 "cluster.bandwidth_gbps=0 100 100 100  100 0 100 100  100 100 0 100  100 100 100 0", "cluster.price_per_gpu_hour=1 1 1 1",
                                 "parallel.stages_per_dc=1 0 0 0", "parallel.dp_size=1", "parallel.tp_size=4",
                                 "model.layers=80", "model.hidden=8192", "model.heads=64"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(msg, HasSubstr("(tp 8 x pp 2 x dp 1 = 16 GPUs) needs 2 stages of 8 GPUs each"));
  EXPECT_THAT(msg, HasSubstr("hint: a stage of tp 8 GPUs must sit in one DC and the largest DC has 4"));
  EXPECT_THAT(msg, Not(HasSubstr("global batch")));
}

TEST(PlanErrors, BadClustersAreCaughtWithClearMessages) {
  // Every DC with zero GPUs: the deck says so.
  EXPECT_THAT(error_of([] { (void)deck(kCluster, {"cluster.gpus_per_dc=0 0 0"}); }),
              HasSubstr("every DC has zero GPUs"));
  // And the planner says so for a Config that skipped validation.
  Config cfg = deck(kCluster);
  cfg.cluster.gpus_per_dc = {0, 0, 0};
  EXPECT_THAT(error_of([&] { (void)search(cfg, sched::builtin_device_profile(GpuKind::H100)); }),
              HasSubstr("no plan fits: every DC in cluster.gpus_per_dc has zero free GPUs"));
  // A latency matrix that is not square, or negative.
  EXPECT_THAT(error_of([] { (void)deck(kCluster, {"cluster.latency_ms=0 10 30 10 0 15 30 15"}); }),
              HasSubstr("cluster.latency_ms has 8 entries, but 3 DCs need a square 3x3 matrix"));
  EXPECT_THAT(error_of([] { (void)deck(kCluster, {"cluster.latency_ms=0 -10 30 10 0 15 30 15 0"}); }),
              HasSubstr("expected a space-separated list of numbers in [0, 1000000]"));
  // A model preset that does not exist.
  EXPECT_THAT(error_of([] { (void)model_preset("1t"); }), HasSubstr("unknown model preset '1t'"));
}

TEST(PlanErrors, TheDecksOwnLayoutNeedNotFitTheCluster) {
  // The deck's layout (2 stages x dp 4 x tp 8 in 'big') does not fit 16 GPUs per DC, but the
  // planner replaces it: only the cluster and model must be valid.
  deck::JobShape shape;
  shape.world_size = -1;
  const Config cfg = deck::parse("plan.deck", kCluster, {"cluster.gpus_per_dc=16 16 16"});
  EXPECT_FALSE(deck::validate(cfg, shape).empty());
  EXPECT_TRUE(validate_for_planning(cfg, false).empty());
  EXPECT_FALSE(search(cfg, sched::builtin_device_profile(GpuKind::H100)).plans.empty());
  // Real problems still surface.
  const Config bad = deck::parse("plan.deck", kCluster, {"cluster.gpus_per_dc=0 0 0", "model.heads=30"});
  const auto problems = validate_for_planning(bad, false);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_THAT(problems[0], HasSubstr("every DC has zero GPUs"));
  EXPECT_THAT(problems[1], HasSubstr("model.hidden = 4096 is not divisible by model.heads = 30"));
}

TEST(PlanErrors, AGlobalBatchPastTheLimitsIsAConfigErrorNotAnInternalOne) {
  // The planner keeps the deck's global batch (its dp's): past the limit it is the deck's error.
  const Config big = deck::parse("plan.deck", kCluster,
                                 {"parallel.dp_size=100", "train.micro_batches=1000", "train.micro_batch_size=1000"});
  const auto problems = validate_for_planning(big, false);
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_THAT(problems[0], HasSubstr("parallel.dp_size (100) x train.micro_batches (1000) x train.micro_batch_size "
                                     "(1000) = 100000000 sequences per step, more than 16777216"));
  // A global batch within the limit whose every shape makes a schedule table past the limit (the
  // fuzzer's find: atlas plan ended in an internal error in plan_config).
  Config cfg = deck::parse("plan.deck", kCluster, {"parallel.dp_size=160", "train.micro_batches=65536", "model.layers=4"});
  ASSERT_TRUE(validate_for_planning(cfg, false).empty());
  EXPECT_THAT(error_of([&] { (void)search(cfg, sched::builtin_device_profile(GpuKind::H100)); }),
              HasSubstr("no plan fits: with a global batch of 10485760 sequences (parallel.dp_size x "
                        "train.micro_batches x train.micro_batch_size) every shape's schedule table has more "
                        "than 2000000 slots"));
}

// ---- power, energy, carbon, residency ----

TEST(PlanPower, APowerCapLimitsTheGpusADcMayUse) {
  // H100 board power 700 W x PUE 1.1 = 770 W a GPU. big: 6.16 kW / 770 W = 8 GPUs (of 64);
  // mid: 0 MW = none; small: 1 MW = 1298 > 16, so its 16 free GPUs.
  Config cfg = deck(kCluster, {"cluster.power_mw=0.00616 0 1", "cluster.pue=1.1"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  EXPECT_EQ(prof.board_power_w, 700);
  EXPECT_EQ(powered_gpus(cfg, prof), (std::vector<int>{8, 0, 16}));
  const PlanResult r = search(cfg, prof);
  EXPECT_EQ(r.usable_gpus, (std::vector<int>{8, 0, 16}));
  for (const Plan& p : r.plans) {
    EXPECT_LE(p.stages_per_dc[0] * p.dp * p.tp, 8);
    EXPECT_EQ(p.stages_per_dc[1], 0);
    EXPECT_LE(p.stages_per_dc[2] * p.dp * p.tp, 16);
    // Within each budget: GPUs x 770 W <= power_mw.
    EXPECT_LE(p.stages_per_dc[0] * p.dp * p.tp * 770.0, 6160.0 + 1e-9);
  }
  // Without the cap the fastest plan uses more than big's 8 powered GPUs there.
  const PlanResult free_run = search(deck(kCluster), prof);
  EXPECT_GT(free_run.plans[0].stages_per_dc[0] * free_run.plans[0].dp * free_run.plans[0].tp, 8);
  // Caps that power nothing: a clear error.
  Config none = deck(kCluster, {"cluster.power_mw=0 0 0"});
  EXPECT_THAT(error_of([&] { (void)search(none, prof); }), HasSubstr("cluster.power_mw powers no GPU in any DC"));
  // A budget without a board power to divide it by: a clear error.
  sched::DeviceProfile no_power = prof;
  no_power.board_power_w = 0;
  EXPECT_THAT(error_of([&] { (void)powered_gpus(cfg, no_power); }), HasSubstr("has no board_power_w"));
}

TEST(PlanPower, ErrorsNameTheBudgetThatLimits) {
  // 70B (80 blocks of 8192) fits tp 8 x pp 2 at the least: two stages of 8 GPUs. Budgets of
  // 4.2 kW = 6 H100s (700 W, PUE 1) per DC leave 18 GPUs, none with a stage's 8: the budgets, not
  // the free GPUs, are what to raise.
  const std::string placed = error_of([] {
    Config cfg = deck(kCluster, {"cluster.power_mw=0.0042 0.0042 0.0042", "cluster.pue=1", "model.layers=80", "model.hidden=8192",
                                 "model.heads=64"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(placed, HasSubstr("no plan fits the powered GPUs: the smallest shape that fits memory (tp 8 x pp 2"));
  EXPECT_THAT(placed, HasSubstr("the DCs have big=6 (of 64 free: cluster.power_mw), mid=6 (of 32 free: "
                                "cluster.power_mw), small=6 (of 16 free: cluster.power_mw)"));
  EXPECT_THAT(placed, HasSubstr("hint: raise cluster.power_mw where it limits a DC: big (powers 6 of 64 free), mid "
                                "(powers 6 of 32 free), small (powers 6 of 16 free)"));
  // One GPU powered in all: no shape holds the 7B model's 112 GB of state; the hint names the budget.
  const std::string memory = error_of([] {
    Config cfg = deck(kCluster, {"cluster.power_mw=0.0007 0 0", "cluster.pue=1"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(memory, HasSubstr("no plan fits: the model"));
  EXPECT_THAT(memory, HasSubstr("hint: raise cluster.power_mw where it limits a DC (big (powers 1 of 64 free), mid "
                                "(powers 0 of 32 free), small (powers 0 of 16 free)) or add GPUs"));
  // Residency: only small may hold the end stages, and its budget is what keeps them out.
  const std::string residency = error_of([] {
    Config cfg = deck(kCluster, {"cluster.may_hold_data=0 0 1", "cluster.power_mw=1 1 0.0007", "cluster.pue=1", "model.layers=80",
                                 "model.hidden=8192", "model.heads=64"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(residency, HasSubstr("no plan meets the data-residency constraint cluster.may_hold_data"));
  EXPECT_THAT(residency, HasSubstr("or add GPUs to small, or raise cluster.power_mw where it limits them: small (powers 1 "
                                   "of 16 free), so a pipeline can start and end there"));
}

TEST(PlanPower, ADecksOwnLayoutOverItsBudgetIsNamed) {
  // kCluster's layout: 2 stages x dp 4 x tp 8 = 64 GPUs in big. At 700 W x PUE 1.1 = 770 W a GPU
  // big's 30.8 kW powers 40 of them; 64 need 49.28 kW.
  Config cfg = deck(kCluster, {"cluster.power_mw=0.0308 1 1", "cluster.pue=1.1", "run.steps=10"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const std::vector<std::string> over = power_overruns(cfg, prof);
  ASSERT_EQ(over.size(), 1u);
  EXPECT_THAT(over[0], HasSubstr("DC big runs 64 GPUs, but its budget cluster.power_mw = 0.0308 MW powers 40 (700 W a "
                                 "GPU x PUE 1.1): 0.0493 MW needed"));
  EXPECT_THAT(over[0], HasSubstr("hint: give the DC fewer stages"));
  EXPECT_TRUE(power_overruns(deck(kCluster, {"cluster.power_mw=0.0493 0 0", "cluster.pue=1.1"}), prof).empty());
  EXPECT_TRUE(power_overruns(deck(kCluster), prof).empty());
  // What the layout draws: 64 x 0.77 kW = 49.28 kW; a step of one hour is 49.28 kWh, ten 492.8 kWh.
  EXPECT_EQ(energy_summary(cfg, prof, {64, 0, 0}, 3.6e6),
            "49.3 kW (GPUs x board power x PUE): 49.3 kWh a step; run.steps = 10: 493 kWh");
  Config green = deck(kCluster, {"cluster.pue=1.1", "cluster.carbon_g_per_kwh=100 0 0", "run.steps=10"});
  EXPECT_EQ(energy_summary(green, prof, {64, 0, 0}, 3.6e6),
            "49.3 kW (GPUs x board power x PUE): 49.3 kWh a step, 4.928 kg CO2 a step; run.steps = 10: 493 kWh, "
            "49.28 kg CO2");
  // Past a tonne, tonnes: 1000 steps of 4.928 kg.
  Config long_run = deck(kCluster, {"cluster.pue=1.1", "cluster.carbon_g_per_kwh=100 0 0", "run.steps=1000"});
  EXPECT_THAT(energy_summary(long_run, prof, {64, 0, 0}, 3.6e6), ::testing::EndsWith("49280 kWh, 4.928 t CO2"));
  sched::DeviceProfile no_power = prof;
  no_power.board_power_w = 0;
  EXPECT_EQ(energy_summary(cfg, no_power, {64, 0, 0}, 3.6e6), "");
}

TEST(PlanPower, EnergyAndEmissionsAddUp) {
  // GPUs x 700 W x PUE (per DC) x step, and x gCO2/kWh per DC.
  Config cfg = deck(kCluster, {"cluster.pue=1.1 1.3 1.5", "cluster.carbon_g_per_kwh=400 50 700"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult r = search(cfg, prof);
  const double pue[] = {1.1, 1.3, 1.5};
  const double carbon[] = {400, 50, 700};
  for (const Plan& p : r.plans) {
    double kwh = 0.0;
    double kg = 0.0;
    for (int dc = 0; dc < 3; ++dc) {
      const double e = p.stages_per_dc[static_cast<std::size_t>(dc)] * p.dp * p.tp * 0.7 * pue[dc] * p.step_ms / 3.6e6;
      kwh += e;
      kg += e * carbon[dc] / 1e3;
    }
    EXPECT_NEAR(p.energy_kwh_per_step, kwh, 1e-12 * kwh);
    EXPECT_NEAR(p.co2_kg_per_step, kg, 1e-12 * kg);
  }
  // One plan by hand: 64 GPUs of big alone draw 64 x 0.7 kW x 1.1 = 49.28 kW.
  for (const Plan& q : r.plans)
    if (q.dc_order == std::vector<int>{0} && q.gpus == 64) {
      EXPECT_NEAR(q.power_kw, 49.28, 1e-9);
    }
  const std::string table = what_if_table(r, cfg, 4);
  EXPECT_THAT(table, HasSubstr("kWh/step"));
  EXPECT_THAT(table, HasSubstr("kgCO2/step"));
  // The objectives: the chosen plan is the least by each.
  for (const auto& [name, obj] : std::vector<std::pair<std::string, PlanObjective>>{
           {"energy", PlanObjective::Energy}, {"carbon", PlanObjective::Carbon}, {"cost", PlanObjective::Cost}}) {
    Config c = deck(kCluster, {"cluster.pue=1.1 1.3 1.5", "cluster.carbon_g_per_kwh=400 50 700", "plan.objective=" + name});
    const PlanResult o = search(c, prof);
    EXPECT_EQ(o.objective, obj);
    const Plan& chosen = o.plans[static_cast<std::size_t>(o.chosen)];
    for (const Plan& q : o.plans) {
      const double a = obj == PlanObjective::Energy ? q.energy_kwh_per_step
                       : obj == PlanObjective::Carbon ? q.co2_kg_per_step : q.cost_per_step;
      const double b = obj == PlanObjective::Energy ? chosen.energy_kwh_per_step
                       : obj == PlanObjective::Carbon ? chosen.co2_kg_per_step : chosen.cost_per_step;
      EXPECT_GE(a, b * (1 - 1e-9)) << name;
    }
  }
  EXPECT_THAT(error_of([&] { (void)search(deck(kCluster, {"plan.objective=carbon"}), prof); }),
              HasSubstr("plan.objective = carbon needs each DC's grid carbon intensity"));
}

TEST(PlanResidency, TheDataStagesStayInDcsThatMayHoldThem) {
  // big may not hold the first or last stage: it may still hold middle stages.
  Config cfg = deck(kCluster, {"cluster.may_hold_data=0 1 1"});
  const sched::DeviceProfile prof = sched::device_profile(cfg);
  const PlanResult r = search(cfg, prof);
  ASSERT_FALSE(r.plans.empty());
  bool middle_in_big = false;
  for (const Plan& p : r.plans) {
    EXPECT_NE(p.dc_order.front(), 0);
    EXPECT_NE(p.dc_order.back(), 0);
    middle_in_big = middle_in_big || p.stages_per_dc[0] > 0;
  }
  EXPECT_TRUE(middle_in_big);
  // The emitted deck keeps the constraint with its DC.
  const Config out = plan_config(cfg, r.plans[0]);
  for (int dc = 0; dc < 3; ++dc)
    EXPECT_EQ(out.cluster.may_hold_data_of(dc), out.cluster.dcs[static_cast<std::size_t>(dc)] != "big");
  EXPECT_TRUE(out.cluster.may_hold_data_of(0));  // the pipeline starts in a DC that may
}

TEST(PlanResidency, ADecksOwnLayoutThatBreaksItIsNamed) {
  // kCluster's layout: 2 stages in big (the first and the last). big marked 0: named once.
  const std::vector<std::string> both = residency_violations(deck(kCluster, {"cluster.may_hold_data=0 1 1"}));
  ASSERT_EQ(both.size(), 1u);
  EXPECT_THAT(both[0], HasSubstr("DC big holds the pipeline's first and last stage, but cluster.may_hold_data marks it 0"));
  EXPECT_THAT(both[0], HasSubstr("hint: order cluster.dcs and parallel.stages_per_dc so the pipeline starts and ends"));
  // Stages in big, mid and small: the first in big, the last in small; mid's middle stage may sit anywhere.
  const Config three = deck(kCluster, {"parallel.stages_per_dc=1 1 1", "parallel.dp_size=2", "model.layers=33", "cluster.may_hold_data=1 0 0"});
  const std::vector<std::string> last = residency_violations(three);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_THAT(last[0], HasSubstr("DC small holds the pipeline's last stage"));
  EXPECT_TRUE(residency_violations(deck(kCluster, {"parallel.stages_per_dc=1 1 1", "parallel.dp_size=2", "model.layers=33",
                                                   "cluster.may_hold_data=1 0 1"}))
                  .empty());
  EXPECT_TRUE(residency_violations(deck(kCluster)).empty());  // no constraint
}

TEST(PlanResidency, AConstraintNoPlanCanMeetIsAClearError) {
  // 64.9B parameters x 16 bytes = 121 GiB a GPU on small's 8 GPUs (72 GiB usable); only small
  // may hold the end stages, and a pipeline over several DCs has its two ends in two DCs.
  const std::string msg = error_of([] {
    Config cfg = deck(kCluster, {"cluster.may_hold_data=0 0 1", "cluster.gpus_per_dc=64 32 8", "model.layers=80",
                                 "model.hidden=8192", "model.heads=64"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(msg, HasSubstr("no plan meets the data-residency constraint cluster.may_hold_data"));
  EXPECT_THAT(msg, HasSubstr("a DC marked 1 (small), not in big, mid"));
  EXPECT_THAT(msg, HasSubstr("hint: mark another DC 1 in cluster.may_hold_data, or add GPUs to small"));
  const std::string none = error_of([] {
    Config cfg = deck(kCluster, {"cluster.may_hold_data=0 0 0"});
    (void)search(cfg, sched::device_profile(cfg));
  });
  EXPECT_THAT(none, HasSubstr("a DC marked 1 (none is)"));
  EXPECT_THAT(none, HasSubstr("hint: mark at least one DC 1 in cluster.may_hold_data"));
  EXPECT_THAT(error_of([] { (void)deck(kCluster, {"cluster.may_hold_data=1 0"}); }),
              HasSubstr("cluster.may_hold_data has 2 entries; give none or one per DC (3)"));
}

// ---- designs ----

TEST(PlanDesigns, DpAcrossDcsPaysTheRingAllReduceOverOneFlow) {
  Config cfg = deck(kCluster, {"parallel.stages_per_dc=1 1 0", "cluster.gpus_per_dc=32 32 0",
                               "cluster.latency_ms=0 20 20 20 0 20 20 20 0"});
  const sched::DeviceProfile prof = sched::builtin_device_profile(GpuKind::H100);
  const Comparison c = compare_designs(cfg, prof);
  ASSERT_TRUE(c.a_fits);
  EXPECT_EQ(c.stages_a, 1);        // 7B fits one stage of tp 8
  EXPECT_EQ(c.pipelines_a, 8);     // 64 GPUs / 8
  EXPECT_EQ(c.micro_batches_a, 8); // global batch 64 kept
  // Ring over the two DCs, one TCP flow of 6 MiB window at 40 ms RTT, the whole model in bf16.
  const double grad = static_cast<double>(cfg.model.parameter_count()) * 2;
  const double one_flow = 6.0 * 1024 * 1024 / 40.0;
  EXPECT_NEAR(c.wan_allreduce_ms, 2.0 * 1 / 2 * grad / one_flow + 2 * 20.0, 1e-6);
  EXPECT_NEAR(c.wan_allreduce_cap_ms, 2.0 * 1 / 2 * grad / (100e9 / 8 / 1e3) + 2 * 20.0, 1e-6);
  EXPECT_NEAR(c.step_a_ms - c.step_a_cap_ms, c.wan_allreduce_ms - c.wan_allreduce_cap_ms, 1e-6);
  // (a') does the same compute in a shorter step: its utilization is (a)'s x step_a / step_a'
  // (it used to print (a)'s).
  EXPECT_NEAR(c.util_a_cap, c.util_a * c.step_a_ms / c.step_a_cap_ms, 1e-9);
  EXPECT_GT(c.util_a_cap, c.util_a);
  EXPECT_GT(c.step_b_ms, 0);
  EXPECT_GT(c.step_c_ms, 0);
  EXPECT_GE(c.util_d, c.util_c);
  EXPECT_LE(c.util_d, 1.0 + 1e-12);
}

TEST(PlanDesigns, PerDcBudgetsCarbonAndResidencyDoNotBreakTheComparison) {
  // Design (a) times one DC's job and the grid makes up its DCs: every per-DC list must follow
  // (it was an internal error: "design (a) made an invalid deck: cluster.power_mw has 3 entries").
  for (const std::string& key : {std::string("cluster.power_mw=1 1 1"), std::string("cluster.pue=1.1 1.2 1.3"),
                                 std::string("cluster.carbon_g_per_kwh=100 200 300"),
                                 std::string("cluster.may_hold_data=1 1 0")}) {
    Config cfg = deck(kCluster, {"parallel.stages_per_dc=1 1 0", "cluster.gpus_per_dc=32 32 0", key});
    const sched::DeviceProfile prof = sched::builtin_device_profile(GpuKind::H100);
    Comparison c;
    EXPECT_NO_THROW(c = compare_designs(cfg, prof)) << key;
    EXPECT_TRUE(c.a_fits) << key;
    EXPECT_GT(c.step_a_ms, 0) << key;
    GridSpec spec;
    spec.models = {"7b"};
    spec.dc_counts = {2};
    spec.latencies_ms = {10};
    spec.dps = {2};
    EXPECT_NO_THROW((void)run_grid(cfg, prof, spec, {})) << key;
  }
}

TEST(PlanDesigns, GridPointsKeepTheStatedShape) {
  const Config base = deck(kCluster);
  const sched::DeviceProfile prof = sched::builtin_device_profile(GpuKind::H100);
  GridSpec spec;
  const Config c = grid_config(base, prof, "175b", 3, 50.0, 4, spec);
  const int k = c.parallel.stages_per_dc.front();
  EXPECT_EQ(c.parallel.stages_per_dc, (std::vector<int>{k, k, k}));
  EXPECT_EQ(c.cluster.gpus_per_dc, (std::vector<int>{4 * 8 * k, 4 * 8 * k, 4 * 8 * k}));
  EXPECT_EQ(c.train.micro_batches, 4 * 3 * k);
  EXPECT_DOUBLE_EQ(c.cluster.latency(0, 2), 50.0);
  EXPECT_DOUBLE_EQ(c.cluster.latency(1, 1), 0.0);
  // k is the fewest stages with which one whole-model pipeline fits (so design (a) can run).
  ModelCfg m = model_preset("175b");
  m.layers_per_stage = split_layers(96, k - 1);
  EXPECT_GT(sim::peak_memory(m, k - 1, 8, 1, 4 * (k - 1), ScheduleKind::OneFOneB, prof).total(), prof.usable_bytes());
  spec.models = {"7b"};
  spec.dc_counts = {2};
  spec.latencies_ms = {10};
  spec.dps = {2};
  const auto rows = run_grid(base, prof, spec, {});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_GT(rows[0].speedup_c_over_b, 1.0);
  EXPECT_THAT(grid_csv(rows), HasSubstr("7b,2,10,2,8,2,1,32,8,"));
  EXPECT_THAT(grid_markdown(rows), HasSubstr("| 7b | 2 | 10 | 2 | 8 x 2 | 32 |"));
}

}  // namespace
}  // namespace atlas::plan
