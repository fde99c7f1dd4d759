// SPDX-License-Identifier: MIT
// `atlas bench sim`: the simulator's and planner's speed at scale, measured (a 10,000-GPU,
// 175B-parameter, 64-micro-batch step; a planner search for 1,024 GPUs over 4 DCs). The lead
// wires it into `atlas bench`; one process, no MPI.
#pragma once

#include "atlas/bench/harness.hpp"

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::sim {

/// The benchmark job: 4 DCs, 175B (96 x 12288), tp 8 x pp 16 x dp 78 = 9,984 H100s,
/// 64 micro-batches, 20 ms one-way, 100 Gbit/s between DCs. A valid deck's Config.
Config bench_step_config();

/// The planner benchmark: 1,024 H100s over 4 DCs (384 + 256 + 256 + 128), a 70B model,
/// a global batch of 512 sequences. A valid deck's Config.
Config bench_plan_config();

/// `atlas bench sim`'s options: --repeat N (default 3; the median is reported).
[[nodiscard]] const atlas::bench::Spec& sim_bench_spec();

/// Runs both benchmarks and prints what it measured (fixed-width, '#' comments, an OK/FAILED
/// footer against the targets: one step <= 1 s, one search <= 10 s). Returns 0 when both targets
/// are met. One process, no MPI.
int run_sim_bench(const atlas::bench::Args& args);

}  // namespace atlas::sim
