// SPDX-License-Identifier: MIT
// BubbleTea's prefill cost model: the predicted time of one prefill chunk on one rank, measured
// at start-up on this rank's backend (or estimated from FLOPs for `atlas schedule`), corrected
// online by the chunks actually run; and the prediction of Prefill slots for a schedule table.
#pragma once

#include "atlas/bubbletea/model.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::bubbletea {

/// Predicted milliseconds of a chunk of `n` tokens at positions [pos, pos + n) on one rank:
///   t = (fixed_ms + per_token_ms * n + per_pair_ms * n * (pos + n)) * scale
/// (the last term is attention over the cache). `scale` starts at the calibration's worst
/// measured/fitted ratio (>= 1) and then follows the chunks actually run (observe()).
struct PrefillCost {
  static constexpr int kWindow = 32;  ///< recent chunks the scale is taken over
  static constexpr double kQuantile = 0.9;
  /// Bubbles in a row where work waited but no chunk fit the prediction before the scale steps
  /// back (nothing_fit()).
  static constexpr int kStarvedBubbles = 16;

  double fixed_ms = 0.0;
  double per_token_ms = 0.0;
  double per_pair_ms = 0.0;
  double scale = 1.0;
  /// `scale` as calibrated, before any observe(): what device.backend = emulated sleeps for a
  /// chunk (emulated_ms). The emulated duration must not follow the online scale: the sleep's
  /// own overshoot would raise the scale, which lengthens the next sleep, and so on (the scale
  /// ran away to the clamp and prefill to 1.5k tokens/s in the 2-DC ablation, docs/emulated.md).
  double calibrated_scale = 1.0;

  [[nodiscard]] double raw_ms(int n, int pos) const {
    return fixed_ms + per_token_ms * n + per_pair_ms * static_cast<double>(n) * (pos + n);
  }
  [[nodiscard]] double predict_ms(int n, int pos) const { return raw_ms(n, pos) * scale; }
  /// The emulated compute time of a chunk (device.backend = emulated): fixed by the calibration.
  [[nodiscard]] double emulated_ms(int n, int pos) const { return raw_ms(n, pos) * calibrated_scale; }
  /// Online correction after a chunk took `actual_ms`: once 8 chunks were seen, `scale` is the
  /// 90th percentile of actual / raw over the last kWindow chunks, never the largest one (with
  /// fewer than 20 chunks the 90th percentile would be it), so a chunk slowed once (the OS, a
  /// noisy neighbour) does not stop prefill, and a machine that got slower is followed.
  void observe(int n, int pos, double actual_ms);
  /// A bubble where work waited but no chunk fit the prediction. After kStarvedBubbles of them
  /// in a row the scale steps 20% back toward the calibration's (never below), and the window
  /// forgets ratios above it: a burst of slow chunks that priced every chunk out of every bubble
  /// would otherwise stop prefill for the rest of the run (nothing runs, so nothing corrects the
  /// scale). A chunk that runs resets the count.
  void nothing_fit();

 private:
  double m_ratios[kWindow] = {};
  int m_seen = 0;
  int m_starved = 0;
};

/// Measures `model` (this rank's layers, on its backend): the median of `repeats` timed forward
/// calls for a few chunk sizes up to model.max_chunk() at positions 0 and context / 2, then a
/// least-squares fit with non-negative coefficients. Takes well under a second for the example
/// decks. Not collective.
[[nodiscard]] PrefillCost calibrate(InferenceModel& model, int repeats = 3);

/// A FLOP estimate of the same cost for `layers` blocks (plus the LM head when `head`), at the
/// rate the training cost model assumes (schedule.fwd_ms_per_layer when set, else
/// schedule.device_tflops / plan.gpu). For `atlas schedule`, which measures nothing.
[[nodiscard]] PrefillCost estimate_cost(const Config& cfg, int layers, bool head);

/// device.backend = emulated: a DC's decode worker as a clock, not a process. One server decodes
/// the DC's requests one after another in the order their first tokens came; each new token
/// after the first takes `whole_model`'s time for one token at its position (the FLOP estimate
/// of every block and the head, estimate_cost). Nothing runs and nothing sleeps: the request's
/// decode wait and time are what the worker would report.
class EmulatedDecoder {
 public:
  struct Timing {
    double wait_s = 0.0;    ///< from the first token until the server took the request
    double decode_s = 0.0;  ///< its max_new_tokens - 1 decode steps
  };
  EmulatedDecoder() = default;
  explicit EmulatedDecoder(const PrefillCost& whole_model) : m_cost(whole_model) {}
  /// The request whose first token came at `first_token_s` (job clock) with a prompt of
  /// `prompt_tokens`, decoding to `max_new_tokens` in all (the first one included).
  Timing submit(double first_token_s, int prompt_tokens, int max_new_tokens);

 private:
  PrefillCost m_cost;
  double m_free_s = 0.0;  ///< when the server finishes what it has taken
};

/// The tokens of one predicted Prefill slot: bubbletea.chunk_tokens, or the mean generated
/// prompt length when chunking is off.
[[nodiscard]] int planned_chunk_tokens(const BubbleTeaCfg& cfg);

/// The Prefill slots BubbleTea is predicted to place in `layout`'s schedule table: per row, the
/// FLOP-estimated time of one chunk on the rank of that row holding the most inference blocks;
/// demand limited to the generator's rate (prompt tokens per step per DC pipeline).
[[nodiscard]] sched::PrefillPlan prefill_plan(const Config& cfg, const topo::Layout& layout,
                                              const sched::ScheduleTable& table);

/// Predicted prompt tokens per second a table with Prefill slots (place_prefill) serves: per
/// inference pipeline (bubbletea.pipeline, `mode`), the fewest prefill tokens any of its rows gets
/// per step (every rank of a pipeline sees every token of its pipeline), summed over the
/// pipelines, over the step time.
[[nodiscard]] double predicted_prefill_tokens_per_s(InferPipeline mode, const sched::ScheduleTable& table,
                                                    const topo::Layout& layout);

/// The request stream served by a table's Prefill slots over `steps` back-to-back steps: the
/// deck's requests (load_requests: trace or generator) go FIFO to their pipeline (dealt as the
/// runtime deals them, serving_pipelines); each Prefill slot of the pipeline's bottleneck row (the
/// fewest prefill tokens a step) serves one chunk of the request at the head of the queue if it
/// had arrived by the slot's start; a request's first token is at the end of the slot that runs
/// its last chunk. Ignores the pass through the pipeline's other ranks (exact for one rank per
/// pipeline). Place the slots with unlimited demand for the capacity.
struct ServicePrediction {
  int arrived = 0, served = 0;       ///< requests arrived within the steps / whose prefill ended
  double tokens_per_s = 0.0;         ///< prompt tokens of the served requests over the steps' time
  double ttft_p50_ms = 0.0, ttft_p99_ms = 0.0;
};
[[nodiscard]] ServicePrediction predict_service(const Config& cfg, const topo::Layout& layout,
                                                const sched::ScheduleTable& table, int steps);

}  // namespace atlas::bubbletea
