// SPDX-License-Identifier: MIT
// Entry point of the one SPMD binary. No logic here: the environment, then run_app.
// MPI_THREAD_MULTIPLE: the runtime's WAN sender thread passes link-order tokens over MPI.
#include "atlas/app/app.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/mpi/comm.hpp"

int main(int argc, char** argv) {
  // Before any thread exists: threads inherit the scheduling policy (shared CPU hosts only).
  (void)atlas::device::prepare_host_scheduling();
  atlas::mpi::Environment env(argc, argv, atlas::mpi::ThreadLevel::Multiple, atlas::app::needs_mpi(argc, argv));
  return atlas::app::run_app(env, argc, argv);
}
