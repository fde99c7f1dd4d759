// SPDX-License-Identifier: MIT
// One training job from a parsed deck: set-up, pre-flight, train loop, teardown. `atlas train`
// runs one; the side-by-side benchmarks (`atlas bench step|schedules|profile`) run several in one
// MPI job so their figures share the same machine state.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/runtime/trainer.hpp"

namespace atlas::app {

struct JobOptions {
  std::string deck_path = "(deck)";  ///< for the header
  bool quiet = false;                ///< no progress rows (files are still written)
  /// `atlas train`: the job answers SIGUSR1 with a checkpoint and a stop (core/signals.hpp holds
  /// the handler for the command), so the checkpoint directory is locked even when the deck
  /// writes no checkpoints.
  bool stop_on_request = false;
};

struct JobResult {
  std::vector<double> losses;       ///< per step run (valid on world rank 0)
  double final_val_loss = 0.0;      ///< rank 0
  double mean_step_s = 0.0;         ///< rank 0, excluding the first (warm-up) step when possible
  double predicted_step_ms = 0.0;   ///< the table's
  double predicted_bubble = 0.0;    ///< the table's mean bubble fraction
  double measured_bubble = 0.0;     ///< 1 - mean over ranks of (compute + prefill) / wall
  double measured_utilization = 0.0;
  double measured_prefill = 0.0;    ///< mean over ranks of BubbleTea's prefill / wall (in measured_utilization)
  double tokens_per_s = 0.0;
  double mean_allreduce_s = 0.0;    ///< AllReduce slot per timed step, mean over ranks (DP sums not hidden)
  double mean_compute_s = 0.0;      ///< forward + backward + optimizer per timed step, mean over ranks
  double dp_buckets_early = 0.0;    ///< fraction of DP buckets started during the last backward
  std::int64_t prefill_tokens = 0;  ///< whole job
  int steps_run = 0;
  int timed_steps = 0;              ///< the steps mean_step_s averages (all but the first, or the only one)
  int stopped_at_step = -1;         ///< the steps done when a stop request (SIGUSR1) ended the run; -1: it ran to the end
  /// World rank 0: every rank's executed slots (profile.enabled), as in profile.h5.
  std::vector<runtime::SlotEvent> events;
};

/// Collective over `world`: runs the job `cfg` describes (cfg must be validated for world.size()),
/// with BubbleTea serving prefills in the bubbles when bubbletea.enabled.
JobResult run_training_job(const Config& cfg, const mpi::Comm& world, const JobOptions& opt);

}  // namespace atlas::app
