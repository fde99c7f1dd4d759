// SPDX-License-Identifier: MIT
// `atlas simulate DECK`: the deck's schedule table timed by the simulator (step time, per-stage
// busy/idle, bubble map, WAN use, tokens/s, optional JSON timeline); --compare runs designs
// (a)-(d) for the deck; --grid runs the paper-reproduction grid and writes CSV + markdown.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/app/progress.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/units.hpp"
#include "atlas/bubbletea/cost.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/plan/designs.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/runtime/profile_reader.hpp"
#include "atlas/runtime/profile_writer.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sim/insitu.hpp"
#include "atlas/sim/profile.hpp"
#include "atlas/sim/sanity.hpp"
#include "atlas/sim/simulator.hpp"

namespace atlas::app {

namespace {

template <typename T>
std::vector<T> parse_list(const std::string& text, const char* option) {
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(item);
    } else if constexpr (std::is_same_v<T, int>) {
      const auto v = units::parse_int(item);
      if (!v || *v < 1 || *v > std::numeric_limits<int>::max())
        throw UsageError(fmt::format("--{} expects a comma-separated list of integers in [1, {}], got '{}'", option,
                                     std::numeric_limits<int>::max(), item));
      out.push_back(static_cast<int>(*v));
    } else {
      const auto v = units::parse_double(item);
      if (!v || *v < 0) throw UsageError(fmt::format("--{} expects a comma-separated list of numbers >= 0, got '{}'", option, item));
      out.push_back(*v);
    }
  }
  if (out.empty()) throw UsageError(fmt::format("--{} is empty", option));
  return out;
}

void write_file(const std::string& path, const std::string& text) { write_file_whole(path, text); }

/// A table with only the first `keep` DP replicas of each stage (for a readable bubble map).
sched::ScheduleTable trimmed(const sched::ScheduleTable& t, int keep) {
  if (t.dp <= keep) return t;
  sched::ScheduleTable out = t;
  out.dp = keep;
  out.rows.clear();
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < keep; ++d) out.rows.push_back(t.row(s, d));
  out.links.clear();  // link rows would show every pipeline's transfers
  return out;
}

int run_grid(const Config& base, const sched::DeviceProfile& prof, const Args& args) {
  plan::GridSpec spec;
  if (args.flag("models")) spec.models = parse_list<std::string>(args.option("models"), "models");
  if (args.flag("dcs")) spec.dc_counts = parse_list<int>(args.option("dcs"), "dcs");
  if (args.flag("latencies")) spec.latencies_ms = parse_list<double>(args.option("latencies"), "latencies");
  if (args.flag("dps")) spec.dps = parse_list<int>(args.option("dps"), "dps");
  plan::CompareOptions opt;
  opt.prefill_tokens = args.int_option("prefill-tokens", opt.prefill_tokens, 1, std::numeric_limits<int>::max());
  opt.planner = args.flag("planner");
  const std::string dir = args.option("out", "runs/sim_grid");
  std::filesystem::create_directories(dir);
  const std::size_t points = spec.models.size() * spec.dc_counts.size() * spec.latencies_ms.size() * spec.dps.size();
  fmt::print("# grid: {} points ({} models x {} DC counts x {} latencies x {} dp), profile {}, WAN {:g} Gbit/s, "
             "{} rails, prefill {} tokens\n",
             points, spec.models.size(), spec.dc_counts.size(), spec.latencies_ms.size(), spec.dps.size(), prof.name,
             base.cluster.bandwidth_gbps.size() == 1 ? base.cluster.bandwidth_gbps[0] : base.cluster.bandwidth(0, 1),
             base.wan.rails, opt.prefill_tokens);
  const auto rows = plan::run_grid(base, prof, spec, opt, [](const plan::GridRow& r) {
    fmt::print("  {:>5} {} DCs {:>5g} ms dp {:>2}: a {:9.2f} s  b {:8.2f} s  c {:8.2f} s  c* {:8.2f} s  c/a {:7.1f}x  "
               "c/b {:5.2f}x  util c {:3.0f}% d {:3.0f}%\n",
               r.model, r.dcs, r.latency_ms, r.dp, r.c.step_a_ms / 1e3, r.c.step_b_ms / 1e3, r.c.step_c_ms / 1e3,
               r.c.step_plan_ms / 1e3, r.speedup_c_over_a, r.speedup_c_over_b, 100 * r.c.util_c, 100 * r.c.util_d);
    std::fflush(stdout);
  });
  const std::string csv = dir + "/sim_grid.csv";
  const std::string md = dir + "/sim_grid.md";
  write_file(csv, plan::grid_csv(rows));
  write_file(md, plan::grid_markdown(rows));
  fmt::print("# wrote {} and {}\n# plot: /usr/bin/python3 scripts/plot_sim_grid.py {} {}/sim_grid.png\n", csv, md,
             csv, dir);
  return 0;
}

/// BubbleTea at the deck's scale (bubbletea.enabled): the simulated table's bubbles filled with
/// prefill chunks as the runtime's admission would (bubbletea::prefill_plan: FLOP-estimated chunk
/// times, the guard, the generator's demand); training slots and the step are unchanged.
/// Utilization per stage = (forward + backward + the optimizer's own time + prefill) / step, as
/// the runtime counts it (the gradient norm's WAN wait is not busy). Returns the filled table.
sched::ScheduleTable simulate_bubbletea(const Config& cfg, const sim::SimResult& r) {
  const topo::Layout layout(cfg.parallel);
  const sched::PrefillPlan plan = bubbletea::prefill_plan(cfg, layout, r.table);
  const sched::ScheduleTable filled = sched::place_prefill(r.table, plan);
  fmt::print("\n# BubbleTea (predicted): chunks of {} prompt tokens, guard {:.2f} ms, demand {}; training step "
             "unchanged ({:.3f} ms: training slots first)\n",
             bubbletea::planned_chunk_tokens(cfg.bubbletea), cfg.bubbletea.guard_ms,
             cfg.bubbletea.trace.empty() && cfg.bubbletea.rate_per_s > 0
                 ? fmt::format("{:g} requests/s", cfg.bubbletea.rate_per_s)
                 : std::string("unbounded (trace or rate 0)"),
             filled.step_ms);
  fmt::print("# {:<12} {:>5} {:>10} {:>10} {:>9} {:>9}\n", "dc", "stage", "util_off%", "util_on%", "prefill%", "idle%");
  double off_sum = 0.0, on_sum = 0.0;
  for (int s = 0; s < filled.pp; ++s) {
    double off = 0.0, on = 0.0, pre = 0.0, idle = 0.0;
    for (int d = 0; d < filled.dp; ++d)
      for (const auto& sl : filled.row(s, d)) {
        const double busy = sched::is_compute(sl.kind) ? sl.duration_ms
                            : sl.kind == sched::SlotKind::Optimizer
                                ? std::min(sl.duration_ms, r.cost.optimizer_ms[static_cast<std::size_t>(s)])
                                : 0.0;
        off += busy;
        if (sl.kind == sched::SlotKind::Prefill) pre += sl.duration_ms;
        if (sl.kind == sched::SlotKind::Idle) idle += sl.duration_ms;
      }
    on = off + pre;
    const double denom = filled.step_ms * filled.dp;
    off_sum += off / denom;
    on_sum += on / denom;
    const int dc = filled.stage_dc[static_cast<std::size_t>(s)];
    fmt::print("  {:<12} {:>5} {:>10.1f} {:>10.1f} {:>9.1f} {:>9.1f}\n",
               static_cast<std::size_t>(dc) < cfg.cluster.dcs.size() ? cfg.cluster.dcs[static_cast<std::size_t>(dc)]
                                                                       : std::to_string(dc),
               s, 100 * off / denom, 100 * on / denom, 100 * pre / denom, 100 * idle / denom);
  }
  fmt::print("utilization      off {:.1f}% -> on {:.1f}% (all ranks)\n", 100 * off_sum / filled.pp,
             100 * on_sum / filled.pp);
  fmt::print("prefill          {:.0f} prompt tokens/s (each inference pipeline's slowest stage, summed)\n",
             bubbletea::predicted_prefill_tokens_per_s(cfg.bubbletea.pipeline, filled, layout));
  // The request stream over run.steps steps, FIFO per DC, through every slot the bubbles hold.
  sched::PrefillPlan capacity = plan;
  capacity.max_tokens_per_row = 1e300;
  const bubbletea::ServicePrediction sp =
      bubbletea::predict_service(cfg, layout, sched::place_prefill(r.table, capacity), cfg.run.steps);
  fmt::print("requests         {} of {} arrived in {} steps prefilled, {:.0f} prompt tokens/s; TTFT p50 {:.1f} ms, p99 "
             "{:.1f} ms\n",
             sp.served, sp.arrived, cfg.run.steps, sp.tokens_per_s, sp.ttft_p50_ms, sp.ttft_p99_ms);
  return filled;
}

/// `--profile FILE` / `--trace FILE`: the simulated timeline of `--steps N` steps (default 3) in the
/// format of a real run's profile.h5 (source "simulated") and trace.json, so `atlas report` and
/// Perfetto read a simulation like a run.
void write_simulated_profile(const Config& cfg, const sim::SimResult& r, const Args& args) {
  const int steps = args.int_option("steps", 3, 1, 1000);
  const topo::Layout layout(cfg.parallel);
  std::size_t per_step = 0;
  for (const auto& row : r.table.rows) per_step += row.size();
  const double events = static_cast<double>(per_step) * r.table.tp * steps;
  constexpr double kMaxEvents = 5e7;  // 48 bytes each in memory, twice that in the file
  if (events > kMaxEvents)
    throw UsageError(fmt::format("--profile/--trace: {:.3g} events ({} ranks x {} steps) is more than {:.0g}; use "
                                 "fewer --steps (or simulate a smaller dp: every DP replica's row is alike)",
                                 events, layout.world_size(), steps, kMaxEvents));
  const auto ev = runtime::table_events(r.table, layout, steps);
  if (args.flag("profile")) {
    const std::string out = args.option("profile");
    runtime::ProfileMeta meta;
    meta.run_name = cfg.run.name;
    meta.deck = deck::resolved_deck(cfg);
    meta.dc_names = cfg.cluster.dcs;
    meta.hosts.assign(static_cast<std::size_t>(layout.world_size()), "simulated");
    meta.table = &r.table;
    meta.layout = &layout;
    meta.source = "simulated";
    runtime::write_profile(out, meta, ev, runtime::table_steps(r.table, layout, steps, r.tokens_per_step));
    fmt::print("# wrote {} ({} events, {} simulated steps; `atlas report {}` reads it)\n", out, ev.size(), steps, out);
  }
  if (args.flag("trace")) {
    const std::string out = args.option("trace");
    write_file(out, runtime::chrome_trace_json(ev, runtime::trace_labels(layout, r.table, cfg.cluster.dcs)));
    fmt::print("# wrote {} ({} events; open in https://ui.perfetto.dev)\n", out, ev.size());
  }
}

/// --compute-from RUN: each stage's forward and backward cost measured in situ in a run's
/// profile.h5 (sim::insitu_compute: the median slot that ran while no more ranks of its host
/// computed than it has cores), in place of the device profile's. Returns the lines to print.
std::string compute_from_run(const Config& cfg, const Args& args, sim::SimOptions& opt) {
  const std::string from = args.option("compute-from");
  const int skip = args.int_option("skip-steps", 1);
  if (skip < 0) throw UsageError("--skip-steps must be >= 0 (steps of the run not measured: 1 skips the first)");
  const runtime::ProfileSlots run = runtime::read_profile_slots(from);
  const int pp = cfg.parallel.pp_size();
  int run_pp = 0;
  for (int st : run.rank_stage) run_pp = std::max(run_pp, st + 1);
  if (run_pp != pp)
    throw ConfigError("--compute-from " + from + ": the run has " + std::to_string(run_pp) +
                      " pipeline stages, the deck " + std::to_string(pp) +
                      "\n  hint: measure the deck's own layout (atlas train DECK writes runs/NAME/profile.h5), or "
                      "simulate the run's deck");
  // Hosts by name, in order of first appearance.
  std::vector<std::string> names;
  std::vector<int> rank_host;
  for (const auto& h : run.rank_host) {
    const auto it = std::find(names.begin(), names.end(), h);
    rank_host.push_back(static_cast<int>(it - names.begin()));
    if (it == names.end()) names.push_back(h);
  }
  const bool deck_cores = cfg.cluster.cores_per_host > 0;
  const double cores =
      deck_cores ? cfg.cluster.cores_per_host : static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<sim::ComputeSpan> spans;
  spans.reserve(run.events.size());
  for (const auto& e : run.events)
    spans.push_back({e.world_rank, run.rank_stage[static_cast<std::size_t>(e.world_rank)], e.step,
                     static_cast<sched::SlotKind>(e.kind), e.start_s, e.end_s});
  // --skip-steps counts from the first recorded step (a resumed run's start past 0), as atlas
  // report's does.
  const int first_step = sim::first_step_after(spans, skip);
  sim::InSituCompute ic;
  try {
    ic = sim::insitu_compute(spans, pp, rank_host, cores, first_step);
  } catch (const Error& e) {
    throw ConfigError("--compute-from " + from + ": " + e.what());
  }
  opt.stage_fwd_ms = ic.fwd_ms;
  opt.stage_bwd_ms = ic.bwd_ms;
  // The slots carry the host CPU the run's WAN transfers took; the network term takes it again.
  opt = sim::without_network_share(cfg, cfg, opt);
  std::string s = fmt::format(
      "# compute in situ from {} (run {}{}, steps from {}): per stage the median forward / backward slot that ran "
      "while at most {:g} ranks of its host computed ({}; {} ranks on {} host(s)), in place of the profile's\n",
      from, run.run_name, run.source == "measured" ? "" : ", " + run.source, first_step, cores,
      deck_cores ? "cluster.cores_per_host" : "this machine's hardware threads", run.rank_stage.size(), names.size());
  for (int st = 0; st < pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
    s += fmt::format("#   stage {:>3}: forward {:.3f} ms ({} slots), backward {:.3f} ms ({} slots){}{}\n", st, ic.fwd_ms[i],
                     ic.fwd_samples[i], ic.bwd_ms[i], ic.bwd_samples[i],
                     ic.fwd_samples[i] == 0 || ic.bwd_samples[i] == 0 ? "  (none ran unshared: the shortest)" : "",
                     opt.stage_fwd_ms[i] == ic.fwd_ms[i] && opt.stage_bwd_ms[i] == ic.bwd_ms[i]
                         ? ""
                         : fmt::format("; {:.3f} / {:.3f} ms without the network's CPU", opt.stage_fwd_ms[i],
                                       opt.stage_bwd_ms[i]));
  }
  if (cfg.cluster.host_net_ns_per_byte > 0)
    s += fmt::format("#   the run's slots carry the host CPU its WAN transfers took: each stage's costs are divided "
                     "by the median stretch cluster.host_net_ns_per_byte = {:g} gives its slots, so the simulation charges "
                     "that CPU once (sim::without_network_share)\n",
                     cfg.cluster.host_net_ns_per_byte);
  return s;
}

/// The deck's layout against the cluster's constraints: a DC over its power budget, an end stage
/// where cluster.may_hold_data forbids it (warnings: a what-if may mean it).
void warn_about_layout(const Config& cfg, const sched::DeviceProfile& prof) {
  for (const auto& w : plan::power_overruns(cfg, prof)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  for (const auto& w : plan::residency_violations(cfg)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
}

}  // namespace

int cmd_simulate(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  keep_heap_for_reuse();
  const Args args = parse_args(ctx.args,
                               {"json", "width", "wan", "out", "models", "dcs", "latencies", "dps", "prefill-tokens",
                                "rows", "profile", "trace", "steps", "compute-scale", "compute-from", "skip-steps", "progress-after"},
                               {"search", "gantt", "compare", "grid", "quiet", "planner", "ignore-memory"});
  const std::string path = deck_path(args, "simulate");
  for (const char* file : {"json", "profile", "trace"})
    if (args.flag(file)) check_output_file("atlas simulate", std::string("--") + file, args.option(file));
  std::vector<std::string> overrides;
  if (args.flag("wan")) overrides = sim::wan_profile_overrides(args.option("wan"), path, args.overrides);
  overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
  const Config cfg = load_offline_deck(path, overrides);
  const sched::DeviceProfile prof = sched::device_profile(cfg);

  // The two modes read their own options only: one of the deck's simulation given with them was
  // ignored silently (--compare --json wrote nothing; --width 3, out of range, passed).
  if (args.flag("grid")) {
    only_options(args, "simulate --grid",
                 {"grid", "models", "dcs", "latencies", "dps", "prefill-tokens", "planner", "out", "wan", "quiet"});
    return run_grid(cfg, prof, args);
  }

  if (args.flag("compare")) {
    only_options(args, "simulate --compare", {"compare", "prefill-tokens", "wan", "progress-after", "quiet"});
    plan::CompareOptions opt;
    opt.prefill_tokens = args.int_option("prefill-tokens", opt.prefill_tokens, 1, std::numeric_limits<int>::max());
    opt.planner = true;
    // Designs (b) and (c) run the deck's layout: said as for the deck's own simulation.
    warn_about_layout(cfg, prof);
    const plan::Comparison c = [&] {
      Progress progress("atlas simulate --compare", progress_after_s(args));
      progress.set("timing designs (a)-(d) and the planner's plan");
      return plan::compare_designs(cfg, prof, opt);
    }();
    fmt::print("# deck {}: {} GPUs (tp {} x pp {} x dp {}), {} micro-batches of {}, profile {}\n", path, c.gpus, c.tp,
               c.pp, c.dp, c.micro_batches, c.micro_batch_size, prof.name);
    const std::string name_a =
        fmt::format("(a) DP across DCs, {} pipelines of {} stages, WAN all-reduce 1 flow", c.pipelines_a, c.stages_a);
    const std::string name_c = fmt::format("(c) ATLAS: {} rails, temporal sharing, heuristic placement", cfg.wan.rails);
    // The design column as wide as its longest name, so every row's figures line up.
    const std::size_t w = std::max<std::size_t>({58, name_a.size(), name_c.size()});
    fmt::print("# {:<{}} {:>12} {:>10} {:>10}\n", "design", w, "step_s", "util%", "vs (c)");
    // A design whose table does not fit the device's memory is timed, but flagged on its row.
    auto misfit = [&](bool fits, double bytes) {
      return fits ? std::string()
                  : fmt::format("   DOES NOT FIT: {:.1f} GiB per GPU, {:.1f} GiB usable on {}",
                                bytes / static_cast<double>(units::kGiB),
                                c.mem_limit_bytes / static_cast<double>(units::kGiB),
                                sched::memory_owner(cfg, prof.name));
    };
    auto row = [&](const std::string& name, double ms, double util, const std::string& note = {}) {
      fmt::print("  {:<{}} {:>12.3f} {:>9.1f}% {:>9.2f}x{}\n", name, w, ms / 1e3, 100 * util, ms / c.step_c_ms, note);
    };
    if (c.a_fits) {
      row(name_a, c.step_a_ms, c.util_a);
      row("(a') the same, WAN all-reduce at full link capacity", c.step_a_cap_ms, c.util_a_cap);
    } else {
      fmt::print("  {:<{}} {:>12}\n", "(a) DP across DCs", w, "no whole-model pipeline fits one DC's GPUs");
    }
    row("(b) PP across DCs, 1F1B, 1 TCP flow per transfer, shared", c.step_b_ms, c.util_b,
        misfit(c.b_fits(), c.mem_b_bytes));
    row(name_c, c.step_c_ms, c.util_c, misfit(c.c_fits(), c.mem_c_bytes));
    fmt::print("  {:<{}} {:>12.3f} {:>9.1f}% {:>9.2f}x   (tp {} x pp {} x dp {} = {} GPUs in {} DC(s))\n",
               cfg.cluster.power_mw.empty() ? "(c*) ATLAS planner's fastest plan, same GPUs and batch"
                                            : "(c*) ATLAS planner's fastest plan, same batch, within power",
               w, c.step_plan_ms / 1e3, 100 * c.util_plan,
               c.step_plan_ms / c.step_c_ms, c.plan_tp, c.plan_pp, c.plan_dp, c.plan_gpus, c.plan_dcs);
    fmt::print("  {:<{}} {:>12} {:>9.1f}%   (Idle slots filled by {}-token prefills)\n", "(d) ATLAS + BubbleTea (modelled)",
               w, "-", 100 * c.util_d, opt.prefill_tokens);
    return 0;
  }

  // The deck's own simulation reads these only, and each of the last four only beside the option
  // it shapes: --dps 4,8 --out DIR (the grid's) ran a plain simulation without a word.
  only_options(args, "simulate",
               {"json", "wan", "search", "gantt", "width", "rows", "profile", "trace", "steps", "compute-scale",
                "compute-from", "skip-steps", "progress-after", "quiet", "ignore-memory"});
  const auto needs = [&](const char* option, bool given, const char* with) {
    if (args.flag(option) && !given)
      throw UsageError(fmt::format("--{} applies to {} only\n  hint: add {}, or drop --{}", option, with, with, option));
  };
  needs("width", args.flag("gantt"), "--gantt");
  needs("rows", args.flag("gantt"), "--gantt");
  needs("steps", args.flag("profile") || args.flag("trace"), "--profile or --trace");
  needs("skip-steps", args.flag("compute-from"), "--compute-from");

  sim::SimOptions opt;
  opt.source = args.flag("search") ? sim::TableSource::Search : sim::TableSource::Deck;
  if (args.flag("compute-scale")) {
    const auto k = units::parse_double(args.option("compute-scale"));
    if (!k || !(*k > 0) || *k > 1e6)
      throw UsageError("--compute-scale needs a number > 0 (e.g. 1.3: every compute cost 30% longer)");
    opt.compute_scale = *k;
  }
  std::string in_situ_note;
  if (args.flag("compute-from")) in_situ_note = compute_from_run(cfg, args, opt);
  const sim::SimResult r = [&] {
    Progress progress("atlas simulate", progress_after_s(args));
    progress.set(fmt::format("timing the {} schedule table", opt.source == sim::TableSource::Deck ? "deck's" : "searched"));
    return sim::simulate(cfg, prof, opt);
  }();
  for (const auto& w : sim::sanity_warnings(cfg, r.step_ms)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  // A table that does not fit the device's memory is not a plan to time: refuse it, naming the
  // memory, the limit and the fixes (--ignore-memory times it anyway, flagged).
  const sched::ScheduleMemory mem = sched::memory_per_gpu(r.cost, r.table);
  if (!mem.fits() && !args.flag("ignore-memory"))
    throw ConfigError(sched::memory_misfit(mem, r.table, cfg, prof.name) +
                      "\n  (atlas simulate --ignore-memory times it anyway)");
  fmt::print("{}", in_situ_note);
  if (mem.known())
    fmt::print("# memory per GPU: {:.2f} GiB (stage {}) of {:.2f} GiB usable on {}{}\n",
               mem.peak_bytes / static_cast<double>(units::kGiB), mem.peak_stage,
               mem.limit_bytes / static_cast<double>(units::kGiB), sched::memory_owner(cfg, prof.name),
               mem.fits() ? "" : ": DOES NOT FIT (--ignore-memory)");
  warn_about_layout(cfg, prof);
  if (const std::string e = plan::energy_summary(cfg, prof, plan::deck_gpus_per_dc(cfg), r.step_ms); !e.empty())
    fmt::print("# power: {} GPUs draw {}\n", cfg.parallel.world_size(), e);
  fmt::print("# deck {}: {}{}\n", path,
             opt.source == sim::TableSource::Deck ? "the runtime's schedule table, timed by the simulator"
                                                  : "a schedule table built from the simulator's costs (--search)",
             prof.path.empty() ? " (built-in profile)" : fmt::format(" (profile {})", prof.path));
  if (r.cost.ranks_per_host > 0)
    fmt::print("# shared hosts: {} ranks per host on {:g} cores (processor sharing); a waiting receiver's wake-up "
               "delay {:g} us per message while the cores are all busy (cluster.host_wake_us{}); {:g} ns of host CPU "
               "per WAN byte (cluster.host_net_ns_per_byte)\n",
               r.cost.ranks_per_host, r.cost.cores_per_host, r.cost.wake_ms * 1e3,
               r.cost.wake_ms > 0 ? "" : "; `atlas bench fidelity` under mpirun measures this host's",
               r.cost.net_ns_per_byte);
  fmt::print("{}", sim::report(r, cfg.cluster.dcs));
  if (args.flag("gantt")) {
    const int width = args.int_option("width", 100, 10, 1000);
    const int keep = args.int_option("rows", 4, 1, std::numeric_limits<int>::max());
    const sched::ScheduleTable shown = trimmed(r.table, keep);
    if (shown.dp < r.table.dp)
      fmt::print("\n# bubble map: the first {} of {} DP replicas per stage (--rows N shows more)\n", shown.dp, r.table.dp);
    fmt::print("\n{}", sched::gantt(shown, cfg.cluster.dcs, width));
  }
  if (args.flag("json")) {
    const std::string out = args.option("json");
    write_file(out, sched::to_json(r.table, cfg.cluster.dcs));
    fmt::print("# wrote {}\n", out);
  }
  if (cfg.bubbletea.enabled) {
    sim::SimResult with = r;
    with.table = simulate_bubbletea(cfg, r);
    if (args.flag("profile") || args.flag("trace")) write_simulated_profile(cfg, with, args);
    return 0;
  }
  if (args.flag("profile") || args.flag("trace")) write_simulated_profile(cfg, r, args);
  return 0;
}

}  // namespace atlas::app
