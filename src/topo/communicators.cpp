// SPDX-License-Identifier: MIT
// Communicator creation and the rank map.
#include "atlas/topo/communicators.hpp"

#include <fmt/format.h>

#include "atlas/core/env.hpp"

namespace atlas::topo {

Communicators Communicators::create(const mpi::Comm& world, const Layout& layout) {
  Communicators c;
  c.world = world.dup();
  const Coord me = layout.coord(c.world.rank());
  const int key = c.world.rank();
  c.tp = c.world.split(layout.color(Group::Tensor, me), key);
  c.dp = c.world.split(layout.color(Group::Data, me), key);
  c.pp = c.world.split(layout.color(Group::Pipeline, me), key);
  c.dc = c.world.split(layout.color(Group::Dc, me), key);
  return c;
}

std::string rank_map(const mpi::Comm& world, const Layout& layout,
                     const std::vector<std::string>& dc_names) {
  const auto hosts = world.allgather_strings(env::host_name());
  std::string out = fmt::format("# rank map: {} ranks = {} stages x dp {} x tp {} over {} DCs\n",
                                layout.world_size(), layout.pp_size(), layout.dp_size(),
                                layout.tp_size(), layout.dc_count());
  out += fmt::format("# {:>5} {:<16} {:<10} {:>5} {:>3} {:>3}  {}\n", "rank", "host", "dc", "stage",
                     "dp", "tp", "pipeline prev -> next");
  for (int r = 0; r < layout.world_size(); ++r) {
    const Coord c = layout.coord(r);
    const std::string dc = static_cast<std::size_t>(c.dc) < dc_names.size()
                               ? dc_names[static_cast<std::size_t>(c.dc)]
                               : std::to_string(c.dc);
    std::string link;
    if (c.stage > 0) {
      const int prev = layout.world_rank(c.stage - 1, c.dp, c.tp);
      link += fmt::format("{}{}", prev, layout.crosses_dc(c.stage - 1) ? " (WAN)" : "");
    } else {
      link += "-";
    }
    link += " -> ";
    if (c.stage + 1 < layout.pp_size()) {
      const int next = layout.world_rank(c.stage + 1, c.dp, c.tp);
      link += fmt::format("{}{}", next, layout.crosses_dc(c.stage) ? " (WAN)" : "");
    } else {
      link += "-";
    }
    out += fmt::format("# {:>5} {:<16} {:<10} {:>5} {:>3} {:>3}  {}\n", r,
                       hosts[static_cast<std::size_t>(r)], dc, c.stage, c.dp, c.tp, link);
  }
  return out;
}

}  // namespace atlas::topo
