// SPDX-License-Identifier: MIT
// In-situ compute costs from a run's slots (see insitu.hpp).
#include "atlas/sim/insitu.hpp"

#include <algorithm>
#include <map>

#include "atlas/core/check.hpp"

namespace atlas::sim {
namespace {

bool computes(sched::SlotKind k) {
  return k == sched::SlotKind::Forward || k == sched::SlotKind::Backward || k == sched::SlotKind::Prefill;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Most ranks computing at once on the host during [a, b], the slot itself included (`others`:
/// the host's other compute slots).
int peak_overlap(double a, double b, const std::vector<const ComputeSpan*>& others, const ComputeSpan* self) {
  std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end); ends sort first
  int at_start = 1;
  for (const ComputeSpan* o : others) {
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
  std::map<int, std::vector<const ComputeSpan*>> by_host;
  for (const auto& s : spans)
    if (computes(s.kind)) by_host[host_of(s)].push_back(&s);
  std::vector<std::vector<double>> alone_f(static_cast<std::size_t>(pp)), alone_b(static_cast<std::size_t>(pp));
  std::vector<double> min_f(static_cast<std::size_t>(pp), -1.0), min_b(static_cast<std::size_t>(pp), -1.0);
  InSituCompute r;
  for (const auto& s : spans) {
    if ((s.kind != sched::SlotKind::Forward && s.kind != sched::SlotKind::Backward) || s.step < first_step) continue;
    if (s.stage < 0 || s.stage >= pp)
      ATLAS_THROW(Config, "in-situ compute: a slot of stage " << s.stage << " in a " << pp << "-stage pipeline");
    const bool fwd = s.kind == sched::SlotKind::Forward;
    const auto st = static_cast<std::size_t>(s.stage);
    const double ms = (s.end_s - s.start_s) * 1e3;
    double& lo = fwd ? min_f[st] : min_b[st];
    lo = lo < 0 ? ms : std::min(lo, ms);
    ++r.slots;
    if (shared_hosts &&
        peak_overlap(s.start_s, s.end_s, by_host[host_of(s)], &s) > static_cast<int>(cores_per_host + 1e-9))
      continue;
    (fwd ? alone_f : alone_b)[st].push_back(ms);
  }
  for (int st = 0; st < pp; ++st) {
    const auto i = static_cast<std::size_t>(st);
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

}  // namespace atlas::sim
