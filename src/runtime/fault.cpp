// SPDX-License-Identifier: MIT
// Environment-driven fault injection (see the header).
#include "atlas/runtime/fault.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"

namespace atlas::runtime {

void maybe_inject_kill(const char* var, int world_rank, int step, bool resumed) {
  const char* v = std::getenv(var);
  if (!v || !*v || resumed) return;
  const std::string s(v);
  const auto colon = s.find(':');
  const auto rank = colon == std::string::npos ? std::nullopt : units::parse_int(s.substr(0, colon));
  const auto at = colon == std::string::npos ? std::nullopt : units::parse_int(s.substr(colon + 1));
  if (!rank || !at) throw ConfigError(std::string(var) + " = \"" + s + "\": expected RANK:STEP (two integers)");
  if (*rank != world_rank || *at != step) return;
  std::fprintf(stderr, "[rank %d] fault injection (%s): killing this rank at step %d\n", world_rank, var, step);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace atlas::runtime
