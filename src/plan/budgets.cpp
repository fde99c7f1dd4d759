// SPDX-License-Identifier: MIT
// What decides where to train beside time (see planner.hpp): what each DC's power budget
// (cluster.power_mw) powers at board power x PUE, what a layout draws and emits, and whether a
// deck's layout keeps its data-reading stages where cluster.may_hold_data allows.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/plan/planner.hpp"

namespace atlas::plan {

namespace {

/// An energy figure in kWh, with the digits that matter.
std::string kwh_text(double kwh) { return kwh >= 100 ? fmt::format("{:.0f} kWh", kwh) : fmt::format("{:.3g} kWh", kwh); }

/// Emissions with the unit that reads well: kg below a tonne, t above.
std::string co2_text(double kg) { return kg >= 1000 ? fmt::format("{:.4g} t CO2", kg / 1e3) : fmt::format("{:.4g} kg CO2", kg); }

/// GPUs of board power `watts` a budget of `mw` MW powers at `pue`.
double gpus_powered(double mw, double watts, double pue) { return std::floor(mw * 1e6 / (watts * pue) + 1e-9); }

}  // namespace

std::vector<int> powered_gpus(const Config& cfg, const sched::DeviceProfile& prof) {
  std::vector<int> out = cfg.cluster.gpus_per_dc;
  if (cfg.cluster.power_mw.empty()) return out;
  if (!(prof.board_power_w > 0))
    throw ConfigError(fmt::format("cluster.power_mw needs the device profile's board power, and {} has no board_power_w\n"
                                  "  hint: add board_power_w = WATTS to its profile",
                                  prof.name));
  for (std::size_t dc = 0; dc < out.size(); ++dc) {
    const double fit = gpus_powered(cfg.cluster.power_mw[dc], prof.board_power_w, cfg.cluster.pue_of(static_cast<int>(dc)));
    out[dc] = static_cast<int>(std::min<double>(out[dc], fit));
  }
  return out;
}

std::string power_limited_dcs(const Config& cfg, const std::vector<int>& powered) {
  std::string out;
  for (std::size_t dc = 0; dc < powered.size(); ++dc)
    if (powered[dc] < cfg.cluster.gpus_per_dc[dc])
      out += fmt::format("{}{} (powers {} of {} free)", out.empty() ? "" : ", ", cfg.cluster.dcs[dc], powered[dc],
                         cfg.cluster.gpus_per_dc[dc]);
  return out;
}

std::vector<int> plan_gpus_per_dc(const Plan& p) {
  std::vector<int> out;
  for (int s : p.stages_per_dc) out.push_back(s * p.dp * p.tp);
  return out;
}

std::vector<int> deck_gpus_per_dc(const Config& cfg) {
  std::vector<int> out;
  for (int dc = 0; dc < cfg.cluster.dc_count(); ++dc) out.push_back(static_cast<int>(cfg.parallel.ranks_in_dc(dc)));
  return out;
}

double power_kw(const Config& cfg, const sched::DeviceProfile& prof, const std::vector<int>& gpus_per_dc) {
  double w = 0.0;
  for (std::size_t dc = 0; dc < gpus_per_dc.size(); ++dc)
    w += static_cast<double>(gpus_per_dc[dc]) * prof.board_power_w * cfg.cluster.pue_of(static_cast<int>(dc));
  return w / 1e3;
}

double co2_kg_per_hour(const Config& cfg, const sched::DeviceProfile& prof, const std::vector<int>& gpus_per_dc) {
  if (cfg.cluster.carbon_g_per_kwh.empty()) return 0.0;
  double g = 0.0;
  for (std::size_t dc = 0; dc < gpus_per_dc.size(); ++dc)
    g += static_cast<double>(gpus_per_dc[dc]) * prof.board_power_w / 1e3 * cfg.cluster.pue_of(static_cast<int>(dc)) *
         cfg.cluster.carbon_g_per_kwh[dc];
  return g / 1e3;
}

std::vector<std::string> power_overruns(const Config& cfg, const sched::DeviceProfile& prof) {
  std::vector<std::string> out;
  if (cfg.cluster.power_mw.empty() || !(prof.board_power_w > 0)) return out;
  const std::vector<int> gpus = deck_gpus_per_dc(cfg);
  for (int dc = 0; dc < cfg.cluster.dc_count(); ++dc) {
    const auto i = static_cast<std::size_t>(dc);
    const double pue = cfg.cluster.pue_of(dc);
    const int ranks = gpus[i];
    const double powered = gpus_powered(cfg.cluster.power_mw[i], prof.board_power_w, pue);
    if (static_cast<double>(ranks) <= powered) continue;
    out.push_back(fmt::format("DC {} runs {} GPUs, but its budget cluster.power_mw = {:g} MW powers {:.0f} ({:g} W a GPU x "
                              "PUE {:g}): {:.3g} MW needed\n  hint: give the DC fewer stages (parallel.stages_per_dc) or "
                              "a smaller parallel.dp_size; `atlas plan` keeps every DC within its budget",
                              cfg.cluster.dcs[i], ranks, cfg.cluster.power_mw[i], powered, prof.board_power_w, pue,
                              static_cast<double>(ranks) * prof.board_power_w * pue / 1e6));
  }
  return out;
}

std::string energy_summary(const Config& cfg, const sched::DeviceProfile& prof, const std::vector<int>& gpus_per_dc,
                           double step_ms) {
  if (!(prof.board_power_w > 0)) return "";
  const double kw = power_kw(cfg, prof, gpus_per_dc);
  const double step_h = step_ms / 3.6e6;
  const bool carbon = !cfg.cluster.carbon_g_per_kwh.empty();
  const double kg = co2_kg_per_hour(cfg, prof, gpus_per_dc) * step_h;
  std::string s = fmt::format("{:.1f} kW (GPUs x board power x PUE): {} a step", kw, kwh_text(kw * step_h));
  if (carbon) s += fmt::format(", {} a step", co2_text(kg));
  if (cfg.run.steps > 0) {
    s += fmt::format("; run.steps = {}: {}", cfg.run.steps, kwh_text(kw * step_h * cfg.run.steps));
    if (carbon) s += fmt::format(", {}", co2_text(kg * cfg.run.steps));
  }
  return s;
}

std::vector<std::string> residency_violations(const Config& cfg) {
  std::vector<std::string> out;
  if (cfg.cluster.may_hold_data.empty()) return out;
  // The DCs holding a first or last stage: with DP across DCs every DC with stages holds whole
  // pipelines; else the stages run through the DCs in deck order.
  std::vector<std::pair<int, const char*>> ends;
  const auto& st = cfg.parallel.stages_per_dc;
  int first = -1;
  int last = -1;
  for (int dc = 0; dc < static_cast<int>(st.size()); ++dc)
    if (st[static_cast<std::size_t>(dc)] > 0) {
      if (cfg.parallel.dp_across_dcs) ends.emplace_back(dc, "first and last");
      if (first < 0) first = dc;
      last = dc;
    }
  if (!cfg.parallel.dp_across_dcs && first >= 0) {
    ends.emplace_back(first, first == last ? "first and last" : "first");
    if (last != first) ends.emplace_back(last, "last");
  }
  for (const auto& [dc, which] : ends)
    if (!cfg.cluster.may_hold_data_of(dc))
      out.push_back(fmt::format("DC {} holds the pipeline's {} stage, but cluster.may_hold_data marks it 0 (it may not "
                                "hold the stages that read the training data or hold the embedding)\n  hint: order "
                                "cluster.dcs and parallel.stages_per_dc so the pipeline starts and ends in a DC marked "
                                "1; `atlas plan` places the end stages there",
                                cfg.cluster.dcs[static_cast<std::size_t>(dc)], which));
  return out;
}

}  // namespace atlas::plan
