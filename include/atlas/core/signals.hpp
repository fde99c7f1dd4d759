// SPDX-License-Identifier: MIT
// Signals a training job answers (docs/slurm.md, "Time limits and preemption"):
//   - SIGUSR1 asks for a checkpoint and a clean stop: the handler only records it; the training
//     loop agrees on it across ranks at a logged step, writes a checkpoint there and ends with
//     ExitCode::Stopped (Slurm: `#SBATCH --signal=B:USR1@300`, a requeue then resumes).
//   - SIGTERM, SIGINT and SIGHUP still end the process at once (the launcher kills the job's other
//     ranks within a second, too soon for a checkpoint), but first, on the process that armed it
//     (world rank 0), a note says so: an ERROR line in log.txt and on stderr, and run.json with
//     status "interrupted", the step and the newest checkpoint's step. Only async-signal-safe
//     calls run in that handler (open, write, rename, close, nanosleep); everything it writes is
//     prepared beforehand. A second such signal on another thread waits (at most 2 s) for the
//     first one's note before the process dies.
//   - SIGBUS inside a mapped input file (MappedFileWatch) names the file before the process dies.
#pragma once

#include <cstddef>
#include <string>

namespace atlas::signals {

/// Installs the SIGUSR1 handler for the life of the object (one scope at a time: a second one is
/// an internal error). After it, a handler installed before comes back; the default action
/// (terminate) becomes "ignore", so a late request cannot kill a rank that stopped cleanly.
/// `atlas train` holds one.
class StopRequests {
 public:
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
};

/// The signal that asked this process to stop (SIGUSR1), 0 when none has arrived.
[[nodiscard]] int stop_requested() noexcept;
/// Forgets a request (tests; a new job in the same process).
void clear_stop_request() noexcept;

/// What the interrupt note needs, prepared before the signal can arrive.
struct InterruptNote {
  std::string log_path;       ///< the run's log.txt (appended to)
  std::string run_json_path;  ///< run.json (replaced: written to run.json.signal.tmp, then renamed)
  std::string run_name;       ///< JSON-escaped already
  int steps = 0;              ///< run.steps, for the note
  /// How to resume, for the note: "run.resume=latest", or with run.resume_fallback=PATH when the
  /// run started from a checkpoint outside its ckpt.dir (latest alone would not find it).
  std::string resume_hint = "run.resume=latest";
};

/// Installs the SIGTERM/SIGINT/SIGHUP handlers that write the note before the process dies of the
/// signal, until the object is destroyed (then the previous handlers come back).
class InterruptNotes {
 public:
  explicit InterruptNotes(const InterruptNote& note);
  ~InterruptNotes();
  InterruptNotes(const InterruptNotes&) = delete;
  InterruptNotes& operator=(const InterruptNotes&) = delete;
};

/// The step the loop is in and the newest checkpoint's step (-1: none), for the note. Cheap
/// (two relaxed atomic stores); the loop calls it every step.
void set_progress(int step, int checkpoint_step) noexcept;

/// Names a memory-mapped input file in the SIGBUS that reading it raises when the file shrank
/// under the mapping (truncated or rewritten in place while the run reads it) or its file system
/// failed: while the object lives, a SIGBUS at an address in [base, base + bytes) first writes
/// "ERROR: SIGBUS reading <what> '<path>' at byte N: ..." and a hint on stderr, then the process
/// dies of the signal as it would have (a handler installed before, e.g. Open MPI's backtrace,
/// still runs). Up to kMaxMappedFiles at once; more are watched unnamed (no line). Not copyable.
class MappedFileWatch {
 public:
  static constexpr int kMaxMappedFiles = 4096;
  /// `path` and `what` ("token shard") are copied.
  MappedFileWatch(const void* base, std::size_t bytes, const std::string& path, const std::string& what);
  ~MappedFileWatch();
  MappedFileWatch(const MappedFileWatch&) = delete;
  MappedFileWatch& operator=(const MappedFileWatch&) = delete;

 private:
  int m_slot = -1;
  std::string m_text;  ///< "<what> '<path>'", read by the handler while the slot points at it
};

}  // namespace atlas::signals
