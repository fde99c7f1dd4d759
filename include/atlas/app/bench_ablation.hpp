// SPDX-License-Identifier: MIT
// `atlas bench ablation DECK`: the paper's ablation as real runs of one deck inside one MPI job
// (src/app/bench_ablation.cpp). Registered in src/app/bench_cmd.cpp.
#pragma once

#include "atlas/app/commands.hpp"
#include "atlas/bench/harness.hpp"

namespace atlas::app {

/// Its Spec: operands "DECK [key=value ...]", options --steps, --rows, --png, --png-size.
const bench::Spec& ablation_bench_spec();
/// The rows --rows names ("a,d": only (a) and (d); default every row), as their letters in table
/// order ("ad"). A letter other than a-e, a repeat or an empty list is a ConfigError naming it.
std::string ablation_rows(const bench::Args& args);
/// Collective: runs the rows (a)-(e) (those of --rows) and prints the table on rank 0; writes the PNG.
int bench_ablation(Context& ctx, const bench::Args& args);

}  // namespace atlas::app
