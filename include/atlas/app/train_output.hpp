// SPDX-License-Identifier: MIT
// What `atlas train` prints and writes: the #-prefixed header (build info, resolved deck, rank
// map, schedule), one fixed-width row per step, metrics.csv, run.json, the profile and trace,
// checkpoints at the deck's cadence, and the OK/FAILED footer. Rank 0 prints; collective calls
// say so.
#pragma once

#include <fstream>
#include <string>

#include "atlas/deck/config.hpp"
#include "atlas/runtime/profile_writer.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::app {

class TrainOutput {
 public:
  /// Rank 0 creates runs/NAME/ and writes resolved.deck there.
  TrainOutput(const Config& cfg, bool root, bool quiet = false);

  void header(const std::string& deck_path, const topo::Layout& layout);
  void text(const std::string& s);
  void schedule(const sched::ScheduleTable& table);
  /// Collective over comms.world: restores run.resume (if set); returns the first step to run.
  int resume(runtime::Trainer& trainer, const topo::Communicators& comms);
  void columns();
  /// Collective over comms.world on logged steps (job-wide bubble and WAN figures); rank 0
  /// prints one progress row and writes one metrics.csv line (rank 0's timings).
  void step(const runtime::StepReport& rep, double val_loss, std::int64_t tokens_per_step,
            const topo::Communicators& comms);
  /// Collective over comms.world: a checkpoint after `steps_done` steps when the deck asks.
  void maybe_checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done, bool last);
  /// Collective over comms.world: gathers the profile, writes profile.h5 / trace.json / run.json,
  /// prints the per-rank summary and the OK footer.
  void finish(runtime::Trainer& trainer, const topo::Communicators& comms, const topo::Layout& layout,
              const sched::ScheduleTable& table, runtime::Profiler& profiler, wan::PeerTransport& wan);

 private:
  const Config& m_cfg;
  bool m_root;
  bool m_quiet;
  std::string m_dir;
  std::ofstream m_metrics;
  std::ofstream m_log;
  double m_first_loss = 0.0;
  double m_last_loss = 0.0;
  double m_last_val = 0.0;
  double m_sum_step_s = 0.0;
  int m_timed_steps = 0;
  std::int64_t m_prefill_tokens = 0;
  std::vector<runtime::StepRow> m_steps;
  void print(const std::string& s);
  /// Collective over comms.world: gathers every rank's events and writes profile.h5 on rank 0.
  void write_profile(const topo::Communicators& comms, const topo::Layout& layout, const sched::ScheduleTable& table,
                     const std::vector<runtime::SlotEvent>& events);
};

}  // namespace atlas::app
