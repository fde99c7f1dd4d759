// SPDX-License-Identifier: MIT
// The simulator: the deck's schedule table re-timed under the simulator's cost model through
// sched's engine, and the measurements taken from the timed table.
#include "atlas/sim/simulator.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sim {

SimResult measure(const sched::ScheduleTable& t, const sched::CostModel& cost, double tokens_per_step) {
  SimResult r;
  r.table = t;
  r.cost = cost;
  r.step_ms = t.step_ms;
  r.tokens_per_step = tokens_per_step;
  r.tokens_per_s = t.step_ms > 0 ? tokens_per_step / (t.step_ms * 1e-3) : 0.0;
  r.gpus = t.pp * t.dp * t.tp;
  double idle_sum = 0.0;
  double compute_sum = 0.0;
  for (int s = 0; s < t.pp; ++s) {
    StageUse u;
    u.stage = s;
    u.dc = t.stage_dc[static_cast<std::size_t>(s)];
    u.idle_min_ms = t.step_ms;
    for (int d = 0; d < t.dp; ++d) {
      double compute = 0.0;
      double other = 0.0;
      double idle = 0.0;
      for (const auto& sl : t.row(s, d)) {
        if (sched::is_compute(sl.kind)) compute += sl.duration_ms;
        else if (sl.kind == sched::SlotKind::Idle) idle += sl.duration_ms;
        else other += sl.duration_ms;
      }
      u.compute_ms += compute / t.dp;
      u.other_ms += other / t.dp;
      u.idle_min_ms = std::min(u.idle_min_ms, idle);
      u.idle_max_ms = std::max(u.idle_max_ms, idle);
      u.bubble_fraction += t.step_ms > 0 ? idle / t.step_ms / t.dp : 0.0;
      idle_sum += idle;
      compute_sum += compute;
    }
    r.stages.push_back(u);
  }
  const double rows = static_cast<double>(t.pp) * t.dp;
  if (t.step_ms > 0) {
    r.bubble_fraction = idle_sum / rows / t.step_ms;
    r.compute_utilization = compute_sum / rows / t.step_ms;
  }
  for (const auto& l : t.links) {
    LinkUse u;
    u.src_dc = l.src_dc;
    u.dst_dc = l.dst_dc;
    // Busy time: the union of the transfers' [start, end] intervals.
    std::vector<std::pair<double, double>> iv;
    for (const auto& x : l.order) {
      u.bytes += static_cast<double>(x.bytes);
      if (x.end_ms > x.start_ms) iv.emplace_back(x.start_ms, x.end_ms);
    }
    std::sort(iv.begin(), iv.end());
    double lo = 0.0;
    double hi = -1.0;
    for (const auto& [a, b] : iv) {
      if (a > hi) {
        if (hi > lo) u.busy_ms += hi - lo;
        lo = a;
        hi = b;
      } else {
        hi = std::max(hi, b);
      }
    }
    if (hi > lo) u.busy_ms += hi - lo;
    const double cap = cost.link(l.src_dc, l.dst_dc).capacity_bytes_per_ms;
    if (t.step_ms > 0) {
      u.utilization = u.bytes / (cap * t.step_ms);
      u.busy_fraction = u.busy_ms / t.step_ms;
    }
    r.max_link_utilization = std::max(r.max_link_utilization, u.utilization);
    r.links.push_back(u);
  }
  return r;
}

SimResult simulate(const sched::CostModel& cost, ScheduleKind kind, int micro_batches, double tokens,
                   bool atlas_full_search, bool atlas_baseline, const std::shared_ptr<sched::SearchRuns>& atlas_runs) {
  sched::ScheduleOptions o;
  o.runs = atlas_runs;
  o.kind = kind;
  o.micro_batches = micro_batches;
  o.full_search = atlas_full_search;
  o.baseline_1f1b = atlas_baseline;
  return measure(sched::build_schedule(cost, o), cost, tokens);
}

namespace {
// The table from `deck` (the runtime's, or a search), timed with the costs of `machine`.
SimResult simulate_impl(const Config& deck, const Config& machine, const DeviceProfile& profile,
                        const SimOptions& opt) {
  const topo::Layout layout(deck.parallel);
  sched::CostModel cost = sched::cost_model(machine, layout, profile);
  cost.virtual_stages = deck.schedule.virtual_stages;  // the deck's model chunks (interleaved 1F1B)
  if (!opt.stage_fwd_ms.empty() || !opt.stage_bwd_ms.empty()) {
    const auto pp = static_cast<std::size_t>(cost.pp);
    if (opt.stage_fwd_ms.size() != pp || opt.stage_bwd_ms.size() != pp)
      ATLAS_THROW(Config, "per-stage compute costs for " << opt.stage_fwd_ms.size() << " / " << opt.stage_bwd_ms.size()
                                                         << " stages (forward / backward), the deck has " << pp);
    for (std::size_t s = 0; s < pp; ++s) {
      if (!(opt.stage_fwd_ms[s] > 0) || !(opt.stage_bwd_ms[s] > 0) || !std::isfinite(opt.stage_fwd_ms[s]) ||
          !std::isfinite(opt.stage_bwd_ms[s]))
        ATLAS_THROW(Config, "stage " << s << ": per-stage compute costs must be positive and finite (forward "
                                     << opt.stage_fwd_ms[s] << " ms, backward " << opt.stage_bwd_ms[s] << " ms)");
      const double was = cost.fwd_ms[s] + cost.bwd_ms[s];
      if (was > 0) cost.optimizer_ms[s] *= (opt.stage_fwd_ms[s] + opt.stage_bwd_ms[s]) / was;
      cost.fwd_ms[s] = opt.stage_fwd_ms[s];
      cost.bwd_ms[s] = opt.stage_bwd_ms[s];
    }
  }
  ATLAS_ASSERT(opt.compute_scale > 0, "compute_scale must be positive");
  if (opt.compute_scale != 1.0)
    for (auto* v : {&cost.fwd_ms, &cost.bwd_ms, &cost.optimizer_ms})
      for (double& ms : *v) ms *= opt.compute_scale;
  SimResult r;
  if (opt.source == TableSource::Deck) {
    // The runtime's own table (its slot order and, for atlas, its frozen WAN link orders).
    // Timed with the deck's own costs it is its own timing (build_schedule times the table it
    // returns, and a retime with the same costs gives it to the bit): no second engine run.
    const bool own_costs = &deck == &machine && opt.stage_fwd_ms.empty() && opt.stage_bwd_ms.empty() &&
                           opt.compute_scale == 1.0 && profile == sched::device_profile(deck);
    const sched::ScheduleTable deck_table = sched::build_schedule(deck, layout);
    r = measure(own_costs ? deck_table : sched::retime(deck_table, cost), cost, static_cast<double>(deck.tokens_per_step()));
  } else {
    sched::ScheduleOptions o = sched::schedule_options(deck, deck.schedule.kind);
    o.full_search = opt.atlas_full_search;
    r = measure(sched::build_schedule(cost, o), cost, static_cast<double>(deck.tokens_per_step()));
  }
  r.profile_name = profile.name;
  return r;
}
}  // namespace

SimResult simulate(const Config& cfg, const DeviceProfile& profile, const SimOptions& opt) {
  return simulate_impl(cfg, cfg, profile, opt);
}

SimResult simulate(const Config& cfg, const SimOptions& opt) {
  return simulate(cfg, sched::device_profile(cfg), opt);
}

SimResult simulate_on(const Config& deck, const Config& machine, const SimOptions& opt) {
  return simulate_impl(deck, machine, sched::device_profile(machine), opt);
}

SimResult simulate_on(const Config& deck, const Config& machine, const DeviceProfile& profile,
                      const SimOptions& opt) {
  return simulate_impl(deck, machine, profile, opt);
}

Config machine_config(const Config& deck, const RunMachine& m) {
  Config c = deck;
  if (m.loopback_wan) {
    std::fill(c.cluster.latency_ms.begin(), c.cluster.latency_ms.end(), 0.0);
    for (double& gbps : c.cluster.bandwidth_gbps)
      if (gbps > 0) gbps = c.cluster.intra_bandwidth_gbps;
  }
  if (m.host_backend) {
    c.plan.gpu = GpuKind::Host;
    c.schedule.fwd_ms_per_layer = 0.0;
    c.schedule.device_tflops = 0.0;
  }
  if (m.ranks_per_host > 0) {
    c.cluster.ranks_per_host = m.ranks_per_host;
    c.cluster.cores_per_host = m.cores_per_host;
    c.cluster.host_wake_us = m.wake_ms * 1e3;
    c.cluster.host_net_ns_per_byte = m.net_ns_per_byte;
  }
  return c;
}

Prediction prediction(const SimResult& r) {
  Prediction p;
  p.step_ms = r.step_ms;
  p.bubble_fraction = r.bubble_fraction;
  p.compute_utilization = r.compute_utilization;
  p.tokens_per_s = r.tokens_per_s;
  p.max_link_utilization = r.max_link_utilization;
  for (const auto& l : r.links) p.wan_bytes_per_step += l.bytes;
  p.structure_hash = r.table.structure_hash();
  p.profile_name = r.profile_name;
  return p;
}

Prediction predict(const Config& cfg) { return prediction(simulate(cfg)); }

FillResult fill_bubbles(const sched::ScheduleTable& t, const sched::CostModel& cost, double tokens_per_micro,
                        int prefill_tokens, double guard_ms, bool fill_wan_waits) {
  FillResult f;
  if (t.step_ms <= 0) return f;
  const bool spans_dcs = !t.stage_dc.empty() && t.stage_dc.front() != t.stage_dc.back();
  double busy = 0.0;
  for (int s = 0; s < t.pp; ++s) {
    const double one = cost.fwd_ms[static_cast<std::size_t>(s)] * prefill_tokens / tokens_per_micro;
    for (int d = 0; d < t.dp; ++d)
      for (const auto& sl : t.row(s, d)) {
        if (sched::is_compute(sl.kind)) busy += sl.duration_ms;
        double room = 0.0;
        if (sl.kind == sched::SlotKind::Idle) room = sl.duration_ms;
        if (sl.kind == sched::SlotKind::Optimizer && fill_wan_waits && spans_dcs)
          room = sl.duration_ms - cost.optimizer_ms[static_cast<std::size_t>(s)];  // the norm's round trip
        if (one <= 0 || room <= guard_ms) continue;
        const auto n = static_cast<long long>(std::floor((room - guard_ms) / one + 1e-9));
        f.prefills += n;
        f.prefill_ms += static_cast<double>(n) * one;
      }
  }
  f.utilization = (busy + f.prefill_ms) / (static_cast<double>(t.pp) * t.dp * t.step_ms);
  return f;
}

std::string report(const SimResult& r, const std::vector<std::string>& dc_names) {
  auto dc = [&](int i) {
    return static_cast<std::size_t>(i) < dc_names.size() ? dc_names[static_cast<std::size_t>(i)] : fmt::format("dc{}", i);
  };
  std::string out;
  out += fmt::format("# {} schedule, {} stages x dp {} x tp {} = {} GPUs, {} micro-batches; profile {}\n",
                     to_string(r.table.kind), r.table.pp, r.table.dp, r.table.tp, r.gpus,
                     r.table.micro_batches, r.profile_name.empty() ? "-" : r.profile_name);
  out += fmt::format("step_ms          {:.3f}\n", r.step_ms);
  out += fmt::format("tokens_per_s     {:.1f}\n", r.tokens_per_s);
  out += fmt::format("bubble           {:.1f}%\n", 100.0 * r.bubble_fraction);
  out += fmt::format("compute_util     {:.1f}%  (forward + backward time / step, mean over ranks)\n",
                     100.0 * r.compute_utilization);
  out += fmt::format("\n# {:<12} {:>5} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "dc", "stage", "compute_ms",
                     "ar+opt_ms", "idle_min_ms", "idle_max_ms", "bubble%");
  for (const auto& u : r.stages)
    out += fmt::format("  {:<12} {:>5} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>7.1f}%\n", dc(u.dc), u.stage,
                       u.compute_ms, u.other_ms, u.idle_min_ms, u.idle_max_ms, 100.0 * u.bubble_fraction);
  if (!r.links.empty()) {
    out += fmt::format("\n# {:<24} {:>14} {:>10} {:>10} {:>9}\n", "wan link", "GB/step", "busy_ms", "busy%", "util%");
    for (const auto& l : r.links)
      out += fmt::format("  {:<24} {:>14.4f} {:>10.3f} {:>9.1f}% {:>8.1f}%\n",
                         fmt::format("{} -> {}", dc(l.src_dc), dc(l.dst_dc)), l.bytes / 1e9, l.busy_ms,
                         100.0 * l.busy_fraction, 100.0 * l.utilization);
  }
  return out;
}

}  // namespace atlas::sim
