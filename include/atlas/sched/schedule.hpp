// SPDX-License-Identifier: MIT
// The static schedule table (DESIGN.md §5): for one training step, every (stage, dp) replica's
// ordered slots with predicted start and duration (its TP ranks share the row), and for every
// WAN link (ordered DC pair) the order in which the pipelines' transfers use it. Built for gpipe,
// 1f1b and atlas from a cost model; consumed by the runtime, the simulator, BubbleTea and the
// reports. Does no I/O and no communication. Implemented in program.cpp (the engine programs),
// build.cpp (building, the atlas search, re-timing, queries) and format.cpp (Gantt, JSON).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/engine.hpp"
#include "atlas/sched/slot.hpp"

namespace atlas::sched {

/// One transfer on a WAN link, in the link's order.
struct LinkTransfer {
  int src_stage = 0;
  int dst_stage = 0;
  int dp = 0;
  int micro = 0;
  Flow flow = Flow::Activation;
  std::int64_t bytes = 0;  ///< all TP lanes together
  double post_ms = 0, start_ms = 0, end_ms = 0, arrive_ms = 0;
  int chunk = 0;           ///< the sender's model chunk (interleaved 1F1B; 0 otherwise)
};

/// One direction of a DC pair.
struct WanLink {
  int src_dc = 0;
  int dst_dc = 0;
  LinkMode mode = LinkMode::Shared;  ///< Shared (gpipe, 1f1b) or Ordered (atlas)
  int slots = 1;                     ///< Ordered: transfers allowed at once
  std::vector<LinkTransfer> order;   ///< service order (for Shared: the order they started)
};

/// What the atlas search chose.
struct AtlasChoice {
  double stagger_ms = 0.0;       ///< pipeline d's first stage starts d * stagger_ms later
  TieBreak tie_break = TieBreak::PipelineOrder;
  int slots = 1;
  /// Per stage: the most micro-batches in flight (activations held) the search chose, from
  /// 1F1B's min(pp - stage, m) to GPipe's m, under the device's memory (sched/memory.hpp).
  std::vector<int> depth;
  /// Whether the backward is split (schedule.split_backward: on, or auto where it won) and, per
  /// stage, the most micro-batches held with it (a W frees a micro-batch's activations; >= depth).
  bool split = false;
  std::vector<int> hold;
  int candidates_tried = 0;
  /// Of those, the ones the engine timed (the others were known from a run already made, or lost
  /// on a lower bound: build.cpp), and the engine events of the whole build (the search, the
  /// 1F1B baseline and the final timing): its work, which the scale tests bound.
  int candidates_timed = 0;
  int candidates_earlier = 0;  ///< of those timed, runs an earlier search made (ScheduleOptions::runs)
  std::uint64_t engine_events = 0;
  double baseline_1f1b_ms = 0.0; ///< 1F1B with concurrent sharing, same cost model
};

struct ScheduleTable {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp = 1, dp = 1, tp = 1, micro_batches = 1;
  int virtual_stages = 1;               ///< model chunks per stage (interleaved 1F1B when > 1)
  std::vector<int> stage_dc;
  std::vector<std::vector<Slot>> rows;  ///< [stage * dp + dp_index]
  std::vector<WanLink> links;
  double step_ms = 0.0;                 ///< predicted step time (slowest row's end)
  AtlasChoice atlas;                    ///< only for kind == Atlas

  [[nodiscard]] const std::vector<Slot>& row(int stage, int dp_index) const {
    return rows[static_cast<std::size_t>(stage * dp + dp_index)];
  }
  /// Idle time of a row divided by the step time.
  [[nodiscard]] double bubble_fraction(int stage, int dp_index) const;
  [[nodiscard]] double mean_bubble_fraction() const;
  /// Busy (compute, all-reduce, optimizer, prefill) time of a row.
  [[nodiscard]] double busy_ms(int stage, int dp_index) const;
  /// Index of the link src_dc -> dst_dc, or -1.
  [[nodiscard]] int link_index(int src_dc, int dst_dc) const;
  /// Structure hash (slot kinds, micro ids, peers, link orders; not the times): ranks compare it
  /// before training to prove they walk the same table.
  [[nodiscard]] std::uint64_t structure_hash() const;
};

/// Whether a table's backwards are split (schedule.split_backward: its rows hold BackwardInput and
/// BackwardWeight slots instead of Backward ones).
[[nodiscard]] bool is_split(const ScheduleTable& table);

/// "" when every rank's structure hash (index = world rank) is the same; else one message that
/// lists each distinct hash with the ranks that built it ("ranks 0-3, 6") and the likely causes,
/// for a config error every rank raises alike.
[[nodiscard]] std::string table_mismatch(const std::vector<std::uint64_t>& hash_of_rank);
/// The same for every rank's resolved deck (text_hash of deck::resolved_deck): empty when all
/// agree, else a config error naming the groups of ranks and the fix.
[[nodiscard]] std::string deck_mismatch(const std::vector<std::uint64_t>& hash_of_rank);
/// FNV-1a of `text` (the same on every host).
[[nodiscard]] std::uint64_t text_hash(std::string_view text);

/// Engine runs of atlas searches kept for a later search of the same cost model (opaque).
struct SearchRuns;

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int micro_batches = 1;
  double max_stagger_transfers = 2.0;  ///< atlas: largest stagger tried, in WAN transfer times
  bool full_search = true;             ///< atlas: try every candidate (else one sensible default)
  int fixed_slots = 0;                 ///< atlas: > 0 = only this many transfers per link at once
  /// atlas: time 1F1B too, for AtlasChoice::baseline_1f1b_ms (false: it stays 0, one engine run
  /// saved; the choice and the table are the same either way).
  bool baseline_1f1b = true;
  /// atlas: candidates timed at once, speculatively (build.cpp): 1 = one after another; N > 1 =
  /// N threads; 0 = the process's spare threads (take_search_threads) where one candidate's run is
  /// long. The choice, the counts of candidates tried and timed and the table are the same for
  /// every value; only AtlasChoice::engine_events counts the extra runs.
  int search_threads = 0;
  /// The zero-bubble split of the backward (schedule.split_backward; docs/schedules.md): Off =
  /// the tables as without it; On = every kind's backwards split (one model chunk only, else
  /// ConfigError); Auto = atlas also tries the split and keeps it where the predicted step is
  /// lower at no more memory (gpipe and 1f1b unsplit). Off by default here; decks default to auto.
  SplitBackward split = SplitBackward::Off;
  /// Testing: every engine run without its shortcuts (EngineProgram::reference): the same table.
  bool reference_engine = false;
  /// atlas: the engine runs of earlier searches of the same cost model and micro-batches (the
  /// planner's quick timing of a plan, then its whole search): a search takes those it would make
  /// (a run under a stop bound at or above its own is that run), and adds its own. The choice,
  /// the counts and the table are those without it. Null: none kept.
  std::shared_ptr<SearchRuns> runs;
};

/// A new, empty store of atlas search runs (ScheduleOptions::runs).
std::shared_ptr<SearchRuns> new_search_runs();

/// The process's spare threads for the atlas search (min(hardware threads, 8) - 1 in all): takes
/// up to `most` (returns how many; never waits), and gives them back. Callers that run work on
/// threads of their own (the planner) take them too, so that searches only add threads that idle.
int take_search_threads(int most);
void give_search_threads(int n);

/// Builds the table for a cost model. Throws atlas::Error (Internal) if the program deadlocks,
/// which would be a bug in the program generator. Where one_replica_per_stage(cost), it times one
/// DP replica per stage and copies its rows to the others (the same table, to the bit).
ScheduleTable build_schedule(const CostModel& cost, const ScheduleOptions& opt);
/// Whether build_schedule and retime time one DP replica per stage for all (the fast path at
/// scale): every stage in one DC (no WAN link for replicas to share), no shared hosts
/// (cost.ranks_per_host = 0), dp > 1. Elsewhere every replica is timed.
[[nodiscard]] bool one_replica_per_stage(const CostModel& cost);
/// build_schedule with the path given: one_replica = false times every replica (the full path,
/// which tests compare the fast one with); true needs one_replica_per_stage(cost) (else Internal).
ScheduleTable build_schedule(const CostModel& cost, const ScheduleOptions& opt, bool one_replica);
/// The options a deck gives a table of kind `kind` (micro-batches, the atlas stagger cap, fixed
/// slots): what training, atlas schedule, atlas simulate and the tests build with.
[[nodiscard]] ScheduleOptions schedule_options(const Config& cfg, ScheduleKind kind);

/// The deck's table, the one `atlas train` runs: build_schedule(cost_model(cfg, layout),
/// schedule_options(cfg, schedule.kind)), on the deck's device profile (cfg.device_profiles must
/// have been read: deck::load does it). `atlas schedule`, `atlas simulate` (deck mode), the
/// benches and the tests build the same table with it.
ScheduleTable build_schedule(const Config& cfg, const topo::Layout& layout);

/// Re-times an existing table under another cost model (the simulator's): the same programs as
/// build_schedule (each stage's compute order; for atlas the table's WAN link orders frozen and
/// the same stagger), timed by the engine. The table's shape (pp, dp, stage_dc) must match the
/// cost model's, else atlas::Error (Internal). The result has the table's structure_hash().
ScheduleTable retime(const ScheduleTable& table, const CostModel& cost);
/// retime with the path given (as build_schedule's one_replica).
ScheduleTable retime(const ScheduleTable& table, const CostModel& cost, bool one_replica);

/// The compute order (Forward/Backward, micro) of one stage: the schedule's core rule.
std::vector<std::pair<SlotKind, int>> compute_order(ScheduleKind kind, int stage, int pp, int micro_batches);

/// One compute slot of a stage with model chunks: Forward/Backward of `micro` through `chunk`.
struct ChunkStep {
  SlotKind kind = SlotKind::Forward;
  int micro = 0;
  int chunk = 0;
};

/// The compute order of one stage running `virtual_stages` model chunks (src/sched/interleaved.cpp).
/// virtual_stages == 1: compute_order above, chunk 0. Else Megatron-LM's interleaved 1F1B
/// (Narayanan et al. SC'21 §2.2.2): forwards k = 0 .. v*m-1 visit chunk (k mod p*v) / p with
/// micro-batch (k / p*v) * p + k mod p, backwards the chunks in reverse; (p - stage - 1) * 2 +
/// (v - 1) * p warm-up forwards (all of them when m == p), then one forward and one backward
/// alternately, then the cool-down backwards. Per chunk, forwards and backwards run in micro-batch
/// order, so every parameter accumulates its gradient in the same order as with one chunk.
/// Needs kind != GPipe and micro_batches a multiple of pp when virtual_stages > 1 (Internal
/// error otherwise; the deck's validation names the keys).
std::vector<ChunkStep> compute_order(ScheduleKind kind, int stage, int pp, int micro_batches, int virtual_stages);

/// The virtual boundary (0 <= b < virtual_stages * pp - 1, between virtual stages b and b + 1) a
/// send or receive slot of `stage` crosses: activations go up from the sender, gradients down.
[[nodiscard]] int virtual_boundary(const Slot& slot, int stage, int pp);
/// The same for a link transfer (its chunk is the sender's).
[[nodiscard]] int virtual_boundary(const LinkTransfer& x, int pp);

/// BubbleTea's predicted use of the bubbles (input of place_prefill).
struct PrefillPlan {
  std::vector<double> chunk_ms;  ///< per row [stage * dp + dp_index]: predicted ms of one chunk
  int chunk_tokens = 0;          ///< prompt tokens per Prefill slot
  double guard_ms = 0.0;         ///< kept free before each bubble's end
  double max_tokens_per_row = 1e300;  ///< demand: prompt tokens a row can be given per step
};

/// A copy of `table` in which every Idle slot starts with as many back-to-back Prefill slots
/// (plan.chunk_tokens tokens, plan.chunk_ms[row] long, numbered by `request` in row order) as
/// fit before the slot's end minus plan.guard_ms, within the row's demand; the rest of the
/// bubble stays Idle. Training slots, links and step_ms are unchanged (training comes first).
ScheduleTable place_prefill(const ScheduleTable& table, const PrefillPlan& plan);

/// Machine-readable dump of the whole table.
std::string to_json(const ScheduleTable& table, const std::vector<std::string>& dc_names);

/// Text Gantt chart: one row per (stage, dp) replica and one per WAN link, time across.
std::string gantt(const ScheduleTable& table, const std::vector<std::string>& dc_names, int width = 100);

/// One line per row: busy, idle and bubble fraction; then the step time.
std::string summary(const ScheduleTable& table, const std::vector<std::string>& dc_names);

}  // namespace atlas::sched
