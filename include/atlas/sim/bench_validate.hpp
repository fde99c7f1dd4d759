// SPDX-License-Identifier: MIT
// `atlas bench validate`: the simulator's step time of published training runs (one deck per run
// under inputs/validate/, listed with the published iteration time in inputs/validate/runs.txt)
// against the published figure, per row, with the mean and max error of each group. Not a fit:
// every row of a device shares its profile (peak, HBM bandwidth, GEMM efficiency curve, NVLink).
// One process, no MPI.
#pragma once

#include <string>
#include <vector>

#include "atlas/bench/harness.hpp"

namespace atlas::sim {

/// One published run: its deck, the published iteration time and the prediction.
struct ValidationRow {
  std::string group;       ///< "published" (the issue's rows) or "other" (further checks)
  std::string deck;        ///< deck path
  std::string source;      ///< where the published figure is from
  double published_s = 0.0;
  double predicted_s = 0.0;
  double bubble = 0.0;     ///< predicted idle fraction of the step
  int gpus = 0;
  double memory_bytes = 0.0;  ///< the memory model's peak per GPU (sched::memory_per_gpu)
  double limit_bytes = 0.0;   ///< the device profile's usable memory (0: not known)
  bool memory_fits = true;    ///< sched::ScheduleMemory::fits (true where the limit is not known)
  [[nodiscard]] bool fits() const { return memory_fits; }
  [[nodiscard]] double error() const { return predicted_s / published_s - 1.0; }
};

/// Mean and max |error| of a group's rows.
struct ValidationSummary {
  int rows = 0;
  double mean_abs_error = 0.0;
  double max_abs_error = 0.0;
};

/// Reads `runs_file` (lines `group deck t_iter_s "source"`, '#' comments; decks relative to the
/// file) and simulates each deck with `overrides` applied. ConfigError naming file:line for a bad
/// line, and the deck's own errors.
std::vector<ValidationRow> validate_runs(const std::string& runs_file, const std::vector<std::string>& overrides = {});

/// The summary of the rows of `group`.
ValidationSummary summarize(const std::vector<ValidationRow>& rows, const std::string& group);

/// `atlas bench validate`'s options: --runs FILE (default inputs/validate/runs.txt).
[[nodiscard]] const atlas::bench::Spec& validate_bench_spec();

/// Prints the table and a footer per group; returns 0 (a benchmark reports, the ctest asserts).
int run_validate_bench(const atlas::bench::Args& args);

}  // namespace atlas::sim
