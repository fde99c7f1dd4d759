// SPDX-License-Identifier: MIT
// Hand-built schedule cost models for the schedule and simulator tests: equal stages, WAN links
// of one speed, free intra-DC transfers, no all-reduce or optimizer time.
#pragma once

#include <cstdint>
#include <vector>

#include "atlas/sched/cost_model.hpp"

namespace atlas::testing {

/// `stages_per_dc` stages, `dp` pipelines, forward `fwd` and backward `bwd` ms per micro-batch,
/// boundary tensors of `bytes`, WAN links of capacity `cap` and per-transfer cap `flow_cap`
/// (bytes/ms) and one-way latency `lat` (ms).
inline sched::CostModel uniform_cost_model(const std::vector<int>& stages_per_dc, int dp, double fwd, double bwd,
                                           std::int64_t bytes, double cap, double flow_cap, double lat) {
  sched::CostModel c;
  c.dc_count = static_cast<int>(stages_per_dc.size());
  for (int dc = 0; dc < c.dc_count; ++dc)
    for (int s = 0; s < stages_per_dc[static_cast<std::size_t>(dc)]; ++s) c.stage_dc.push_back(dc);
  c.pp = static_cast<int>(c.stage_dc.size());
  c.dp = dp;
  c.tp = 1;
  c.fwd_ms.assign(static_cast<std::size_t>(c.pp), fwd);
  c.bwd_ms.assign(static_cast<std::size_t>(c.pp), bwd);
  c.allreduce_ms.assign(static_cast<std::size_t>(c.pp), 0.0);
  c.optimizer_ms.assign(static_cast<std::size_t>(c.pp), 0.0);
  c.act_bytes = bytes;
  c.intra_latency_ms = 0.0;
  c.intra_bytes_per_ms = 1e18;
  c.links.resize(static_cast<std::size_t>(c.dc_count * c.dc_count));
  for (auto& l : c.links) {
    l.latency_ms = lat;
    l.capacity_bytes_per_ms = cap;
    l.flow_cap_bytes_per_ms = flow_cap;
  }
  return c;
}

}  // namespace atlas::testing
