// SPDX-License-Identifier: MIT
// The deck as a run's schedule table is costed, made the same on every rank: a rank that costed
// its own machine would build another table on a host of another kind or size, and the job's
// pre-flight check would then refuse the tables as if the binaries or overrides differed.
#pragma once

#include <string>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::runtime {

struct CostedRun {
  Config cfg;        ///< the deck with plan.gpu and cluster.cores_per_host as costed
  std::string note;  ///< sched::run_costing's line ("# table costed with ...")
};

/// Collective over `world`: plan.gpu from rank 0's device (`device_name`, the backend's
/// describe(), through sched::run_costing), and cluster.cores_per_host = 0 (this machine's
/// hardware threads) replaced by rank 0's count (`local_cores`: this rank's; 0 = its hardware
/// threads).
[[nodiscard]] CostedRun costed_run(const mpi::Comm& world, const Config& cfg, std::string device_name,
                                   int local_cores = 0);

}  // namespace atlas::runtime
