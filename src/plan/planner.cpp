// SPDX-License-Identifier: MIT
// The ATLAS planner (see planner.hpp): enumerate shapes, check memory, place stages with the
// DC-selection heuristic, prune by a closed-form estimate, rank by simulated step time.
#include "atlas/plan/planner.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <bit>
#include <cstdint>
#include <functional>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sim/cost.hpp"
#include "atlas/sim/simulator.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::plan {

namespace {

double gib(double bytes) { return bytes / static_cast<double>(units::kGiB); }

/// A planning problem of the deck (exit code 2, printed as "ERROR: ...").
[[noreturn]] void config_error(const std::string& msg) { throw ConfigError(msg); }

double latency_of(const Config& cfg, int a, int b) {
  if (a == b) return 0.0;
  return cfg.cluster.latency_ms.size() == 1 ? cfg.cluster.latency_ms[0] : cfg.cluster.latency(a, b);
}

double capacity_of(const Config& cfg, int a, int b) {
  const double gbps = cfg.cluster.bandwidth_gbps.size() == 1 ? cfg.cluster.bandwidth_gbps[0] : cfg.cluster.bandwidth(a, b);
  return std::max(gbps, 1e-9) * 1e9 / 8.0 / 1e3;  // bytes per ms
}

/// The divisors of n in increasing order, by trial division up to sqrt(n).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int d = 1; static_cast<long long>(d) * d <= n; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

template <typename T>
std::vector<T> permute(const std::vector<T>& v, const std::vector<int>& order) {
  std::vector<T> out;
  for (int i : order) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

/// Row-major n x n matrix permuted to `order` (a scalar stays a scalar).
std::vector<double> permute_matrix(const std::vector<double>& m, const std::vector<int>& order) {
  const auto n = order.size();
  if (m.size() != n * n) return m;
  std::vector<double> out;
  for (int a : order)
    for (int b : order) out.push_back(m[static_cast<std::size_t>(a) * n + static_cast<std::size_t>(b)]);
  return out;
}

double price_of(const Config& cfg, int dc) {
  return cfg.cluster.price_per_gpu_hour.empty() ? 1.0 : cfg.cluster.price_per_gpu_hour[static_cast<std::size_t>(dc)];
}

/// Price of a plan's GPUs per hour (GPU-hours per hour without prices).
double price_per_hour(const Config& cfg, const Plan& p) {
  double price = 0.0;
  for (std::size_t dc = 0; dc < p.stages_per_dc.size(); ++dc)
    price += p.stages_per_dc[dc] * p.dp * p.tp * price_of(cfg, static_cast<int>(dc));
  return price;
}

/// The sets of DCs the placement heuristic is tried in (bit dc = DC dc may hold stages): every
/// non-empty set up to kAllSubsetsDcs DCs with GPUs; beyond that the largest-first prefixes, each
/// DC alone, and every prefix without one of its DCs.
constexpr int kAllSubsetsDcs = 6;
/// Quick-timed plans per set of DCs (by estimate).
constexpr int kPerDcSet = 2;
/// Quick-timed plans within this factor of the deadline are fully re-timed (never slower).
constexpr double kDeadlineSlack = 1.25;
std::vector<std::uint64_t> dc_subsets(const std::vector<int>& free_gpus) {
  std::vector<int> order;
  for (std::size_t dc = 0; dc < free_gpus.size() && dc < 64; ++dc)
    if (free_gpus[dc] > 0) order.push_back(static_cast<int>(dc));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return free_gpus[static_cast<std::size_t>(a)] > free_gpus[static_cast<std::size_t>(b)];
  });
  std::vector<std::uint64_t> out;
  const auto n = order.size();
  if (n <= static_cast<std::size_t>(kAllSubsetsDcs)) {
    for (std::uint64_t bits = 1; bits < (std::uint64_t{1} << n); ++bits) {
      std::uint64_t set = 0;
      for (std::size_t i = 0; i < n; ++i)
        if ((bits >> i) & 1U) set |= std::uint64_t{1} << order[i];
      out.push_back(set);
    }
    // Largest sets first: the full set's placement is the classic heuristic's.
    std::stable_sort(out.begin(), out.end(), [](std::uint64_t a, std::uint64_t b) {
      return std::popcount(a) > std::popcount(b);
    });
    return out;
  }
  std::uint64_t prefix = 0;
  for (std::size_t i = 0; i < n; ++i) {
    prefix |= std::uint64_t{1} << order[i];
    out.push_back(prefix);
    for (std::size_t j = 0; j < i; ++j) out.push_back(prefix & ~(std::uint64_t{1} << order[j]));
  }
  for (int dc : order) out.push_back(std::uint64_t{1} << dc);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  std::stable_sort(out.begin(), out.end(), [](std::uint64_t a, std::uint64_t b) {
    return std::popcount(a) > std::popcount(b);
  });
  return out;
}

}  // namespace

std::vector<std::string> validate_for_planning(const Config& cfg, bool cuda_built) {
  Config probe = cfg;
  const int n = cfg.cluster.dc_count();
  probe.parallel.stages_per_dc.assign(static_cast<std::size_t>(n), 0);
  if (n > 0) {
    int big = 0;
    for (int dc = 0; dc < n && dc < static_cast<int>(cfg.cluster.gpus_per_dc.size()); ++dc)
      if (cfg.cluster.gpus_per_dc[static_cast<std::size_t>(dc)] > cfg.cluster.gpus_per_dc[static_cast<std::size_t>(big)]) big = dc;
    probe.parallel.stages_per_dc[static_cast<std::size_t>(big)] = 1;
  }
  probe.parallel.dp_size = 1;
  probe.parallel.tp_size = 1;
  probe.parallel.dp_across_dcs = false;  // as plan_config: the probe's one stage is in one DC
  probe.model.layers_per_stage.clear();
  probe.schedule.virtual_stages = 1;  // the search has no model chunks (atlas plan says so)
  // With no GPU anywhere the probe stage cannot fit either; say only what is wrong.
  std::vector<std::string> extra;
  const bool none = std::all_of(cfg.cluster.gpus_per_dc.begin(), cfg.cluster.gpus_per_dc.end(), [](int g) { return g <= 0; });
  if (none && !probe.cluster.gpus_per_dc.empty()) {
    probe.cluster.gpus_per_dc.assign(probe.cluster.gpus_per_dc.size(), 1);
    extra.push_back("cluster.gpus_per_dc: every DC has zero GPUs; at least one DC needs GPUs");
  }
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = cuda_built;
  auto problems = deck::validate(probe, shape);
  problems.insert(problems.begin(), extra.begin(), extra.end());
  // The probe has dp 1: the global batch the planner keeps is the deck's dp's.
  const double batch = static_cast<double>(cfg.sequences_per_step());
  if (batch > deck::limits::kMaxGlobalBatch && probe.train.micro_batches * static_cast<double>(probe.train.micro_batch_size) <=
                                                   deck::limits::kMaxGlobalBatch)
    problems.push_back(fmt::format(
        "parallel.dp_size ({}) x train.micro_batches ({}) x train.micro_batch_size ({}) = {:.0f} sequences per step, "
        "more than {:.0f}\n  hint: lower train.micro_batches or train.micro_batch_size",
        cfg.parallel.dp_size, cfg.train.micro_batches, cfg.train.micro_batch_size, batch, deck::limits::kMaxGlobalBatch));
  return problems;
}

int global_batch(const Config& cfg) { return static_cast<int>(cfg.sequences_per_step()); }

std::optional<std::vector<int>> place_stages(const std::vector<int>& free_gpus, int pp, int gpus_per_stage) {
  std::vector<int> order(free_gpus.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return free_gpus[static_cast<std::size_t>(a)] > free_gpus[static_cast<std::size_t>(b)];
  });
  std::vector<int> stages(free_gpus.size(), 0);
  int left = pp;
  for (int dc : order) {
    if (left == 0) break;
    const int fit = free_gpus[static_cast<std::size_t>(dc)] / gpus_per_stage;
    const int take = std::min(fit, left);
    stages[static_cast<std::size_t>(dc)] = take;
    left -= take;
  }
  if (left > 0) return std::nullopt;
  return stages;
}

std::vector<int> chain_order(const Config& cfg, const std::vector<int>& stages_per_dc) {
  // Placement order (most free GPUs first) is the starting point and the tie-break.
  std::vector<int> used;
  for (std::size_t dc = 0; dc < stages_per_dc.size(); ++dc)
    if (stages_per_dc[dc] > 0) used.push_back(static_cast<int>(dc));
  std::stable_sort(used.begin(), used.end(), [&](int a, int b) {
    return cfg.cluster.gpus_per_dc[static_cast<std::size_t>(a)] > cfg.cluster.gpus_per_dc[static_cast<std::size_t>(b)];
  });
  // Data residency: the first stage (reads the data, holds the embedding) and the last (LM head,
  // tied to the embedding) only in DCs that may hold them.
  auto ends_ok = [&](const std::vector<int>& order) {
    return order.empty() || (cfg.cluster.may_hold_data_of(order.front()) && cfg.cluster.may_hold_data_of(order.back()));
  };
  if (used.size() <= 2 || used.size() > 8) {
    if (ends_ok(used)) return used;
    std::vector<int> rev(used.rbegin(), used.rend());
    if (ends_ok(rev)) return rev;
    return {};
  }
  std::vector<int> idx(used.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto path = [&](const std::vector<int>& p) {
    double sum = 0.0;
    for (std::size_t i = 1; i < p.size(); ++i)
      sum += latency_of(cfg, used[static_cast<std::size_t>(p[i - 1])], used[static_cast<std::size_t>(p[i])]);
    return sum;
  };
  auto mapped = [&](const std::vector<int>& p) {
    std::vector<int> out;
    for (int i : p) out.push_back(used[static_cast<std::size_t>(i)]);
    return out;
  };
  std::vector<int> best;
  double best_sum = std::numeric_limits<double>::infinity();
  do {
    if (!ends_ok(mapped(idx))) continue;
    const double s = path(idx);
    if (s < best_sum - 1e-9) {
      best_sum = s;
      best = idx;
    }
  } while (std::next_permutation(idx.begin(), idx.end()));
  return best.empty() ? std::vector<int>{} : mapped(best);
}

PlanObjective effective_objective(const Config& cfg) {
  if (cfg.plan.objective != PlanObjective::Auto) return cfg.plan.objective;
  return cfg.plan.deadline_s > 0 ? PlanObjective::Cost : PlanObjective::Time;
}

double objective_value(const Plan& p, PlanObjective o) {
  switch (o) {
    case PlanObjective::Cost: return p.cost_per_step;
    case PlanObjective::Energy: return p.energy_kwh_per_step;
    case PlanObjective::Carbon: return p.co2_kg_per_step;
    default: return p.step_ms;
  }
}

std::vector<int> split_layers(int layers, int pp) {
  std::vector<int> out(static_cast<std::size_t>(pp), layers / pp);
  int extra = layers % pp;
  // Middle stages first: the first holds the embedding, the last the LM head.
  for (int s = 1; s < pp - 1 && extra > 0; ++s, --extra) ++out[static_cast<std::size_t>(s)];
  for (int s : {0, pp - 1})
    if (extra > 0) {
      ++out[static_cast<std::size_t>(s)];
      --extra;
    }
  return out;
}

Config plan_config(const Config& base, const Plan& p) {
  Config c = base;
  const int n = base.cluster.dc_count();
  std::vector<int> order = p.dc_order;
  for (int dc = 0; dc < n; ++dc)
    if (std::find(order.begin(), order.end(), dc) == order.end()) order.push_back(dc);
  c.cluster.dcs = permute(base.cluster.dcs, order);
  c.cluster.gpus_per_dc = permute(base.cluster.gpus_per_dc, order);
  c.cluster.latency_ms = permute_matrix(base.cluster.latency_ms, order);
  c.cluster.bandwidth_gbps = permute_matrix(base.cluster.bandwidth_gbps, order);
  if (base.cluster.price_per_gpu_hour.size() == static_cast<std::size_t>(n))
    c.cluster.price_per_gpu_hour = permute(base.cluster.price_per_gpu_hour, order);
  if (base.cluster.bind_hosts.size() == static_cast<std::size_t>(n))
    c.cluster.bind_hosts = permute(base.cluster.bind_hosts, order);
  if (base.cluster.power_mw.size() == static_cast<std::size_t>(n)) c.cluster.power_mw = permute(base.cluster.power_mw, order);
  if (base.cluster.pue.size() == static_cast<std::size_t>(n) && n > 1) c.cluster.pue = permute(base.cluster.pue, order);
  if (base.cluster.carbon_g_per_kwh.size() == static_cast<std::size_t>(n))
    c.cluster.carbon_g_per_kwh = permute(base.cluster.carbon_g_per_kwh, order);
  if (base.cluster.may_hold_data.size() == static_cast<std::size_t>(n))
    c.cluster.may_hold_data = permute(base.cluster.may_hold_data, order);
  c.parallel.stages_per_dc = permute(p.stages_per_dc, order);
  c.parallel.dp_size = p.dp;
  c.parallel.tp_size = p.tp;
  // A plan keeps each stage's DP replicas inside its DC (PP across DCs, DP and TP inside): a
  // deck's parallel.dp_across_dcs layout is not one the planner searches.
  c.parallel.dp_across_dcs = false;
  const bool even = base.model.layers % p.pp == 0;
  c.model.layers_per_stage = even ? std::vector<int>{} : p.layers_per_stage;
  c.train.micro_batch_size = p.micro_batch_size;
  c.train.micro_batches = p.micro_batches;
  c.schedule.kind = ScheduleKind::Atlas;
  c.schedule.virtual_stages = 1;  // the search has no model chunks
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = true;  // the plan says nothing about this binary's backends
  const auto problems = deck::validate(c, shape);
  ATLAS_ASSERT(problems.empty(), "the planner made an invalid deck: " << problems.front());
  return c;
}

PlanResult search(const Config& cfg, const sched::DeviceProfile& prof, const PlanOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanResult res;
  res.profile_name = prof.name;
  res.global_batch = global_batch(cfg);
  res.priced = !cfg.cluster.price_per_gpu_hour.empty();
  const int G = res.global_batch;
  const ModelCfg& model = cfg.model;
  if (std::accumulate(cfg.cluster.gpus_per_dc.begin(), cfg.cluster.gpus_per_dc.end(), 0) <= 0)
    throw ConfigError("no plan fits: every DC in cluster.gpus_per_dc has zero free GPUs\n"
                      "  hint: give at least one DC its free GPU count");
  const PlanObjective objective = effective_objective(cfg);
  res.objective = objective;
  if ((objective == PlanObjective::Energy || objective == PlanObjective::Carbon) && !(prof.board_power_w > 0))
    config_error((std::ostringstream() << "plan.objective = " << (objective == PlanObjective::Energy ? "energy" : "carbon")
                                            << " needs the device profile's board power, and " << prof.name
                                            << " has no board_power_w\n  hint: add board_power_w = WATTS to its profile").str());
  if (objective == PlanObjective::Carbon && cfg.cluster.carbon_g_per_kwh.empty())
    config_error((std::ostringstream() << "plan.objective = carbon needs each DC's grid carbon intensity\n"
                        "  hint: set cluster.carbon_g_per_kwh (gCO2/kWh, one per DC)").str());
  // The GPUs the planner may use: the free ones each DC can power (cluster.power_mw).
  const std::vector<int> free_gpus = powered_gpus(cfg, prof);
  res.usable_gpus = free_gpus;
  const int total = std::accumulate(free_gpus.begin(), free_gpus.end(), 0);
  if (total <= 0)
    config_error((std::ostringstream() << "no plan fits: cluster.power_mw powers no GPU in any DC (" << prof.name << ": "
                                                                                    << prof.board_power_w
                                                                                    << " W a GPU x cluster.pue)\n"
                                                                                       "  hint: raise cluster.power_mw").str());
  const double usable = sched::memory_limit_bytes(cfg, prof);  // per rank (host sharing, BubbleTea)

  std::vector<int> tps;
  for (int t = 1; t <= std::min({cfg.plan.max_tp, cfg.cluster.gpus_per_node, total}); t *= 2)
    if (model.heads % t == 0 && model.hidden % t == 0 &&
        (model.kv_heads <= 0 || model.kv_heads % t == 0 || t % model.kv_heads == 0))
      tps.push_back(t);
  if (tps.empty())
    throw ConfigError(fmt::format("no plan fits: no tensor-parallel size divides model.heads = {}{}", model.heads,
                                  model.kv_heads > 0 ? fmt::format(" and divides into or is divided by model.kv_heads = {}",
                                                                   model.kv_heads)
                                                     : std::string()));
  std::vector<int> bs{1, 2, 4, 8, 16};
  if (std::find(bs.begin(), bs.end(), cfg.train.micro_batch_size) == bs.end()) bs.push_back(cfg.train.micro_batch_size);

  std::map<std::pair<int, int>, sched::BlockCost> block_cache;
  auto block = [&](int tp, int b) -> const sched::BlockCost& {
    auto it = block_cache.find({tp, b});
    if (it != block_cache.end()) return it->second;
    Config cb = cfg;
    cb.train.micro_batch_size = b;
    return block_cache.emplace(std::make_pair(tp, b), sched::block_cost(cb, tp, prof)).first->second;
  };

  const int flows = sched::flows_per_transfer(cfg);
  const double window = sched::flow_window_bytes(cfg);
  const double intra_bpms = cfg.cluster.intra_bandwidth_gbps * 1e9 / 8.0 / 1e3;
  const double intra_lat = cfg.cluster.intra_latency_us / 1e3;

  // Price, energy and emissions per step follow the step time.
  auto set_step = [&](Plan& p, double step_ms) {
    p.cost_per_step = price_per_hour(cfg, p) * step_ms / 3.6e6;
    p.power_kw = power_kw(cfg, prof, plan_gpus_per_dc(p));
    p.energy_kwh_per_step = p.power_kw * step_ms / 3.6e6;
    p.co2_kg_per_step = co2_kg_per_hour(cfg, prof, plan_gpus_per_dc(p)) * step_ms / 3.6e6;
  };
  // Closed-form step estimate of a placed plan (pruning only) and its price at that estimate.
  auto estimate = [&](Plan& p, const ModelCfg& mm) {
    const sched::BlockCost& bc = block(p.tp, p.micro_batch_size);
    const int pp = p.pp;
    const int dp = p.dp;
    const int m = p.micro_batches;
    double t_max = 0.0;
    double ar_max = 0.0;
    for (int s = 0; s < pp; ++s) {
      const int layers = mm.layers_per_stage[static_cast<std::size_t>(s)];
      const bool last = s == pp - 1;
      const double compute = layers * (bc.fwd_ms + bc.bwd_ms) + (last ? bc.head_fwd_ms + bc.head_bwd_ms : 0.0);
      t_max = std::max(t_max, compute);
      const double params = sched::stage_params_per_gpu(mm, s, pp, p.tp);
      ar_max = std::max(ar_max, sched::dp_sync_ms(sched::ring_allreduce_ms(params * prof.grad_bytes, dp, intra_bpms, intra_lat),
                                                  compute, m, prof.zero_stage) +
                                    params * prof.optimizer_share(dp) * prof.optimizer_bytes_per_param /
                                        (prof.mem_bandwidth_gbs * 1e9) * 1e3);
    }
    const double xfer_bytes = static_cast<double>(p.micro_batch_size) * model.seq_len * model.hidden *
                              sched::boundary_element_bytes(cfg, prof) * (prof.pipeline_scatter_gather ? 1.0 : p.tp);
    double fill = 0.0;
    double wan_bound = 0.0;
    for (std::size_t i = 1; i < p.dc_order.size(); ++i) {
      const int a = p.dc_order[i - 1];
      const int c = p.dc_order[i];
      const double lat = latency_of(cfg, a, c);
      const double cap = capacity_of(cfg, a, c);
      const double one = sched::transfer_cap_bytes_per_ms(cap, lat, flows, window);
      fill += 2.0 * (lat + xfer_bytes / one);
      wan_bound = std::max(wan_bound, dp * m * xfer_bytes / std::min(cap, dp * one));
    }
    p.estimate_ms = std::max((m + pp - 1) * t_max + fill, wan_bound + (pp - 1) * t_max + fill) + ar_max;
    set_step(p, p.estimate_ms);  // replaced by the simulated step
  };

  std::vector<Plan> cands;
  int too_big = 0;  // shapes whose schedule table atlas could not hold (deck::limits)
  double smallest_unplaced_gpus = std::numeric_limits<double>::infinity();
  Plan smallest_unplaced;
  long long residency_rejected = 0;  // placements whose first/last stage would sit in a DC with may_hold_data 0
  const std::vector<std::uint64_t> subsets = dc_subsets(free_gpus);
  const std::vector<int> dps = divisors(G);  // once: G may be millions
  for (int tp : tps) {
    if (opt.progress) opt.progress(fmt::format("enumerating shapes (tp {}): {} candidate plans so far", tp, cands.size()));
    for (int pp = 1; pp <= std::min(model.layers, total / tp); ++pp) {
      ModelCfg mm = model;
      mm.layers_per_stage = split_layers(model.layers, pp);
      for (int dp : dps) {
        if (static_cast<long long>(dp) * tp * pp > total) break;
        for (int b : bs) {
          if ((G / dp) % b != 0) continue;
          const int m = G / dp / b;
          ++res.shapes;
          if (6.0 * m * pp * dp > deck::limits::kMaxScheduleSlots) {
            ++too_big;
            continue;
          }
          // Every plan's memory is checked here, and only here (sim::peak_memory).
          const sim::MemoryEstimate mem = sim::peak_memory(mm, pp, tp, b, m, ScheduleKind::Atlas, prof, 1, dp);
          if (mem.total() > usable) continue;
          ++res.fit_memory;
          Plan p;
          p.tp = tp;
          p.pp = pp;
          p.dp = dp;
          p.micro_batch_size = b;
          p.micro_batches = m;
          p.gpus = tp * pp * dp;
          p.mem_bytes = mem.total();
          p.layers_per_stage = mm.layers_per_stage;
          // The heuristic placement in every candidate set of DCs (all of them, each alone,
          // the set without the largest, ...): each distinct placement is a candidate.
          std::vector<std::vector<int>> seen;
          for (std::uint64_t set : subsets) {
            std::vector<int> masked = free_gpus;
            for (std::size_t dc = 0; dc < masked.size(); ++dc)
              if (((set >> dc) & 1U) == 0) masked[dc] = 0;
            auto placed = place_stages(masked, pp, dp * tp);
            if (!placed || std::find(seen.begin(), seen.end(), *placed) != seen.end()) continue;
            seen.push_back(*placed);
            Plan q = p;
            q.stages_per_dc = *placed;
            q.dc_order = chain_order(cfg, q.stages_per_dc);
            if (q.dc_order.empty()) {
              ++residency_rejected;
              continue;
            }
            estimate(q, mm);
            cands.push_back(std::move(q));
          }
          if (seen.empty()) {
            if (p.gpus < smallest_unplaced_gpus) {
              smallest_unplaced_gpus = p.gpus;
              smallest_unplaced = p;
            }
            continue;
          }
          ++res.placed;
        }
      }
    }
  }

  if (res.fit_memory == 0 && too_big == res.shapes)
    throw ConfigError(fmt::format(
        "no plan fits: with a global batch of {} sequences (parallel.dp_size x train.micro_batches x "
        "train.micro_batch_size) every shape's schedule table has more than {:.0f} slots\n"
        "  hint: lower train.micro_batches",
        G, deck::limits::kMaxScheduleSlots));
  if (res.fit_memory == 0) {
    // Report the shape with the most GPUs holding one model copy (ties: the larger tp).
    int tp = tps.back();
    int pp = std::max(1, std::min(model.layers, total / tp));
    for (int t : tps) {
      const int q = std::max(1, std::min(model.layers, total / t));
      if (t * q > tp * pp || (t * q == tp * pp && t > tp)) {
        tp = t;
        pp = q;
      }
    }
    ModelCfg mm = model;
    mm.layers_per_stage = split_layers(model.layers, pp);
    // The most replicas that shape leaves room for: train.zero_stage splits the state over them.
    // (dividing the global batch, each replica then holding G / dp micro-batches).
    int dp_most = std::max(1, total / (tp * pp));
    while (dp_most > 1 && G % dp_most != 0) --dp_most;
    const sim::MemoryEstimate e = sim::peak_memory(mm, pp, tp, 1, G / dp_most, ScheduleKind::Atlas, prof, 1, dp_most);
    // What zero_stage 2 would leave of the state (offered only where the shape then fits).
    sched::DeviceProfile zero2 = prof;
    zero2.zero_stage = 2;
    const double zero2_total =
        sim::peak_memory(mm, pp, tp, 1, G / dp_most, ScheduleKind::Atlas, zero2, 1, dp_most).total();
    throw ConfigError(fmt::format(
        "no plan fits: the model ({:.1f}B parameters) needs {:.1f} GiB per GPU at the largest tp*pp "
        "(tp {} x pp {}, micro-batch size 1: {:.1f} GiB weights/grads/Adam + {:.1f} GiB activations), "
        "{} has {:g} GiB ({:.1f} GiB usable{})\n  hint: {}",
        static_cast<double>(model.parameter_count()) / 1e9, gib(e.total()), tp, pp, gib(e.state_bytes),
        gib(e.activation_bytes), prof.name, prof.memory_gib, gib(usable), sched::memory_sharing(cfg), [&] {
          // Only what can help: more GPUs while they, not model.layers, limit pp; a larger tp up to
          // the node's size (tp stays inside a node); recomputation where the state alone fits
          // (it shrinks activations only); a device with more memory.
          std::vector<std::string> fixes;
          if (pp < model.layers) {
            const std::string limited = power_limited_dcs(cfg, free_gpus);
            fixes.push_back(limited.empty() ? std::string("add GPUs (pp is limited to the free GPUs / tp)")
                                            : fmt::format("raise cluster.power_mw where it limits a DC ({}) or add GPUs "
                                                          "(pp is limited to the GPUs the budgets power / tp)",
                                                          limited));
          }
          if (tp < cfg.cluster.gpus_per_node && tp == cfg.plan.max_tp)
            fixes.push_back(fmt::format("raise plan.max_tp (up to cluster.gpus_per_node = {})", cfg.cluster.gpus_per_node));
          if (cfg.train.recompute != Recompute::Full && e.state_bytes <= usable)
            fixes.emplace_back("set train.recompute = full");
          if (cfg.train.zero_stage < 2 && dp_most > 1 && zero2_total <= usable)
            fixes.push_back(fmt::format("set train.zero_stage = 2 (the optimizer state and the gradients split over "
                                        "up to {} DP replicas)", dp_most));
          fixes.emplace_back("use a larger-memory plan.gpu");
          if (pp == model.layers && e.state_bytes > usable)
            fixes.emplace_back("a smaller model (every block already has a stage of its own)");
          std::string h = either(fixes);
          if (tp == cfg.cluster.gpus_per_node && cfg.plan.max_tp > cfg.cluster.gpus_per_node)
            h += fmt::format(" (tp stays inside a node: cluster.gpus_per_node = {} caps it, so plan.max_tp above that "
                             "adds nothing)",
                             cfg.cluster.gpus_per_node);
          return h;
        }()));
  }
  if (cands.empty() && residency_rejected > 0) {
    std::string allowed;
    std::string denied;
    for (int dc = 0; dc < cfg.cluster.dc_count(); ++dc)
      (cfg.cluster.may_hold_data_of(dc) ? allowed : denied) +=
          fmt::format("{}{}", (cfg.cluster.may_hold_data_of(dc) ? allowed : denied).empty() ? "" : ", ",
                      cfg.cluster.dcs[static_cast<std::size_t>(dc)]);
    config_error((std::ostringstream() <<
                "no plan meets the data-residency constraint cluster.may_hold_data: the first stage (reads the "
                "training data, holds the embedding) and the last (LM head, tied to the embedding) must sit in "
                "a DC marked 1 ("
                    << (allowed.empty() ? std::string("none is") : allowed) << "), not in " << denied << "; "
                    << residency_rejected << " placements that fit memory and the free GPUs put an end stage elsewhere"
                    << "\n  hint: "
                    << (allowed.empty()
                            ? std::string("mark at least one DC 1 in cluster.may_hold_data")
                            : "mark another DC 1 in cluster.may_hold_data, or add GPUs to " + allowed +
                                  [&] {
                                    std::vector<int> only = free_gpus;
                                    for (int dc = 0; dc < cfg.cluster.dc_count(); ++dc)
                                      if (!cfg.cluster.may_hold_data_of(dc)) only[static_cast<std::size_t>(dc)] = cfg.cluster.gpus_per_dc[static_cast<std::size_t>(dc)];
                                    const std::string limited = power_limited_dcs(cfg, only);
                                    return limited.empty() ? std::string()
                                                           : ", or raise cluster.power_mw where it limits them: " + limited;
                                  }() +
                                  ", so a pipeline can start and end there")).str());
  }
  if (cands.empty()) {
    // The GPUs each DC may use: its free ones, or what its power budget powers.
    std::string free;
    for (std::size_t dc = 0; dc < cfg.cluster.dcs.size(); ++dc)
      free += fmt::format("{}{}={}{}", free.empty() ? "" : ", ", cfg.cluster.dcs[dc], free_gpus[dc],
                          free_gpus[dc] < cfg.cluster.gpus_per_dc[dc]
                              ? fmt::format(" (of {} free: cluster.power_mw)", cfg.cluster.gpus_per_dc[dc])
                              : "");
    const Plan& s = smallest_unplaced;
    const int largest_dc = *std::max_element(free_gpus.begin(), free_gpus.end());
    const std::string limited = power_limited_dcs(cfg, free_gpus);
    // The hint names what would help this shape: a stage too big for every DC needs a bigger DC
    // (or, with dp > 1, fewer DP pipelines); a global batch change never helps a dp-1 shape.
    std::string hint;
    if (s.dp * s.tp > largest_dc && s.dp == 1)
      hint = fmt::format("a stage of tp {} GPUs must sit in one DC and the largest DC has {}: give one DC at least {} "
                         "free GPUs, or use a larger-memory plan.gpu so a smaller tp fits",
                         s.tp, largest_dc, s.tp);
    else if (s.dp * s.tp > largest_dc)
      hint = fmt::format("give one DC at least {} free GPUs, or lower the global batch (train.micro_batches) so fewer "
                         "DP pipelines are needed",
                         s.dp * s.tp);
    else if (s.dp == 1)
      hint = fmt::format("add GPUs (the stages need {} DC slots of {} GPUs), or use a larger-memory plan.gpu", s.pp, s.tp);
    else
      hint = "add GPUs, or lower the global batch (train.micro_batches) so fewer DP pipelines are needed";
    // Where the budgets hold the DCs below their free GPUs, the budgets are what to raise.
    if (!limited.empty()) hint = "raise cluster.power_mw where it limits a DC: " + limited;
    if (cfg.train.recompute != Recompute::Full)
      hint += std::string(limited.empty() ? ", or" : "; or") +
              " set train.recompute = full (less activation memory: smaller shapes may fit)";
    throw ConfigError(fmt::format(
        "no plan fits the {} GPUs: the smallest shape that fits memory (tp {} x pp {} x dp {} = {} GPUs) "
        "needs {} stages of {} GPUs each, every stage inside one DC, but the DCs have {}\n  hint: {}",
        limited.empty() ? "free" : "powered", s.tp, s.pp, s.dp, s.gpus, s.pp, s.dp * s.tp, free, hint));
  }

  // ---- simulate the promising plans ----
  // Quick-simulated (one atlas candidate): the best estimates, the deck's own shape, the best
  // estimates of every set of DCs (so single-DC plans and plans without the largest DC are
  // timed), and with a deadline the cheapest plans near it. Fully re-timed (the whole atlas
  // search; never slower than the quick timing): the plan.top fastest of the first three groups,
  // the fastest of every set of DCs, and the cheapest quick-timed plans meeting the deadline, so
  // a deadline only adds plans and never loses the fastest one.
  const int top = std::max(1, cfg.plan.top);
  const std::size_t k = static_cast<std::size_t>(opt.simulate_top > 0 ? opt.simulate_top : std::max(3 * top, 32));
  std::vector<std::size_t> idx(cands.size());
  std::iota(idx.begin(), idx.end(), 0);
  enum Pick : char { None = 0, Base = 1, Deadline = 2 };
  std::vector<char> pick(cands.size(), None);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return cands[a].estimate_ms < cands[b].estimate_ms; });
  for (std::size_t i = 0; i < std::min(k, idx.size()); ++i) pick[idx[i]] = Base;
  auto set_of = [](const Plan& p) {
    std::uint64_t set = 0;
    for (std::size_t dc = 0; dc < p.stages_per_dc.size() && dc < 64; ++dc)
      if (p.stages_per_dc[dc] > 0) set |= std::uint64_t{1} << dc;
    return set;
  };
  {
    std::map<std::uint64_t, int> per_set;
    for (std::size_t i : idx)
      if (per_set[set_of(cands[i])]++ < kPerDcSet) pick[i] = Base;
  }
  // The deck's own shape is always simulated (its best placement): the what-if table then shows
  // where it stands.
  for (std::size_t i : idx) {
    const Plan& p = cands[i];
    if (p.tp == cfg.parallel.tp_size && p.pp == cfg.parallel.pp_size() && p.dp == cfg.parallel.dp_size &&
        p.micro_batch_size == cfg.train.micro_batch_size) {
      pick[i] = Base;
      break;
    }
  }
  const bool deadline = cfg.plan.deadline_s > 0;
  if (deadline || objective != PlanObjective::Time) {
    // The plans best by the objective (estimated), near the deadline if any, are candidates too.
    std::vector<std::size_t> by_obj = idx;
    std::stable_sort(by_obj.begin(), by_obj.end(), [&](std::size_t a, std::size_t b) {
      return objective_value(cands[a], objective) < objective_value(cands[b], objective);
    });
    std::size_t added = 0;
    for (std::size_t i : by_obj) {
      if (added >= k) break;
      if (!deadline || cands[i].estimate_ms <= cfg.plan.deadline_s * 1e3 * 1.5) {
        if (pick[i] == None) pick[i] = Deadline;
        ++added;
      }
    }
  }

  // Per plan (res.plans' index), the atlas search's engine runs of its quick timing, which its
  // whole search takes again instead of timing them (sched::ScheduleOptions::runs; same plans).
  std::vector<std::shared_ptr<sched::SearchRuns>> runs_of;
  // Times plan p with the atlas search (full: the whole search, else one candidate) and `split`
  // (schedule.split_backward's On / Auto / Off for this run; see `split_pass` below).
  auto run = [&](Plan& p, bool full, SplitBackward split, const std::shared_ptr<sched::SearchRuns>& runs) {
    const Config pc = plan_config(cfg, p);
    const topo::Layout layout(pc.parallel.stages_per_dc, pc.parallel.dp_size, pc.parallel.tp_size);
    const sched::CostModel cost = sched::cost_model(pc, layout, prof);
    const auto tokens = static_cast<double>(cfg.tokens_per_step());  // the deck's global batch, every plan's
    // No 1F1B baseline: the planner never shows it (the atlas table is the same without it).
    sched::ScheduleOptions so;
    so.kind = ScheduleKind::Atlas;
    so.micro_batches = p.micro_batches;
    so.full_search = full;
    so.baseline_1f1b = false;
    so.split = split;
    so.runs = runs;
    const sim::SimResult r = sim::measure(sched::build_schedule(cost, so), cost, tokens);
    p.simulated = true;
    p.split_backward = sched::is_split(r.table);
    // No table of this plan, split or not, is faster than its busiest row's work (compute,
    // all-reduce, optimizer: the split moves W, it does not shrink it) nor than its busiest WAN
    // link's bytes at the link's capacity (the split sends the same bytes).
    double floor_ms = 0.0;
    for (int s = 0; s < r.table.pp; ++s)
      for (int d = 0; d < r.table.dp; ++d) floor_ms = std::max(floor_ms, r.table.busy_ms(s, d));
    p.step_floor_ms = std::max(floor_ms, r.max_link_utilization * r.step_ms);
    p.fully_timed = full;
    p.step_ms = r.step_ms;
    p.tokens_per_s = r.tokens_per_s;
    p.utilization = r.compute_utilization;
    p.bubble_fraction = r.bubble_fraction;
    // The atlas table may hold more micro-batches than 1F1B (its depth search stays within the
    // device's memory): the plan's memory per GPU is the table's (sched/memory.hpp).
    const double table_bytes = sched::memory_per_gpu(cost, r.table).peak_bytes;
    p.mem_bytes = p.split_backward ? table_bytes : std::max(p.mem_bytes, table_bytes);
    set_step(p, p.step_ms);
  };
  std::mutex tell_mutex;
  auto tell = [&](const std::string& what) {
    const std::lock_guard<std::mutex> lock(tell_mutex);
    if (opt.progress) opt.progress(what);
  };
  // Times plans[i] for every i in `which` on up to opt.threads threads (each plan's run touches
  // only that plan), telling `what(n)` before the n-th (1-based) starts.
  const unsigned hw = std::max(1U, std::thread::hardware_concurrency());
  const auto threads = static_cast<std::size_t>(opt.threads > 0 ? opt.threads : static_cast<int>(std::min(hw, 8U)));
  auto run_all = [&](std::vector<Plan>& plans, const std::vector<std::size_t>& which_in, bool full,
                     const std::function<std::string(std::size_t)>& what,
                     SplitBackward split) {
    // The costliest runs first, so that the last ones to finish are short (the plans and their
    // results are the same in any order): a plan over several DCs times every replica row
    // (pp x dp), one in one DC a replica per stage (sched::one_replica_per_stage), each over its
    // micro-batches.
    std::vector<std::size_t> which = which_in;
    auto work_of = [&](std::size_t i) {
      const Plan& p = plans[i];
      const bool multi = std::popcount(set_of(p)) > 1;
      return static_cast<double>(p.pp) * (multi ? p.dp : 1) * p.micro_batches;
    };
    std::stable_sort(which.begin(), which.end(), [&](std::size_t a, std::size_t b) { return work_of(a) > work_of(b); });
    std::atomic<std::size_t> next{0};
    std::exception_ptr failed;
    std::mutex failed_mutex;
    // A thread that runs out of plans gives its place to the atlas searches still running
    // (sched::take_search_threads): the spawned ones took a place from the pool, the caller's is
    // its own.
    auto work = [&](bool from_pool) {
      for (std::size_t n = next++; n < which.size(); n = next++) {
        tell(what(n + 1));
        try {
          run(plans[which[n]], full, split, runs_of[which[n]]);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failed_mutex);
          if (!failed) failed = std::current_exception();
          next = which.size();
        }
      }
      sched::give_search_threads(from_pool ? 1 : 0);
    };
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < std::min(threads, which.size()); ++t)
      pool.emplace_back(work, sched::take_search_threads(1) == 1);
    work(false);
    if (!pool.empty()) sched::give_search_threads(1);  // the caller waits: its place is free
    for (auto& th : pool) th.join();
    if (!pool.empty()) sched::take_search_threads(1);
    if (failed) std::rethrow_exception(failed);
  };
  // schedule.split_backward: on splits every candidate of every run; off never. auto: the plans
  // are quick-timed and re-timed unsplit (as with off), then split_pass tries the split on each
  // plan (re-timed or quick-timed) that could still become the chosen one: whose step floor (step_floor_ms: no
  // split beats it) beats the best plan by the objective, within the deadline. The try is the
  // quick search with auto (it takes the plan's earlier runs again, ScheduleOptions::runs, and
  // times the split candidates); a split table replaces the unsplit one only where faster. Auto in
  // every run cost the 1,024-GPU deck ~1.6x, auto in the whole re-timing search ~1.3x.
  const SplitBackward deck_split = cfg.schedule.split_backward;
  const SplitBackward unsplit_first = deck_split == SplitBackward::Auto ? SplitBackward::Off : deck_split;
  // Which of `timed` could still become the chosen plan (or the fastest): whose step floor
  // (step_floor_ms: no table of the plan beats it) beats, by the objective within the deadline,
  // the best of `against` as timed so far (each timing only improves: never slower), or, with
  // `or_fastest`, beats the fastest of them (the what-if table's "fastest" row).
  auto in_time = [&](double step_ms) { return !deadline || step_ms <= cfg.plan.deadline_s * 1e3; };
  const auto could_win = [&](const std::vector<std::size_t>& timed, const std::vector<std::size_t>& against,
                             bool or_fastest) {
    const bool any_in_time =
        std::any_of(against.begin(), against.end(), [&](std::size_t i) { return in_time(res.plans[i].step_ms); });
    // What a plan is ranked by: the objective among plans within the deadline; the step where none is.
    const PlanObjective rank_by = any_in_time ? objective : PlanObjective::Time;
    double best = std::numeric_limits<double>::infinity();
    double fastest = std::numeric_limits<double>::infinity();
    for (std::size_t i : against) {
      if (!any_in_time || in_time(res.plans[i].step_ms)) best = std::min(best, objective_value(res.plans[i], rank_by));
      fastest = std::min(fastest, res.plans[i].step_ms);
    }
    std::vector<std::size_t> which;
    for (std::size_t i : timed) {
      Plan floor = res.plans[i];
      floor.step_ms = floor.step_floor_ms;
      set_step(floor, floor.step_ms);
      if (((!any_in_time || in_time(floor.step_ms)) && objective_value(floor, rank_by) < best * (1 - 1e-4)) ||
          (or_fastest && floor.step_ms < fastest * (1 - 1e-4)))
        which.push_back(i);
    }
    return which;
  };
  // The split is tried on every plan that could still win against the re-timed ones (`timed`),
  // not only on those: which plans are re-timed follows plan.top (the rows shown), and a plan
  // outside them whose split wins was never tried (plan_13b_deadline chose a plan another beat on
  // both step and cost, and plan.top changed the choice).
  const auto split_pass = [&](const std::vector<std::size_t>& timed) {
    if (deck_split != SplitBackward::Auto || timed.empty()) return;
    std::vector<std::size_t> every(res.plans.size());
    std::iota(every.begin(), every.end(), 0);
    const std::vector<std::size_t> which = could_win(every, timed, false);
    // The split is tried by the quick search (around 1F1B's depth, with the default and the
    // concurrent link policies): the whole search with auto cost the 1,024-GPU deck ~0.25 s more,
    // over its 1 s budget. A split table replaces the whole unsplit search's only where faster.
    std::vector<Plan> trial = res.plans;
    run_all(
        trial, which, false,
        [&](std::size_t n) {
          return fmt::format("{} plans re-timed; trying the split backward on plan {} of {}", timed.size(), n,
                             which.size());
        },
        SplitBackward::Auto);
    for (std::size_t i : which) {
      if (trial[i].split_backward && trial[i].step_ms < res.plans[i].step_ms * (1 - 1e-4)) {
        trial[i].fully_timed = true;
        res.plans[i] = trial[i];
      }
      res.plans[i].split_tried = true;
    }
  };
  std::vector<char> group;  // res.plans[i]'s Pick
  for (std::size_t i = 0; i < cands.size(); ++i)
    if (pick[i] != None) {
      res.plans.push_back(cands[i]);
      group.push_back(pick[i]);
    }
  runs_of.resize(res.plans.size());
  for (auto& runs : runs_of) runs = sched::new_search_runs();
  {
    std::vector<std::size_t> all(res.plans.size());
    std::iota(all.begin(), all.end(), 0);
    run_all(
        res.plans, all, false,
        [&](std::size_t n) { return fmt::format("{} candidate plans; quick-timing plan {} of {}", cands.size(), n, all.size()); },
        unsplit_first);
  }
  if (opt.final_full_search) {
    std::vector<std::size_t> order(res.plans.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return res.plans[a].step_ms < res.plans[b].step_ms; });
    std::vector<bool> retime(res.plans.size(), false);
    int base = 0;
    std::map<std::uint64_t, bool> set_done;
    std::vector<std::size_t> per_set;
    int near = 0;
    for (std::size_t i : order) {
      const Plan& p = res.plans[i];
      if (group[i] == Base && base < top) {
        retime[i] = true;
        ++base;
      }
      if (group[i] == Base && !set_done[set_of(p)]) {
        per_set.push_back(i);
        set_done[set_of(p)] = true;
      }
    }
    // The fastest of each set of DCs is re-timed where the whole search could still make it the
    // chosen or the fastest plan; one whose floor (its busiest WAN link's bytes at capacity, its
    // busiest row's work) is behind the best quick timing keeps its quick timing (at 100k GPUs the
    // WAN-bound sets' searches were most of the planner's time, for no change of plan).
    for (std::size_t i : could_win(per_set, order, true)) retime[i] = true;
    if (deadline || objective != PlanObjective::Time) {
      std::vector<std::size_t> by_obj = order;
      std::stable_sort(by_obj.begin(), by_obj.end(), [&](std::size_t a, std::size_t b) {
        return objective_value(res.plans[a], objective) < objective_value(res.plans[b], objective);
      });
      for (std::size_t i : by_obj)
        if (near < top && (!deadline || res.plans[i].step_ms <= cfg.plan.deadline_s * 1e3 * kDeadlineSlack)) {
          retime[i] = true;
          ++near;
        }
    }
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < res.plans.size(); ++i)
      if (retime[i]) which.push_back(i);
    run_all(
        res.plans, which, true,
        [&](std::size_t n) {
          return fmt::format("{} plans quick-timed; re-timing plan {} of {} with the whole atlas search",
                             res.plans.size(), n, which.size());
        },
        unsplit_first);
    split_pass(which);
  }
  auto by_step = [](const Plan& a, const Plan& b) { return a.step_ms < b.step_ms; };
  std::stable_sort(res.plans.begin(), res.plans.end(), by_step);
  // A plan whose timed table does not fit the device's memory is never chosen nor shown.
  std::erase_if(res.plans, [&](const Plan& p) { return p.mem_bytes > usable; });
  if (res.plans.empty())
    throw ConfigError(fmt::format("no plan fits: every simulated plan's schedule table needs more than the {:.1f} GiB "
                                  "usable on {}\n  hint: add GPUs or use a larger-memory plan.gpu",
                                  gib(usable), sched::memory_owner(cfg, prof.name)));
  res.best = 0;
  res.chosen = 0;
  // The chosen plan's row is what `atlas simulate` of its deck (--deck-out) prints: where the
  // split pass timed it (the quick search with the split), the whole search with the split is run
  // as simulate runs it, and kept where it is no slower and fits (it may hold more micro-batches
  // than the quick table: the row's GiB/GPU was the quick table's, 31 against simulate's 47 GiB).
  const auto retime_as_simulate = [&](std::size_t i) {
    Plan& p = res.plans[i];
    if (!opt.final_full_search || deck_split != SplitBackward::Auto || !p.split_tried) return;
    Plan again = p;
    run(again, true, SplitBackward::Auto, nullptr);
    if (again.step_ms <= p.step_ms && again.mem_bytes <= usable) p = again;
  };
  if (!deadline && objective == PlanObjective::Time) retime_as_simulate(0);  // only faster: still first
  if (deadline || objective != PlanObjective::Time) {
    // The plan best by the objective among those meeting the deadline (ties: the faster).
    auto pick_best = [&]() {
      int chosen = -1;
      for (std::size_t i = 0; i < res.plans.size(); ++i) {
        const Plan& p = res.plans[i];
        if (deadline && p.step_ms > cfg.plan.deadline_s * 1e3) continue;
        if (chosen < 0 || objective_value(p, objective) <
                              objective_value(res.plans[static_cast<std::size_t>(chosen)], objective) * (1 - 1e-12))
          chosen = static_cast<int>(i);
      }
      return chosen;
    };
    int chosen = pick_best();
    res.deadline_met = chosen >= 0;
    if (chosen >= 0 && opt.final_full_search && !res.plans[static_cast<std::size_t>(chosen)].fully_timed) {
      run(res.plans[static_cast<std::size_t>(chosen)], true, deck_split, nullptr);  // never slower: still in time
      std::stable_sort(res.plans.begin(), res.plans.end(), by_step);
      chosen = pick_best();
    }
    if (chosen >= 0 && res.plans[static_cast<std::size_t>(chosen)].split_tried) {
      retime_as_simulate(static_cast<std::size_t>(chosen));  // only faster: still in time, still best
      std::stable_sort(res.plans.begin(), res.plans.end(), by_step);
      chosen = pick_best();
    }
    if (chosen >= 0) res.chosen = chosen;
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace atlas::plan
