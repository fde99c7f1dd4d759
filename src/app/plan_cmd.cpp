// SPDX-License-Identifier: MIT
// `atlas plan DECK`: the ATLAS planner's what-if table and the chosen plan as a ready deck.
#include <cstdio>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/app/progress.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/sim/profile.hpp"
#include "atlas/sim/sanity.hpp"

namespace atlas::app {

int cmd_plan(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  keep_heap_for_reuse();
  const Args args = parse_args(ctx.args, {"wan", "deck-out", "rows", "progress-after"}, {"quiet"},
                               {{"wan", "PROFILE: the WAN matrices from a profile (profiles/wan/*.profile)"},
                                {"deck-out", "FILE: the chosen plan as a ready deck"},
                                {"rows", "N: rows of the what-if table (plan.top)"},
                                {"progress-after", "SECONDS: progress lines on stderr after this long (3)"},
                                {"quiet", "without the plan's deck on stdout"}});
  const std::string path = deck_path(args, "plan");
  if (args.flag("deck-out")) check_output_file("atlas plan", "--deck-out", args.option("deck-out"));
  std::vector<std::string> overrides;
  if (args.flag("wan")) overrides = sim::wan_profile_overrides(args.option("wan"), path, args.overrides);
  overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
  // The deck's parallel layout is only the planner's starting point (its dp sets the global
  // batch): check everything else, and not whether that layout fits the cluster.
  Config cfg = deck::parse(path, deck::read_text_file(path), overrides);
  if (auto problems = plan::validate_for_planning(cfg, cuda_built()); !problems.empty()) throw ConfigError(problems);
  const int rows = args.int_option("rows", cfg.plan.top, 1, std::numeric_limits<int>::max());
  if (cfg.schedule.virtual_stages > 1) {
    std::fprintf(stderr,
                 "note: atlas plan searches schedules without model chunks: schedule.virtual_stages = %d is not "
                 "searched, the plans (and --deck-out) use 1\n  hint: to compare interleaving, run atlas simulate "
                 "on the plan's deck with schedule.virtual_stages=V\n",
                 cfg.schedule.virtual_stages);
    cfg.schedule.virtual_stages = 1;
  }
  // The planner times and writes ATLAS schedules with PP across DCs (plan::plan_config): a deck
  // asking for another schedule or for DP across DCs was planned as ATLAS without a word.
  if (cfg.schedule.kind != ScheduleKind::Atlas)
    std::fprintf(stderr,
                 "note: atlas plan searches ATLAS schedules: schedule.kind = %s is not searched, the plans (and "
                 "--deck-out) use atlas\n  hint: to time another schedule, run atlas simulate on the plan's deck "
                 "with schedule.kind=%s\n",
                 to_string(cfg.schedule.kind), to_string(cfg.schedule.kind));
  if (cfg.parallel.dp_across_dcs)
    std::fprintf(stderr,
                 "note: atlas plan keeps each stage's DP replicas inside a DC: parallel.dp_across_dcs = true is not "
                 "searched, the plans (and --deck-out) use false\n  hint: atlas simulate --compare times DP "
                 "across DCs beside the planner's plan (design a)\n");
  deck::read_device_profiles(cfg);
  if (const std::string note = sched::offline_costing_note(cfg); !note.empty()) std::fputs(note.c_str(), stderr);
  const sched::DeviceProfile prof = sched::device_profile(cfg);

  int total = 0;
  for (int g : cfg.cluster.gpus_per_dc) total += g;
  fmt::print("# deck {}: {} DCs, {} free GPUs ({}), model {:.2f}B parameters, global batch {} sequences of {} tokens\n",
             path, cfg.cluster.dc_count(), total,
             [&] {
               std::string s;
               for (std::size_t i = 0; i < cfg.cluster.dcs.size(); ++i)
                 s += fmt::format("{}{} {}", i ? ", " : "", cfg.cluster.dcs[i], cfg.cluster.gpus_per_dc[i]);
               return s;
             }(),
             static_cast<double>(cfg.model.parameter_count()) / 1e9, plan::global_batch(cfg), cfg.model.seq_len);
  fmt::print("# profile {} ({}): {:.4g} TFLOP/s x {:.2f} achievable, {:g} GiB ({:.0f}% usable){}\n", prof.name,
             prof.path.empty() ? "built in" : prof.path, prof.peak_tflops, prof.achievable_fraction, prof.memory_gib,
             100 * prof.usable_memory_fraction,
             cfg.schedule.fwd_ms_per_layer > 0
                 ? fmt::format("; compute from schedule.fwd_ms_per_layer = {:g} ms a block", cfg.schedule.fwd_ms_per_layer)
             : cfg.schedule.device_tflops > 0
                 ? fmt::format("; compute at schedule.device_tflops = {:g} TFLOP/s", cfg.schedule.device_tflops)
                 : std::string());
  if (prof.board_power_w > 0)
    fmt::print("# power: {:g} W a GPU (board) x PUE {}\n", prof.board_power_w, [&] {
      std::string s;
      for (int dc = 0; dc < (cfg.cluster.pue.size() > 1 ? cfg.cluster.dc_count() : 1); ++dc)
        s += fmt::format("{}{:g}", dc ? " " : "", cfg.cluster.pue_of(dc));
      return s;
    }());
  if (!cfg.cluster.power_mw.empty()) {
    const std::vector<int> powered = plan::powered_gpus(cfg, prof);
    std::string s;
    for (std::size_t dc = 0; dc < powered.size(); ++dc)
      s += fmt::format("{}{} {:g} MW = {} GPUs{}", dc ? ", " : "", cfg.cluster.dcs[dc], cfg.cluster.power_mw[dc], powered[dc],
                       powered[dc] < cfg.cluster.gpus_per_dc[dc] ? fmt::format(" (of {} free)", cfg.cluster.gpus_per_dc[dc]) : "");
    fmt::print("# power budgets (cluster.power_mw; GPUs x board power x PUE): {}\n", s);
  }
  if (!cfg.cluster.may_hold_data.empty()) {
    std::string yes;
    std::string no;
    for (int dc = 0; dc < cfg.cluster.dc_count(); ++dc)
      (cfg.cluster.may_hold_data_of(dc) ? yes : no) +=
          fmt::format("{}{}", (cfg.cluster.may_hold_data_of(dc) ? yes : no).empty() ? "" : ", ", cfg.cluster.dcs[static_cast<std::size_t>(dc)]);
    fmt::print("# data residency (cluster.may_hold_data): the first stage (reads the training data, holds the "
               "embedding) and the last (LM head, tied to the embedding) {}; {} may hold middle stages only\n",
               yes.empty() ? "in no DC (every DC is marked 0)" : "only in " + yes, no.empty() ? "no DC" : no);
  }

  plan::PlanResult r;
  {
    Progress progress("atlas plan", progress_after_s(args));
    plan::PlanOptions opt;
    opt.progress = progress.setter();
    r = plan::search(cfg, prof, opt);
  }
  fmt::print("# searched {} shapes (tp <= {}, every pp, dp dividing the global batch, micro-batch sizes): {} fit "
             "memory, {} placed, {} simulated, {:.2f} s\n",
             r.shapes, cfg.plan.max_tp, r.fit_memory, r.placed, r.plans.size(), r.seconds);
  for (const auto& w : sim::sanity_warnings(cfg, r.plans[static_cast<std::size_t>(r.best)].step_ms))
    std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  if (!r.priced) fmt::print("# no cluster.price_per_gpu_hour: cost is in GPU-hours per step\n");
  fmt::print("\n{}", plan::what_if_table(r, cfg, rows));
  if (cfg.plan.deadline_s > 0 && !r.deadline_met)
    fmt::print("\n# WARNING: no plan meets plan.deadline_s = {:g} s per step; the fastest takes {:.3f} s. "
               "The deck below is the fastest plan.\n",
               cfg.plan.deadline_s, r.plans[static_cast<std::size_t>(r.best)].step_ms / 1e3);

  const plan::Plan& chosen = r.plans[static_cast<std::size_t>(r.chosen)];
  {
    const SplitBackward split = cfg.schedule.split_backward;
    const char* setting = split == SplitBackward::On    ? "on"
                          : split == SplitBackward::Off ? "off"
                          : chosen.split_backward      ? "auto: the split won"
                                                        : "auto: the split did not win";
    fmt::print("\n# the chosen plan's atlas table {} (schedule.split_backward = {})\n",
               chosen.split_backward ? "splits the backward into B + W (zero-bubble)" : "does not split the backward",
               setting);
  }
  if (chosen.power_kw > 0) {
    fmt::print("\n# the chosen plan draws {}\n",
               plan::energy_summary(cfg, prof, plan::plan_gpus_per_dc(chosen), chosen.step_ms));
  }
  const Config out = plan::plan_config(cfg, chosen);
  std::string text = fmt::format("# atlas plan of {}: {} GPUs, predicted step {:.3f} s, {:.0f} tokens/s, "
                                 "utilization {:.1f}%{}\n",
                                 path, chosen.gpus, chosen.step_ms / 1e3, chosen.tokens_per_s, 100 * chosen.utilization,
                                 chosen.split_backward ? ", backward split (B + W)" : "");
  text += deck::resolved_deck(out);
  if (args.flag("deck-out")) {
    const std::string file = args.option("deck-out");
    write_file_whole(file, text);
    fmt::print("\n# wrote the plan's deck to {}\n", file);
  } else if (!args.flag("quiet")) {
    fmt::print("\n# ---- the plan as a deck (--deck-out FILE writes it) ----\n{}", text);
  }
  return 0;
}

}  // namespace atlas::app
