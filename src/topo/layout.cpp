// SPDX-License-Identifier: MIT
// Layout arithmetic. rank = ((stage * dp_size) + dp) * tp_size + tp; since DCs hold contiguous
// stages, this is also (dc, stage, dp, tp) order. With dp_across_dcs, DC d holds replicas
// [d * dpl, (d + 1) * dpl) (dpl = dp_size / DCs) of every stage:
// rank = (((dc * pp + stage) * dpl) + dp % dpl) * tp_size + tp.
#include "atlas/topo/layout.hpp"

#include <algorithm>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas::topo {

Layout::Layout(std::vector<int> stages_per_dc, int dp_size, int tp_size, bool dp_across_dcs)
    : m_stages_per_dc(std::move(stages_per_dc)), m_dp(dp_size), m_tp(tp_size), m_dp_across(dp_across_dcs) {
  ProblemList problems;
  if (m_stages_per_dc.empty()) problems.add("layout has no DCs");
  for (std::size_t dc = 0; dc < m_stages_per_dc.size(); ++dc) {
    if (m_stages_per_dc[dc] < 0) problems.add("layout: DC " + std::to_string(dc) + " has a negative stage count");
    if (m_dp_across) {
      if (m_stages_per_dc[dc] != m_stages_per_dc[0])
        problems.add("layout: dp_across_dcs needs the same stage count in every DC (DC " + std::to_string(dc) +
                     " has " + std::to_string(m_stages_per_dc[dc]) + ", DC 0 " + std::to_string(m_stages_per_dc[0]) +
                     ")");
      continue;
    }
    for (int s = 0; s < m_stages_per_dc[dc]; ++s) m_stage_dc.push_back(static_cast<int>(dc));
  }
  if (m_dp_across && !m_stages_per_dc.empty()) {
    m_stage_dc.assign(static_cast<std::size_t>(std::max(0, m_stages_per_dc[0])), 0);
    if (m_dp % static_cast<int>(m_stages_per_dc.size()) != 0)
      problems.add("layout: dp_across_dcs needs dp_size (" + std::to_string(m_dp) + ") to be a multiple of the " +
                   std::to_string(m_stages_per_dc.size()) + " DCs");
  }
  m_pp = static_cast<int>(m_stage_dc.size());
  if (m_pp == 0 && !m_stages_per_dc.empty()) problems.add("layout places no pipeline stage in any DC");
  if (m_dp < 1) problems.add("layout: dp_size must be >= 1");
  if (m_tp < 1) problems.add("layout: tp_size must be >= 1");
  problems.throw_if_any();
}

Layout::Layout(const ParallelCfg& parallel)
    : Layout(parallel.stages_per_dc, parallel.dp_size, parallel.tp_size, parallel.dp_across_dcs) {}

Layout::Layout(int world_size, const ParallelCfg& parallel) : Layout(parallel) {
  if (auto msg = parallel.size_mismatch(world_size); !msg.empty()) throw ConfigError(msg);
}

Coord Layout::coord(int world_rank) const {
  ATLAS_ASSERT(world_rank >= 0 && world_rank < world_size(),
               "world rank " << world_rank << " outside [0, " << world_size() << ")");
  Coord c;
  c.tp = world_rank % m_tp;
  if (m_dp_across) {
    const int dpl = dp_per_dc();
    const int r = world_rank / m_tp;
    c.dc = r / (m_pp * dpl);
    c.stage = (r / dpl) % m_pp;
    c.dp = c.dc * dpl + r % dpl;
    return c;
  }
  c.dp = (world_rank / m_tp) % m_dp;
  c.stage = world_rank / (m_tp * m_dp);
  c.dc = m_stage_dc[static_cast<std::size_t>(c.stage)];
  return c;
}

int Layout::world_rank(int stage, int dp, int tp) const {
  ATLAS_ASSERT(stage >= 0 && stage < m_pp && dp >= 0 && dp < m_dp && tp >= 0 && tp < m_tp,
               "coordinate (stage " << stage << ", dp " << dp << ", tp " << tp << ") outside the layout");
  if (m_dp_across) {
    const int dpl = dp_per_dc();
    return (((dp / dpl) * m_pp + stage) * dpl + dp % dpl) * m_tp + tp;
  }
  return (stage * m_dp + dp) * m_tp + tp;
}

int Layout::world_rank(const Coord& c) const {
  ATLAS_ASSERT(dc_of(c.stage, c.dp) == c.dc, "stage " << c.stage << " dp " << c.dp << " is not in DC " << c.dc);
  return world_rank(c.stage, c.dp, c.tp);
}

int Layout::dc_of_stage(int stage) const {
  ATLAS_ASSERT(stage >= 0 && stage < m_pp, "stage " << stage << " outside [0, " << m_pp << ")");
  return m_stage_dc[static_cast<std::size_t>(stage)];
}

int Layout::dc_of(int stage, int dp) const {
  ATLAS_ASSERT(dp >= 0 && dp < m_dp, "dp " << dp << " outside [0, " << m_dp << ")");
  return m_dp_across ? dp / dp_per_dc() : dc_of_stage(stage);
}

int Layout::first_stage_of_dc(int dc) const {
  if (m_dp_across) return 0;
  int first = 0;
  for (int d = 0; d < dc; ++d) first += m_stages_per_dc[static_cast<std::size_t>(d)];
  return first;
}

bool Layout::crosses_dc(int stage) const {
  return !m_dp_across && stage + 1 < m_pp && dc_of_stage(stage) != dc_of_stage(stage + 1);
}

std::vector<int> Layout::wan_peers(const Coord& c) const {
  std::vector<int> peers;
  if (c.stage > 0 && crosses_dc(c.stage - 1)) peers.push_back(world_rank(c.stage - 1, c.dp, c.tp));
  if (c.stage + 1 < m_pp && crosses_dc(c.stage)) peers.push_back(world_rank(c.stage + 1, c.dp, c.tp));
  if (const int e = embedding_partner(c); e >= 0 && coord(e).dc != c.dc) peers.push_back(e);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

int Layout::embedding_partner(const Coord& c) const {
  if (m_pp < 2) return -1;
  if (c.stage == 0) return world_rank(m_pp - 1, c.dp, c.tp);
  if (c.stage == m_pp - 1) return world_rank(0, c.dp, c.tp);
  return -1;
}

int Layout::ranks_in_dc(int dc) const {
  return m_stages_per_dc[static_cast<std::size_t>(dc)] * dp_per_dc() * m_tp;
}

int Layout::color(Group g, const Coord& c) const {
  switch (g) {
    case Group::Tensor: return c.stage * m_dp + c.dp;
    case Group::Data: return c.stage * m_tp + c.tp;
    case Group::Pipeline: return c.dp * m_tp + c.tp;
    case Group::Dc: return c.dc;
  }
  return 0;
}

std::vector<int> Layout::members(Group g, const Coord& c) const {
  std::vector<int> out;
  switch (g) {
    case Group::Tensor:
      for (int t = 0; t < m_tp; ++t) out.push_back(world_rank(c.stage, c.dp, t));
      break;
    case Group::Data:
      for (int d = 0; d < m_dp; ++d) out.push_back(world_rank(c.stage, d, c.tp));
      break;
    case Group::Pipeline:
      for (int s = 0; s < m_pp; ++s) out.push_back(world_rank(s, c.dp, c.tp));
      break;
    case Group::Dc: {
      const int first = m_dp_across ? world_rank(0, c.dc * dp_per_dc(), 0) : world_rank(first_stage_of_dc(c.dc), 0, 0);
      for (int r = first; r < first + ranks_in_dc(c.dc); ++r) out.push_back(r);
      break;
    }
  }
  return out;
}

std::string Layout::describe(int rank, const std::vector<std::string>& dc_names) const {
  const Coord c = coord(rank);
  std::string dc = "dc " + std::to_string(c.dc);
  if (static_cast<std::size_t>(c.dc) < dc_names.size()) dc += " (" + dc_names[static_cast<std::size_t>(c.dc)] + ")";
  return dc + " stage " + std::to_string(c.stage) + " dp " + std::to_string(c.dp) + " tp " +
         std::to_string(c.tp);
}

}  // namespace atlas::topo
