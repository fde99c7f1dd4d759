// SPDX-License-Identifier: MIT
// Output of `atlas train` (see the header). Every file a run writes is written whole: to a
// temporary name first, then renamed, so a killed run never leaves half a file.
#include "atlas/app/train_output.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>

#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/json.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/core/units.hpp"
#include "atlas/runtime/checkpointing.hpp"
#include "atlas/sched/mfu.hpp"

namespace atlas::app {

namespace fs = std::filesystem;

namespace {

/// A JSON number with 6 decimals, or null when not finite (an emulated run's loss).
std::string json_number(double v) { return json::number(v, 6); }

std::string json_escape(const std::string& text) { return json::escape(text); }

/// errno's text after a failed stream operation ("" when errno says nothing).
/// "# peak memory per rank (...): r0 1.2 GiB, r1 ..." (at most 16 ranks named, then the largest).
std::string peak_memory_line(const std::vector<unsigned long long>& peaks, const device::Backend& backend) {
  const char* what = backend.kind() == Backend::Cuda ? "device Buffers' high-water mark"
                                                     : "the rank's peak resident set";
  std::string list;
  unsigned long long top = 0;
  std::size_t top_rank = 0;
  for (std::size_t i = 0; i < peaks.size(); ++i) {
    if (peaks[i] > top) top = peaks[i], top_rank = i;
    if (i < 16) list += fmt::format("{}r{} {}", list.empty() ? "" : ", ", i, units::format_bytes_human(static_cast<double>(peaks[i])));
  }
  if (peaks.size() > 16) list += fmt::format(", ... (largest: r{} {})", top_rank, units::format_bytes_human(static_cast<double>(top)));
  return fmt::format("# peak memory per rank ({}): {}\n", what, list);
}

std::string errno_text() { return errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(); }

/// Whether checkpoint file `path` lies in `ckpt_dir` (links and `..` resolved; an error reads as
/// outside): run.resume = latest finds only such a file.
bool in_ckpt_dir(const std::string& path, const std::string& ckpt_dir) {
  std::error_code e1, e2;
  // (absolute first: a bare file name's parent is "", the working directory)
  const fs::path from = fs::weakly_canonical(fs::absolute(path, e1).parent_path(), e1);
  const fs::path ours = fs::weakly_canonical(ckpt_dir, e2);
  return !e1 && !e2 && from == ours;
}

/// Whether the run directory's run.json is a finished run's summary ("status":"OK").
bool run_json_says_ok(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "run.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("\"status\":\"OK\"") != std::string::npos;
}


}  // namespace

TrainOutput::TrainOutput(const Config& cfg, bool root, bool quiet, bool sets_aside, bool owns_ckpt_dir)
    : m_cfg(cfg), m_root(root), m_quiet(quiet), m_dir(cfg.run_dir()) {
  if (!m_root) return;
  std::error_code ec;
  fs::create_directories(m_dir, ec);
  if (ec) ATLAS_THROW(Io, "cannot create run directory " << m_dir << ": " << ec.message());
  errno = 0;
  m_log.open(fs::path(m_dir) / "log.txt", std::ios::app);
  if (!m_log.is_open()) ATLAS_THROW(Io, "cannot open " << m_dir << "/log.txt" << errno_text());
  // A new timeline: nothing to resume (run.resume = ""), or a start from a checkpoint outside
  // this run's ckpt.dir (a fine-tune's imported weights), whose rows and files are not this run's.
  const bool new_timeline =
      cfg.run.resume.empty() || (cfg.run.resume != "latest" && !in_ckpt_dir(cfg.run.resume, cfg.ckpt_dir()));
  if (new_timeline && sets_aside) {
    // The earlier run's results and checkpoints are moved aside (never deleted), not mixed with
    // this run's, before anything is written: `atlas report` read its profile.h5 as this run's,
    // run.resume = latest resumed its weights, pruning counted them (io::set_aside_checkpoints).
    static const std::set<std::string> kResults = {"resolved.deck", "metrics.csv", "run.json",
                                                   "profile.h5",    "trace.json",  "bubbletea.json"};
    const std::string why = cfg.run.resume.empty() ? "a fresh start (run.resume = \"\")"
                                                   : "a start from " + cfg.run.resume + " (outside ckpt.dir)";
    const MovedAside results =
        move_aside(m_dir, [](const std::string& name) { return kResults.count(name) > 0; }, why);
    std::string note;
    if (results.files > 0)
      note += fmt::format("# {}: moved {} result file(s) of an earlier run to {}\n", why, results.files, results.dir);
    if (owns_ckpt_dir) {
      const MovedAside ckpts = io::set_aside_checkpoints(cfg.ckpt_dir(), why);
      if (ckpts.files > 0)
        note += fmt::format("# {}: moved {} checkpoint file(s) ({}) of an earlier run from {} to {}; to continue that "
                            "run instead: run.resume=latest; remove an earlier-run-* directory when it is no longer "
                            "needed\n",
                            why, ckpts.files, units::format_bytes_human(static_cast<double>(ckpts.bytes)),
                            cfg.ckpt_dir(), ckpts.dir);
    }
    if (!note.empty()) print(note);  // at once: a job that fails before its first step still says so
  } else if (sets_aside && owns_ckpt_dir && cfg.run.resume != "latest") {
    // A resume from an older checkpoint of ckpt.dir (a roll-back, e.g. before a divergence): the
    // abandoned timeline's later steps move aside, or run.resume = latest would take them up
    // again after a crash (and pruning would count them).
    if (const std::optional<std::int64_t> step = io::checkpoint_step_of(cfg.run.resume)) {
      const std::string why = fmt::format("a resume from {} (step {}: an earlier step of ckpt.dir)", cfg.run.resume,
                                          *step);
      const MovedAside later = io::set_aside_checkpoints(cfg.ckpt_dir(), why, *step);
      if (later.files > 0)
        print(fmt::format("# {}: moved {} checkpoint file(s) of later steps ({}) from {} to {}, so run.resume = "
                          "latest continues this timeline; they are kept there\n",
                          why, later.files, units::format_bytes_human(static_cast<double>(later.bytes)),
                          cfg.ckpt_dir(), later.dir));
    }
  }
  // A resumed run writes its resolved deck once the checkpoint is accepted (started()): a resume
  // refused (another model.hidden) must not leave a deck no checkpoint of the run matches.
  if (cfg.run.resume.empty()) write_resolved_deck();
  const bool fresh = new_timeline || !fs::exists(fs::path(m_dir) / "metrics.csv");
  m_metrics_appended = !fresh;
  m_metrics.open(fs::path(m_dir) / "metrics.csv", fresh ? std::ios::trunc : std::ios::app);
  if (!m_metrics.is_open()) ATLAS_THROW(Io, "cannot open " << m_dir << "/metrics.csv" << errno_text());
  if (fresh) {
    // Written every step by rank 0 without a job-wide sum: the per-rank columns say whose they are
    // (the progress row's bubble% and wan_MB/s are job-wide; docs/formats.md, "metrics.csv").
    m_metrics << "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,rank0_bubble_pct,rank0_compute_ms,"
                 "rank0_intra_dc_ms,rank0_wan_wait_ms,rank0_wan_send_mb_s,rank0_prefill_tokens\n";
    m_metrics.flush();
    check_written(m_metrics, "metrics.csv");
  }
}

void TrainOutput::check_written(std::ofstream& f, const std::string& file) const {
  if (!f.fail()) return;
  const std::string why = errno_text();
  f.clear();  // later writes (the error path's last lines) may still go through
  ATLAS_THROW(Io, "writing " << m_dir << "/" << file << " failed" << why
                             << "\n  hint: the disk may be full or the file system read-only; the run stops "
                                "here (its checkpoints so far are kept)");
}

void TrainOutput::print(const std::string& s) {
  if (!m_root) return;
  if (!m_quiet) {
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  }
  if (m_log.is_open()) {
    errno = 0;
    m_log << s;
    m_log.flush();
    check_written(m_log, "log.txt");
  }
}

void TrainOutput::text(const std::string& s) {
  flush_row();
  print(s);
}

void TrainOutput::header(const std::string& deck_path, const topo::Layout& layout) {
  std::string h = fmt::format("# atlas {} ({}, {}), {}, HDF5 {}, {}\n", build::kVersion, build::kGitSha,
                              build::kBuildType, mpi::Environment::library_version(), build::kHdf5Version,
                              build::kCompiler);
  h += device::host_scheduling_note();
  h += mpi::Environment::tcp_protocol_note();
  h += fmt::format("# deck {} -> {}/resolved.deck\n", deck_path, m_dir);
  h += "# resolved deck:\n";
  std::istringstream in(deck::resolved_deck(m_cfg));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') h += "#   " + line + "\n";
  h += fmt::format("# job: {} ranks = {} stages x dp {} x tp {} over {} DCs; schedule {}; WAN {} ({} rails)\n",
                   layout.world_size(), layout.pp_size(), layout.dp_size(), layout.tp_size(), layout.dc_count(),
                   to_string(m_cfg.schedule.kind), to_string(m_cfg.wan.transport), m_cfg.wan.rails);
  print(h);
}

void TrainOutput::schedule(const sched::ScheduleTable& table) {
  std::string s = sched::gantt(table, m_cfg.cluster.dcs, 100);
  std::string out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out += (line.rfind("#", 0) == 0 ? line : "# " + line) + "\n";
  out += fmt::format("# predicted step {:.1f} ms, mean bubble {:.1f}%\n", table.step_ms, 100.0 * table.mean_bubble_fraction());
  print(out);
}

int TrainOutput::resume(runtime::Trainer& trainer, const topo::Communicators& comms) {
  // A checkpoint refused (another model, a damaged file) leaves the finished run's run.json
  // (failed()); a failure of anything else before the first step does not.
  const runtime::Restored r = [&] {
    try {
      return runtime::restore_checkpoint(trainer, m_cfg, comms);
    } catch (const ConfigError&) {
      m_resume_refused = true;
      throw;
    } catch (const io::ChecksumMismatch&) {
      m_resume_refused = true;
      throw;
    }
  }();
  if (!r.path.empty()) {
    print(fmt::format("# resumed from {} at step {}\n", r.path, r.step));
    m_last_checkpoint = r.step;
    m_last_checkpoint_path = r.path;
  }
  return r.step;
}

void TrainOutput::mfu_basis(double flops_per_token, double peak_flops, int devices, const std::string& basis) {
  m_mfu_flops_per_token = flops_per_token;
  m_mfu_peak_flops = peak_flops * devices;
  print(fmt::format("# mfu% = tok/s x {:.4g} model FLOPs per token (6 N + 12 L T C, docs/gpu.md) / ({} x {:.4g} "
                    "TFLOP/s, {})\n",
                    flops_per_token, devices, peak_flops / 1e12, basis));
}

void TrainOutput::columns() {
  if (emulated())
    print("# device.backend = emulated: no arithmetic, each compute slot sleeps its predicted time; loss n/a "
          "(emulated compute)\n");
  print("# columns: loss = training loss of the step, val = validation loss, tok/s and step_ms of rank 0, bubble% = job\n"
        "#   mean of 1 - (compute + prefill) / step, comp/intra/wan_ms = rank 0's compute, intra-DC wait, WAN wait,\n"
        "#   wan_MB/s = the whole job's WAN bytes over the step time, prefill = rank 0's BubbleTea tokens;\n"
        "#   metrics.csv has every step, with rank 0's bubble and WAN send rate (docs/formats.md)\n");
  print(fmt::format("# {:>5} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}{}\n", "step", "loss",
                    "val", "lr", "tok/s", "step_ms", "bubble%", "comp_ms", "intra_ms", "wan_ms", "wan_MB/s",
                    "prefill", m_mfu_peak_flops > 0 ? fmt::format(" {:>6}", "mfu%") : std::string()));
}

bool TrainOutput::logged(int step, bool evaluated) const {
  return (step + 1) % m_cfg.run.log_every_steps == 0 || step + 1 == m_cfg.run.steps || evaluated;
}

void TrainOutput::step(const runtime::StepReport& r, std::optional<double> val, std::int64_t tokens_per_step,
                       const topo::Communicators& comms) {
  const bool logged = this->logged(r.step, val.has_value());
  // Job-wide figures on logged steps only: one small all-reduce every log_every_steps steps. It
  // crosses the WAN, so it is not waited for here: the row is printed once the sum is in (at the
  // next logged step, or flush_row()), and the ranks never wait for each other to log.
  if (m_root && !emulated() && (!std::isfinite(r.loss) || (val && !std::isfinite(*val)))) m_bad_loss = true;
  if (logged) {
    flush_row();
    m_job = {(r.compute_s + r.prefill_s) / r.step_s,
             static_cast<double>(r.boundary.wan_bytes_sent + r.boundary.wan_exchange_bytes),
             r.boundary.wan_send_busy_s, m_bad_loss ? 1.0 : 0.0, signals::stop_requested() != 0 ? 1.0 : 0.0};
    m_job_sum = comms.world.iallreduce_sum(std::span<double>(m_job));
  }
  if (m_first_step < 0) m_first_step = r.step;
  const bool timed = r.step > m_first_step || m_cfg.run.steps - m_first_step == 1;
  m_mine_all.add(r);
  if (timed) {
    m_mine.add(r);
    ++m_mine_steps;
  }
  if (!m_root) return;
  if (m_timed_steps == 0 && m_first_loss == 0.0) m_first_loss = r.loss;
  m_last_loss = r.loss;
  if (val) m_last_val = val;
  m_sum_step_s_all += r.step_s;
  if (timed) {
    m_sum_step_s += r.step_s;
    ++m_mean_steps;
  }
  ++m_timed_steps;
  const double tok_s = static_cast<double>(tokens_per_step) / r.step_s;
  const double mfu = sched::mfu(tok_s, m_mfu_flops_per_token, m_mfu_peak_flops, 1);
  m_sum_mfu_all += mfu;
  if (timed) m_sum_mfu += mfu;
  const double bubble_r0 = 100.0 * (1.0 - (r.compute_s + r.prefill_s) / r.step_s);
  m_steps.push_back({r.step, r.loss, r.step_s, tok_s, bubble_r0 / 100.0, r.prefill_tokens});
  const double wan_mb_s_r0 = r.boundary.wan_send_busy_s > 0 ? r.boundary.wan_bytes_sent / r.boundary.wan_send_busy_s / 1e6 : 0.0;
  const std::string val_s = val ? fmt::format("{:.4f}", *val) : std::string("-");
  if (logged) {
    const int n = comms.world.size();
    // An emulated run computes no loss (device.backend = emulated): the column says so.
    const std::string loss_s = emulated() ? std::string("n/a") : fmt::format("{:.4f}", r.loss);
    const std::string mfu_s = m_mfu_peak_flops > 0 ? fmt::format(" {:>6.1f}", 100.0 * mfu) : std::string();
    m_pending_row = [this, n, r, loss_s, val_s, tok_s, mfu_s] {
      const double job_bubble = 100.0 * (1.0 - m_job[0] / n);
      // WAN throughput: bytes of every WAN send of the step over the step's wall time.
      const double job_wan_mb_s = m_job[1] / r.step_s / 1e6;
      print(fmt::format("  {:>5} {:>8} {:>8} {:>9.2e} {:>9.0f} {:>8.1f} {:>7.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8}{}\n",
                        r.step, loss_s, val_s, r.lr, tok_s, r.step_s * 1e3, job_bubble, r.compute_s * 1e3,
                        r.intra_s * 1e3, r.wan_s * 1e3, job_wan_mb_s, r.prefill_tokens, mfu_s));
    };
  }
  errno = 0;
  m_metrics << fmt::format("{},{:.6f},{},{:.6e},{:.6f},{:.1f},{:.3f},{:.2f},{:.3f},{:.3f},{:.3f},{:.3f},{}\n", r.step, r.loss,
                           val ? fmt::format("{:.6f}", *val) : std::string(), r.lr, r.grad_norm, tok_s,
                           r.step_s * 1e3, bubble_r0, r.compute_s * 1e3, r.intra_s * 1e3, r.wan_s * 1e3, wan_mb_s_r0,
                           r.prefill_tokens);
  m_metrics.flush();
  check_written(m_metrics, "metrics.csv");
}

void TrainOutput::flush_row() {
  if (m_job_sum.pending()) {
    m_job_sum.wait_polling();
    m_lagged_bad_loss = m_job[3] > 0.0;
    m_stop_ranks = static_cast<int>(std::lround(m_job[4]));
  }
  if (!m_pending_row) return;
  const std::function<void()> row = std::move(m_pending_row);
  m_pending_row = nullptr;
  row();
}

void TrainOutput::diverged(int step, const std::string& why) {
  if (!m_root) return;
  m_notes.reset();  // the run.json written here says why the run ended; no interrupt note replaces it
  // The divergence is the job's error: a run.json that cannot be written (a full disk) is
  // reported, but must not replace it with an I/O error on rank 0 alone.
  try {
    write_file_whole((fs::path(m_dir) / "run.json").string(),
                fmt::format("{{\"run\":\"{}\",\"status\":\"diverged\",\"step\":{},\"exit_code\":{},\"error\":\"{}\"}}\n",
                            json_escape(m_cfg.run.name), step, static_cast<int>(ExitCode::Diverged), json_escape(why)));
    m_diverged_written = true;
  } catch (const Error& e) {
    log::warn("{}", e.what());
  }
}

void TrainOutput::failed(const std::vector<std::string>& problems, int exit_code) noexcept {
  if (!m_root) return;
  m_notes.reset();  // as in diverged()
  try {
    // Not flush_row(): its pending row waits on a job-wide sum that failing ranks may never join.
    if (m_log.is_open()) {
      m_log.clear();
      for (const std::string& why : problems) m_log << "ERROR: " << why << "\n";
      m_log.flush();
    }
    // A resume that failed before it trained (refused: another model.hidden) leaves the run.json
    // of the run that finished in this directory; its log.txt and exit code say why. (A fresh
    // start owns the directory from its first line: its failure replaces the earlier run.json.)
    if (!m_diverged_written && !(m_resume_refused && run_json_says_ok(m_dir)))
      write_file_whole((fs::path(m_dir) / "run.json").string(),
                       fmt::format("{{\"run\":\"{}\",\"status\":\"failed\",\"exit_code\":{},\"error\":\"{}\"}}\n",
                                   json_escape(m_cfg.run.name), exit_code,
                                   json_escape(problems.empty() ? std::string() : problems.front())));
  } catch (...) {  // NOLINT(bugprone-empty-catch): the job's own error is reported already
  }
}

void TrainOutput::nothing_to_train(int checkpoint_step) {
  if (!m_root) return;
  if (run_json_says_ok(m_dir)) return;
  write_file_whole((fs::path(m_dir) / "run.json").string(),
                   fmt::format("{{\"run\":\"{}\",\"status\":\"finished\",\"checkpoint_step\":{},\"steps\":{},"
                               "\"note\":\"the job that ran the last steps ended before its summary; metrics.csv and "
                               "the checkpoints hold its results\"}}\n",
                               json_escape(m_cfg.run.name), checkpoint_step, m_cfg.run.steps));
}

void TrainOutput::started(int first_step) {
  if (!m_root) return;
  if (!m_cfg.run.resume.empty()) write_resolved_deck();
  if (m_metrics_appended && m_metrics.is_open()) {
    // A resumed run appends to metrics.csv: the rows of steps it runs again (a killed job got
    // past its last checkpoint; every row when run.resume = latest found no checkpoint and the
    // run starts at step 0 again) go, so each step has one row, the resumed run's.
    m_metrics.close();
    const fs::path path = fs::path(m_dir) / "metrics.csv";
    std::ifstream in(path);
    std::string line, kept;
    int dropped = 0;
    for (bool header = true; std::getline(in, line); header = false) {
      char* end = nullptr;
      const long step = header ? -1 : std::strtol(line.c_str(), &end, 10);
      if (!header && end != line.c_str() && step >= first_step) {
        ++dropped;
        continue;
      }
      kept += line + "\n";
    }
    in.close();
    if (dropped > 0) write_file_whole(path.string(), kept);
    m_metrics.open(path, std::ios::app);
    if (!m_metrics.is_open()) ATLAS_THROW(Io, "cannot open " << m_dir << "/metrics.csv" << errno_text());
    if (dropped > 0)
      print(fmt::format("# metrics.csv: dropped {} row(s) of steps >= {} an earlier job wrote (this run writes them again)\n",
                        dropped, first_step));
  }
  write_file_whole((fs::path(m_dir) / "run.json").string(),
                   fmt::format("{{\"run\":\"{}\",\"status\":\"running\",\"first_step\":{},\"steps\":{}}}\n",
                               json_escape(m_cfg.run.name), first_step, m_cfg.run.steps));
  // From here a SIGTERM/SIGINT/SIGHUP (scancel, Ctrl-C, a lost terminal) leaves a note in
  // log.txt and run.json before the process dies of it (core/signals.hpp).
  signals::set_progress(first_step, m_last_checkpoint);
  signals::InterruptNote note{(fs::path(m_dir) / "log.txt").string(), (fs::path(m_dir) / "run.json").string(),
                              json_escape(m_cfg.run.name), m_cfg.run.steps};
  note.resume_hint = resume_hint();
  m_notes.emplace(note);
}

std::string TrainOutput::resume_hint() const {
  // A run started from a checkpoint outside its ckpt.dir (run.resume = PATH, or the fallback):
  // latest alone finds nothing there until this run writes its own, and would start from step 0.
  if (!m_last_checkpoint_path.empty() && !in_ckpt_dir(m_last_checkpoint_path, m_cfg.ckpt_dir()))
    return "run.resume=latest run.resume_fallback=" + m_last_checkpoint_path;
  return "run.resume=latest";
}

void TrainOutput::write_resolved_deck() const {
  write_file_whole((fs::path(m_dir) / "resolved.deck").string(), deck::resolved_deck(m_cfg));
}

void TrainOutput::begin_step(int step) const { signals::set_progress(step, m_last_checkpoint); }

bool TrainOutput::checkpoint_due(int steps_done, bool last) const {
  const bool periodic = m_cfg.ckpt.every_steps > 0 && steps_done % m_cfg.ckpt.every_steps == 0;
  return periodic || (last && m_cfg.ckpt.final);
}

void TrainOutput::maybe_checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done,
                                   bool last) {
  if (checkpoint_due(steps_done, last)) checkpoint(trainer, comms, steps_done);
}

void TrainOutput::checkpoint(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done) {
  flush_row();
  const io::WriteResult r = runtime::save_checkpoint(trainer, m_cfg, comms, steps_done);
  m_last_checkpoint = steps_done;
  m_last_checkpoint_path = r.path;
  signals::set_progress(steps_done, m_last_checkpoint);
  print(fmt::format("# checkpoint {} ({}, {:.2f} s)\n", r.path, units::format_bytes_human(static_cast<double>(r.file_bytes)),
                    r.seconds));
}

void TrainOutput::stop(runtime::Trainer& trainer, const topo::Communicators& comms, int steps_done) {
  flush_row();
  std::string saved;
  if (emulated()) {
    saved = "no checkpoint (device.backend = emulated computes no weights)";
  } else {
    if (m_last_checkpoint != steps_done) checkpoint(trainer, comms, steps_done);
    saved = fmt::format("its checkpoint is {}", m_last_checkpoint_path);
  }
  m_stopped_at = steps_done;
  print(fmt::format("# stop requested (SIGUSR1, seen by {} of {} ranks): stopping after {} of run.steps = {} steps; {}\n"
                    "#   resume with the same command and run.resume=latest (scripts/launch/atlas-run-restart.sh "
                    "and the Slurm scripts do; docs/slurm.md)\n",
                    m_stop_ranks, comms.world.size(), steps_done, m_cfg.run.steps, saved));
}

void TrainOutput::write_profile(const topo::Communicators& comms, const topo::Layout& layout,
                                const sched::ScheduleTable& table, const std::vector<runtime::SlotEvent>& events) {
  const auto hosts = comms.world.allgather_strings(env::host_name());
  if (!m_root) return;
  runtime::ProfileMeta meta;
  meta.run_name = m_cfg.run.name;
  meta.deck = deck::resolved_deck(m_cfg);
  meta.dc_names = m_cfg.cluster.dcs;
  meta.hosts = hosts;
  meta.table = &table;
  meta.layout = &layout;
  runtime::write_profile((fs::path(m_dir) / "profile.h5").string(), meta, events, m_steps);
}

void RankTime::add(const runtime::StepReport& r) {
  wall += r.step_s;
  compute += r.compute_s;
  intra += r.intra_s;
  wan += r.wan_s;
  idle += r.idle_s;
  prefill += r.prefill_s;
}

std::string rank_time_table(const std::vector<RankTime>& ranks, const topo::Layout& layout,
                            const std::vector<std::string>& dcs, int steps, const std::string& which) {
  std::string s = fmt::format("# per-rank time over {} steps{} (s): compute (forward, backward, optimizer), intra-DC "
                              "comm, WAN wait, idle, prefill, utilization = (compute + prefill) / wall\n",
                              steps, which);
  // The "where" column is as wide as its longest entry: never cut (it ends with the dp index).
  std::vector<std::string> where(ranks.size());
  std::size_t width = 5;
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    where[rank] = layout.describe(static_cast<int>(rank), dcs);
    width = std::max(width, where[rank].size());
  }
  s += fmt::format("# {:>5} {:<{}} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}\n", "rank", "where", width, "compute", "intra",
                   "wan", "idle", "prefill", "util%");
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    const RankTime& a = ranks[rank];
    s += fmt::format("  {:>5} {:<{}} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>6.1f}\n", rank, where[rank], width,
                     a.compute, a.intra, a.wan, a.idle, a.prefill, 100.0 * a.utilization());
  }
  return s;
}

std::vector<runtime::SlotEvent> TrainOutput::finish(runtime::Trainer& trainer, const topo::Communicators& comms,
                                                    const topo::Layout& layout, const sched::ScheduleTable& table,
                                                    runtime::Profiler& profiler, wan::PeerTransport& wan,
                                                    const device::Backend& backend) {
  flush_row();
  const double entropy = trainer.validation_unigram_entropy();
  auto events = profiler.gather(comms.world, 0);
  if (m_cfg.profile.enabled) write_profile(comms, layout, table, events);
  const auto stats = wan.stats();
  const unsigned long long wan_bytes = comms.world.allreduce(static_cast<unsigned long long>(stats.total_bytes_sent()), MPI_SUM);
  // Per-rank time budget over the steps run, from each rank's step reports.
  // A run stopped after its first step has no timed step: that step is all there is.
  const RankTime& budget = m_mine_steps > 0 ? m_mine : m_mine_all;
  std::vector<double> mine{budget.wall, budget.compute, budget.intra, budget.wan, budget.idle, budget.prefill};
  std::vector<double> all(m_root ? mine.size() * static_cast<std::size_t>(comms.world.size()) : 0);
  ATLAS_MPI_CHECK(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                             static_cast<int>(mine.size()), MPI_DOUBLE, 0, comms.world.get()));
  // Every rank's peak memory (host: its resident set; a GPU: its Buffers' high-water mark).
  const auto peak_mine = static_cast<unsigned long long>(backend.peak_bytes());
  std::vector<unsigned long long> peaks(m_root ? static_cast<std::size_t>(comms.world.size()) : 0);
  ATLAS_MPI_CHECK(MPI_Gather(&peak_mine, 1, MPI_UNSIGNED_LONG_LONG, peaks.data(), 1, MPI_UNSIGNED_LONG_LONG, 0,
                             comms.world.get()));
  // The blocks' CUDA graphs (device.cuda_graphs), summed over ranks; the first refusal: rank 0's.
  long long graphs_mine[5] = {0, 0, 0, 0, 0};
  long long graphs[5] = {0, 0, 0, 0, 0};
  if (m_cfg.device.cuda_graphs) {
    const device::GraphStats& g = trainer.model().graph_stats();
    graphs_mine[0] = g.recorded, graphs_mine[1] = g.launches, graphs_mine[2] = g.eager;
    graphs_mine[3] = g.refused, graphs_mine[4] = g.dropped;
    ATLAS_MPI_CHECK(MPI_Reduce(graphs_mine, graphs, 5, MPI_LONG_LONG, MPI_SUM, 0, comms.world.get()));
  }
  if (!m_root) return events;
  std::vector<RankTime> ranks(static_cast<std::size_t>(comms.world.size()));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const double* v = &all[i * mine.size()];
    ranks[i] = RankTime{v[0], v[1], v[2], v[3], v[4], v[5]};
  }
  const bool first_only = m_mean_steps == 0;
  const int mean_steps = first_only ? m_timed_steps : m_mean_steps;
  std::string s = rank_time_table(ranks, layout, m_cfg.cluster.dcs, mean_steps,
                                  first_only || m_mean_steps == m_timed_steps ? "" : " (the first step's one-time costs left out)");
  const double mean_step = mean_steps > 0 ? (first_only ? m_sum_step_s_all : m_sum_step_s) / mean_steps : 0.0;
  s += fmt::format("# mean step {:.1f} ms over {} steps (table predicted {:.1f} ms); WAN bytes sent {}\n",
                   mean_step * 1e3, mean_steps, table.step_ms, wan_bytes);
  s += peak_memory_line(peaks, backend);
  if (m_cfg.device.cuda_graphs) {
    s += fmt::format("# cuda graphs (all ranks): {} recorded, {} block passes launched as graphs, {} eager "
                     "(warm-up{}), {} dropped when a workspace moved\n",
                     graphs[0], graphs[1], graphs[2], graphs[3] > 0 ? fmt::format(", {} refused", graphs[3]) : "",
                     graphs[4]);
    if (const std::string& why = trainer.model().graph_stats().first_refusal; !why.empty())
      s += fmt::format("# cuda graphs: a recording was refused on rank 0 (that block pass stays eager): {}\n", why);
  }
  const double mean_mfu =
      mean_steps > 0 && m_mfu_peak_flops > 0 ? (first_only ? m_sum_mfu_all : m_sum_mfu) / mean_steps : -1.0;
  if (mean_mfu >= 0) s += fmt::format("# mean MFU {:.1f}%\n", 100.0 * mean_mfu);
  std::string peaks_json;
  for (const unsigned long long b : peaks) peaks_json += fmt::format("{}{}", peaks_json.empty() ? "" : ",", b);
  if (m_cfg.profile.enabled && m_cfg.profile.trace_json) {
    write_file_whole((fs::path(m_dir) / "trace.json").string(),
                runtime::chrome_trace_json(events, runtime::trace_labels(layout, table, m_cfg.cluster.dcs)));
    s += fmt::format("# wrote {}/trace.json ({} events){}\n", m_dir, events.size(),
                     m_cfg.profile.enabled ? " and profile.h5" : "");
  }
  // The run ends well from here: no interrupt note may replace the run.json written now.
  m_notes.reset();
  const bool stopped = m_stopped_at >= 0;
  const std::string status =
      stopped ? fmt::format("\"stopped\",\"exit_code\":{},\"steps_done\":{},\"checkpoint\":{}",
                            static_cast<int>(ExitCode::Stopped), m_stopped_at,
                            m_last_checkpoint == m_stopped_at ? "\"" + json_escape(m_last_checkpoint_path) + "\""
                                                              : std::string("null"))
              : std::string("\"OK\"");
  write_file_whole((fs::path(m_dir) / "run.json").string(),
              fmt::format("{{\"run\":\"{}\",\"status\":{},\"steps\":{},\"first_step\":{},\"steps_run\":{},"
                          "\"first_loss\":{},\"final_loss\":{},"
                          "\"final_val_loss\":{},\"mean_step_ms\":{:.3f},\"predicted_step_ms\":{:.3f},"
                          "\"schedule\":\"{}\",\"world_size\":{},\"wan_bytes\":{},\"prefill_tokens\":{},"
                          "\"tokens_per_step\":{},\"mfu\":{},\"peak_memory_bytes\":[{}]}}\n",
                          json_escape(m_cfg.run.name), status, m_cfg.run.steps, std::max(m_first_step, 0),
                          m_timed_steps, json_number(m_first_loss),
                          json_number(m_last_loss),
                          m_last_val ? fmt::format("{:.6f}", *m_last_val) : std::string("null"), mean_step * 1e3,
                          table.step_ms, to_string(m_cfg.schedule.kind), layout.world_size(), wan_bytes,
                          m_job_prefill_tokens, static_cast<long long>(m_cfg.tokens_per_step()),
                          mean_mfu >= 0 ? fmt::format("{:.6f}", mean_mfu) : std::string("null"), peaks_json));
  // A run stopped on request says so in its footer, which a script must not take for an OK.
  const std::string verdict =
      stopped ? fmt::format("STOPPED on request after {} of run.steps = {} steps (resume with run.resume=latest)",
                            m_stopped_at, m_cfg.run.steps)
              : std::string("OK");
  if (emulated())
    s += fmt::format("# {}: {} steps, loss n/a (emulated compute: device.backend = emulated); results in {}/\n",
                     verdict, m_timed_steps, m_dir);
  else
    s += fmt::format("# {}: {} steps, loss {:.4f} -> {:.4f}, val {} (unigram entropy of the validation text: {:.4f} "
                     "nats/token); results in {}/\n",
                     verdict, m_timed_steps, m_first_loss, m_last_loss, m_last_val ? fmt::format("{:.4f}", *m_last_val) : "-",
                     entropy, m_dir);
  // What a user does next with a finished run's newest checkpoint (README: Evaluating, Sampling).
  if (!emulated() && !stopped && !m_last_checkpoint_path.empty()) {
    // This binary as the user can type it: relative to the working directory when it lies under
    // it (build/bin/atlas), else its full path.
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    std::string atlas = ec ? std::string("atlas") : exe.string();
    if (!ec)
      if (const fs::path rel = exe.lexically_relative(fs::current_path(ec)); !ec && !rel.empty() && *rel.begin() != "..")
        atlas = rel.string();
    s += fmt::format("# next: {} report {} | {} eval {} | {} sample {} --prompt \"The \"\n", atlas, m_dir, atlas,
                     m_last_checkpoint_path, atlas, m_last_checkpoint_path);
  }
  print(s);
  return events;
}

}  // namespace atlas::app
