// SPDX-License-Identifier: MIT
// `atlas bench gemm`: the host backend's GEMM throughput on the GPT model's own shapes, side by
// side with a bare cblas_sgemm call on the same shapes and buffers (goal: ratio >= 0.7).
#pragma once

#include "atlas/bench/harness.hpp"

#include <string>
#include <vector>

namespace atlas::model {

/// `atlas bench gemm`'s options: the model shapes (--hidden 768, --seq-len 256, --batch 4,
/// --vocab 256, --tp 1: the per-rank shard of column/row-parallel layers) and --reps 5 (timed
/// calls per shape, best is reported). The backend and its threads are the deck keys
/// device.backend and device.threads, given as key=value.
[[nodiscard]] const atlas::bench::Spec& gemm_bench_spec();

/// Runs the GEMM benchmark and prints one table to stdout. Returns 0 when every run completed and
/// the overall ratio is >= 0.7, 2 when the ratio goal is missed; a bad option or key throws
/// ConfigError. One process; not collective.
int run_gemm_bench(const atlas::bench::Args& args);

}  // namespace atlas::model
