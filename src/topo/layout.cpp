// SPDX-License-Identifier: MIT
// Layout arithmetic. rank = ((stage * dp_size) + dp) * tp_size + tp; since DCs hold contiguous
// stages, this is also (dc, stage, dp, tp) order.
#include "atlas/topo/layout.hpp"

#include <algorithm>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas::topo {

Layout::Layout(std::vector<int> stages_per_dc, int dp_size, int tp_size)
    : m_stages_per_dc(std::move(stages_per_dc)), m_dp(dp_size), m_tp(tp_size) {
  ProblemList problems;
  if (m_stages_per_dc.empty()) problems.add("layout has no DCs");
  for (std::size_t dc = 0; dc < m_stages_per_dc.size(); ++dc) {
    if (m_stages_per_dc[dc] < 0) problems.add("layout: DC " + std::to_string(dc) + " has a negative stage count");
    for (int s = 0; s < m_stages_per_dc[dc]; ++s) m_stage_dc.push_back(static_cast<int>(dc));
  }
  m_pp = static_cast<int>(m_stage_dc.size());
  if (m_pp == 0 && !m_stages_per_dc.empty()) problems.add("layout places no pipeline stage in any DC");
  if (m_dp < 1) problems.add("layout: dp_size must be >= 1");
  if (m_tp < 1) problems.add("layout: tp_size must be >= 1");
  problems.throw_if_any();
}

Layout::Layout(int world_size, const ParallelCfg& parallel)
    : Layout(parallel.stages_per_dc, parallel.dp_size, parallel.tp_size) {
  if (auto msg = parallel.size_mismatch(world_size); !msg.empty()) throw ConfigError(msg);
}

Coord Layout::coord(int world_rank) const {
  ATLAS_ASSERT(world_rank >= 0 && world_rank < world_size(),
               "world rank " << world_rank << " outside [0, " << world_size() << ")");
  Coord c;
  c.tp = world_rank % m_tp;
  c.dp = (world_rank / m_tp) % m_dp;
  c.stage = world_rank / (m_tp * m_dp);
  c.dc = m_stage_dc[static_cast<std::size_t>(c.stage)];
  return c;
}

int Layout::world_rank(int stage, int dp, int tp) const {
  ATLAS_ASSERT(stage >= 0 && stage < m_pp && dp >= 0 && dp < m_dp && tp >= 0 && tp < m_tp,
               "coordinate (stage " << stage << ", dp " << dp << ", tp " << tp << ") outside the layout");
  return (stage * m_dp + dp) * m_tp + tp;
}

int Layout::world_rank(const Coord& c) const {
  ATLAS_ASSERT(dc_of_stage(c.stage) == c.dc, "stage " << c.stage << " is not in DC " << c.dc);
  return world_rank(c.stage, c.dp, c.tp);
}

int Layout::dc_of_stage(int stage) const {
  ATLAS_ASSERT(stage >= 0 && stage < m_pp, "stage " << stage << " outside [0, " << m_pp << ")");
  return m_stage_dc[static_cast<std::size_t>(stage)];
}

int Layout::first_stage_of_dc(int dc) const {
  int first = 0;
  for (int d = 0; d < dc; ++d) first += m_stages_per_dc[static_cast<std::size_t>(d)];
  return first;
}

bool Layout::crosses_dc(int stage) const {
  return stage + 1 < m_pp && dc_of_stage(stage) != dc_of_stage(stage + 1);
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
  return m_stages_per_dc[static_cast<std::size_t>(dc)] * m_dp * m_tp;
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
      const int first = first_stage_of_dc(c.dc);
      const int count = m_stages_per_dc[static_cast<std::size_t>(c.dc)];
      for (int r = world_rank(first, 0, 0); r < world_rank(first, 0, 0) + count * m_dp * m_tp; ++r)
        out.push_back(r);
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
