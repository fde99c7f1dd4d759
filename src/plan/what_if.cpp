// SPDX-License-Identifier: MIT
// The planner's what-if table (plan::what_if_table, see planner.hpp): the ranked plans as rows,
// with the labels a user reads first (fastest, cheapest, within the deadline, the deck's shape).
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/units.hpp"
#include "atlas/plan/planner.hpp"

namespace atlas::plan {

namespace {

double gib(double bytes) { return bytes / static_cast<double>(units::kGiB); }

}  // namespace

std::string what_if_table(const PlanResult& r, const Config& cfg, int rows) {
  std::vector<int> shown;
  for (int i = 0; i < std::min(rows, static_cast<int>(r.plans.size())); ++i) shown.push_back(i);
  if (r.chosen >= rows) shown.push_back(r.chosen);
  // The fastest plan in each DC alone and without the largest DC, when not among the rows.
  const int n = cfg.cluster.dc_count();
  int largest = 0;
  for (int dc = 1; dc < n; ++dc)
    if (cfg.cluster.gpus_per_dc[static_cast<std::size_t>(dc)] > cfg.cluster.gpus_per_dc[static_cast<std::size_t>(largest)]) largest = dc;
  std::map<int, std::string> extra_note;
  auto first_where = [&](const std::function<bool(const Plan&)>& f) {
    for (std::size_t i = 0; i < r.plans.size(); ++i)
      if (f(r.plans[i])) return static_cast<int>(i);
    return -1;
  };
  auto used = [](const Plan& p, int dc) { return p.stages_per_dc[static_cast<std::size_t>(dc)] > 0; };
  for (int dc = 0; dc < n && n > 1; ++dc) {
    const int i = first_where([&](const Plan& p) { return used(p, dc) && p.dc_order.size() == 1; });
    if (i >= 0) extra_note[i] = fmt::format("fastest in {} alone", cfg.cluster.dcs[static_cast<std::size_t>(dc)]);
  }
  if (n > 1) {
    const int i = first_where([&](const Plan& p) { return !used(p, largest); });
    // Both labels where one plan is both (a single-DC plan outside the largest DC).
    if (i >= 0) {
      const std::string prefix = extra_note.count(i) > 0 ? ", " : "";
      extra_note[i] += prefix + fmt::format("fastest without {}", cfg.cluster.dcs[static_cast<std::size_t>(largest)]);
    }
  }
  for (const auto& [i, note] : extra_note)
    if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
  std::sort(shown.begin(), shown.end());
  auto dcs_of = [&](const Plan& p) {
    std::string dcs;
    for (int dc : p.dc_order)
      dcs += fmt::format("{}{}:{}", dcs.empty() ? "" : " ", cfg.cluster.dcs[static_cast<std::size_t>(dc)],
                         p.stages_per_dc[static_cast<std::size_t>(dc)]);
    return dcs;
  };
  std::size_t width = 17;
  for (int i : shown) width = std::max(width, dcs_of(r.plans[static_cast<std::size_t>(i)]).size());
  const char* unit = r.priced ? "cost/step" : "GPU-h/step";
  // Energy (GPUs x board power x PUE x step) when the profile knows its board power; emissions
  // when the DCs' carbon intensities are given.
  const bool energy = std::any_of(r.plans.begin(), r.plans.end(), [](const Plan& p) { return p.power_kw > 0; });
  const bool carbon = energy && !cfg.cluster.carbon_g_per_kwh.empty();
  std::string out = fmt::format("# {:>3} {:<{}} {:>6} {:>3} {:>4} {:>4} {:>3} {:>5} {:>8} {:>10} {:>12} {:>6} {:>11}", "#",
                                "DCs used (stages)", width, "GPUs", "tp", "pp", "dp", "mbs", "mb", "GiB/GPU", "step_s",
                                "tokens/s", "util%", unit);
  if (energy) out += fmt::format(" {:>9} {:>10}", "kW", "kWh/step");
  if (carbon) out += fmt::format(" {:>11}", "kgCO2/step");
  out += "  note\n";
  const char* chosen_note = nullptr;
  switch (r.objective) {
    case PlanObjective::Cost: chosen_note = "cheapest"; break;
    case PlanObjective::Energy: chosen_note = "least energy"; break;
    case PlanObjective::Carbon: chosen_note = "least CO2"; break;
    default: chosen_note = cfg.plan.deadline_s > 0 ? "fastest" : nullptr; break;
  }
  for (int i : shown) {
    const Plan& p = r.plans[static_cast<std::size_t>(i)];
    std::string note;
    if (i == r.best) note += "fastest";
    if (p.tp == cfg.parallel.tp_size && p.pp == cfg.parallel.pp_size() && p.dp == cfg.parallel.dp_size &&
        p.micro_batch_size == cfg.train.micro_batch_size)
      note += std::string(note.empty() ? "" : ", ") + "the deck's shape";
    if (chosen_note != nullptr && i == r.chosen && r.deadline_met)
      note += std::string(note.empty() ? "" : ", ") + chosen_note + (cfg.plan.deadline_s > 0 ? " within deadline" : "");
    if (auto it = extra_note.find(i); it != extra_note.end()) note += std::string(note.empty() ? "" : ", ") + it->second;
    if (p.split_backward) note += std::string(note.empty() ? "" : ", ") + "split backward";
    out += fmt::format("  {:>3} {:<{}} {:>6} {:>3} {:>4} {:>4} {:>3} {:>5} {:>8.1f} {:>10.3f} {:>12.0f} {:>6.1f} {:>11.4g}",
                       i + 1, dcs_of(p), width, p.gpus, p.tp, p.pp, p.dp, p.micro_batch_size, p.micro_batches,
                       gib(p.mem_bytes), p.step_ms / 1e3, p.tokens_per_s, 100.0 * p.utilization, p.cost_per_step);
    if (energy) out += fmt::format(" {:>9.1f} {:>10.4g}", p.power_kw, p.energy_kwh_per_step);
    if (carbon) out += fmt::format(" {:>11.4g}", p.co2_kg_per_step);
    out += note.empty() ? std::string("\n") : fmt::format("  {}\n", note);
  }
  // With split_backward = auto only the plans that could be chosen get the split's timing: say
  // which rows, so a row timed unsplit is not read as the split's verdict.
  if (cfg.schedule.split_backward == SplitBackward::Auto) {
    std::string tried;
    bool untried = false;
    for (int i : shown) {
      if (r.plans[static_cast<std::size_t>(i)].split_tried) tried += fmt::format("{}{}", tried.empty() ? "" : ", ", i + 1);
      else untried = true;
    }
    if (untried)
      out += fmt::format("# the split backward (B + W) was timed for {} (the plans that could be chosen) and kept where "
                         "faster; the other rows are timed unsplit (schedule.split_backward = on splits every row)\n",
                         tried.empty() ? std::string("no row shown") : "rows " + tried);
  }
  return out;
}

}  // namespace atlas::plan
