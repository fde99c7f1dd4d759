// SPDX-License-Identifier: MIT
// What `atlas train` prints and writes: the #-prefixed header (build info, resolved deck, rank
// map, schedule), one fixed-width row per step, metrics.csv, run.json, the profile and trace,
// checkpoints at the deck's cadence, and the OK/FAILED footer. Rank 0 prints; collective calls
// say so.
#pragma once

#include <array>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "atlas/core/signals.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/runtime/profile_writer.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::app {

/// One rank's time budget over the steps it ran, summed from its StepReports (the classification
/// `atlas bench bubbletea` uses too: the optimizer's wait for the global norm is a wait, not
/// compute; prefill inside a bubble or a wait is BubbleTea's).
struct RankTime {
  double wall = 0, compute = 0, intra = 0, wan = 0, idle = 0, prefill = 0;
  void add(const runtime::StepReport& r);
  /// (compute + prefill) / wall; 0 before any step.
  [[nodiscard]] double utilization() const { return wall > 0 ? (compute + prefill) / wall : 0.0; }
};

/// The per-rank table `atlas train` prints at the end: one row per rank (index = world rank), over
/// `steps` steps (`which`: what the header adds about them, e.g. that the first was left out).
std::string rank_time_table(const std::vector<RankTime>& ranks, const topo::Layout& layout,
                            const std::vector<std::string>& dcs, int steps, const std::string& which = "");

class TrainOutput {
 public:
  /// Rank 0 creates runs/NAME/ and writes resolved.deck there. `sets_aside`: `atlas train` (not a
  /// bench's runs): a new timeline (run.resume = "", or a checkpoint outside ckpt.dir) moves an
  /// earlier run's results in runs/NAME/ aside (core::move_aside). `owns_ckpt_dir`: this job holds
  /// the checkpoint directory's lock (it may write checkpoints); then the earlier run's
  /// checkpoints there are moved aside too (io::set_aside_checkpoints). A job that does not hold
  /// it never touches another job's files there.
  TrainOutput(const Config& cfg, bool root, bool quiet = false, bool sets_aside = false, bool owns_ckpt_dir = false);

  void header(const std::string& deck_path, const topo::Layout& layout);
  void text(const std::string& s);
  void schedule(const sched::ScheduleTable& table);
  /// Collective over comms.world: restores run.resume (if set); returns the first step to run.
  int resume(runtime::Trainer& trainer, const topo::Communicators& comms);
  /// Before columns(): adds an MFU column to the progress line (a GPU run): `flops_per_token` of
  /// the model over `devices` x `peak_flops` (sched/mfu.hpp); `basis` says which peak, printed once.
  void mfu_basis(double flops_per_token, double peak_flops, int devices, const std::string& basis);
  void columns();
  /// True when step `step` (0-based) gets a printed row: every run.log_every_steps steps, the
  /// last step, and every step with a validation loss.
  [[nodiscard]] bool logged(int step, bool evaluated) const;
  /// device.backend = emulated: no loss to print.
  [[nodiscard]] bool emulated() const { return m_cfg.device.backend == Backend::Emulated; }
  /// Rank 0 writes one metrics.csv line (rank 0's timings) and, on logged steps, one progress
  /// row. A row's job-wide figures (bubble, WAN) are a sum over comms.world that this call only
  /// starts: the row is printed once it is in, at the next logged step or flush_row(), so that
  /// logging never makes the job wait for its slowest rank (across DCs: a WAN round trip) each
  /// step. `val_loss` is empty on steps without an evaluation (a NaN one is a diverged model,
  /// printed as nan). Throws atlas::Error (Io) on rank 0 when a line cannot be written.
  void step(const runtime::StepReport& rep, std::optional<double> val_loss, std::int64_t tokens_per_step,
            const topo::Communicators& comms);
  /// True on every rank once a logged step's job-wide sum has come back saying rank 0 had seen a
  /// non-finite loss by then (the sum carries that flag): the lagged divergence check of logged
  /// steps, read right after step() on a logged step, where every rank has the same sum.
  [[nodiscard]] bool lagged_bad_loss() const { return m_lagged_bad_loss; }
  /// Waits for the last logged step's job-wide sum and prints its row (nothing pending: returns
  /// at once). Every rank calls it before anything else is printed (checkpoints, the divergence
  /// check, the footer) so rows keep their order; checkpoint(), text() and finish() call it.
  void flush_row();
  /// Rank 0: writes run.json with status "diverged" and the reason (the run then ends with
  /// ExitCode::Diverged; the metrics and checkpoints written so far stay).
  void diverged(int step, const std::string& why);
  /// Rank 0: the job's errors as ERROR lines in log.txt (stderr has them from run_app), and
  /// run.json with status "failed", the exit code and the first error (unless diverged() wrote
  /// it), so the run directory says why the run ended and no earlier job's "OK" stands in for it.
  /// Never throws (the job is failing already).
  void failed(const std::vector<std::string>& problems, int exit_code) noexcept;
  /// Rank 0: run.json with status "running" as the steps begin, so a job that is killed (no
  /// error path runs) leaves no earlier job's "OK" beside its own metrics.
  void started(int first_step);
  /// Rank 0, a finished run resumed again (nothing to train): run.json stays as it is when it says
  /// "OK"; otherwise (the job that ran the last steps was killed before its summary) it says
  /// "finished", with the checkpoint's step, instead of that job's "running".
  void nothing_to_train(int checkpoint_step);
  /// Every rank, before each step: the step the signals' interrupt note names (signals.hpp).
  void begin_step(int step) const;
  /// True on every rank, at the same step, once a logged step's job-wide sum has come back with a
  /// stop request (SIGUSR1) from some rank: the loop then calls stop(). A request travels with the
  /// next logged step's sum, which is read at the logged step after that: at most 2 x
  /// run.log_every_steps steps after the signal.
  [[nodiscard]] bool stop_agreed() const { return m_stop_ranks > 0; }
  /// Collective over comms.world: after `steps_done` steps, on a stop request: a checkpoint (unless
  /// this step has one already, or the compute is emulated), the note saying how to resume;
  /// finish() then writes run.json with status "stopped" and the STOPPED footer.
  void stop(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done);
  /// True when the deck asks for a checkpoint after `steps_done` steps (`last`: the run's last).
  [[nodiscard]] bool checkpoint_due(int steps_done, bool last) const;
  /// Collective over comms.world: a checkpoint after `steps_done` steps when the deck asks.
  void maybe_checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done, bool last);
  /// The steps the run had done when it stopped on request (stop()), -1 when it did not.
  [[nodiscard]] int stopped_at() const { return m_stopped_at; }
  /// Rank 0: the prompt tokens BubbleTea prefilled in the whole job (its report's, counted once
  /// per request), which run.json's `prefill_tokens` gives; without it (no BubbleTea) 0.
  void set_job_prefill_tokens(std::int64_t tokens) { m_job_prefill_tokens = tokens; }
  /// Collective over comms.world: gathers the profile, writes profile.h5 / trace.json / run.json,
  /// prints the per-rank summary, every rank's peak memory (`backend`.peak_bytes()) and the OK
  /// footer. Returns every rank's slots on rank 0 (empty elsewhere, and when profile.enabled = false).
  std::vector<runtime::SlotEvent> finish(runtime::Trainer& trainer, const topo::Communicators& comms,
                                         const topo::Layout& layout, const sched::ScheduleTable& table,
                                         runtime::Profiler& profiler, wan::PeerTransport& wan,
                                         const device::Backend& backend);

 private:
  const Config& m_cfg;
  bool m_root;
  bool m_quiet;
  std::string m_dir;
  std::ofstream m_metrics;
  std::ofstream m_log;
  double m_first_loss = 0.0;
  double m_last_loss = 0.0;
  std::optional<double> m_last_val;
  // The footer's means and time table leave the first step of the run out when it has more than
  // one (its one-time costs: allocation, first touch, TCP slow start), as atlas bench does
  // (JobResult); the *_all sums, over every step, serve a run stopped after its first step.
  int m_first_step = -1;               // the first step this run ran (a resume starts later)
  double m_sum_step_s = 0.0;           // timed steps
  double m_sum_step_s_all = 0.0;
  int m_mean_steps = 0;                // timed steps
  int m_timed_steps = 0;               // every step run (the footer's "N steps")
  std::int64_t m_job_prefill_tokens = 0;  // set_job_prefill_tokens (run.json)
  double m_mfu_flops_per_token = 0.0;  // mfu_basis(): 0 = no MFU column
  double m_mfu_peak_flops = 0.0;       // all devices together
  double m_sum_mfu = 0.0;              // over the timed steps, for the footer
  double m_sum_mfu_all = 0.0;
  RankTime m_mine;      // every rank: its own budget over the timed steps, gathered at the end
  RankTime m_mine_all;  // over every step
  int m_mine_steps = 0;  // timed steps on this rank
  // The last logged step's job-wide sum (step()): [3] rank 0's bad-loss flag, [4] the number of
  // ranks that had a stop request (SIGUSR1).
  std::array<double, 5> m_job{};
  int m_stop_ranks = 0;                 // m_job[4] of the last sum that came back (flush_row())
  int m_stopped_at = -1;                // stop(): the steps done when the run stopped on request
  int m_last_checkpoint = -1;           // the newest checkpoint's step (resumed or written), -1: none
  std::string m_last_checkpoint_path;
  bool m_metrics_appended = false;      // rank 0: metrics.csv was opened to append (a resume), not truncated
  bool m_resume_refused = false;        // rank 0: resume() refused the checkpoint (failed() keeps an OK run.json)
  std::optional<signals::InterruptNotes> m_notes;  // rank 0, from started() until finish()'s run.json
  bool m_lagged_bad_loss = false;       // the last sum that came back carried rank 0's flag (flush_row())
  bool m_bad_loss = false;              // rank 0: a non-finite loss was seen
  bool m_diverged_written = false;      // rank 0: diverged() wrote run.json (failed() keeps it)
  mpi::Request m_job_sum;               // ... in flight until flush_row()
  std::function<void()> m_pending_row;  // rank 0: prints that step's row from m_job
  std::vector<runtime::StepRow> m_steps;
  void print(const std::string& s);
  /// The deck keys that resume this run: run.resume=latest, with run.resume_fallback=PATH when it
  /// started from a checkpoint outside its ckpt.dir.
  [[nodiscard]] std::string resume_hint() const;
  /// Rank 0: runs/NAME/resolved.deck (a fresh start at once, a resume once its checkpoint is accepted).
  void write_resolved_deck() const;
  /// Collective over comms.world: writes the checkpoint of `steps_done` steps and prints its line.
  void checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done);
  /// Rank 0: throws atlas::Error (Io) naming `file` when `f` is in a failed state.
  void check_written(std::ofstream& f, const std::string& file) const;
  /// Collective over comms.world: gathers every rank's events and writes profile.h5 on rank 0.
  void write_profile(const topo::Communicators& comms, const topo::Layout& layout, const sched::ScheduleTable& table,
                     const std::vector<runtime::SlotEvent>& events);
};

}  // namespace atlas::app
