// SPDX-License-Identifier: MIT
// `atlas bench wan`: throughput of the multirail transport at several rail counts, of the MPI
// baseline and of iperf3 -P N between the same two ranks on the same (emulated) link, side by
// side, plus an in-process loopback overhead check; and, with --latency, the time of single
// messages after idle gaps. scripts/wan/bench_wan.sh runs it on an
// emulated 2-DC link.
#pragma once

#include <string>
#include <vector>

#include "atlas/bench/harness.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::wan {

/// `atlas bench wan`'s options (the harness parses them; src/app/bench_cmd.cpp registers it).
[[nodiscard]] const atlas::bench::Spec& wan_bench_spec();
/// `atlas bench latency`'s options (= `atlas bench wan --latency`).
[[nodiscard]] const atlas::bench::Spec& wan_latency_bench_spec();

/// Runs the WAN benchmark: [DECK] [key=value ...] and the options of wan_bench_spec(). Collective
/// over MPI_COMM_WORLD: rank 0 sends, the first rank of another DC receives (DC of a rank:
/// ATLAS_WAN_DC from the emulation launcher, else the deck's layout); the others take part in
/// the collectives only. Prints on rank 0, ending with
/// "best: rails=N fraction=F vs rails=1: R x vs mpi: M x". Returns the process exit code;
/// transport failures throw atlas::Error, a bad option or deck ConfigError (on every rank).
int run_wan_bench(mpi::Environment& env, const atlas::bench::Args& args);

/// The command line of atlas-wan-bench (the words after the program name): parsed by the harness
/// as `atlas bench wan`, or as `atlas bench latency` when it holds `--latency`.
int run_wan_bench(mpi::Environment& env, const std::vector<std::string>& args);

/// The latency benchmark (`atlas bench latency`, `atlas bench wan --latency`): one message at a
/// time after an idle gap, per variant (multirail at given rails and chunk sizes, Open MPI, one
/// plain TCP socket), between rank 0 and the first rank of another DC. A variant without its own
/// congestion control uses the deck's wan.tcp_congestion. Prints on rank 0 the one-way (isend to
/// the receiver's completion) and acknowledged-send times (p50/p90/p99/max, ms) against the ideal
/// latency + bytes/rate (and RTT + bytes/rate), ending with a "latency:" verdict line.
/// Collective over MPI_COMM_WORLD. Returns 0, or 1 (on every rank) when --max-ratio R is given
/// and a multirail variant's p50 exceeds R x ideal or its first message 2R x ideal; usage errors
/// throw ConfigError.
int run_wan_latency_bench(mpi::Environment& env, const atlas::bench::Args& args);

}  // namespace atlas::wan
