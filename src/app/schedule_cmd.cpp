// SPDX-License-Identifier: MIT
// `atlas schedule DECK`: the static tables for gpipe, 1f1b and atlas side by side (Gantt charts
// with WAN link rows, predicted step time and bubble fraction), optionally as JSON and as a PNG.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/app/report_script.hpp"
#include "atlas/bubbletea/cost.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sim/sanity.hpp"
#include "atlas/core/units.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::app {

int cmd_schedule(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  keep_heap_for_reuse();
  const Args args = parse_args(ctx.args, {"json", "width", "kind", "png"}, {"quiet"},
                               {{"json", "FILE: the tables as JSON"},
                                {"width", "COLUMNS: the Gantt charts' width (100)"},
                                {"kind", "gpipe|1f1b|atlas: that table only (all three)"},
                                {"png", "FILE: the Gantt charts as a picture"},
                                {"quiet", "no Gantt charts on stdout, the summary only"}});
  const std::string path = deck_path(args, "schedule");
  // Output paths first: a missing directory is found before the tables are printed, not after.
  for (const char* file : {"json", "png"})
    if (args.flag(file)) check_output_file("atlas schedule", std::string("--") + file, args.option(file));
  const Config cfg = load_offline_deck(path, args.overrides);
  const topo::Layout layout(cfg.parallel);
  // The cost model `atlas train` uses (the deck's device profile), so the tables shown are the
  // ones a run executes.
  const sched::CostModel cost = sched::cost_model(cfg, layout);
  const int width = args.int_option("width", 100, 10, 1000);

  std::vector<ScheduleKind> kinds{ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas};
  if (args.flag("kind")) {
    const std::string k = args.option("kind");
    if (k == "gpipe") kinds = {ScheduleKind::GPipe};
    else if (k == "1f1b") kinds = {ScheduleKind::OneFOneB};
    else if (k == "atlas") kinds = {ScheduleKind::Atlas};
    else throw UsageError("--kind must be gpipe, 1f1b or atlas");
  }

  std::vector<sched::ScheduleTable> tables;
  for (ScheduleKind k : kinds) tables.push_back(sched::build_schedule(cost, sched::schedule_options(cfg, k)));

  // BubbleTea: the charts and JSON show the bubbles' predicted Prefill slots ('~'), FLOP-estimated.
  std::vector<sched::ScheduleTable> shown = tables;
  if (cfg.bubbletea.enabled)
    for (auto& t : shown) t = sched::place_prefill(t, bubbletea::prefill_plan(cfg, layout, t));

  fmt::print("# deck {}: {} DCs, {} stages x dp {} x tp {} = {} ranks, {} micro-batches of {} x {} tokens\n",
             path, layout.dc_count(), layout.pp_size(), layout.dp_size(), layout.tp_size(),
             layout.world_size(), cfg.train.micro_batches, cfg.train.micro_batch_size, cfg.model.seq_len);
  fmt::print("# cost model: forward per stage (ms):");
  for (double f : cost.fwd_ms) fmt::print(" {:.3f}", f);
  fmt::print("; boundary tensor {} bytes per TP lane\n", cost.act_bytes);
  for (const auto& t : shown) {
    if (!args.flag("quiet")) fmt::print("\n{}", sched::gantt(t, cfg.cluster.dcs, width));
  }
  fmt::print("\n# {:<8} {:>12} {:>14} {:>10} {:>12} {:>16}\n", "schedule", "step_ms", "mean_bubble_%", "vs_1f1b",
             "mem_GiB/GPU", "in_flight/stage");
  double onefoneb = 0.0;
  for (const auto& t : tables)
    if (t.kind == ScheduleKind::OneFOneB) onefoneb = t.step_ms;
  std::string misfits;
  for (const auto& t : tables) {
    // Memory per GPU: the fullest stage's state + its in-flight micro-batches' activations.
    const sched::ScheduleMemory mem = sched::memory_per_gpu(cost, t);
    std::string depth;
    for (int d : mem.depth) depth += (depth.empty() ? "" : ",") + std::to_string(d);
    fmt::print("  {:<8} {:>12.3f} {:>14.1f} {:>10} {:>12.2f} {:>16}{}\n", to_string(t.kind), t.step_ms,
               100.0 * t.mean_bubble_fraction(),
               onefoneb > 0 ? fmt::format("{:.3f}", t.step_ms / onefoneb) : std::string("-"),
               mem.peak_bytes / static_cast<double>(units::kGiB), depth,
               std::string(sched::is_split(t) ? "  split B+W" : "") + (mem.fits() ? "" : "  DOES NOT FIT"));
    if (!mem.fits()) misfits += "# WARNING: " + sched::memory_misfit(mem, t, cfg, sched::device_profile(cfg).name) + "\n";
  }
  fmt::print("# memory limit: {:.2f} GiB usable per GPU ({})\n{}", cost.memory_limit_bytes / static_cast<double>(units::kGiB),
             sched::memory_owner(cfg, sched::device_profile(cfg).name), misfits);
  // An implausible prediction (a step of years: a deck's typo) is said, as simulate and plan do.
  double slowest_ms = 0.0;
  for (const auto& t : tables) slowest_ms = std::max(slowest_ms, t.step_ms);
  std::fflush(stdout);  // the warnings after the table they are about, also in a pipe
  for (const auto& w : sim::sanity_warnings(cfg, slowest_ms)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  // The same data-residency check atlas train refuses on (cluster.may_hold_data).
  for (const auto& w : plan::residency_violations(cfg)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());

  if (cfg.bubbletea.enabled) {
    fmt::print("\n# BubbleTea (predicted from FLOPs): chunks of {} prompt tokens, guard {:.2f} ms\n",
               bubbletea::planned_chunk_tokens(cfg.bubbletea), cfg.bubbletea.guard_ms);
    for (const auto& t : shown)
      fmt::print("  {:<8} prefill {:>10.0f} tokens/s, bubbles left {:5.1f}%\n", to_string(t.kind),
                 bubbletea::predicted_prefill_tokens_per_s(cfg.bubbletea.pipeline, t, layout), 100.0 * t.mean_bubble_fraction());
  }

  std::string json_path = args.option("json");
  if (json_path.empty() && args.flag("png"))
    json_path = (std::filesystem::temp_directory_path() / ("atlas-schedule-" + std::to_string(::getpid()) + ".json")).string();
  if (!json_path.empty()) {
    std::string json = "[";
    for (std::size_t i = 0; i < shown.size(); ++i) json += (i ? "," : "") + sched::to_json(shown[i], cfg.cluster.dcs);
    write_file_whole(json_path, json + "]\n");
    if (args.flag("json")) fmt::print("# wrote {}\n", json_path);
  }
  if (args.flag("png")) {
    // The same picture `atlas report` draws for a run, here for the predicted tables.
    const int rc = run_report_script(find_report_script("atlas_report.py"),
                                     {"--schedule-json", json_path, "--out", args.option("png")});
    if (!args.flag("json")) std::filesystem::remove(json_path);
    if (rc != 0) ATLAS_THROW(Io, "drawing " << args.option("png") << " failed (atlas_report.py exited with " << rc << ")");
    fmt::print("# wrote {}\n", args.option("png"));
  }
  return 0;
}

}  // namespace atlas::app
