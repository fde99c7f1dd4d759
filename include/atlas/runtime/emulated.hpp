// SPDX-License-Identifier: MIT
// Emulated compute (device.backend = emulated): the sizes one rank's messages would have in the
// real job and the wait that stands for a compute operation. No arithmetic and no parameter
// tensors: the Trainer walks its table row as always, and where it would call the model it
// sleeps to a deadline (the slot's predicted duration) instead, so dozens of ranks share a core.
#pragma once

#include <cstddef>

#include "atlas/deck/config.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::runtime {

/// Sleeps until CLOCK_MONOTONIC reaches `deadline_s` (clock_nanosleep TIMER_ABSTIME; never spins;
/// restarts after a signal). Returns at once when the deadline has passed.
void sleep_until_monotonic(double deadline_s);
/// CLOCK_MONOTONIC now, in seconds.
[[nodiscard]] double monotonic_s();
/// Takes `seconds` of emulated compute from now: sleep_until_monotonic(monotonic_s() + seconds).
void emulate_compute(double seconds);

/// What one rank of an emulated run moves and waits for, from the deck and its table (the cost
/// model's sizes, so a run with a GPU's device profile sends that GPU job's bytes).
struct EmulatedStage {
  std::size_t boundary_bytes = 0;   ///< one boundary tensor (the table's slot bytes)
  std::size_t grad_floats = 0;      ///< this stage's gradient per TP lane (the DP all-reduce's size)
  std::size_t bucket_floats = 0;    ///< one DP bucket (train.dp_bucket_bytes, at most grad_floats)
  std::size_t embed_floats = 0;     ///< the tied embedding's gradient per TP lane (first and last stage, pp > 1)
  double optimizer_s = 0.0;         ///< the optimizer's compute (the cost model's per-stage figure)
};

/// The emulated sizes and times of stage `stage` of the deck's job on `layout`, whose table is `table`.
[[nodiscard]] EmulatedStage emulated_stage(const Config& cfg, const topo::Layout& layout,
                                           const sched::ScheduleTable& table, int stage);

}  // namespace atlas::runtime
