// SPDX-License-Identifier: MIT
// Records every slot a rank runs (kind, micro-batch, start, end, bytes, peer) into a
// preallocated buffer: two clock reads and one store per slot, no allocation, no I/O in the
// loop. Gathered to world rank 0 at the end (and at checkpoints) for profile.h5 and trace.json.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "atlas/mpi/comm.hpp"
#include "atlas/sched/slot.hpp"

namespace atlas::runtime {

/// One executed slot. Plain data (gathered as bytes).
struct SlotEvent {
  std::int32_t world_rank = 0;
  std::int32_t step = 0;
  std::int32_t slot_index = 0;   ///< position in the rank's table row
  std::int32_t kind = 0;         ///< sched::SlotKind
  std::int32_t micro = -1;
  std::int32_t peer = -1;        ///< world rank at the other end (send/recv)
  std::int32_t link = -1;        ///< WAN link index in the table
  std::int32_t request = -1;     ///< prefill request id
  std::int64_t bytes = 0;
  double start_s = 0.0;          ///< seconds since the job's common t0
  double end_s = 0.0;
  double complete_s = 0.0;       ///< sends: when the transfer completed (after end_s)
  double predicted_start_ms = 0.0;  ///< from the schedule table (step-relative)
  double predicted_ms = 0.0;
  /// Of the slot's time (less the prefill inside it), what the run counted as a wait on the WAN /
  /// inside a DC (its footer's and metrics.csv's split): all of a receive's, the gradient-norm sum
  /// inside an optimizer slot, the tied-embedding exchange and the DP sum of an all-reduce, the
  /// sums an idle slot waited on. The rest is the slot kind's category. 0 where not recorded (a
  /// simulated profile: the kind's category alone).
  double wan_wait_s = 0.0;
  double intra_wait_s = 0.0;
};

class Profiler {
 public:
  /// `enabled` = profile.enabled; a disabled profiler records nothing and costs one branch.
  Profiler(bool enabled, int world_rank, std::size_t reserve_events);

  /// Collective over `world`: a barrier, then every rank takes now() as t0; when every rank runs
  /// on one kernel (same /proc/sys/kernel/random/boot_id: one machine, also across the emulated
  /// WAN's namespaces) they all take rank 0's, so their clocks agree exactly. Across hosts the
  /// ranks are aligned to within the barrier's skew.
  void sync_epoch(const mpi::Comm& world);

  /// The steady-clock instant now() counts from.
  [[nodiscard]] std::chrono::steady_clock::time_point epoch() const noexcept { return m_t0; }
  [[nodiscard]] double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_t0).count();
  }
  [[nodiscard]] bool enabled() const noexcept { return m_enabled; }

  /// Appends one event (no-op when disabled).
  void record(const SlotEvent& e) {
    if (m_enabled) m_events.push_back(e);
  }
  [[nodiscard]] const std::vector<SlotEvent>& events() const noexcept { return m_events; }
  void clear() { m_events.clear(); }

  /// Collective over `world`: every rank's events, concatenated in rank order, on `root`
  /// (empty elsewhere).
  [[nodiscard]] std::vector<SlotEvent> gather(const mpi::Comm& world, int root) const;

 private:
  bool m_enabled;
  int m_world_rank;
  std::chrono::steady_clock::time_point m_t0;
  std::vector<SlotEvent> m_events;
};

/// Our half of a tied-embedding exchange across the WAN (Boundary records one a step: kind
/// WanSend, slot_index -1, since no slot of the table holds it; profile.h5 has them in /exchanges).
[[nodiscard]] inline bool is_exchange_event(const SlotEvent& e) {
  return e.slot_index < 0 && e.step >= 0 && static_cast<sched::SlotKind>(e.kind) == sched::SlotKind::WanSend;
}

/// Names for the tracks of a trace: one per rank and one per WAN link.
struct TraceLabels {
  std::vector<std::string> dc_names;
  std::vector<std::string> rank_names;  ///< "rank 3: east s1 d0 t0"
  std::vector<int> rank_dc;
  std::vector<std::string> link_names;  ///< "WAN east>west"
  std::vector<int> link_src_dc, link_dst_dc;  ///< per link (the table's); empty: exchanges get no link track
};

/// Chrome trace event format (opens in Perfetto / chrome://tracing): one process per DC with a
/// thread per rank, plus one process "WAN links" with a thread per link whose events are the
/// WanSend transfers (post to completion) and the tied-embedding exchanges (a track of their own
/// for a DC pair the table has no link for).
std::string chrome_trace_json(const std::vector<SlotEvent>& events, const TraceLabels& labels);

}  // namespace atlas::runtime
