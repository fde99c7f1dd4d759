// SPDX-License-Identifier: MIT
// What BubbleTea measured in one run: per request (arrival, prefill start, first token, decoded
// tokens), per rank (training busy, prefill busy, wall, bubbles offered and used, overruns), and
// the summary figures (utilization, prefill tokens/s, time to first token, queue length), as text
// for the end of `atlas train` and as runs/NAME/bubbletea.json. Plain data; no MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atlas::bubbletea {

/// One request as seen by the whole DC pipeline and its decode worker. Times are seconds on the
/// job clock (the train loop's start = 0); -1 when it did not happen.
struct RequestRecord {
  int id = 0;
  int dc = 0;
  int prompt_tokens = 0;
  int max_new_tokens = 0;
  double arrival_s = 0.0;
  double start_s = -1.0;        ///< its first chunk started on the DC's first inference rank
  double first_token_s = -1.0;  ///< its last chunk finished on the head rank (first token known)
  int chunks = 0;
  double decode_wait_s = 0.0;   ///< worker: KV complete -> decode start
  double decode_s = 0.0;        ///< worker: decode compute
  std::vector<std::int32_t> tokens;  ///< generated ids (first token first); empty if not decoded

  [[nodiscard]] bool prefilled() const { return first_token_s >= 0; }
  [[nodiscard]] bool started() const { return start_s >= 0; }
  [[nodiscard]] double ttft_s() const { return first_token_s - arrival_s; }
};

/// One rank's account.
struct RankStats {
  int world_rank = 0;
  int dc = 0;
  int dc_rank = 0;        ///< position in the DC's inference pipeline
  int first_layer = 0;
  int layers = 0;
  int steps = 0;
  double wall_s = 0.0;            ///< sum of training step times
  double compute_s = 0.0;         ///< training forward + backward + optimizer
  double comm_s = 0.0;            ///< training waits on intra-DC and WAN boundaries, all-reduce
  double idle_s = 0.0;            ///< bubbles left empty
  double prefill_s = 0.0;         ///< prefill work in bubbles (chunks + KV handoff)
  double offered_s = 0.0;         ///< sum of the table's bubble budgets the runtime offered (bubbles only)
  /// Sum of what those bubbles were allowed to fill: a learned allowance (<= the table's), or for
  /// a watched bubble up to a quantile of its real lengths (<= max_stretch x the table's).
  double allowed_s = 0.0;
  double overrun_s = 0.0;         ///< time past a bubble's budget (0 = never delayed training)
  std::int64_t overruns = 0;      ///< chunks that ended past their bubble's budget
  std::int64_t fill_calls = 0;
  /// Waits outside the table's bubbles that were filled: receives (fill_recv_waits) and WAN waits
  /// inside training slots (fill_wan_waits); not part of offered_s / allowed_s.
  std::int64_t unplanned_fills = 0;
  double unplanned_budget_s = 0.0;   ///< their learned budgets, summed
  double unplanned_prefill_s = 0.0;  ///< prefill work inside them (part of prefill_s)
  double starved_s = 0.0;            ///< watched bubbles' time waiting for a chunk to run (nothing ready)
  std::int64_t chunks = 0;
  std::int64_t pauses = 0;        ///< chunks stopped between blocks because training's data came
  std::int64_t tokens = 0;        ///< prompt tokens through this rank's layers
  std::uint64_t weight_bytes = 0;
  std::uint64_t peak_bytes = 0;   ///< most BubbleTea memory held at once (weights + scratch + KV + buffers)
  double cost_per_token_ms = 0.0; ///< calibrated cost model (final scale applied)
  double cost_fixed_ms = 0.0;
  double cost_scale = 1.0;
  double queue_mean = 0.0;        ///< dispatcher only: mean queue length at the bubbles
  int queue_max = 0;
  int queue_final = 0;

  [[nodiscard]] double utilization() const { return wall_s > 0 ? (compute_s + prefill_s) / wall_s : 0.0; }
  [[nodiscard]] double training_utilization() const { return wall_s > 0 ? compute_s / wall_s : 0.0; }
};

struct Report {
  std::vector<RankStats> ranks;          ///< in world-rank order
  std::vector<RequestRecord> requests;   ///< in id order
  double wall_s = 0.0;                   ///< training wall time: sum of step times (slowest rank)
  double end_s = 0.0;                    ///< job clock when BubbleTea stopped (evaluations included)
  int steps = 0;
  double mean_step_s = 0.0;              ///< mean training step time (slowest rank per step)

  [[nodiscard]] int served() const;      ///< prefilled (first token known)
  [[nodiscard]] int decoded() const;     ///< tokens came back from the decode worker
  [[nodiscard]] int arrived() const;     ///< arrived by end_s
  [[nodiscard]] int queued() const;      ///< arrived by end_s, never started
  [[nodiscard]] int in_progress() const; ///< started, not prefilled
  [[nodiscard]] double utilization() const;           ///< sum (compute + prefill) / sum wall
  [[nodiscard]] double training_utilization() const;  ///< sum compute / sum wall
  [[nodiscard]] std::int64_t prefill_tokens() const;  ///< prompt tokens of the prefilled requests
  [[nodiscard]] double prefill_tokens_per_s() const;  ///< prefill_tokens / wall_s
  /// Quantile q in [0, 1] of the prefilled requests' time to first token (s); NaN if none.
  [[nodiscard]] double ttft_quantile(double q) const;
};

/// Lines for the end of `atlas train` (each starts with "# " or two spaces).
[[nodiscard]] std::string format_report(const Report& r, const std::vector<std::string>& dc_names);
/// The whole report as one JSON object (runs/NAME/bubbletea.json).
[[nodiscard]] std::string to_json(const Report& r);
/// Writes to_json(r) to `path` whole (a temporary file renamed into place). Throws atlas::Error
/// (Io) when it cannot.
void write_json(const Report& r, const std::string& path);

}  // namespace atlas::bubbletea
