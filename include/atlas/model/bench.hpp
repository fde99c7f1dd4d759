// SPDX-License-Identifier: MIT
// `atlas bench gemm`: the host backend's GEMM throughput on the GPT model's own shapes, side by
// side with a bare cblas_sgemm call on the same shapes and buffers (goal: ratio >= 0.7).
#pragma once

#include <string>
#include <vector>

namespace atlas::model {

/// Runs the GEMM benchmark and prints one table to stdout. `args` are key=value pairs (a leading
/// "--" is accepted): hidden (768), seq_len (256), batch (4), vocab (256), tp (1: the per-rank
/// shard of column/row-parallel layers), reps (5: timed calls per shape, best is reported),
/// threads (0 = auto, as device.threads). Returns 0 when every run completed and the overall
/// ratio is >= 0.7, 1 on a bad argument (message on stderr), 2 when the ratio goal is missed.
/// One process; not collective.
int run_gemm_bench(const std::vector<std::string>& args);

}  // namespace atlas::model
