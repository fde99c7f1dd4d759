// SPDX-License-Identifier: MIT
// A discrete-event engine that times a pipeline program: workers run ordered op lists (compute,
// post a send, wait for a receive, join a sync group), messages cross intra-DC channels (fixed
// cost) or WAN links (fluids: window-sized transfers as bursts served in post order, larger ones
// or unknown windows shared fairly, each capped per flow, one peer pair's transfers in turn; or a
// static service order: docs/schedules.md).
// The schedule table and the simulator both time programs with it; neither duplicates it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "atlas/sched/slot.hpp"

namespace atlas::sched {

enum class LinkMode : std::uint8_t {
  Shared,      ///< every posted transfer is admitted at once; a peer pair's go on the wire in turn
               ///< (EngineChannel::per_pair); bursts are served in start order, other flows
               ///< share the link fairly, each capped
  Ordered,     ///< transfers start in `order`, at most `slots` at once (ATLAS temporal sharing)
  OrderedFifo, ///< like Ordered, but the order is decided on the fly: earliest-posted first,
               ///< ties by `tie_break`; the decided order is written to `served`
};

/// How OrderedFifo breaks ties between transfers posted at the same instant.
enum class TieBreak : std::uint8_t { PipelineOrder, GradientsFirst, ActivationsFirst };

struct EngineOp {
  enum class Type : std::uint8_t { Compute, Send, Recv, Sync };
  Type type = Type::Compute;
  SlotKind kind = SlotKind::Forward;  ///< slot kind recorded for this op
  int micro = -1;
  double duration_ms = 0.0;  ///< Compute, and Sync once every member arrived
  int message = -1;          ///< Send/Recv
  int sync_group = -1;       ///< Sync
  int chunk = 0;             ///< the model chunk the op belongs to (interleaved 1F1B; recorded)
  /// Compute only: deferrable work (the zero-bubble W, SlotKind::BackwardWeight). It stands at its
  /// latest position in the list (a deadline) and becomes pending once op `after` of the same
  /// worker has run. A worker whose next op is a receive whose message has not arrived runs its
  /// oldest pending deferred op first. Deferred ops run in list order.
  bool deferred = false;
  int after = -1;
};

struct EngineMessage {
  int channel = -1;         ///< -1 = intra-DC (fixed cost); else index into channels
  std::int64_t bytes = 0;   ///< total bytes (all TP lanes)
  int pipeline = 0;         ///< DP index of the sender (tie-breaking and display)
  int micro = 0;
  Flow flow = Flow::Activation;
  int chunk = 0;            ///< the sender's model chunk (interleaved 1F1B; display and identity)
  // ---- results ----
  double post_ms = -1.0;    ///< sender posted it
  double start_ms = -1.0;   ///< first byte on the link
  double end_ms = -1.0;     ///< last byte left (sender side complete)
  double arrive_ms = -1.0;  ///< last byte at the receiver (end + latency)
};

struct EngineChannel {
  LinkMode mode = LinkMode::Shared;
  double latency_ms = 0.0;
  double capacity_bytes_per_ms = 1.0;
  double flow_cap_bytes_per_ms = 1.0;
  int slots = 1;               ///< Ordered/OrderedFifo: concurrent transfers allowed
  /// Ordered/OrderedFifo: how long a finished transfer still holds its slot — the time until its
  /// sender knows it completed (an acknowledgement: one round trip) and hands the link on.
  double handover_ms = 0.0;
  TieBreak tie_break = TieBreak::PipelineOrder;
  /// The transfers of one peer pair (sender worker, receiver worker) are on the wire one after
  /// another, in the order the link admitted them: one TCP connection, or one bundle of rails, of
  /// at most flow_cap_bytes_per_ms per pair.
  bool per_pair = true;
  /// Bytes one peer pair can have on the wire at once (its rails' TCP windows); 0 = not known. When
  /// every transfer of the link fits, a transfer leaves in one burst at the link's rate (in its
  /// turn), and a pair's next transfer may start once the bytes it started before are
  /// acknowledged at flow_cap_bytes_per_ms (windows per round trip): LinkState::burst.
  double window_bytes = 0.0;
  std::vector<int> order;      ///< Ordered: message ids in service order
  std::vector<int> served;     ///< result: message ids in the order they started
};

struct EngineProgram {
  std::vector<std::vector<EngineOp>> workers;
  std::vector<double> worker_start_ms;     ///< optional start delay per worker (stagger)
  std::vector<EngineMessage> messages;
  std::vector<EngineChannel> channels;
  std::vector<std::vector<int>> sync_groups;  ///< worker ids that must all arrive
  /// Optional, per sync group: an n x n matrix (row-major, [j * n + i], n = the group's size) of
  /// how long after member j reaches the group member i has j's part. With it, member i's op
  /// ends at ready_i + its duration, ready_i = max over j of (reach_j + delay[j][i]): each member
  /// waits only for what it needs. The op starts at max(reach_i, ready_i - the longest delay
  /// into i): the slot holds the collective's own communication, the rest of the wait (for later
  /// members) is a bubble before it. Without it (empty) the group is a barrier: every member
  /// starts when the last arrives.
  std::vector<std::vector<double>> sync_delay_ms;
  /// Optional, per sync group, the same in block form, for a group whose delays depend only on
  /// which block each member is in (group 0's two halves: (2 dp)^2 entries, 20 MB at dp 784,
  /// built and scanned for every program otherwise): member i's block sync_delay_block[g][i] in
  /// [0, k), and sync_delay_ms[g] is then k x k ([bj * k + bi]: how long after a member of block
  /// bj reaches the group one of block bi has its part). Empty: sync_delay_ms[g] is n x n. The
  /// times are those of the n x n matrix it stands for, to the bit.
  std::vector<std::vector<int>> sync_delay_block;
  /// Optional, per sync group: the group whose sync_delay_ms (and sync_delay_block) it uses, for
  /// groups with the same delays (every pipeline's gradient-norm sum: one pp x pp matrix, not dp of
  /// them: 11 GB at pp 4096 x dp 81). Empty, or an entry < 0 or out of range: its own.
  std::vector<int> sync_delay_of;
  double intra_latency_ms = 0.0;
  double intra_bytes_per_ms = 1.0;
  double wake_ms = 0.0;      ///< an intra-DC message's receiver runs this long after the arrival
  double wan_wake_ms = 0.0;  ///< same for a WAN message (more threads must run: CostModel::wake_ms)
  /// On a shared host (worker_host >= 0) wake_ms / wan_wake_ms are the delays while its cores are
  /// all busy (the receiver waits for a time slice); with a core free the receiver runs after
  /// this instead (its poll's sleep), per thread that must run.
  double idle_wake_ms = 0.0;
  /// Shared hosts (CPU backend, several ranks per machine): compute ops of workers on one host
  /// share its cores as a fluid (max-min fair; one op runs at most `worker_cores` cores, its
  /// dedicated speed). Empty = every worker has its own device (GPUs).
  std::vector<double> host_cores;   ///< cores per host
  std::vector<int> worker_host;     ///< host of each worker, -1 = dedicated device
  std::vector<double> worker_cores; ///< cores one compute op of the worker uses at full speed
  /// Host CPU per byte of a WAN transfer (shared hosts only), half at the sender's host and half at
  /// the receiver's: while a flow runs at r bytes/ms it takes r * net_ns_per_byte / 1e6 cores
  /// from the compute ops there (at most 90% of the host).
  double net_ns_per_byte = 0.0;
  /// A bound for searches: once the clock passes it with a worker still unfinished (so the
  /// makespan will exceed it), the run stops with `stopped` set and partial times. It also stops
  /// earlier, once the WAN links show the makespan will exceed it: at an instant t, a link's
  /// bytes not yet on the wire need at least bytes / capacity after t, then its latency
  /// (checked before the first event of an instant, every kBoundCheckEvents events at most:
  /// EngineResult::bound_records).
  double stop_after_ms = std::numeric_limits<double>::infinity();
  /// Testing: time without the engine's shortcuts (at each WAN completion every active flow is
  /// looked at, not only those that can finish). The results are the same to the bit.
  bool reference = false;
};

/// Per op: when the worker reached it, when it started (after waiting), when it ended.
struct OpTime {
  double reach_ms = 0.0;
  double start_ms = 0.0;
  double end_ms = 0.0;
  /// A deferred op (EngineOp::deferred) that ran early: the index of the op it ran before (the
  /// worker's executed order puts it there); -1 = it ran at its place in the list.
  int ran_before = -1;
};

/// Events between two checks of the links' bound (EngineProgram::stop_after_ms).
inline constexpr std::uint64_t kBoundCheckEvents = 4096;

struct EngineResult {
  std::vector<std::vector<OpTime>> ops;  ///< [worker][op]
  double makespan_ms = 0.0;
  bool deadlock = false;
  bool stopped = false;                  ///< stopped past EngineProgram::stop_after_ms (makespan > it)
  /// Whether an OrderedFifo link ever chose among transfers posted at the same instant with both
  /// flows (activation and gradient) among them: only then can the tie-break rule change the run.
  /// False: every TieBreak gives this very run (the atlas search times one of them).
  bool tie_break_used = false;
  /// The clock at the first such choice (infinity: none). A run stopped at a lower bound S would
  /// have used a tie-break iff this is <= S: the atlas search's speculative runs (build.cpp).
  double tie_break_first_ms = std::numeric_limits<double>::infinity();
  /// The clock at which every worker had passed its last op (its last compute may still run):
  /// a run with stop_after_ms = S stops iff it meets an event past S while this is > S.
  double pcs_done_ms = std::numeric_limits<double>::infinity();
  /// With a finite stop_after_ms: (bound, t) each time the links' lower bound on the makespan,
  /// checked at the instant t before any of its events ran, rose above every earlier check's.
  /// A run with a lower stop bound S is this run up to the first record whose bound exceeds S,
  /// and stops there, at that t (the atlas search's speculative runs, build.cpp).
  std::vector<std::pair<double, double>> bound_records;
  std::uint64_t events = 0;              ///< events the run processed or queued (its work)
  std::string deadlock_reason;           ///< which workers wait on what
};

/// Times `program` (fills message results and channel `served`). Never hangs: a program that
/// cannot finish returns deadlock = true with a reason.
EngineResult run_engine(EngineProgram& program);

}  // namespace atlas::sched
