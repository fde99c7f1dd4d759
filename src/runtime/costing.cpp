// SPDX-License-Identifier: MIT
// A run's costed deck, rank 0's machine for every rank (costing.hpp).
#include "atlas/runtime/costing.hpp"

#include <algorithm>
#include <span>
#include <thread>
#include <utility>

#include "atlas/sched/profile.hpp"

namespace atlas::runtime {

CostedRun costed_run(const mpi::Comm& world, const Config& cfg, std::string device_name, int local_cores) {
  world.bcast_string(device_name, 0);
  const sched::RunCosting costing = sched::run_costing(cfg, device_name);
  CostedRun out{cfg, costing.note};
  out.cfg.plan.gpu = costing.gpu;
  if (cfg.cluster.cores_per_host <= 0) {
    int cores = local_cores > 0 ? local_cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    world.bcast(std::span<int>(&cores, 1), 0);
    out.cfg.cluster.cores_per_host = cores;
  }
  return out;
}

}  // namespace atlas::runtime
