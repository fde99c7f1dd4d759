// SPDX-License-Identifier: MIT
// `atlas bench NAME ...`: side-by-side benchmarks. Each prints ratios of things measured in the
// same run (this machine is shared and noisy), never a timed assertion. The training benchmarks
// (step, schedules, profile) run several training jobs inside one MPI job.
#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <cstdio>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "atlas/app/bench_ablation.hpp"
#include "atlas/app/commands.hpp"
#include "atlas/app/training_job.hpp"
#include "atlas/bench/harness.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/paths.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/bubbletea/bench.hpp"
#include "atlas/io/bench.hpp"
#include "atlas/model/bench.hpp"
#include "atlas/runtime/net_cpu_probe.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/runtime/wake_probe.hpp"
#include "atlas/sim/bench.hpp"
#include "atlas/sim/insitu.hpp"
#include "atlas/sim/simulator.hpp"
#include "atlas/sim/bench_validate.hpp"
#include "atlas/topo/layout.hpp"
#include "atlas/wan/bench.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::app {

namespace {

/// Loads DECK (default inputs/default.deck) + overrides, validated for a job of `ranks` ranks.
Config bench_deck(const mpi::Comm& world, const bench::Args& args, const std::vector<std::string>& extra, int ranks) {
  const std::string path = args.deck("inputs/default.deck");
  std::vector<std::string> ov = extra;
  ov.insert(ov.end(), args.overrides.begin(), args.overrides.end());
  deck::JobShape shape;
  shape.world_size = ranks;
  shape.cuda_built = cuda_built();
  // deck::load reads on rank 0 and broadcasts, so a missing deck is an error on every rank.
  return deck::load(world, path, ov, shape);
}

const std::vector<std::string> kQuietRun = {"ckpt.every_steps=0", "ckpt.final=false", "train.eval_every_steps=0",
                                            "profile.trace_json=false"};

std::vector<std::string> with(std::vector<std::string> base, std::initializer_list<std::string> more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

/// Runs the deck `rounds` times with `key=false` then `key=true` (interleaved, so a drift of the
/// shared machine hits both) and hands each job's result to `take(on, cfg, result)`.
void interleaved_off_on(const mpi::Comm& world, const bench::Args& args, const std::string& steps, int rounds,
                        const std::string& key, const std::string& run_name,
                        const std::function<void(bool, const Config&, const JobResult&)>& take) {
  JobOptions quiet;
  quiet.quiet = true;
  for (int r = 0; r < rounds; ++r) {
    for (bool on : {false, true}) {
      const Config cfg = bench_deck(
          world, args, with(kQuietRun, {steps, key + "=" + (on ? "true" : "false"), "run.name=" + run_name}),
          world.size());
      take(on, cfg, run_training_job(cfg, world, quiet));
    }
  }
}

// ---- atlas bench step: tokens/s of a deck at 1 rank and at the job's N ranks ----
int bench_step(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 1, 1000000000));
  const Config full = bench_deck(world, args, with(kQuietRun, {steps, "run.name=bench_step_n"}), world.size());
  // The same model and global batch on one rank: every stage in the first DC, dp 1, tp 1, and
  // dp x micro-batches micro-batches.
  std::string one_stage = "parallel.stages_per_dc=1";
  for (std::size_t i = 1; i < full.cluster.dcs.size(); ++i) one_stage += " 0";
  const Config one = bench_deck(
      world, args,
      with(kQuietRun, {steps, "run.name=bench_step_1", one_stage, "parallel.dp_size=1", "parallel.tp_size=1",
                       "train.micro_batches=" + std::to_string(full.train.micro_batches * full.parallel.dp_size),
                       "model.layers_per_stage=\"\""}),
      1);
  JobOptions quiet;
  quiet.quiet = true;
  JobResult r1;
  if (world.rank() == 0) r1 = run_training_job(one, mpi::Comm::self(), quiet);
  // The others wait asleep (MPI_Barrier busy-polls): their spinning took cores from the 1-rank
  // baseline on a shared host and inflated the speedup.
  MPI_Request raw = MPI_REQUEST_NULL;
  ATLAS_MPI_CHECK(MPI_Ibarrier(world.get(), &raw));
  mpi::Request(raw).wait_polling(1000);
  const JobResult rn = run_training_job(full, world, quiet);
  if (world.rank() == 0) {
    fmt::print("# atlas bench step: the same model and global batch ({} tokens/step), {} timed steps\n",
               static_cast<long long>(full.tokens_per_step()),
               rn.timed_steps);
    const bench::Table t({{"ranks", "", 6}, {"step", "ms", 12}, {"tokens", "1/s", 12}, {"loss", "", 10}});
    fmt::print("{}", t.head());
    for (const auto& [ranks, r] : {std::pair<int, const JobResult&>{1, r1}, {world.size(), rn}})
      fmt::print("{}", t.row({std::to_string(ranks), fmt::format("{:.1f}", r.mean_step_s * 1e3),
                              fmt::format("{:.0f}", r.tokens_per_s), fmt::format("{:.4f}", r.losses.back())}));
    fmt::print("speedup: {:.2f} x with {} ranks (on {} hardware threads of this host)\n",
               rn.tokens_per_s / std::max(r1.tokens_per_s, 1e-12), world.size(), std::thread::hardware_concurrency());
  }
  return 0;
}

// ---- atlas bench schedules: gpipe, 1f1b and atlas of one deck, measured vs predicted ----
int bench_schedules(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 1, 1000000000));
  struct Row {
    const char* kind;
    JobResult r;
  };
  std::vector<Row> rows;
  JobOptions quiet;
  quiet.quiet = true;
  for (const char* kind : {"gpipe", "1f1b", "atlas"}) {
    const Config cfg = bench_deck(world, args,
                                  with(kQuietRun, {steps, std::string("schedule.kind=") + kind,
                                                   std::string("run.name=bench_schedules_") + kind}),
                                  world.size());
    rows.push_back({kind, run_training_job(cfg, world, quiet)});
  }
  if (world.rank() != 0) return 0;
  fmt::print("# atlas bench schedules: {} ranks, {} timed steps each; measured = mean step of rank 0, bubble = 1 - "
             "mean over ranks of compute/wall\n",
             world.size(), rows[0].r.timed_steps);
  const bench::Table t({{"kind", "", 6, true},
                        {"measured", "ms", 12},
                        {"predicted", "ms", 13},
                        {"ratio", "", 8},
                        {"meas_bubble", "%", 14},
                        {"pred_bubble", "%", 14},
                        {"loss", "", 10}});
  fmt::print("{}", t.head());
  for (const auto& row : rows)
    fmt::print("{}", t.row({row.kind, fmt::format("{:.1f}", row.r.mean_step_s * 1e3),
                            fmt::format("{:.1f}", row.r.predicted_step_ms),
                            fmt::format("{:.3f}", row.r.mean_step_s * 1e3 / row.r.predicted_step_ms),
                            fmt::format("{:.1f}", 100 * row.r.measured_bubble),
                            fmt::format("{:.1f}", 100 * row.r.predicted_bubble),
                            // device.backend = emulated computes no loss
                            std::isfinite(row.r.losses.back()) ? fmt::format("{:.4f}", row.r.losses.back()) : "n/a"}));
  const auto& g = rows[0].r;
  const auto& o = rows[1].r;
  const auto& a = rows[2].r;
  fmt::print("atlas/1f1b: measured {:.3f} predicted {:.3f}; atlas/gpipe: measured {:.3f} predicted {:.3f}\n",
             a.mean_step_s / o.mean_step_s, a.predicted_step_ms / o.predicted_step_ms, a.mean_step_s / g.mean_step_s,
             a.predicted_step_ms / g.predicted_step_ms);
  return 0;
}

// ---- atlas bench profile: recording overhead, profile off vs on, interleaved ----
int bench_profile(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 1, 1000000000));
  const int rounds = args.integer("rounds", 1, 1000000);
  double off = 0.0, on = 0.0;
  interleaved_off_on(world, args, steps, rounds, "profile.enabled", "bench_profile",
                     [&](bool enabled, const Config&, const JobResult& res) {
                       (enabled ? on : off) += res.mean_step_s / rounds;
                     });
  // The recording path itself, timed in isolation: what one slot costs (two clock reads and one
  // store), times the slots a step records on a rank, over the step time.
  const Config cfg = bench_deck(world, args, with(kQuietRun, {steps}), world.size());
  const topo::Layout layout(world.size(), cfg.parallel);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  std::size_t max_row = 0;
  for (const auto& row : table.rows) max_row = std::max(max_row, row.size());
  constexpr int kEvents = 1000000;
  runtime::Profiler probe(true, 0, kEvents);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) {
    runtime::SlotEvent e;
    e.slot_index = i;
    e.start_s = probe.now();
    e.end_s = probe.now();
    probe.record(e);
  }
  const double ns_per_event =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kEvents;
  if (world.rank() == 0) {
    fmt::print("# atlas bench profile: {} rounds of off/on, mean step of rank 0\n", rounds);
    fmt::print("  profile off {:.2f} ms, on {:.2f} ms: end-to-end difference {:+.2f}% (noise on a shared host is of "
               "this order)\n",
               off * 1e3, on * 1e3, 100.0 * (on - off) / off);
    const double per_step = ns_per_event * 1e-9 * static_cast<double>(max_row);
    fmt::print("  recording one slot: {:.1f} ns; the longest row records {} slots a step: {:.4f} ms of a {:.2f} ms step\n",
               ns_per_event, max_row, per_step * 1e3, off * 1e3);
    fmt::print("overhead: {:.4f}% of step time from the recording path (goal < 1%)\n", 100.0 * per_step / off);
  }
  return 0;
}

// ---- atlas bench overlap: DP gradient sums at the AllReduce slot vs during the last backward ----
int bench_overlap(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 1, 1000000000));
  const int rounds = args.integer("rounds", 1, 1000000);
  struct Side {
    double step_s = 0, allreduce_s = 0, compute_s = 0, early = 0;
    std::vector<double> losses;
  } sides[2];
  int dp = 1;
  interleaved_off_on(world, args, steps, rounds, "train.dp_overlap", "bench_overlap",
                     [&](bool on, const Config& cfg, const JobResult& res) {
                       dp = cfg.parallel.dp_size;
                       Side& sd = sides[on ? 1 : 0];
                       sd.step_s += res.mean_step_s / rounds;
                       sd.allreduce_s += res.mean_allreduce_s / rounds;
                       sd.compute_s += res.mean_compute_s / rounds;
                       sd.early += res.dp_buckets_early / rounds;
                       sd.losses = res.losses;
                     });
  if (world.rank() != 0) return 0;
  if (dp < 2) fmt::print("# note: parallel.dp_size is {}: there is no DP all-reduce to overlap\n", dp);
  fmt::print("# atlas bench overlap: {} ranks, dp {}, {} rounds of off/on interleaved; AllReduce slot and compute are "
             "per step, mean over ranks; step is rank 0's\n",
             world.size(), dp, rounds);
  const bench::Table t({{"train.dp_overlap", "", 22, true},
                        {"step", "ms", 10},
                        {"allreduce", "ms", 14},
                        {"compute", "ms", 12},
                        {"early_buckets", "%", 16},
                        {"loss", "", 10}});
  fmt::print("{}", t.head());
  for (int on = 0; on < 2; ++on)
    fmt::print("{}", t.row({on ? "true" : "false", fmt::format("{:.2f}", sides[on].step_s * 1e3),
                            fmt::format("{:.2f}", sides[on].allreduce_s * 1e3),
                            fmt::format("{:.2f}", sides[on].compute_s * 1e3), fmt::format("{:.0f}", 100 * sides[on].early),
                            fmt::format("{:.4f}", sides[on].losses.empty() ? 0.0 : sides[on].losses.back())}));
  const bool same = sides[0].losses == sides[1].losses;
  fmt::print("overlap: AllReduce slot {:.2f} -> {:.2f} ms ({:.2f} x), step {:.2f} -> {:.2f} ms ({:.3f} x); losses {}\n",
             sides[0].allreduce_s * 1e3, sides[1].allreduce_s * 1e3,
             sides[1].allreduce_s / std::max(sides[0].allreduce_s, 1e-12), sides[0].step_s * 1e3,
             sides[1].step_s * 1e3, sides[1].step_s / std::max(sides[0].step_s, 1e-12),
             same ? "identical at every step" : "DIFFER (dp > 2 may round differently)");
  return 0;
}

// ---- atlas bench fidelity: each example deck run for real and in the simulator ----

/// A simulation's bubble as a run counts it (JobResult::measured_bubble): 1 - (forward + backward
/// + optimizer) / step, mean over the stages. Waits inside slots (a receive, the DP and
/// embedding sums, the gradient norm's) are bubble too, not only the table's Idle slots.
double run_style_bubble(const sim::SimResult& r) {
  if (r.step_ms <= 0 || r.stages.empty()) return 0.0;
  double busy = 0.0;
  for (const auto& u : r.stages) busy += u.compute_ms + r.cost.optimizer_ms[static_cast<std::size_t>(u.stage)];
  return 1.0 - busy / static_cast<double>(r.stages.size()) / r.step_ms;
}

int bench_fidelity(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 1, 1000000000));
  const int warmup_steps = args.integer("warmup-steps", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (warmup_steps < 2)
    throw ConfigError("--warmup-steps " + std::to_string(warmup_steps) +
                      ": the in-situ warm-up run needs at least 2 steps (its first is not measured)");
  std::vector<std::string> decks = args.positional;
  if (decks.empty()) {
    // The example decks: ./inputs, else the ones atlas ships (core::find_data_file), from any directory.
    const auto inputs = core::find_data_file("inputs");
    if (!inputs || !std::filesystem::is_directory(*inputs))
      throw ConfigError("atlas bench fidelity: no DECK given and no example decks found (inputs/ here or beside the "
                        "atlas binary)\n  hint: name the decks: atlas bench fidelity DECK...");
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(*inputs, ec))
      if (e.path().extension() == ".deck") decks.push_back(e.path().string());
    if (ec) throw ConfigError("atlas bench fidelity: cannot list " + inputs->string() + ": " + ec.message());
    std::sort(decks.begin(), decks.end());
  }
  JobOptions quiet;
  quiet.quiet = true;
  // The prediction is for the network the job really runs on: the deck's WAN inside the emulation
  // (scripts/wan/run_emulated.sh sets ATLAS_WAN_EMULATED=1), else loopback between the "DCs".
  const bool emulated = env::get("ATLAS_WAN_EMULATED") == "1";
  std::string table = fmt::format(
      "# {:<30} {:>5} {:>11} {:>12} {:>6} {:>9} {:>11} {:>9} {:>12} {:>9} {:>9} {:>11} {:>11} {:>8} {:>11} {:>7}\n",
      "deck", "ranks", "measured_ms", "predicted_ms", "ratio", "fresh_ms", "fresh_ratio", "insitu_ms", "insitu_ratio",
      "meas_bub%", "pred_bub%", "insitu_bub%", "deck_wan_ms", "trace_ms", "trace_ratio", "net_ns/B");
  // This host's wake-up delay with all the job's ranks on it (the simulator's cluster.host_wake_us).
  const runtime::WakeProbe wake = runtime::probe_wake_delay(world);
  std::string insitu_rows;  // per deck: each stage's in-situ forward/backward ms (the profile's)
  int ran = 0;
  for (const auto& path : decks) {
    bench::Args one = args;
    one.positional = {path};
    Config cfg;
    try {
      cfg = bench_deck(world, one, with(kQuietRun, {steps, "run.name=bench_fidelity"}), world.size());
    } catch (const ConfigError& e) {
      // Decks for another job size (or for plan/simulate only) are skipped, and said so.
      table += fmt::format("  {:<34} skipped: {}\n", path, e.problems().front().substr(0, 90));
      continue;
    }
    // Inside the emulation each rank runs in its DC's namespace (ATLAS_WAN_DC): a deck that lays the
    // ranks out otherwise cannot run on it (make_transport refuses it); skipped, and said so.
    const int my_dc = topo::Layout(world.size(), cfg.parallel).coord(world.rank()).dc;
    if (world.allreduce(wan::in_emulated_dc(my_dc) ? 0 : 1, MPI_MAX) != 0) {
      table += fmt::format("  {:<34} skipped: it puts ranks in other DCs than the emulation's namespaces\n", path);
      continue;
    }
    const sim::Prediction deck_wan = sim::predict(cfg);
    // The deck's table as it really runs here: its ranks share this host's cores, compute from the
    // host profile (not the deck's fwd_ms_per_layer), the network in use.
    sim::RunMachine here;
    here.loopback_wan = !emulated;
    here.host_backend = cfg.device.backend == Backend::Host;
    if (here.host_backend) {
      here.ranks_per_host = device::host_local_ranks();
      here.wake_ms = wake.median_ms;
      // Inside the emulation the WAN's packet path runs on this machine's cores too.
      if (emulated) here.net_ns_per_byte = runtime::probe_net_cpu(world, cfg, my_dc).ns_per_byte;
    }
    const Config net = sim::machine_config(cfg, here);
    const sim::SimResult base = sim::simulate_on(cfg, net);
    const sim::Prediction p = sim::prediction(base);
    // A fresh profile of the deck's own block, timed by rank 0 alone just before the run (the
    // others wait without spinning): this shared machine's speed drifts by tens of percent over
    // minutes, the profile file was measured once. Host backend only.
    double fresh_ms = 0.0;
    if (here.host_backend) {
      const sim::BlockShape shape{cfg.model.hidden, cfg.model.heads, cfg.model.seq_len, cfg.train.micro_batch_size,
                                  cfg.parallel.tp_size};
      std::vector<double> t(2, 0.0);
      if (world.rank() == 0) {
        const sim::BlockTiming b = model_block_timer(5, device::resolve_host_threads(cfg.device.threads))(shape);
        t = {b.fwd_ms, b.bwd_ms};
      }
      mpi::Request done = world.iallreduce_sum(std::span<double>(t));
      if (!done.wait_polling_for(600.0, 2000))
        ATLAS_THROW(Comm, "bench fidelity: the fresh block profile did not arrive from rank 0 in 600 s");
      const sim::DeviceProfile fresh = sim::measure_device_profile(
          [&](const sim::BlockShape&) { return sim::BlockTiming{t[0], t[1]}; }, {shape}, sched::device_profile(net));
      fresh_ms = sim::simulate_on(cfg, net, fresh).step_ms;
    }
    // In situ: a held-out warm-up run of the same deck (not the timed one); its forward and
    // backward slots that ran without processor sharing are each stage's compute cost, which the
    // simulation then shares out like the profile's (sim/insitu.hpp).
    const int pp = cfg.parallel.pp_size();
    const topo::Layout layout(world.size(), cfg.parallel);
    // Collective: per stage the in-situ forward and backward ms of a run's slots after its first
    // step (rank 0 has them), as SimOptions for the simulation.
    auto in_situ_of = [&](const JobResult& run) {
      std::vector<double> ms(static_cast<std::size_t>(2 * pp), 0.0);
      std::string error;
      if (world.rank() == 0) {
        std::vector<sim::ComputeSpan> spans;
        for (const auto& e : run.events)
          spans.push_back({e.world_rank, layout.coord(e.world_rank).stage, e.step, static_cast<sched::SlotKind>(e.kind),
                           e.start_s, e.end_s});
        std::vector<int> rank_host;  // every rank of a host backend job on one of this machine's hosts
        if (here.host_backend && here.ranks_per_host > 0)
          for (int rank = 0; rank < world.size(); ++rank) rank_host.push_back(rank / here.ranks_per_host);
        try {
          const sim::InSituCompute ic = sim::insitu_compute(
              spans, pp, rank_host, static_cast<double>(std::max(1u, std::thread::hardware_concurrency())));
          std::copy(ic.fwd_ms.begin(), ic.fwd_ms.end(), ms.begin());
          std::copy(ic.bwd_ms.begin(), ic.bwd_ms.end(), ms.begin() + pp);
        } catch (const Error& e) {
          error = e.what();
          ms[0] = -1.0;
        }
      }
      world.bcast(std::span<double>(ms), 0);
      if (ms[0] < 0)
        ATLAS_THROW(Config,
                    fmt::format("bench fidelity: {}: {}", path,
                                error.empty() ? "the in-situ compute costs failed on rank 0" : error));
      sim::SimOptions o;
      o.stage_fwd_ms.assign(ms.begin(), ms.begin() + pp);
      o.stage_bwd_ms.assign(ms.begin() + pp, ms.end());
      return o;
    };
    const Config warm = bench_deck(
        world, one,
        with(kQuietRun, {"run.steps=" + std::to_string(warmup_steps), "run.name=bench_fidelity_warmup",
                         "profile.enabled=true"}),
        world.size());
    const sim::SimOptions in_situ = in_situ_of(run_training_job(warm, world, quiet));
    // In-situ slots carry the network's CPU already: the network term must not take it again.
    const sim::SimResult situ = sim::simulate_on(cfg, net, sim::without_network_share(cfg, net, in_situ));

    const JobResult r = run_training_job(cfg, world, quiet);
    // Trace-driven (not held out): the same with the timed run's own in-situ costs. What remains
    // of its error is the schedule, network, sharing and synchronisation model's, not the
    // compute's, nor the machine's drift between two runs.
    const sim::SimOptions traced = in_situ_of(r);
    const sim::SimResult trace = sim::simulate_on(cfg, net, sim::without_network_share(cfg, net, traced));
    const double measured_ms = r.mean_step_s * 1e3;
    const std::string fresh_cols = fresh_ms > 0 ? fmt::format("{:>9.1f} {:>11.3f}", fresh_ms, measured_ms / fresh_ms)
                                                : fmt::format("{:>9} {:>11}", "-", "-");
    table += fmt::format(
        "  {:<30} {:>5} {:>11.1f} {:>12.1f} {:>6.3f} {} {:>9.1f} {:>12.3f} {:>9.1f} {:>9.1f} {:>11.1f} {:>11.1f} "
        "{:>8.1f} {:>11.3f} {:>7.2f}\n",
        path, world.size(), measured_ms, p.step_ms, measured_ms / p.step_ms, fresh_cols, situ.step_ms,
        measured_ms / situ.step_ms, 100 * (r.measured_bubble + r.measured_prefill), 100 * run_style_bubble(base),
        100 * run_style_bubble(situ), deck_wan.step_ms, trace.step_ms, measured_ms / trace.step_ms,
        here.net_ns_per_byte);
    insitu_rows += fmt::format("  {:<30}", path);
    for (int st = 0; st < pp; ++st) {
      const auto i = static_cast<std::size_t>(st);
      insitu_rows += fmt::format("  s{} {:.2f}/{:.2f} ({:.2f}/{:.2f})", st, in_situ.stage_fwd_ms[i],
                                 in_situ.stage_bwd_ms[i], base.cost.fwd_ms[i], base.cost.bwd_ms[i]);
    }
    insitu_rows += "\n";
    ++ran;
  }
  if (world.rank() == 0) {
    fmt::print("# atlas bench fidelity: each deck that fits {} ranks, run for real ({} timed steps) and simulated "
               "(sim::simulate_on: the deck's own table with this machine's costs)\n",
               world.size(), std::max(1, args.integer("steps", 1, 1000000000) - 1));
    fmt::print("# predicted for this machine: on the host backend the {} ranks share {} hardware threads (processor "
               "sharing) and compute comes from the host profile, not from the deck's schedule.fwd_ms_per_layer; "
               "the table is the deck's own (the runtime's)\n",
               device::host_local_ranks(), std::thread::hardware_concurrency());
    fmt::print("# wake-up delay of a waiting rank, {} ranks on this host (runtime::probe_wake_delay, {} samples): "
               "median {:.3f} ms, p90 {:.3f} ms; predicted with cluster.host_wake_us = the median\n",
               world.size(), wake.samples, wake.median_ms, wake.p90_ms);
    fmt::print("# predicted_ms: compute from the profile file (plan.gpu); fresh_ms: from the deck's own block timed "
               "by rank 0 alone just before its run (host backend)\n");
    fmt::print("# net_ns/B: host CPU per byte sent between DCs (runtime::probe_net_cpu, inside the emulation: "
               "TCP and the emulated links' packet path), predicted as compute taken from the host while a "
               "transfer runs (cluster.host_net_ns_per_byte)\n");
    fmt::print("# insitu_ms: compute from a held-out warm-up run of the deck ({} steps, the first not measured, "
               "before the timed run): per stage the median forward and backward slot that ran while no more ranks "
               "of its host computed than it has cores (sim::insitu_compute), shared out by the simulation like "
               "the profile's; inside the emulation divided by the median stretch net_ns/B gives the slots, which "
               "carry that CPU already (sim::without_network_share; trace_ms too)\n",
               warmup_steps);
    fmt::print("# meas_bub%: training's bubble, 1 - (forward + backward + optimizer) / step, mean over ranks "
               "(BubbleTea's prefills fill it, they do not shrink it); pred_bub% and insitu_bub% the same of the "
               "simulation (its waits inside slots count, not only its Idle slots)\n");
    fmt::print("# trace_ms: the same from the timed run's own slots (not held out: the schedule, network, sharing "
               "and synchronisation model alone, without the machine's drift between the two runs)\n");
    fmt::print("# network: {}; deck_wan_ms = the prediction with the deck's WAN matrices\n",
               emulated ? "the emulated WAN (ATLAS_WAN_EMULATED=1): predicted with the deck's latency and bandwidth"
                        : "loopback (no ATLAS_WAN_EMULATED): predicted with 0 ms latency and the intra-DC bandwidth "
                          "between DCs; run under scripts/wan/run_emulated.sh for the deck's WAN");
    fmt::print("{}", table);
    fmt::print("# in-situ compute per stage, forward/backward ms (the profile's in brackets):\n{}", insitu_rows);
    fmt::print("decks run: {}\n", ran);
  }
  return 0;
}

int bench_wan(Context& ctx, const bench::Args& args) { return wan::run_wan_bench(ctx.env, args); }
int bench_latency(Context& ctx, const bench::Args& args) { return wan::run_wan_latency_bench(ctx.env, args); }
int bench_bubbletea(Context& ctx, const bench::Args& args) { return bubbletea::run_bubbletea_bench(ctx.env, args); }
int bench_sim(Context& ctx, const bench::Args& args) {
  if (ctx.env.world_rank() != 0) return 0;
  keep_heap_for_reuse();
  return sim::run_sim_bench(args);
}
int bench_validate(Context& ctx, const bench::Args& args) {
  return ctx.env.world_rank() == 0 ? sim::run_validate_bench(args) : 0;
}
int bench_gemm(Context& ctx, const bench::Args& args) {
  return ctx.env.world_rank() == 0 ? model::run_gemm_bench(args) : 0;
}
int bench_ckpt(Context& ctx, const bench::Args& args) { return io::run_ckpt_bench(ctx.env, args); }

// ---- the registry: every `atlas bench NAME` ----

const bench::Option kSteps{"steps", "N", "8", "steps of each training run (the first is not timed)"};
const bench::Option kRounds{"rounds", "N", "3", "off/on pairs, interleaved"};

const bench::Spec kStepSpec{"step", "tokens/s of a deck at 1 rank and at N ranks (mpirun -np N)",
                            "[DECK] [key=value ...]", {kSteps}};
const bench::Spec kSchedulesSpec{"schedules", "gpipe, 1f1b and atlas of one deck: measured vs predicted step and bubble",
                                 "[DECK] [key=value ...]", {kSteps}};
const bench::Spec kProfileSpec{"profile", "profile recording overhead (off vs on, interleaved)",
                               "[DECK] [key=value ...]", {kSteps, kRounds}};
const bench::Spec kOverlapSpec{"overlap",
                               "DP gradient sums at the AllReduce slot vs overlapped with backward (interleaved)",
                               "[DECK] [key=value ...]", {kSteps, kRounds}};
const bench::Spec kFidelitySpec{
    "fidelity", "example decks run for real and in the simulator: measured vs predicted", "[DECK ...] [key=value ...]",
    {kSteps, {"warmup-steps", "N", "6", "steps of the held-out in-situ warm-up run (at least 2)"}}};

struct BenchEntry {
  const bench::Spec& spec;
  int (*run)(Context&, const bench::Args&);
};

const std::vector<BenchEntry>& benches() {
  static const std::vector<BenchEntry> all = {
      {wan::wan_bench_spec(), bench_wan},
      {wan::wan_latency_bench_spec(), bench_latency},
      {model::gemm_bench_spec(), bench_gemm},
      {kStepSpec, bench_step},
      {kSchedulesSpec, bench_schedules},
      {kProfileSpec, bench_profile},
      {kOverlapSpec, bench_overlap},
      {io::ckpt_bench_spec(), bench_ckpt},
      {sim::sim_bench_spec(), bench_sim},
      {kFidelitySpec, bench_fidelity},
      {sim::validate_bench_spec(), bench_validate},
      {bubbletea::bubbletea_bench_spec(), bench_bubbletea},
      {ablation_bench_spec(), bench_ablation},
  };
  return all;
}

}  // namespace

std::string bench_names() {
  std::string names;
  for (const auto& b : benches()) names += (names.empty() ? "" : ", ") + b.spec.name;
  return names;
}

int cmd_bench(Context& ctx) {
  const bool root = ctx.env.world_rank() == 0;
  if (ctx.args.empty() || ctx.args.front() == "--help" || ctx.args.front() == "-h") {
    // Asked for: the list on stdout, exit 0; no name given: on stderr, a usage error.
    FILE* out = ctx.args.empty() ? stderr : stdout;
    if (root) {
      std::fprintf(out, "usage: atlas bench <name> [DECK] [key=value ...] [options]   (atlas bench <name> --help)\n");
      for (const auto& b : benches()) std::fprintf(out, "  %-10s %s\n", b.spec.name.c_str(), b.spec.help.c_str());
    }
    return static_cast<int>(ctx.args.empty() ? ExitCode::Usage : ExitCode::Ok);
  }
  std::string name = ctx.args.front();
  std::vector<std::string> words(ctx.args.begin() + 1, ctx.args.end());
  // `atlas bench wan --latency` is `atlas bench latency` (scripts/wan and earlier docs use it).
  if (const auto it = std::find(words.begin(), words.end(), "--latency"); name == "wan" && it != words.end()) {
    words.erase(it);
    name = "latency";
  }
  for (const auto& b : benches()) {
    if (name != b.spec.name) continue;
    const auto asks = [&](const char* w) { return std::find(words.begin(), words.end(), w) != words.end(); };
    if (asks("--help") || asks("-h")) {
      if (root) std::printf("%s: %s\n%s\n", b.spec.name.c_str(), b.spec.help.c_str(), bench::usage(b.spec).c_str());
      return 0;
    }
    const bench::Args args = bench::parse(b.spec, words);
    if (root) {
      fmt::print("{}", bench::header(args));
      std::fflush(stdout);
    }
    return b.run(ctx, args);
  }
  throw UsageError("unknown benchmark '" + name + "' (atlas bench lists them)");
}

}  // namespace atlas::app
