// SPDX-License-Identifier: MIT
// The job's communicators (DESIGN.md §3), each created once with MPI_Comm_split and owned here,
// plus the rank map printed at start-up. Knows nothing about the model.
#pragma once

#include <string>

#include "atlas/mpi/comm.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::topo {

struct Communicators {
  mpi::Comm world;  ///< a dup of MPI_COMM_WORLD (never the raw world)
  mpi::Comm tp;     ///< Group::Tensor
  mpi::Comm dp;     ///< Group::Data
  mpi::Comm pp;     ///< Group::Pipeline
  mpi::Comm dc;     ///< Group::Dc

  /// Collective over `world`: dups it and splits tp, dp, pp and dc by the layout's colors (keys
  /// are world ranks, so communicator ranks follow Layout::members order).
  static Communicators create(const mpi::Comm& world, const Layout& layout);
};

/// Collective over `world`: gathers every rank's host name and returns the rank map table
/// (world rank, host, dc, stage, dp, tp, and pipeline neighbours) on every rank.
std::string rank_map(const mpi::Comm& world, const Layout& layout,
                     const std::vector<std::string>& dc_names);

}  // namespace atlas::topo
