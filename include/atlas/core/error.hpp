// SPDX-License-Identifier: MIT
// atlas's two failure classes (STYLE.md §5): CollectiveError / ConfigError (collective, every rank
// sees it the same way; rank 0 prints) and Error (local; the rank that saw it prints, then the job
// is aborted).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace atlas {

/// Process exit codes; Slurm logs then say what class of failure happened.
enum class ExitCode : int {
  Ok = 0,
  Usage = 1,     ///< bad command line (unknown subcommand, missing deck path)
  Config = 2,    ///< deck / schema / layout / schedule errors (collective)
  Comm = 3,      ///< MPI or WAN transport failure
  Device = 4,    ///< CUDA / NCCL / backend failure
  Io = 5,        ///< HDF5, checkpoint, file system
  Internal = 6,  ///< a broken invariant: a bug in atlas
  Diverged = 7,  ///< training diverged: a non-finite loss or gradient norm (collective)
  Stopped = 8,   ///< stopped on request (SIGUSR1) after a checkpoint: resume with run.resume=latest
};

/// A local error: one rank saw it. Carries the exit code class and the call site.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), m_code(code) {}
  [[nodiscard]] ExitCode code() const noexcept { return m_code; }

 private:
  ExitCode m_code;
};

/// A collective error: every rank raises it the same way (by construction, or agreed through
/// mpi::agree), rank 0 prints every problem and every rank exits with `code()`. Holds every
/// problem found (not just the first), each already formatted as one message.
class CollectiveError : public std::runtime_error {
 public:
  CollectiveError(ExitCode code, std::vector<std::string> problems);
  [[nodiscard]] ExitCode code() const noexcept { return m_code; }
  [[nodiscard]] const std::vector<std::string>& problems() const noexcept { return m_problems; }

 private:
  ExitCode m_code;
  std::vector<std::string> m_problems;
};

/// A collective configuration error (exit code 2): every rank detects it identically.
class ConfigError : public CollectiveError {
 public:
  explicit ConfigError(std::vector<std::string> problems)
      : CollectiveError(ExitCode::Config, std::move(problems)) {}
  explicit ConfigError(const std::string& problem) : ConfigError(std::vector<std::string>{problem}) {}
};

/// Collects problems during validation and throws them together.
class ProblemList {
 public:
  void add(std::string problem) { m_problems.push_back(std::move(problem)); }
  [[nodiscard]] bool empty() const noexcept { return m_problems.empty(); }
  [[nodiscard]] const std::vector<std::string>& items() const noexcept { return m_problems; }
  /// Throws ConfigError holding every problem, if there are any.
  void throw_if_any() const;

 private:
  std::vector<std::string> m_problems;
};

/// A hint's alternatives as one phrase: "a", "a or b", "a, b, or c" (empty: "").
std::string either(const std::vector<std::string>& fixes);

namespace detail {
/// "[rank 3 host dc1-n3] " once the process knows its rank; empty before.
std::string rank_prefix();
void set_rank_identity(int world_rank, const std::string& host);
[[noreturn]] void throw_error(ExitCode code, const std::string& msg, const char* file, int line);
}  // namespace detail

}  // namespace atlas
