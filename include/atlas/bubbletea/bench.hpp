// SPDX-License-Identifier: MIT
// `atlas bench bubbletea DECK [key=value ...] [--repeats N] [--warmup N]`: trains the same deck
// with BubbleTea off and on, alternately, in one invocation, and prints step time (the slowdown
// BubbleTea costs training), utilization per rank and overall, prefill tokens/s, time to first
// token and the queue; checks that both runs have bitwise equal losses.
#pragma once

#include "atlas/bench/harness.hpp"

#include <string>
#include <vector>

#include "atlas/mpi/comm.hpp"

namespace atlas::bubbletea {

/// `atlas bench bubbletea`'s options: --repeats N (off/on pairs, default 2), --warmup N (leading
/// steps of each run left out of the step time, default 2).
[[nodiscard]] const atlas::bench::Spec& bubbletea_bench_spec();

/// Runs the bench: the deck path and key=value overrides (applied to both runs;
/// bubbletea.enabled is forced off/on per run) and the options above.
/// Collective over MPI_COMM_WORLD. Rank 0 prints; writes runs/NAME/bubbletea_bench.json. The
/// decode worker program is found as for `atlas train` (next to this executable, or
/// $ATLAS_DECODE_WORKER). Returns 0, or 6 (internal error) when the runs' losses differ. Throws
/// ConfigError (on every rank) for a bad deck or command line (--repeats < 1, --warmup >= steps,
/// an unknown option, no deck).
int run_bubbletea_bench(mpi::Environment& env, const atlas::bench::Args& args);
/// The same from the words after "bubbletea" (parsed by the harness).
int run_bubbletea_bench(mpi::Environment& env, const std::vector<std::string>& words);

}  // namespace atlas::bubbletea
