// SPDX-License-Identifier: MIT
// `atlas bench sim`: measured speed of one simulated step at 10,000 GPUs and of one planner
// search over 1,024 GPUs in 4 DCs.
#include "atlas/sim/bench.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/core/stats.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sim/simulator.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sim {

namespace {

Config parse_text(const char* name, const std::string& text) {
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = true;
  Config cfg = deck::parse_and_validate(name, text, {}, shape);
  deck::read_device_profiles(cfg);
  return cfg;
}

/// The GPT-3 175B model, atlas schedule, 16 rails and the H100 profile of the step and scale decks.
constexpr const char* kGpt175bAtlas = R"(
model.layers = 96
model.hidden = 12288
model.heads = 96
model.seq_len = 2048
model.vocab = 50304
schedule.kind = atlas
wan.rails = 16
plan.gpu = h100
)";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Config bench_step_config() {
  return parse_text("bench_step", R"(
run.name = bench_sim_step
cluster.dcs = east central west south
cluster.gpus_per_dc = 2496 2496 2496 2496
cluster.latency_ms = 0 20 20 20  20 0 20 20  20 20 0 20  20 20 20 0
cluster.bandwidth_gbps = 0 100 100 100  100 0 100 100  100 100 0 100  100 100 100 0
cluster.intra_bandwidth_gbps = 400
parallel.stages_per_dc = 4 4 4 4
parallel.dp_size = 78
parallel.tp_size = 8
train.micro_batch_size = 1
train.micro_batches = 64
)" + std::string(kGpt175bAtlas));
}

Config bench_plan_config() {
  return parse_text("bench_plan", R"(
run.name = bench_sim_plan
cluster.dcs = east central west south
cluster.gpus_per_dc = 384 256 256 128
cluster.latency_ms = 0 10 30 40  10 0 20 30  30 20 0 15  40 30 15 0
cluster.bandwidth_gbps = 0 100 100 100  100 0 100 100  100 100 0 100  100 100 100 0
cluster.intra_bandwidth_gbps = 400
cluster.price_per_gpu_hour = 2.5 2.2 2.0 1.8
parallel.stages_per_dc = 4 0 0 0
parallel.dp_size = 8
parallel.tp_size = 8
model.layers = 80
model.hidden = 8192
model.heads = 64
model.seq_len = 2048
model.vocab = 50304
train.micro_batch_size = 1
train.micro_batches = 64
schedule.kind = atlas
wan.rails = 16
plan.gpu = h100
)");
}

/// The scale deck (#25): GPT-3 175B on 100,352 GPUs, 4 DCs of 25,088 (16 stages x dp 784 x tp 8,
/// 16 micro-batches of 4), the WAN of inputs/sim_gpt175b_4dc.deck. `one_dc`: the same GPUs in one DC.
Config bench_scale_config(bool one_dc) {
  const std::string wan = one_dc ? R"(
cluster.dcs = dc0
cluster.gpus_per_dc = 100352
cluster.latency_ms = 0
cluster.bandwidth_gbps = 100
parallel.stages_per_dc = 16
)"
                                 : R"(
cluster.dcs = us-east-1 us-west-2 eu-west-1 eu-central-1
cluster.gpus_per_dc = 25088 25088 25088 25088
cluster.latency_ms = 0 43.49 40.275 44.33   44.34 0 68.5 79.75   40.26 68.5 0 9.78   44.31 79.75 9.775 0
cluster.bandwidth_gbps = 0 100 100 100   100 0 100 100   100 100 0 100   100 100 100 0
parallel.stages_per_dc = 4 4 4 4
)";
  return parse_text("bench_scale", "run.name = bench_sim_scale\n" + wan + R"(
cluster.gpus_per_node = 8
cluster.intra_bandwidth_gbps = 400
parallel.dp_size = 784
parallel.tp_size = 8
train.micro_batch_size = 4
train.micro_batches = 16
)" + kGpt175bAtlas);
}

const atlas::bench::Spec& sim_bench_spec() {
  static const atlas::bench::Spec spec{
      "sim",
      "simulator speed: one step of a 10,000-GPU job; atlas simulate at 100,352 GPUs; planner searches at 1,024 "
      "(and 100,352) GPUs",
      "",
      {{"repeat", "N", "3", "timed runs of each (the median is reported)"},
       {"plan-100k", "", "", "also time a planner search over 100,352 GPUs (minutes on a 2-core machine)"}}};
  return spec;
}

int run_sim_bench(const atlas::bench::Args& args) {
  if (!args.positional.empty() || !args.overrides.empty())
    args.fail("unknown argument '" + (args.positional.empty() ? args.overrides : args.positional).front() +
              "' (its jobs are built in: bench_step_config, bench_plan_config)");
  const int repeat = args.integer("repeat", 1, 1000000);

  // ---- one simulated step at 10,000 GPUs ----
  const Config step_cfg = bench_step_config();
  const DeviceProfile prof = sched::device_profile(step_cfg);
  const topo::Layout layout(step_cfg.parallel);
  fmt::print("# bench sim: {} GPUs ({} DCs, tp {} x pp {} x dp {}), {:.0f}B parameters, {} micro-batches, "
             "profile {}\n",
             layout.world_size(), layout.dc_count(), layout.tp_size(), layout.pp_size(), layout.dp_size(),
             static_cast<double>(step_cfg.model.parameter_count()) / 1e9, step_cfg.train.micro_batches, prof.name);
  auto t0 = std::chrono::steady_clock::now();
  // The table the runtime would run (searched under the profile's costs, as `atlas simulate`'s).
  const sched::ScheduleTable deck_table = sched::build_schedule(step_cfg, layout);
  const double table_s = seconds_since(t0);
  std::vector<double> step_s;
  std::vector<double> onefoneb_s;
  SimResult r;
  for (int i = 0; i < repeat; ++i) {
    t0 = std::chrono::steady_clock::now();
    const sched::CostModel cost = sched::cost_model(step_cfg, layout, prof);
    // Tokens of the whole step (it left out train.micro_batch_size before).
    r = measure(sched::retime(deck_table, cost), cost, static_cast<double>(step_cfg.tokens_per_step()));
    step_s.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    (void)simulate(cost, ScheduleKind::OneFOneB, step_cfg.train.micro_batches, 1.0);
    onefoneb_s.push_back(seconds_since(t0));
  }
  std::size_t ops = 0;
  for (const auto& row : r.table.rows) ops += row.size();
  fmt::print("{:<46} {:>10.3f} s   ({} replica rows, {} slots, {} WAN transfers)\n",
             "atlas table build (profile costs, search)", table_s, r.table.rows.size(), ops,
             [&] { std::size_t n = 0; for (const auto& l : r.table.links) n += l.order.size(); return n; }());
  fmt::print("{:<46} {:>10.3f} s   (median of {}; predicted step {:.3f} s, {:.0f} tokens/s)\n",
             "one simulated step (atlas table re-timed)", median(step_s), repeat, r.step_ms / 1e3, r.tokens_per_s);
  fmt::print("{:<46} {:>10.3f} s   (median of {})\n", "one simulated step (1f1b, build + time)", median(onefoneb_s), repeat);

  // ---- one planner search: 1,024 GPUs over 4 DCs ----
  const Config plan_cfg = bench_plan_config();
  std::vector<double> plan_s;
  plan::PlanResult pr;
  for (int i = 0; i < repeat; ++i) {
    t0 = std::chrono::steady_clock::now();
    pr = plan::search(plan_cfg, sched::device_profile(plan_cfg));
    plan_s.push_back(seconds_since(t0));
  }
  const plan::Plan& best = pr.plans[static_cast<std::size_t>(pr.best)];
  fmt::print("{:<46} {:>10.3f} s   (median of {}; {} shapes, {} fit memory, {} placed, {} simulated; best tp {} "
             "pp {} dp {} mbs {}: {:.3f} s/step)\n",
             "planner search, 1,024 GPUs over 4 DCs (70B)", median(plan_s), repeat, pr.shapes, pr.fit_memory,
             pr.placed, pr.plans.size(), best.tp, best.pp, best.dp, best.micro_batch_size, best.step_ms / 1e3);

  // ---- atlas simulate at 100,352 GPUs: the deck's table (the whole atlas search) and its timing ----
  std::vector<double> scale_s;
  for (const bool one_dc : {false, true}) {
    const Config cfg = bench_scale_config(one_dc);
    const topo::Layout lay(cfg.parallel);
    t0 = std::chrono::steady_clock::now();
    const sched::ScheduleTable t = sched::build_schedule(cfg, lay);
    const sched::CostModel cost = sched::cost_model(cfg, lay, sched::device_profile(cfg));
    const SimResult s = measure(sched::retime(t, cost), cost, static_cast<double>(cfg.tokens_per_step()));
    scale_s.push_back(seconds_since(t0));
    fmt::print("{:<46} {:>10.3f} s   ({} rows; {} of {} atlas candidates timed, {} engine events; predicted step "
               "{:.3f} s)\n",
               one_dc ? "atlas simulate, 100,352 GPUs in one DC" : "atlas simulate, 100,352 GPUs over 4 DCs",
               scale_s.back(), s.table.rows.size(), t.atlas.candidates_timed, t.atlas.candidates_tried,
               t.atlas.engine_events, s.step_ms / 1e3);
  }
  double plan100k_s = 0.0;
  if (args.flag("plan-100k")) {
    const Config cfg = bench_scale_config(false);
    t0 = std::chrono::steady_clock::now();
    const plan::PlanResult big = plan::search(cfg, sched::device_profile(cfg));
    plan100k_s = seconds_since(t0);
    const plan::Plan& b = big.plans[static_cast<std::size_t>(big.best)];
    fmt::print("{:<46} {:>10.3f} s   ({} shapes, {} placed, {} simulated; best tp {} pp {} dp {} mbs {}: {:.3f} s/step)\n",
               "planner search, 100,352 GPUs over 4 DCs (175B)", plan100k_s, big.shapes, big.placed, big.plans.size(),
               b.tp, b.pp, b.dp, b.micro_batch_size, b.step_ms / 1e3);
  }

  const double scale = *std::max_element(scale_s.begin(), scale_s.end());
  const bool ok = median(step_s) <= 1.0 && median(plan_s) <= 1.0 && scale <= 10.0 && plan100k_s <= 60.0;
  fmt::print("{}", atlas::bench::footer(
                       "sim", fmt::format("one step {:.3f} s, planner 1,024 GPUs {:.3f} s, simulate 100,352 GPUs {:.3f} s{} "
                                          "(targets <= 1 s, <= 1 s, <= 10 s{}; wall clock on {} hardware threads): {}",
                                          median(step_s), median(plan_s), scale,
                                          args.flag("plan-100k") ? fmt::format(", planner 100,352 GPUs {:.1f} s", plan100k_s) : "",
                                          args.flag("plan-100k") ? ", <= 60 s" : "", std::thread::hardware_concurrency(),
                                          ok ? "OK" : "FAILED")));
  return ok ? 0 : 1;
}

}  // namespace atlas::sim
