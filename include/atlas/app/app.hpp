// SPDX-License-Identifier: MIT
// Subcommand dispatch for the atlas binary. run_app() is the only place that decides how the
// process ends: it catches ConfigError (rank 0 prints, exit 2) and Error (the rank prints, abort).
#pragma once

#include "atlas/mpi/comm.hpp"

namespace atlas::app {

/// Runs the subcommand named by argv[1]. Collective over MPI_COMM_WORLD for `train` and the MPI
/// benchmarks; the other subcommands run on world rank 0 only. Returns the process exit code.
int run_app(mpi::Environment& env, int argc, char** argv);

/// Whether this command line needs MPI initialised: always under a launcher (mpirun, srun);
/// otherwise not for the offline commands (schedule, plan, simulate, report, tokenize) and the
/// help and usage texts, which then start without Open MPI's singleton start-up (~0.5 s).
[[nodiscard]] bool needs_mpi(int argc, char** argv);

}  // namespace atlas::app
