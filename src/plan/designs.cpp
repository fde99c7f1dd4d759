// SPDX-License-Identifier: MIT
// Designs (a)-(d) side by side and the paper-reproduction grid (see designs.hpp). Every step time
// here is a schedule table timed by sched's engine under the simulator's cost model.
#include "atlas/plan/designs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/plan/planner.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sim/cost.hpp"
#include "atlas/sim/simulator.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::plan {

ModelCfg model_preset(const std::string& name) {
  ModelCfg m;
  m.seq_len = 2048;
  m.vocab = 50304;
  if (name == "7b") {
    m.layers = 32, m.hidden = 4096, m.heads = 32;
  } else if (name == "13b") {
    m.layers = 40, m.hidden = 5120, m.heads = 40;
  } else if (name == "70b") {
    m.layers = 80, m.hidden = 8192, m.heads = 64;
  } else if (name == "175b") {
    m.layers = 96, m.hidden = 12288, m.heads = 96;
  } else {
    throw ConfigError("unknown model preset '" + name + "': expected one of 7b, 13b, 70b, 175b");
  }
  return m;
}

namespace {

double latency_of(const Config& cfg, int a, int b) {
  if (a == b) return 0.0;
  return cfg.cluster.latency_ms.size() == 1 ? cfg.cluster.latency_ms[0] : cfg.cluster.latency(a, b);
}

double capacity_of(const Config& cfg, int a, int b) {
  const double gbps = cfg.cluster.bandwidth_gbps.size() == 1 ? cfg.cluster.bandwidth_gbps[0] : cfg.cluster.bandwidth(a, b);
  return std::max(gbps, 1e-9) * 1e9 / 8.0 / 1e3;
}

/// The problems of a deck the designs built, validated as an offline one (not launched).
std::vector<std::string> offline_problems(const Config& c) {
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = true;
  return deck::validate(c, shape);
}

/// A valid deck or an internal error (the designs build decks themselves).
void check_valid(const Config& c, const char* what) {
  const auto problems = offline_problems(c);
  ATLAS_ASSERT(problems.empty(), what << " made an invalid deck: " << problems.front());
}

/// Cuts `c` (a copy of `base`) down to DC `dc` alone: design (a) times one DC's job, so every
/// per-DC list keeps that DC's entry (a list of one entry is every DC's and stays).
void keep_only_dc(ClusterCfg& c, const ClusterCfg& base, int dc) {
  const auto i = static_cast<std::size_t>(dc);
  const auto n = static_cast<std::size_t>(base.dc_count());
  auto keep = [&](auto& list) {
    if (list.size() == n) list = {list[i]};
  };
  c.dcs = {base.dcs[i]};
  c.gpus_per_dc = {base.gpus_per_dc[i]};
  c.latency_ms = {0.0};
  c.bandwidth_gbps = {base.bandwidth_gbps.size() == 1 ? base.bandwidth_gbps[0] : 100.0};
  c.price_per_gpu_hour.clear();
  c.bind_hosts = {base.bind_hosts.front()};
  keep(c.power_mw);
  keep(c.pue);
  keep(c.carbon_g_per_kwh);
  keep(c.may_hold_data);
}

/// The grid's DCs are made up (dc0, dc1, ...): the deck's per-DC budgets, carbon intensities and
/// residency marks name other DCs, so they do not apply (one PUE for every DC stays).
void drop_per_dc_settings(ClusterCfg& c) {
  c.price_per_gpu_hour.clear();
  c.power_mw.clear();
  if (c.pue.size() > 1) c.pue.clear();
  c.carbon_g_per_kwh.clear();
  c.may_hold_data.clear();
}

}  // namespace

Comparison compare_designs(const Config& cfg, const sched::DeviceProfile& prof, const CompareOptions& opt) {
  Comparison out;
  out.tp = cfg.parallel.tp_size;
  out.pp = cfg.parallel.pp_size();
  out.dp = cfg.parallel.dp_size;
  out.micro_batches = cfg.train.micro_batches;
  out.micro_batch_size = cfg.train.micro_batch_size;
  out.gpus = out.pp * out.dp * out.tp;
  const int G = global_batch(cfg);
  const double tokens_per_micro = static_cast<double>(out.micro_batch_size) * cfg.model.seq_len;
  out.tokens_per_step = static_cast<double>(cfg.tokens_per_step());

  // ---- (b) PP across DCs, 1F1B, one TCP flow per transfer ----
  {
    Config cb = cfg;
    cb.wan.transport = WanTransport::Mpi;  // one flow per transfer
    cb.schedule.kind = ScheduleKind::OneFOneB;
    out.stages_per_dc_b = cfg.parallel.stages_per_dc;
    const topo::Layout layout(cb.parallel.stages_per_dc, cb.parallel.dp_size, cb.parallel.tp_size);
    const sched::CostModel cost = sched::cost_model(cb, layout, prof);
    const sim::SimResult r = sim::simulate(cost, ScheduleKind::OneFOneB, out.micro_batches, out.tokens_per_step);
    out.step_b_ms = r.step_ms;
    out.util_b = r.compute_utilization;
    const sched::ScheduleMemory mem = sched::memory_per_gpu(cost, r.table);
    out.mem_b_bytes = mem.peak_bytes;
    out.mem_limit_bytes = mem.limit_bytes;
  }

  // ---- (c) ATLAS: heuristic placement, multi-rail, temporal sharing; (d) + bubble filling ----
  {
    const auto placed = place_stages(cfg.cluster.gpus_per_dc, out.pp, out.dp * out.tp);
    ATLAS_ASSERT(placed.has_value(), "a valid deck's stages always fit the heuristic placement");
    Plan p;
    p.tp = out.tp;
    p.pp = out.pp;
    p.dp = out.dp;
    p.micro_batch_size = out.micro_batch_size;
    p.micro_batches = out.micro_batches;
    p.stages_per_dc = *placed;
    p.dc_order = chain_order(cfg, p.stages_per_dc);
    p.layers_per_stage = split_layers(cfg.model.layers, out.pp);
    Config cc = plan_config(cfg, p);
    if (cc.wan.transport != WanTransport::Multirail) cc.wan.transport = WanTransport::Multirail;
    out.stages_per_dc_c = cc.parallel.stages_per_dc;
    out.dc_order_c = p.dc_order;
    const topo::Layout layout(cc.parallel.stages_per_dc, cc.parallel.dp_size, cc.parallel.tp_size);
    const sched::CostModel cost = sched::cost_model(cc, layout, prof);
    const sim::SimResult r =
        sim::simulate(cost, ScheduleKind::Atlas, out.micro_batches, out.tokens_per_step, opt.atlas_full_search);
    out.step_c_ms = r.step_ms;
    out.util_c = r.compute_utilization;
    out.mem_c_bytes = sched::memory_per_gpu(cost, r.table).peak_bytes;
    out.util_d = sim::fill_bubbles(r.table, cost, tokens_per_micro, opt.prefill_tokens, cfg.bubbletea.guard_ms,
                                   cfg.bubbletea.fill_wan_waits)
                     .utilization;
  }

  // ---- (c*) the planner's fastest plan for the same DCs, model and global batch ----
  if (opt.planner) {
    PlanOptions po;
    po.simulate_top = opt.planner_simulate_top;
    Config cp = cfg;
    cp.plan.top = 3;  // the three fastest get the whole atlas search
    cp.cluster.gpus_per_dc.assign(cfg.cluster.gpus_per_dc.size(), 0);
    for (std::size_t dc = 0; dc < cp.cluster.gpus_per_dc.size(); ++dc)  // the GPUs (b) uses
      cp.cluster.gpus_per_dc[dc] = cfg.parallel.stages_per_dc[dc] * out.dp * out.tp;
    cp.plan.deadline_s = 0;
    const PlanResult pr = search(cp, prof, po);
    const Plan& best = pr.plans[static_cast<std::size_t>(pr.best)];
    out.step_plan_ms = best.step_ms;
    out.util_plan = best.utilization;
    out.plan_tp = best.tp;
    out.plan_pp = best.pp;
    out.plan_dp = best.dp;
    out.plan_gpus = best.gpus;
    out.plan_dcs = static_cast<int>(best.dc_order.size());
  }

  // ---- (a) DP across DCs: whole pipelines inside each DC, gradients over the WAN ----
  {
    const int n = cfg.cluster.dc_count();
    std::vector<int> gpus_dc(static_cast<std::size_t>(n), 0);
    for (int dc = 0; dc < n; ++dc)
      gpus_dc[static_cast<std::size_t>(dc)] = cfg.parallel.stages_per_dc[static_cast<std::size_t>(dc)] * out.dp * out.tp;
    const double limit = sched::memory_limit_bytes(cfg, prof);
    for (int k = 1; k <= cfg.model.layers; ++k) {
      int pipes = 0;
      for (int g : gpus_dc) pipes += g / (k * out.tp);
      if (pipes == 0) break;
      const int m_a = (G + pipes * out.micro_batch_size - 1) / (pipes * out.micro_batch_size);
      ModelCfg mm = cfg.model;
      mm.layers_per_stage = split_layers(cfg.model.layers, k);
      const sim::MemoryEstimate e =
          sim::peak_memory(mm, k, out.tp, out.micro_batch_size, m_a, ScheduleKind::OneFOneB, prof, 1, pipes);
      if (e.total() > limit) continue;
      out.a_fits = true;
      out.stages_a = k;
      out.pipelines_a = pipes;
      out.micro_batches_a = m_a;
      break;
    }
    if (out.a_fits) {
      const int k = out.stages_a;
      std::vector<int> holders;  // DCs holding at least one pipeline, in deck order
      int d_max = 0;
      int dc_max = 0;
      for (int dc = 0; dc < n; ++dc) {
        const int d = gpus_dc[static_cast<std::size_t>(dc)] / (k * out.tp);
        if (d > 0) holders.push_back(dc);
        if (d > d_max) {
          d_max = d;
          dc_max = dc;
        }
      }
      // The WAN phase of a hierarchical all-reduce: a ring over the DCs; each DC's summed
      // full-model gradient crosses every ring link as 2(n-1)/n of its size.
      const int h = static_cast<int>(holders.size());
      double rate_one = std::numeric_limits<double>::infinity();
      double rate_cap = std::numeric_limits<double>::infinity();
      double lat = 0.0;
      for (int i = 0; i < h && h > 1; ++i) {
        const int a = holders[static_cast<std::size_t>(i)];
        const int b = holders[static_cast<std::size_t>((i + 1) % h)];
        const double cap = capacity_of(cfg, a, b);
        rate_one = std::min(rate_one, sched::transfer_cap_bytes_per_ms(cap, latency_of(cfg, a, b), 1, sched::flow_window_bytes(cfg)));
        rate_cap = std::min(rate_cap, cap);
        lat = std::max(lat, latency_of(cfg, a, b));
      }
      const double grad_bytes = static_cast<double>(cfg.model.parameter_count()) * prof.grad_bytes;
      out.wan_allreduce_ms = h > 1 ? sched::ring_allreduce_ms(grad_bytes, h, rate_one, lat) : 0.0;
      out.wan_allreduce_cap_ms = h > 1 ? sched::ring_allreduce_ms(grad_bytes, h, rate_cap, lat) : 0.0;

      // One DC's job: d_max pipelines of k stages (the busiest DC sets the step).
      Config ca = cfg;
      keep_only_dc(ca.cluster, cfg.cluster, dc_max);
      ca.cluster.gpus_per_dc = {gpus_dc[static_cast<std::size_t>(dc_max)]};
      ca.parallel.stages_per_dc = {k};
      ca.parallel.dp_size = d_max;
      ca.model.layers_per_stage = cfg.model.layers % k == 0 ? std::vector<int>{} : split_layers(cfg.model.layers, k);
      ca.train.micro_batches = out.micro_batches_a;
      ca.schedule.kind = ScheduleKind::OneFOneB;
      check_valid(ca, "design (a)");
      const topo::Layout layout(ca.parallel.stages_per_dc, ca.parallel.dp_size, ca.parallel.tp_size);
      sched::CostModel cost = sched::cost_model(ca, layout, prof);
      const double tokens = static_cast<double>(out.pipelines_a) * out.micro_batches_a * tokens_per_micro;
      for (auto& ar : cost.allreduce_ms) ar += out.wan_allreduce_ms;
      const sim::SimResult r = sim::simulate(cost, ScheduleKind::OneFOneB, out.micro_batches_a, tokens);
      out.step_a_ms = r.step_ms;
      out.util_a = r.compute_utilization;
      for (auto& ar : cost.allreduce_ms) ar += out.wan_allreduce_cap_ms - out.wan_allreduce_ms;
      const sim::SimResult r_cap = sim::simulate(cost, ScheduleKind::OneFOneB, out.micro_batches_a, tokens);
      out.step_a_cap_ms = r_cap.step_ms;
      out.util_a_cap = r_cap.compute_utilization;
    }
  }
  return out;
}

// ---- the grid ----

Config grid_config(const Config& base, const sched::DeviceProfile& prof, const std::string& model, int n,
                   double latency_ms, int dp, const GridSpec& spec) {
  Config c = base;
  c.model = model_preset(model);
  c.model.init_std = base.model.init_std;
  const int tp = std::min(spec.tp, base.cluster.gpus_per_node);
  const double limit = sched::memory_limit_bytes(base, prof);
  int k = 0;
  for (int kk = 1; kk * n <= c.model.layers; ++kk) {
    // (a): a whole pipeline of kk stages; (b)/(c): n * kk stages. Both must fit.
    ModelCfg ma = c.model;
    ma.layers_per_stage = split_layers(c.model.layers, kk);
    ModelCfg mb = c.model;
    mb.layers_per_stage = split_layers(c.model.layers, n * kk);
    const int m = spec.micro_batches_per_stage * n * kk;
    // train.zero_stage splits the state over each stage's replicas: n x dp pipelines in (a), dp in (b)/(c).
    const double a = sim::peak_memory(ma, kk, tp, 1, m / n, ScheduleKind::OneFOneB, prof, 1, n * dp).total();
    const double b = sim::peak_memory(mb, n * kk, tp, 1, m, ScheduleKind::Atlas, prof, 1, dp).total();
    if (a <= limit && b <= limit) {
      k = kk;
      break;
    }
  }
  if (k == 0)
    throw ConfigError(fmt::format("grid: model {} does not fit {} GPUs at tp {} in any pipeline over {} DCs",
                                  model, prof.name, tp, n));
  c.cluster.dcs.clear();
  for (int i = 0; i < n; ++i) c.cluster.dcs.push_back(fmt::format("dc{}", i));
  c.cluster.gpus_per_dc.assign(static_cast<std::size_t>(n), dp * tp * k);
  c.cluster.latency_ms.assign(static_cast<std::size_t>(n * n), latency_ms);
  const double bw = base.cluster.bandwidth_gbps.size() == 1 ? base.cluster.bandwidth_gbps[0] : base.cluster.bandwidth(0, 1);
  c.cluster.bandwidth_gbps.assign(static_cast<std::size_t>(n * n), bw);
  for (int i = 0; i < n; ++i) {
    c.cluster.latency_ms[static_cast<std::size_t>(i * n + i)] = 0.0;
    c.cluster.bandwidth_gbps[static_cast<std::size_t>(i * n + i)] = 0.0;
  }
  drop_per_dc_settings(c.cluster);
  c.cluster.bind_hosts = {base.cluster.bind_hosts.front()};
  c.parallel.stages_per_dc.assign(static_cast<std::size_t>(n), k);
  c.parallel.dp_size = dp;
  c.parallel.tp_size = tp;
  const int pp = n * k;
  c.model.layers_per_stage = c.model.layers % pp == 0 ? std::vector<int>{} : split_layers(c.model.layers, pp);
  c.train.micro_batch_size = 1;
  c.train.micro_batches = spec.micro_batches_per_stage * pp;
  c.schedule.kind = ScheduleKind::Atlas;
  // The point comes from the user's --models/--dcs/--latencies/--dps: a deck they make invalid
  // (dp 200000 is over parallel.dp_size's limit) is their error, named with the point.
  if (const auto problems = offline_problems(c); !problems.empty())
    throw ConfigError(fmt::format("simulate --grid: the point model {}, {} DCs, {:g} ms, dp {} is not a valid deck: "
                                  "{}\n  hint: change --models, --dcs, --latencies or --dps",
                                  model, n, latency_ms, dp, problems.front()));
  return c;
}

std::vector<GridRow> run_grid(const Config& base, const sched::DeviceProfile& prof, const GridSpec& spec,
                              const CompareOptions& opt, void (*progress)(const GridRow&)) {
  // Every point's deck first: a bad one is an error before any work (not after the points
  // before it ran, their rows lost).
  std::vector<Config> decks;
  for (const auto& model : spec.models)
    for (int n : spec.dc_counts)
      for (double lat : spec.latencies_ms)
        for (int dp : spec.dps) decks.push_back(grid_config(base, prof, model, n, lat, dp, spec));
  std::vector<GridRow> rows;
  std::size_t point = 0;
  for (const auto& model : spec.models)
    for (int n : spec.dc_counts)
      for (double lat : spec.latencies_ms)
        for (int dp : spec.dps) {
          const Config& c = decks[point++];
          GridRow row;
          row.model = model;
          row.dcs = n;
          row.latency_ms = lat;
          row.dp = dp;
          row.tp = c.parallel.tp_size;
          row.pp = c.parallel.pp_size();
          row.stages_per_dc = c.parallel.stages_per_dc.front();
          row.gpus = row.pp * dp * row.tp;
          row.micro_batches = c.train.micro_batches;
          row.c = compare_designs(c, prof, opt);
          row.global_batch_tokens = row.c.tokens_per_step;
          if (row.c.step_c_ms > 0) {
            row.speedup_c_over_a = row.c.a_fits ? row.c.step_a_ms / row.c.step_c_ms : 0.0;
            row.speedup_c_over_a_cap = row.c.a_fits ? row.c.step_a_cap_ms / row.c.step_c_ms : 0.0;
            row.speedup_c_over_b = row.c.step_b_ms / row.c.step_c_ms;
          }
          if (row.c.step_plan_ms > 0) {
            row.speedup_plan_over_a_cap = row.c.a_fits ? row.c.step_a_cap_ms / row.c.step_plan_ms : 0.0;
            row.speedup_plan_over_b = row.c.step_b_ms / row.c.step_plan_ms;
          }
          rows.push_back(row);
          if (progress) progress(rows.back());
        }
  return rows;
}

std::string grid_csv(const std::vector<GridRow>& rows) {
  std::string out =
      "model,dcs,latency_ms,dp,tp,pp,stages_per_dc,gpus,micro_batches,global_batch_tokens,"
      "step_a_s,step_a_cap_s,step_b_s,step_c_s,util_a,util_b,util_c,util_d,"
      "speedup_c_over_a,speedup_c_over_a_cap,speedup_c_over_b,step_plan_s,plan_layout,speedup_plan_over_a_cap,"
      "speedup_plan_over_b\n";
  for (const auto& r : rows)
    out += fmt::format("{},{},{:g},{},{},{},{},{},{},{:.0f},{:.6g},{:.6g},{:.6g},{:.6g},{:.4f},{:.4f},{:.4f},{:.4f},"
                       "{:.4g},{:.4g},{:.4g},{:.6g},{},{:.4g},{:.4g}\n",
                       r.model, r.dcs, r.latency_ms, r.dp, r.tp, r.pp, r.stages_per_dc, r.gpus, r.micro_batches,
                       r.global_batch_tokens, r.c.step_a_ms / 1e3, r.c.step_a_cap_ms / 1e3, r.c.step_b_ms / 1e3,
                       r.c.step_c_ms / 1e3, r.c.util_a, r.c.util_b, r.c.util_c, r.c.util_d, r.speedup_c_over_a,
                       r.speedup_c_over_a_cap, r.speedup_c_over_b, r.c.step_plan_ms / 1e3,
                       r.c.step_plan_ms > 0 ? fmt::format("tp{}xpp{}xdp{}/{}DC", r.c.plan_tp, r.c.plan_pp, r.c.plan_dp,
                                                          r.c.plan_dcs)
                                            : std::string("-"),
                       r.speedup_plan_over_a_cap, r.speedup_plan_over_b);
  return out;
}

std::string grid_markdown(const std::vector<GridRow>& rows) {
  std::string out =
      "| model | DCs | lat ms | dp | tp x pp | GPUs | (a) DP 1 flow s | (a') DP at cap s | (b) PP 1F1B s | (c) ATLAS s "
      "| (c*) planner s | c/a | c/a' | c/b | c*/a' | c*/b | util b | util c | util d |\n"
      "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    const bool planned = r.c.step_plan_ms > 0;
    out += fmt::format("| {} | {} | {:g} | {} | {} x {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {} | {:.1f}x | {:.2f}x | "
                       "{:.2f}x | {} | {} | {:.0f}% | {:.0f}% | {:.0f}% |\n",
                       r.model, r.dcs, r.latency_ms, r.dp, r.tp, r.pp, r.gpus, r.c.step_a_ms / 1e3,
                       r.c.step_a_cap_ms / 1e3, r.c.step_b_ms / 1e3, r.c.step_c_ms / 1e3,
                       planned ? fmt::format("{:.2f} ({}x{}x{}, {} DC)", r.c.step_plan_ms / 1e3, r.c.plan_tp,
                                             r.c.plan_pp, r.c.plan_dp, r.c.plan_dcs)
                               : std::string("-"),
                       r.speedup_c_over_a, r.speedup_c_over_a_cap, r.speedup_c_over_b,
                       planned ? fmt::format("{:.2f}x", r.speedup_plan_over_a_cap) : std::string("-"),
                       planned ? fmt::format("{:.2f}x", r.speedup_plan_over_b) : std::string("-"), 100 * r.c.util_b,
                       100 * r.c.util_c, 100 * r.c.util_d);
  }
  return out;
}

}  // namespace atlas::plan
