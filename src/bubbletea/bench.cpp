// SPDX-License-Identifier: MIT
// `atlas bench bubbletea`: the same deck trained with BubbleTea off and on (see bench.hpp). Each
// run builds a fresh trainer (same seed, so the same losses are expected) and its own WAN
// transport; off and on alternate so slow drifts of the machine hit both.
#include "atlas/bubbletea/bench.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "atlas/bubbletea/service.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/json.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/runtime/costing.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/sim/simulator.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::bubbletea {

namespace {

/// Seconds as JSON milliseconds: null when there is no value (no request was prefilled: nan).
std::string json_ms(double s) { return json::number(s * 1e3, 3); }

struct RunResult {
  bool on = false;
  std::vector<double> step_s;     ///< per step, slowest rank
  std::vector<double> end_s;      ///< per step, when its last rank ended it (profiler clock, synced)
  std::vector<double> losses;     ///< rank 0
  std::vector<RankStats> ranks;   ///< compute/prefill/wall per rank (timed steps only)
  Report report;                  ///< BubbleTea's (on runs)
};

RunResult run_once(const Config& base, bool on, int warmup, const topo::Layout& layout,
                   const topo::Communicators& comms, device::Backend& backend, const sched::ScheduleTable& table) {
  Config cfg = base;
  cfg.bubbletea.enabled = on;
  const topo::Coord me = layout.coord(comms.world.rank());
  const std::vector<int> peers = layout.wan_peers(me);
  std::unique_ptr<wan::PeerTransport> transport = wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, peers);
  // Both runs record slots (as `atlas train` does by default): BubbleTea learns each bubble's
  // real length from the waits the profile shows.
  const std::size_t reserve = static_cast<std::size_t>(cfg.run.steps) * table.row(me.stage, me.dp).size() * 2 + 4096;
  runtime::Profiler profiler(true, comms.world.rank(), reserve);
  runtime::Trainer trainer(cfg, layout, comms, table, transport.get(), backend, profiler);
  std::unique_ptr<Service> service;
  if (on) {
    service = std::make_unique<Service>(cfg, layout, comms, table, backend, profiler);
    trainer.set_bubble_filler(service.get());
  }
  RunResult r;
  r.on = on;
  RankStats mine;
  mine.world_rank = comms.world.rank();
  comms.world.barrier();
  profiler.sync_epoch(comms.world);
  if (service) service->start();
  for (int step = 0; step < cfg.run.steps; ++step) {
    const runtime::StepReport rep = trainer.train_step(step);
    if (service) service->after_step(rep);
    r.losses.push_back(rep.loss);
    r.step_s.push_back(rep.step_s);  // the slowest rank's, after the run: no barrier between steps
    r.end_s.push_back(profiler.now());  // the last rank's, after the run
    if (step < warmup) continue;
    ++mine.steps;
    mine.wall_s += rep.step_s;
    mine.compute_s += rep.compute_s;
    mine.prefill_s += rep.prefill_s;
    mine.idle_s += rep.idle_s;
    mine.comm_s += rep.intra_s + rep.wan_s;
  }
  if (service) {
    trainer.set_bubble_filler(nullptr);
    r.report = service->finish();
  }
  ATLAS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, r.step_s.data(), static_cast<int>(r.step_s.size()), MPI_DOUBLE, MPI_MAX,
                                comms.world.get()));
  ATLAS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, r.end_s.data(), static_cast<int>(r.end_s.size()), MPI_DOUBLE, MPI_MAX,
                                comms.world.get()));
  const std::string line = fmt::format("{} {} {} {} {} {}", mine.steps, mine.wall_s, mine.compute_s, mine.prefill_s,
                                       mine.idle_s, mine.comm_s);
  const auto all = comms.world.allgather_strings(line + "\n");
  for (std::size_t i = 0; i < all.size(); ++i) {
    RankStats s;
    s.world_rank = static_cast<int>(i);
    s.dc = layout.coord(static_cast<int>(i)).dc;
    std::istringstream in(all[i]);
    in >> s.steps >> s.wall_s >> s.compute_s >> s.prefill_s >> s.idle_s >> s.comm_s;
    r.ranks.push_back(s);
  }
  return r;
}

struct Summary {
  double mean = 0, sd = 0, median = 0;
  std::size_t n = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0.0;
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  return s;
}

}  // namespace

const atlas::bench::Spec& bubbletea_bench_spec() {
  static const atlas::bench::Spec spec{
      "bubbletea", "the same deck with BubbleTea off and on: step time, utilization, prefill tokens/s, TTFT",
      "DECK [key=value ...]",
      {{"repeats", "N", "2", "off/on pairs, alternating"},
       {"warmup", "N", "2", "leading steps of each run left out of the step time"}}};
  return spec;
}

int run_bubbletea_bench(mpi::Environment& env, const std::vector<std::string>& words) {
  return run_bubbletea_bench(env, atlas::bench::parse(bubbletea_bench_spec(), words));
}

int run_bubbletea_bench(mpi::Environment& env, const atlas::bench::Args& args) {
  (void)env;
  std::vector<std::string> overrides = args.overrides;
  const int repeats = args.integer("repeats", 1, 1000000);
  const int warmup = args.integer("warmup", 0, 1000000000);
  if (args.positional.size() > 1)
    args.fail("more than one deck given ('" + args.positional[0] + "', '" + args.positional[1] + "')");
  if (args.positional.empty()) args.fail("needs a deck: atlas bench bubbletea DECK [key=value ...]");
  const std::string path = args.positional.front();

  const mpi::Comm world = mpi::Comm::world();
  const bool root = world.rank() == 0;
  deck::JobShape shape;
  shape.world_size = world.size();
  // As atlas train: a binary that carries the CUDA backend accepts device.backend = cuda.
  shape.cuda_built = device::backend_available(atlas::Backend::Cuda);
  overrides.push_back("bubbletea.enabled=true");  // validate the [bubbletea] section too
  const Config base_cfg = deck::load(world, path, overrides, shape);
  if (warmup >= base_cfg.run.steps)
    throw ConfigError(fmt::format("bench bubbletea: --warmup {} leaves none of run.steps = {} to time", warmup,
                                  base_cfg.run.steps));
  const topo::Layout layout(world.size(), base_cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  std::unique_ptr<device::Backend> backend = device::make_backend(base_cfg.device);
  // As atlas train: the table costed for the device and host the run is on (rank 0's).
  runtime::CostedRun costed = runtime::costed_run(world, base_cfg, backend->describe());
  Config cfg = std::move(costed.cfg);
  if (root) fmt::print("{}", costed.note);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  if (root)
    fmt::print("# bench bubbletea: deck {}, {} ranks ({} DCs, {} stages x dp {} x tp {}), schedule {}, {} steps per run "
               "({} warm-up), {} off/on pairs\n# table: predicted step {:.1f} ms, mean bubble {:.1f}%\n",
               path, layout.world_size(), layout.dc_count(), layout.pp_size(), layout.dp_size(), layout.tp_size(),
               to_string(cfg.schedule.kind), cfg.run.steps, warmup, repeats, table.step_ms,
               100.0 * table.mean_bubble_fraction());

  const bool emulated = cfg.device.backend == Backend::Emulated;
  std::vector<RunResult> runs;
  for (int r = 0; r < repeats; ++r)
    for (bool on : {false, true}) {
      runs.push_back(run_once(cfg, on, warmup, layout, comms, *backend, table));
      if (root) {
        const auto& x = runs.back();
        std::vector<double> timed(x.step_s.begin() + warmup, x.step_s.end());
        fmt::print("#   run {} bubbletea {:<3}: mean step {:.2f} ms, final loss {}\n", runs.size(), on ? "on" : "off",
                   summarize(timed).mean * 1e3,
                   emulated ? std::string("n/a (emulated compute)") : fmt::format("{:.6f}", x.losses.back()));
      }
    }

  // ---- figures ----
  std::vector<double> steps_off, steps_on;
  // Emulated compute has no loss (NaN in every run): nothing to compare, and NaN != NaN.
  bool losses_equal = true;
  for (const auto& x : runs) {
    (x.on ? steps_on : steps_off).insert((x.on ? steps_on : steps_off).end(), x.step_s.begin() + warmup, x.step_s.end());
    if (!emulated && x.losses != runs.front().losses) losses_equal = false;
  }
  const Summary off = summarize(steps_off), on = summarize(steps_on);
  const double slowdown = off.mean > 0 ? on.mean / off.mean - 1.0 : 0.0;
  // Training's rate: the job's time from the end of the last warm-up step (its last rank's) to the
  // end of the last step (its last rank's), over the timed steps. The per-step figures above take,
  // step by step, the slowest rank's own step; without a barrier between steps a rank whose step
  // ends late (it used its slack: a bubble at the end of its row) starts the next one late and has
  // it short, so that maximum counts every rank's long steps and none of their short ones: it grows
  // with how unevenly the ranks' step boundaries move, not only with how slow training is.
  std::vector<double> elapsed_off, elapsed_on, pair_slowdown;
  for (const auto& x : runs) {
    const double begin = warmup > 0 ? x.end_s[static_cast<std::size_t>(warmup) - 1] : 0.0;  // 0: the synced start
    const double slowest = (x.end_s.back() - begin) /
                           static_cast<double>(x.end_s.size() - static_cast<std::size_t>(warmup));
    (x.on ? elapsed_on : elapsed_off).push_back(slowest);
    if (x.on && elapsed_off.size() == elapsed_on.size() && elapsed_off.back() > 0)
      pair_slowdown.push_back(slowest / elapsed_off.back() - 1.0);
  }
  const Summary eoff = summarize(elapsed_off), eon = summarize(elapsed_on), pairs = summarize(pair_slowdown);
  const double slowdown_elapsed = eoff.mean > 0 ? eon.mean / eoff.mean - 1.0 : 0.0;
  const double slowdown_median = off.median > 0 ? on.median / off.median - 1.0 : 0.0;
  const int n = layout.world_size();
  std::vector<RankStats> sum_off(static_cast<std::size_t>(n)), sum_on(static_cast<std::size_t>(n));
  for (const auto& x : runs)
    for (const auto& s : x.ranks) {
      RankStats& t = (x.on ? sum_on : sum_off)[static_cast<std::size_t>(s.world_rank)];
      t.world_rank = s.world_rank;
      t.dc = s.dc;
      t.steps += s.steps;
      t.wall_s += s.wall_s;
      t.compute_s += s.compute_s;
      t.prefill_s += s.prefill_s;
      t.idle_s += s.idle_s;
      t.comm_s += s.comm_s;
    }
  auto overall = [](const std::vector<RankStats>& v) {
    double busy = 0, wall = 0;
    for (const auto& s : v) {
      busy += s.compute_s + s.prefill_s;
      wall += s.wall_s;
    }
    return wall > 0 ? busy / wall : 0.0;
  };
  // BubbleTea figures over every "on" run.
  std::int64_t tokens = 0;
  double bt_wall = 0;
  int served = 0, queued = 0, total = 0, decoded = 0;
  std::int64_t overruns = 0;
  double overrun_s = 0;
  std::vector<double> ttft;
  for (const auto& x : runs) {
    if (!x.on) continue;
    tokens += x.report.prefill_tokens();
    bt_wall += x.report.wall_s;
    served += x.report.served();
    decoded += x.report.decoded();
    queued += x.report.queued();
    total += static_cast<int>(x.report.requests.size());
    for (const auto& k : x.report.ranks) {
      overruns += k.overruns;
      overrun_s += k.overrun_s;
    }
    for (const auto& q : x.report.requests)
      if (q.prefilled()) ttft.push_back(q.ttft_s());
  }
  std::sort(ttft.begin(), ttft.end());
  auto quant = [&](double q) {
    if (ttft.empty()) return std::nan("");
    const auto k = static_cast<std::size_t>(std::max(1.0, std::ceil(q * static_cast<double>(ttft.size()))));
    return ttft[std::min(k, ttft.size()) - 1];
  };

  if (root) {
    std::string s;
    // comm: receive / all-reduce waits; other: step time in none of these (sends, copies, the step's tail).
    s += fmt::format("# {:>5} {:<8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}\n", "rank", "dc", "util_off%", "util_on%",
                     "prefill_%", "idle_on%", "comm_on%", "other_on%");
    for (int i = 0; i < n; ++i) {
      const auto& a = sum_off[static_cast<std::size_t>(i)];
      const auto& b = sum_on[static_cast<std::size_t>(i)];
      const std::string dc = static_cast<std::size_t>(a.dc) < cfg.cluster.dcs.size()
                                 ? cfg.cluster.dcs[static_cast<std::size_t>(a.dc)]
                                 : fmt::format("dc{}", a.dc);
      const double wall_on = std::max(b.wall_s, 1e-12);
      s += fmt::format("  {:>5} {:<8} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f}\n", i, dc,
                       100.0 * a.compute_s / std::max(a.wall_s, 1e-12), 100.0 * (b.compute_s + b.prefill_s) / wall_on,
                       100.0 * b.prefill_s / wall_on, 100.0 * b.idle_s / wall_on, 100.0 * b.comm_s / wall_on,
                       100.0 * (b.wall_s - b.compute_s - b.prefill_s - b.idle_s - b.comm_s) / wall_on);
    }
    s += fmt::format("# step time: off {:.2f} ms (sd {:.2f}, median {:.2f}, {} steps), on {:.2f} ms (sd {:.2f}, median "
                     "{:.2f}, {} steps): slowdown {:+.2f}% of the mean, {:+.2f}% of the median\n",
                     off.mean * 1e3, off.sd * 1e3, off.median * 1e3, off.n, on.mean * 1e3, on.sd * 1e3, on.median * 1e3,
                     on.n, 100.0 * slowdown, 100.0 * slowdown_median);
    s += fmt::format("# training rate (each run: the job's time from the last warm-up step's end to the last step's, per step): off {:.2f} "
                     "ms, on {:.2f} ms: slowdown {:+.2f}% (per pair: mean {:+.2f}%, sd {:.2f}%, {} pairs; goal <= 1%)\n",
                     eoff.mean * 1e3, eon.mean * 1e3, 100.0 * slowdown_elapsed, 100.0 * pairs.mean, 100.0 * pairs.sd,
                     pairs.n);
    s += fmt::format("# utilization (training + prefill busy) / wall, all ranks: off {:.1f}%, on {:.1f}% (goal >= 94%)\n",
                     100.0 * overall(sum_off), 100.0 * overall(sum_on));
    s += fmt::format("# prefill: {} prompt tokens in {:.2f} s of training = {:.0f} tokens/s; requests {} prefilled ({} "
                     "decoded) of {} ({} queued at the end); TTFT p50 {:.1f} ms, p99 {:.1f} ms; chunks past their "
                     "bubble {} ({:.2f} ms)\n",
                     tokens, bt_wall, bt_wall > 0 ? static_cast<double>(tokens) / bt_wall : 0.0, served, decoded, total,
                     queued, quant(0.5) * 1e3, quant(0.99) * 1e3, overruns, overrun_s * 1e3);
    s += fmt::format("# losses with BubbleTea on and off: {}\n",
                     emulated       ? "n/a (emulated compute: no loss)"
                     : losses_equal ? "bitwise equal"
                                    : "DIFFERENT (BubbleTea changed training: a bug)");
    s += atlas::bench::footer(
        "bubbletea", fmt::format("step {:+.2f}% (mean; training rate {:+.2f}%), utilization {:.1f}% -> {:.1f}%, "
                                 "prefill {:.0f} tokens/s, TTFT p50 {:.1f} ms; losses {}",
                                 100.0 * slowdown, 100.0 * slowdown_elapsed, 100.0 * overall(sum_off), 100.0 * overall(sum_on),
                                 bt_wall > 0 ? static_cast<double>(tokens) / bt_wall : 0.0, quant(0.5) * 1e3,
                                 emulated ? "n/a" : losses_equal ? "bitwise equal" : "DIFFERENT"));
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
    std::error_code ec;
    std::filesystem::create_directories(cfg.run_dir(), ec);
    write_file_whole((std::filesystem::path(cfg.run_dir()) / "bubbletea_bench.json").string(),
                     fmt::format("{{\"deck\":\"{}\",\"ranks\":{},\"steps\":{},\"warmup\":{},\"repeats\":{},\"step_ms_off\":{:.4f},"
                       "\"step_ms_on\":{:.4f},\"median_step_ms_off\":{:.4f},\"median_step_ms_on\":{:.4f},\"slowdown\":{:.5f},"
                       "\"slowdown_median\":{:.5f},\"step_ms_off_rate\":{:.4f},\"step_ms_on_rate\":{:.4f},\"slowdown_rate\":{:.5f},\"utilization_off\":{:.5f},\"utilization_on\":{:.5f},"
                       "\"prefill_tokens_per_s\":{:.1f},\"ttft_p50_ms\":{},\"ttft_p99_ms\":{},\"served\":{},"
                       "\"requests\":{},\"losses_equal\":{}}}\n",
                       json::escape(path), n, cfg.run.steps, warmup, repeats, off.mean * 1e3, on.mean * 1e3, off.median * 1e3,
                       on.median * 1e3, slowdown, slowdown_median, eoff.mean * 1e3, eon.mean * 1e3, slowdown_elapsed,
                       overall(sum_off), overall(sum_on), bt_wall > 0 ? static_cast<double>(tokens) / bt_wall : 0.0,
                       json_ms(quant(0.5)), json_ms(quant(0.99)), served, total, emulated ? "null" : losses_equal ? "true" : "false"));
  }
  return losses_equal ? 0 : static_cast<int>(ExitCode::Internal);
}

}  // namespace atlas::bubbletea
