// SPDX-License-Identifier: MIT
// One entry of a rank's row in the static schedule table (DESIGN.md §5). Pure data.
#pragma once

#include <cstdint>

namespace atlas::sched {

/// What a rank does in one slot. Adding a kind: add it here, to kSlotKindNames, and to the
/// runtime's dispatch switch.
enum class SlotKind : std::uint8_t {
  Forward,    ///< forward pass of one micro-batch through this stage
  Backward,   ///< backward pass of one micro-batch
  WanSend,    ///< post the boundary tensor to the next/previous stage in another DC
  WanRecv,    ///< the boundary tensor from another DC is consumed here (waits end before it)
  LocalSend,  ///< post the boundary tensor to a stage in the same DC
  LocalRecv,  ///< consume the boundary tensor from a stage in the same DC
  AllReduce,  ///< DP gradient all-reduce over dp_comm (never crosses a DC)
  Optimizer,  ///< gradient clipping + AdamW step
  Prefill,    ///< BubbleTea: an inference prefill (chunk) placed in a bubble
  Idle,       ///< predicted wait: a bubble
  /// Zero-bubble split of a backward (schedule.split_backward): the activation-gradient half (B),
  /// which gives the previous stage its gradient; its weight-gradient half runs later in a
  /// BackwardWeight slot (W) of the same micro-batch and chunk. Appended after Idle so that the
  /// kind numbers stored in profiles stay.
  BackwardInput,
  BackwardWeight,  ///< the weight-gradient half (W) of a split backward: fills waits
};

inline constexpr int kSlotKindCount = 12;
inline constexpr const char* kSlotKindNames[kSlotKindCount] = {
    "forward", "backward", "wan_send", "wan_recv", "local_send", "local_recv",
    "all_reduce", "optimizer", "prefill", "idle", "backward_input", "backward_weight"};

constexpr const char* to_string(SlotKind k) { return kSlotKindNames[static_cast<int>(k)]; }
/// A backward or either half of a split one.
constexpr bool is_backward(SlotKind k) {
  return k == SlotKind::Backward || k == SlotKind::BackwardInput || k == SlotKind::BackwardWeight;
}
constexpr bool is_compute(SlotKind k) { return k == SlotKind::Forward || is_backward(k); }
constexpr bool is_send(SlotKind k) { return k == SlotKind::WanSend || k == SlotKind::LocalSend; }
constexpr bool is_recv(SlotKind k) { return k == SlotKind::WanRecv || k == SlotKind::LocalRecv; }
/// A bubble: idle time in the table (Prefill: a bubble with BubbleTea's chunks placed in it).
constexpr bool is_bubble(SlotKind k) { return k == SlotKind::Idle || k == SlotKind::Prefill; }

/// What the runtime does at a slot beyond its kind, set by sched when the table is built
/// (mark_slots below, src/sched/slot_marks.cpp). Bit flags of Slot::marks; not part of
/// the table's structure hash, to_json or the Gantt chart (they follow from the kinds, the
/// schedule kind and the stages' DCs).
enum class SlotMark : std::uint8_t {
  /// Idle: a deliberate delay (the atlas stagger: pipeline d's first stage starts d x stagger
  /// after the step begins, so the pipelines' first transfers do not collide on the link). The
  /// runtime sleeps out what is left of the slot; every other bubble is a wait the next slot does.
  Stagger = 1U << 0,
  /// A wait BubbleTea may fill: a receive (the data may come after the slot starts), or the WAN
  /// wait inside an AllReduce (the tied-embedding exchange across DCs) or an Optimizer slot (the
  /// gradient-norm sum over a pipeline that spans DCs). The runtime hands it to its BubbleFiller.
  FillableWait = 1U << 1,
  /// Idle right before an AllReduce slot whose tied-embedding exchange crosses DCs: the step's
  /// gradients are final here, and the bubble ends when the partner's half arrives.
  ExchangeBubble = 1U << 2,
};

/// Direction of a boundary tensor: activations flow forward, their gradients backward.
enum class Flow : std::uint8_t { Activation, Gradient };

struct Slot {
  SlotKind kind = SlotKind::Idle;
  int micro = -1;            ///< micro-batch id; -1 for AllReduce/Optimizer/Idle
  double start_ms = 0.0;     ///< predicted start, from the step's start
  double duration_ms = 0.0;  ///< predicted duration (sends/recvs: 0, a marker)
  int peer_stage = -1;       ///< send/recv: the stage at the other end
  Flow flow = Flow::Activation;  ///< send/recv: which tensor
  std::int64_t bytes = 0;    ///< send/recv: bytes per TP lane
  int link = -1;             ///< WanSend/WanRecv: index into ScheduleTable::links
  int link_pos = -1;         ///< WanSend/WanRecv: position in that link's transfer order
  int request = -1;          ///< Prefill: request id
  int tokens = 0;            ///< Prefill: prompt tokens in this slot
  std::uint8_t marks = 0;    ///< SlotMark bits (sched::mark_slots)
  /// Forward/Backward/send/recv: which of this stage's model chunks the slot runs or feeds
  /// (interleaved 1F1B, ScheduleTable::virtual_stages > 1: chunk c of stage s is virtual stage
  /// c * pp + s); always 0 with one chunk per stage.
  int chunk = 0;

  [[nodiscard]] bool has(SlotMark m) const { return (marks & static_cast<std::uint8_t>(m)) != 0; }
  void mark(SlotMark m) { marks = static_cast<std::uint8_t>(marks | static_cast<std::uint8_t>(m)); }

  [[nodiscard]] double end_ms() const { return start_ms + duration_ms; }
};

struct ScheduleTable;

/// Sets every slot's marks (SlotMark) from the table's slot kinds, schedule kind and stage DCs:
///  - Stagger: the Idle slot that opens a first-stage row of an atlas table (its stagger);
///  - FillableWait: every receive; the AllReduce slot of the first and last stage when they sit
///    in different DCs (the tied-embedding exchange crosses the WAN); every Optimizer slot when
///    the pipeline spans DCs (the gradient-norm sum crosses the WAN);
///  - ExchangeBubble: an Idle slot right before such an AllReduce.
/// The table builder calls it once on every table it times (built or re-timed); idempotent.
/// Leaves the structure hash, to_json and the Gantt chart unchanged.
void mark_slots(ScheduleTable& table);

}  // namespace atlas::sched
