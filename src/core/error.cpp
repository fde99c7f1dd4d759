// SPDX-License-Identifier: MIT
// Error types and the rank identity that prefixes local errors.
#include "atlas/core/error.hpp"

#include <cstring>
#include <sstream>

#include "atlas/core/check.hpp"

namespace atlas {

namespace {
std::string join_problems(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) {
    if (!out.empty()) out += '\n';
    out += p;
  }
  return out;
}
std::string g_rank_prefix;  // set once, right after MPI init, before any thread starts
}  // namespace

CollectiveError::CollectiveError(ExitCode code, std::vector<std::string> problems)
    : std::runtime_error(join_problems(problems)), m_code(code), m_problems(std::move(problems)) {}

void ProblemList::throw_if_any() const {
  if (!m_problems.empty()) throw ConfigError(m_problems);
}

std::string either(const std::vector<std::string>& fixes) {
  std::string out;
  for (std::size_t i = 0; i < fixes.size(); ++i)
    out += (i == 0 ? "" : i + 1 < fixes.size() ? ", " : fixes.size() == 2 ? " or " : ", or ") + fixes[i];
  return out;
}

namespace detail {

std::string rank_prefix() { return g_rank_prefix; }

void set_rank_identity(int world_rank, const std::string& host) {
  std::ostringstream os;
  os << "[rank " << world_rank << " host " << host << "] ";
  g_rank_prefix = os.str();
}

void throw_error(ExitCode code, const std::string& msg, const char* file, int line) {
  std::ostringstream os;
  os << msg << " (at " << file << ":" << line << ")";
  throw Error(code, os.str());
}

void throw_sys_error(int err, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "system call failed: " << call << ": " << std::strerror(err) << " (errno " << err << ")";
  throw_error(ExitCode::Comm, os.str(), file, line);
}

}  // namespace detail
}  // namespace atlas
