// SPDX-License-Identifier: MIT
// `atlas bench ablation DECK`: the paper's ablation as real runs of one deck, each row the same
// model and global batch on the same ranks (the same ranks per DC, so one emulated WAN serves
// them all), measured beside the simulator's prediction of the same table:
//   (a) DP across DCs: every DC holds whole pipelines, the gradients summed over the WAN by a ring
//       over MPI point-to-point (parallel.dp_across_dcs; one TCP connection per peer, as
//       PyTorch/Gloo would: device::make_ring_collective);
//   (b) PP across DCs, 1F1B, one TCP connection per peer (wan.rails = 1), transfers sharing each
//       link concurrently (Varuna-like);
//   (c) (b) over the deck's multi-rail (wan.rails);
//   (d) (c) with ATLAS temporal sharing (schedule.kind = atlas);
//   (e) (d) with BubbleTea's prefills in the bubbles (bubbletea.enabled = true).
// Every row keeps the deck's device.backend (host, cuda or emulated).
#include "atlas/app/bench_ablation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atlas/app/training_job.hpp"
#include "atlas/bench/chart.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/sim/simulator.hpp"

namespace atlas::app {

namespace {

const std::vector<std::string> kQuiet = {"ckpt.every_steps=0", "ckpt.final=false", "train.eval_every_steps=0",
                                         "profile.trace_json=false"};

Config load(const mpi::Comm& world, const bench::Args& args, std::vector<std::string> ov) {
  ov.insert(ov.end(), args.overrides.begin(), args.overrides.end());
  deck::JobShape shape;
  shape.world_size = world.size();
  shape.cuda_built = cuda_built();
  return deck::load(world, args.deck(), ov, shape);
}

struct Row {
  std::string id, what;
  std::vector<std::string> overrides;
  JobResult run;
  sim::Prediction pred;
  double wan_bytes = 0.0;  ///< per step, predicted from the table and the cost model
};

/// "a b c" -> "a,b" style: a parallel.stages_per_dc value with every DC holding `s`.
std::string repeat(int s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? " " : "") + std::to_string(s);
  return out;
}

std::pair<int, int> parse_size(const bench::Args& args) {
  const std::string v = args.text("png-size");
  const auto x = v.find('x');
  std::optional<std::int64_t> w, h;
  if (x != std::string::npos) {
    w = units::parse_int(v.substr(0, x));
    h = units::parse_int(v.substr(x + 1));
  }
  if (!w || !h) args.fail("--png-size " + v + ": expected WIDTHxHEIGHT in pixels, e.g. 800x480");
  constexpr int lo = bench::kMinChartPixels, hi = bench::kMaxChartPixels;
  if (*w < lo || *h < lo || *w > hi || *h > hi)
    args.fail(fmt::format("--png-size {}: each side must be {} to {} pixels", v, lo, hi));
  return {static_cast<int>(*w), static_cast<int>(*h)};
}

}  // namespace

const bench::Spec& ablation_bench_spec() {
  static const bench::Spec spec{
      "ablation",
      "the paper's ablation as real runs: (a) DP across DCs, (b) PP 1F1B one TCP flow, (c) multi-rail, (d) atlas, "
      "(e) BubbleTea",
      "DECK [key=value ...]",
      {{"steps", "N", "8", "steps of each training run (the first is not timed)"},
       {"rows", "LIST", "a,b,c,d,e", "the rows to run, e.g. a,d (the others are left out of the table and chart)"},
       {"png", "FILE", "bench_ablation.png", "the bar chart (measured beside predicted step per row); \"\" = none"},
       {"png-size", "WxH", "800x480", "the chart's size in pixels"}}};
  return spec;
}

std::string ablation_rows(const bench::Args& args) {
  const std::string all = "abcde";
  std::string out;
  for (const std::string& r : args.list("rows")) {
    if (r.size() != 1 || all.find(r) == std::string::npos)
      args.fail("--rows " + args.text("rows") + ": '" + r + "' is not a row; the rows are a, b, c, d, e (e.g. --rows a,d)");
    if (out.find(r) != std::string::npos) args.fail("--rows " + args.text("rows") + ": row " + r + " is named twice");
    out += r;
  }
  if (out.empty()) args.fail("--rows: no row named; the rows are a, b, c, d, e (e.g. --rows a,d)");
  std::sort(out.begin(), out.end());
  return out;
}

int bench_ablation(Context&, const bench::Args& args) {
  const mpi::Comm world = mpi::Comm::world();
  if (args.positional.empty()) args.fail("no DECK: the ablation needs a deck whose pipeline crosses DCs");
  const std::string steps = "run.steps=" + std::to_string(args.integer("steps", 2, 1000000000));
  const std::string png = args.text("png");
  const auto [png_w, png_h] = parse_size(args);
  // Before any row runs: a chart that cannot be written must not cost the rows' minutes.
  // Rank 0 writes it, so rank 0's file system decides, for every rank.
  if (!png.empty())
    (void)mpi::agree_on_root(world, 0, [&] {
      check_output_file("atlas bench ablation", "--png", png);
      return std::string();
    });
  const std::string wanted = ablation_rows(args);
  const Config base = load(world, args, kQuiet);
  const int ndc = base.cluster.dc_count();
  const auto& sp = base.parallel.stages_per_dc;
  const std::string deck = args.deck();
  if (ndc < 2 || std::count_if(sp.begin(), sp.end(), [](int s) { return s > 0; }) < 2)
    throw ConfigError("bench ablation: " + deck + ": the pipeline must cross DCs (its layout uses " +
                      std::to_string(std::count_if(sp.begin(), sp.end(), [](int s) { return s > 0; })) +
                      " DC of " + std::to_string(ndc) +
                      "), since every row compares training across DCs\n  hint: a deck with cluster.dcs naming "
                      "two or more DCs and parallel.stages_per_dc > 0 in at least two, e.g. "
                      "inputs/ablation_2dc_16.deck");
  if (base.parallel.dp_across_dcs)
    throw ConfigError("bench ablation: " + deck + ": parallel.dp_across_dcs = true; give the pipeline-parallel deck "
                      "(rows b-e), row (a) sets parallel.dp_across_dcs itself");
  for (int s : sp)
    if (s != sp[0])
      throw ConfigError("bench ablation: " + deck + ": parallel.stages_per_dc = " +
                        fmt::format("{}", fmt::join(sp, " ")) +
                        ": row (a) needs the same stage count in every DC (each DC then holds whole pipelines "
                        "on the same ranks)\n  hint: e.g. parallel.stages_per_dc = " + repeat(sp[0], ndc));
  const int micro = base.train.micro_batches;
  if (micro % ndc != 0)
    throw ConfigError("bench ablation: " + deck + ": train.micro_batches = " + std::to_string(micro) +
                      " must be a multiple of the " + std::to_string(ndc) +
                      " DCs: row (a) runs dp_size x DCs pipelines of micro_batches / DCs each (the same global "
                      "batch)\n  hint: train.micro_batches = " + std::to_string(ndc * std::max(1, micro / ndc)));
  const int rails = base.wan.rails;
  if (rails < 2)
    throw ConfigError("bench ablation: " + deck + ": wan.rails = 1: rows (c)-(e) need multi-rail\n  hint: wan.rails = 4 "
                      "(row b runs with 1)");

  const std::string off = "bubbletea.enabled=false";
  std::vector<Row> rows = {
      {"a", "DP across DCs (MPI)",
       {"parallel.dp_across_dcs=true", "parallel.stages_per_dc=" + repeat(sp[0], ndc),
        "parallel.dp_size=" + std::to_string(base.parallel.dp_size * ndc),
        "train.micro_batches=" + std::to_string(micro / ndc), "model.layers_per_stage=\"\"", "schedule.kind=1f1b",
        off},
       {}, {}, 0.0},
      {"b", "PP 1F1B, 1 TCP flow", {"schedule.kind=1f1b", "wan.transport=multirail", "wan.rails=1", off}, {}, {}, 0.0},
      {"c", fmt::format("(b) + {} rails", rails),
       {"schedule.kind=1f1b", "wan.transport=multirail", "wan.rails=" + std::to_string(rails), off}, {}, {}, 0.0},
      {"d", "(c) + atlas sharing",
       {"schedule.kind=atlas", "wan.transport=multirail", "wan.rails=" + std::to_string(rails), off}, {}, {}, 0.0},
      {"e", "(d) + BubbleTea",
       {"schedule.kind=atlas", "wan.transport=multirail", "wan.rails=" + std::to_string(rails),
        "bubbletea.enabled=true"},
       {}, {}, 0.0},
  };

  std::erase_if(rows, [&](const Row& r) { return wanted.find(r.id) == std::string::npos; });

  // The prediction is for the network the job really runs on (as bench fidelity): the deck's WAN
  // inside the emulation (scripts/wan/run_emulated.sh), else loopback between the "DCs"; host
  // ranks share this machine's cores, emulated and GPU ranks compute at the deck's costs.
  const bool emulated_wan = env::get("ATLAS_WAN_EMULATED") == "1";
  JobOptions quiet;
  quiet.quiet = true;
  // Every row's deck first, so a row that does not validate stops the bench before any run.
  std::vector<Config> cfgs;
  for (auto& row : rows) {
    std::vector<std::string> ov = kQuiet;
    ov.push_back(steps);
    ov.push_back("run.name=bench_ablation_" + row.id);
    ov.insert(ov.end(), row.overrides.begin(), row.overrides.end());
    cfgs.push_back(load(world, args, ov));
  }
  const bench::Table table({{"row", "", 4, true},
                            {"setup", "", 24, true},
                            {"measured", "ms", 13},
                            {"predicted", "ms", 14},
                            {"ratio", "", 7},
                            {"vs_a_meas", "x", 13},
                            {"vs_a_pred", "x", 13},
                            {"vs_prev_meas", "x", 16},
                            {"vs_prev_pred", "x", 16},
                            {"wan", "MB", 10},
                            {"meas_bub", "%", 11},
                            {"pred_bub", "%", 11},
                            {"meas_util", "%", 12},
                            {"pred_util", "%", 12}});
  // The header now and each row as soon as it ran (a failure or a time limit later keeps the rows
  // done so far on the screen).
  const bool root = world.rank() == 0;
  const int timed = args.integer("steps", 2, 1000000000) - 1;
  if (root) {
    fmt::print("# atlas bench ablation: {} on {} ranks in {} DCs, {} timed steps per row; every row the same model "
               "and global batch ({} sequences/step) on the same ranks\n",
               deck, world.size(), ndc, timed, base.sequences_per_step());
    fmt::print("# measured = mean step of rank 0; predicted = sim::simulate_on, the row's own table and cost model "
               "(atlas simulate's) on {}{}\n",
               emulated_wan ? "the deck's WAN (emulated: ATLAS_WAN_EMULATED=1)"
                            : "loopback between the DCs (no ATLAS_WAN_EMULATED: run under scripts/wan/run_emulated.sh "
                              "for the deck's WAN)",
               base.device.backend == Backend::Host ? ", host ranks sharing this machine's cores" : "");
    fmt::print("# vs_a = (a)'s step / this row's (x faster than DP across DCs), vs_prev = the row before's / this "
               "row's; wan_MB = bytes crossing DCs per step (the table's, the same each step); bubble = 1 - "
               "(fwd + bwd + optimizer) / step (waits inside slots count), util = (fwd + bwd + prefill) / step, mean "
               "over ranks (pred_util: forward + backward only, no prefill)\n");
    for (const auto& r : rows) fmt::print("#   ({}) {}: {}\n", r.id, r.what, fmt::join(r.overrides, " "));
    fmt::print("{}", table.head());
    std::fflush(stdout);
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    Row& row = rows[i];
    const Config& cfg = cfgs[i];
    sim::RunMachine here;
    here.loopback_wan = !emulated_wan;
    here.host_backend = cfg.device.backend == Backend::Host;
    if (here.host_backend) here.ranks_per_host = device::host_local_ranks();
    const sim::SimResult sr = sim::simulate_on(cfg, sim::machine_config(cfg, here));
    row.pred = sim::prediction(sr);
    // The bubble as a run counts it (JobResult::measured_bubble, as bench fidelity): 1 - (forward +
    // backward + optimizer) / step, mean over the stages; waits inside slots (the DP sums over the
    // WAN, receives) are bubble too, not only the table's Idle slots.
    if (sr.step_ms > 0 && !sr.stages.empty()) {
      double busy = 0.0;
      for (const auto& u : sr.stages) busy += u.compute_ms + sr.cost.optimizer_ms[static_cast<std::size_t>(u.stage)];
      row.pred.bubble_fraction = 1.0 - busy / static_cast<double>(sr.stages.size()) / sr.step_ms;
    }
    // WAN bytes per step: the table's WAN transfers (the simulator's links), or for (a) the DP
    // sums' (the ring, device::make_ring_collective: each of its DCs WAN edges carries 2 (dp - 1)
    // pieces of grad / dp per stage and lane).
    const sim::SimResult deck_wan = sim::simulate(cfg);
    row.wan_bytes = sim::prediction(deck_wan).wan_bytes_per_step;
    if (cfg.parallel.dp_across_dcs) {
      double grad = 0.0;
      for (double b : deck_wan.cost.grad_bytes) grad += b;
      const double dp = cfg.parallel.dp_size;
      row.wan_bytes = ndc * 2.0 * (dp - 1) / dp * grad * cfg.parallel.tp_size;
    }
    row.run = run_training_job(cfg, world, quiet);
    if (!root) continue;
    // vs_a needs row (a), vs_prev the row just before in the full order; "-" where it did not run.
    const Row* a = rows.front().id == "a" ? &rows.front() : nullptr;
    const Row* prev = i > 0 && rows[i - 1].id[0] + 1 == row.id[0] ? &rows[i - 1] : nullptr;
    const auto ratio = [&](const Row* x, bool pred) {
      if (x == nullptr) return std::string("-");
      return pred ? fmt::format("{:.3f}", x->pred.step_ms / row.pred.step_ms)
                  : fmt::format("{:.3f}", x->run.mean_step_s / row.run.mean_step_s);
    };
    const double meas = row.run.mean_step_s * 1e3, pred = row.pred.step_ms;
    // The run's bubble counts BubbleTea's prefill as busy (JobResult::measured_bubble); the column
    // is the training bubble, as pred_bub: prefill added back.
    fmt::print("{}", table.row({row.id, row.what, fmt::format("{:.1f}", meas), fmt::format("{:.1f}", pred),
                                fmt::format("{:.3f}", meas / pred), ratio(a, false), ratio(a, true),
                                ratio(prev, false), ratio(prev, true), fmt::format("{:.2f}", row.wan_bytes / 1e6),
                                fmt::format("{:.1f}", 100 * (row.run.measured_bubble + row.run.measured_prefill)),
                                fmt::format("{:.1f}", 100 * row.pred.bubble_fraction),
                                fmt::format("{:.1f}", 100 * row.run.measured_utilization),
                                fmt::format("{:.1f}", 100 * row.pred.compute_utilization)}));
    std::fflush(stdout);
  }
  if (world.rank() != 0) return 0;
  if (!png.empty()) {
    bench::BarChart chart;
    chart.title = fmt::format("atlas bench ablation: {} ({} ranks, {} DCs)", deck, world.size(), ndc);
    chart.y_label = "step [ms]";
    chart.series = {"measured", "predicted"};
    chart.width = png_w;
    chart.height = png_h;
    for (const auto& r : rows) chart.groups.push_back({"(" + r.id + ")", {r.run.mean_step_s * 1e3, r.pred.step_ms}});
    bench::write_bar_chart_png(png, chart);
    fmt::print("# chart: {} ({}x{} PNG, libpng; measured beside predicted step per row)\n", png, png_w, png_h);
  }
  // The footer: what the rows that ran allow.
  const auto find = [&](char id) -> const Row* {
    for (const auto& r : rows)
      if (r.id[0] == id) return &r;
    return nullptr;
  };
  const Row *ra = find('a'), *rc = find('c'), *rd = find('d'), *re = find('e');
  std::vector<std::string> foot;
  if (ra && rd)
    foot.push_back(fmt::format("(d) atlas vs (a) DP across DCs measured {:.2f} x (predicted {:.2f} x)",
                               ra->run.mean_step_s / rd->run.mean_step_s, ra->pred.step_ms / rd->pred.step_ms));
  if (rc && rd) {
    const double gain_meas = rc->run.mean_step_s / rd->run.mean_step_s, gain_pred = rc->pred.step_ms / rd->pred.step_ms;
    foot.push_back(fmt::format("atlas gain over (c) measured {:.3f} x, predicted {:.3f} x (measured/predicted gain "
                               "{:.2f})",
                               gain_meas, gain_pred, gain_meas / gain_pred));
  }
  if (rd && re) foot.push_back(fmt::format("(e) BubbleTea vs (d) step {:+.1f}%", 100.0 * (re->run.mean_step_s / rd->run.mean_step_s - 1.0)));
  for (const auto& r : rows) foot.push_back(fmt::format("({}) measured/predicted {:.3f}", r.id, r.run.mean_step_s * 1e3 / r.pred.step_ms));
  fmt::print("ablation: {}\n", fmt::join(foot, "; "));
  return 0;
}

}  // namespace atlas::app
