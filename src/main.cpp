// SPDX-License-Identifier: MIT
// Entry point of the one SPMD binary. No logic here: the environment, then run_app.
#include "atlas/app/app.hpp"
#include "atlas/mpi/comm.hpp"

int main(int argc, char** argv) {
  atlas::mpi::Environment env(argc, argv, atlas::mpi::ThreadLevel::Funneled);
  return atlas::app::run_app(env, argc, argv);
}
