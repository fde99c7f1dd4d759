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
};

inline constexpr int kSlotKindCount = 10;
inline constexpr const char* kSlotKindNames[kSlotKindCount] = {
    "forward", "backward", "wan_send", "wan_recv", "local_send", "local_recv",
    "all_reduce", "optimizer", "prefill", "idle"};

constexpr const char* to_string(SlotKind k) { return kSlotKindNames[static_cast<int>(k)]; }
constexpr bool is_compute(SlotKind k) { return k == SlotKind::Forward || k == SlotKind::Backward; }
constexpr bool is_send(SlotKind k) { return k == SlotKind::WanSend || k == SlotKind::LocalSend; }
constexpr bool is_recv(SlotKind k) { return k == SlotKind::WanRecv || k == SlotKind::LocalRecv; }

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

  [[nodiscard]] double end_ms() const { return start_ms + duration_ms; }
};

}  // namespace atlas::sched
