// SPDX-License-Identifier: MIT
// In-situ compute costs from a run's slots (see insitu.hpp).
#include "atlas/sim/insitu.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "atlas/core/check.hpp"
#include "atlas/core/stats.hpp"

namespace atlas::sim {
namespace {

bool computes(sched::SlotKind k) { return sched::is_compute(k) || k == sched::SlotKind::Prefill; }

/// A host's compute slots, sorted by start, and the longest of them: the slots that overlap
/// [a, b] start in [a - longest, b), a window found by binary search (a scan of every slot of
/// the host for every slot was quadratic: minutes for a 1,000-step profile).
struct HostSpans {
  std::vector<const ComputeSpan*> by_start;
  double longest_s = 0.0;
};

/// Most ranks computing at once on the host during [a, b], the slot itself included.
int peak_overlap(double a, double b, const HostSpans& host, const ComputeSpan* self) {
  std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end); ends sort first
  int at_start = 1;
  const auto& v = host.by_start;
  auto it = std::lower_bound(v.begin(), v.end(), a - host.longest_s,
                             [](const ComputeSpan* o, double t) { return o->start_s < t; });
  for (; it != v.end() && (*it)->start_s < b; ++it) {
    const ComputeSpan* o = *it;
    if (o == self || o->end_s <= a || o->start_s >= b) continue;
    if (o->start_s <= a) ++at_start;
    else edges.emplace_back(o->start_s, +1);
    if (o->end_s < b) edges.emplace_back(o->end_s, -1);
  }
  std::sort(edges.begin(), edges.end());
  int now = at_start, peak = at_start;
  for (const auto& [t, d] : edges) peak = std::max(peak, now += d);
  return peak;
}

}  // namespace

int first_step_after(const std::vector<ComputeSpan>& spans, int skip) {
  if (spans.empty()) return skip;
  int first = spans.front().step;
  for (const auto& s : spans) first = std::min(first, s.step);
  return first + skip;
}

InSituCompute insitu_compute(const std::vector<ComputeSpan>& spans, int pp, const std::vector<int>& rank_host,
                             double cores_per_host, int first_step) {
  const bool shared_hosts = !rank_host.empty() && cores_per_host > 0;
  auto host_of = [&](const ComputeSpan& s) {
    if (!shared_hosts) return s.rank;
    if (s.rank < 0 || static_cast<std::size_t>(s.rank) >= rank_host.size())
      ATLAS_THROW(Config, "in-situ compute: a slot of rank " << s.rank << ", the hosts are known for "
                                                             << rank_host.size() << " ranks");
    return rank_host[static_cast<std::size_t>(s.rank)];
  };
  std::map<int, HostSpans> by_host;
  for (const auto& s : spans)
    if (computes(s.kind)) {
      HostSpans& h = by_host[host_of(s)];
      h.by_start.push_back(&s);
      h.longest_s = std::max(h.longest_s, s.end_s - s.start_s);
    }
  for (auto& [host, h] : by_host)
    std::sort(h.by_start.begin(), h.by_start.end(),
              [](const ComputeSpan* x, const ComputeSpan* y) { return x->start_s < y->start_s; });
  // Per kind (forward, backward, and a split backward's B and W: schedule.split_backward), per stage.
  constexpr int kF = 0, kB = 1, kBi = 2, kBw = 3;
  auto kind_index = [](sched::SlotKind k) {
    switch (k) {
      case sched::SlotKind::Forward: return kF;
      case sched::SlotKind::Backward: return kB;
      case sched::SlotKind::BackwardInput: return kBi;
      case sched::SlotKind::BackwardWeight: return kBw;
      default: return -1;
    }
  };
  std::vector<std::vector<std::vector<double>>> alone(4, std::vector<std::vector<double>>(static_cast<std::size_t>(pp)));
  std::vector<std::vector<double>> low(4, std::vector<double>(static_cast<std::size_t>(pp), -1.0));
  InSituCompute r;
  for (const auto& s : spans) {
    const int k = kind_index(s.kind);
    if (k < 0 || s.step < first_step) continue;
    if (s.stage < 0 || s.stage >= pp)
      ATLAS_THROW(Config, "in-situ compute: a slot of stage " << s.stage << " in a " << pp << "-stage pipeline");
    const auto st = static_cast<std::size_t>(s.stage);
    const double ms = (s.end_s - s.start_s) * 1e3;
    double& lo = low[static_cast<std::size_t>(k)][st];
    lo = lo < 0 ? ms : std::min(lo, ms);
    ++r.slots;
    if (shared_hosts &&
        peak_overlap(s.start_s, s.end_s, by_host[host_of(s)], &s) > static_cast<int>(cores_per_host + 1e-9))
      continue;
    alone[static_cast<std::size_t>(k)][st].push_back(ms);
  }
  auto& alone_f = alone[kF];
  auto& alone_b = alone[kB];
  auto& min_f = low[kF];
  auto& min_b = low[kB];
  for (int st = 0; st < pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
    // A split backward: its B's and W's medians add up to the backward (B + W = the backward).
    if (min_b[i] < 0 && low[kBi][i] >= 0 && low[kBw][i] >= 0) {
      min_b[i] = low[kBi][i] + low[kBw][i];
      if (!alone[kBi][i].empty() && !alone[kBw][i].empty()) {
        const double b = median(alone[kBi][i]), w = median(alone[kBw][i]);
        alone_b[i].assign(std::min(alone[kBi][i].size(), alone[kBw][i].size()), b + w);
      }
    }
    if (min_f[i] < 0 || min_b[i] < 0)
      ATLAS_THROW(Config, "in-situ compute: stage " << st << " ran no forward or backward slot (profile.enabled = "
                                                        "false, or no step from " << first_step << " on?)");
    r.fwd_samples.push_back(static_cast<int>(alone_f[i].size()));
    r.bwd_samples.push_back(static_cast<int>(alone_b[i].size()));
    r.fwd_ms.push_back(alone_f[i].empty() ? min_f[i] : median(alone_f[i]));
    r.bwd_ms.push_back(alone_b[i].empty() ? min_b[i] : median(alone_b[i]));
  }
  return r;
}

SimOptions without_network_share(const Config& deck, const Config& machine, const SimOptions& in_situ) {
  if (!(machine.cluster.host_net_ns_per_byte > 0.0) || in_situ.stage_fwd_ms.empty()) return in_situ;
  Config quiet_net = machine;
  quiet_net.cluster.host_net_ns_per_byte = 0.0;
  const SimResult with = simulate_on(deck, machine, in_situ);
  const SimResult without = simulate_on(deck, quiet_net, in_situ);
  const int pp = with.table.pp;
  const int dp = with.table.dp;
  ATLAS_ASSERT(without.table.pp == pp && without.table.dp == dp && static_cast<int>(in_situ.stage_fwd_ms.size()) == pp &&
                   static_cast<int>(in_situ.stage_bwd_ms.size()) == pp,
               "without_network_share: " << in_situ.stage_fwd_ms.size() << " in-situ stages for a table of pp " << pp);
  // Per stage and kind (forward; backward, B and W), each compute slot's length with the term
  // over the same slot's without it; the median, as the in-situ cost is the median slot: where
  // transfers run beside most slots (a WAN-bound deck) it is their stretch, where only a few
  // slots meet a transfer it is 1. The same slot is the one of the same kind, micro-batch and
  // chunk: with a searched schedule (--search, atlas) the two tables may differ in depth, order
  // or split backward, so a slot with no twin is left out (the orders were compared, and a
  // difference was an internal error).
  auto is_bwd = [](sched::SlotKind k) {
    return k == sched::SlotKind::Backward || k == sched::SlotKind::BackwardInput || k == sched::SlotKind::BackwardWeight;
  };
  auto key = [](const sched::Slot& slot) {
    return (static_cast<std::int64_t>(slot.kind) << 48) | (static_cast<std::int64_t>(slot.chunk) << 32) |
           static_cast<std::int64_t>(static_cast<std::uint32_t>(slot.micro));
  };
  std::vector<std::vector<double>> stretch(static_cast<std::size_t>(2 * pp));
  for (int st = 0; st < pp; ++st)
    for (int d = 0; d < dp; ++d) {
      std::unordered_map<std::int64_t, const sched::Slot*> twin;
      for (const auto& slot : without.table.row(st, d))
        if (slot.kind == sched::SlotKind::Forward || is_bwd(slot.kind)) twin.emplace(key(slot), &slot);
      for (const auto& slot : with.table.row(st, d)) {
        if (slot.kind != sched::SlotKind::Forward && !is_bwd(slot.kind)) continue;
        const auto it = twin.find(key(slot));
        if (it == twin.end() || !(it->second->duration_ms > 0.0)) continue;
        const bool fwd = slot.kind == sched::SlotKind::Forward;
        stretch[static_cast<std::size_t>(fwd ? st : pp + st)].push_back(slot.duration_ms / it->second->duration_ms);
      }
    }
  SimOptions out = in_situ;
  for (int st = 0; st < pp; ++st) {
    const auto f = static_cast<std::size_t>(st), b = static_cast<std::size_t>(pp + st);
    if (!stretch[f].empty()) out.stage_fwd_ms[f] /= std::max(1.0, median(stretch[f]));
    if (!stretch[b].empty()) out.stage_bwd_ms[f] /= std::max(1.0, median(stretch[b]));
  }
  return out;
}

}  // namespace atlas::sim
