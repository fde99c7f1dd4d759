// SPDX-License-Identifier: MIT
// Environment-driven fault injection (see the header).
#include "atlas/runtime/fault.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "atlas/core/env.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"

namespace atlas::runtime {

namespace {
/// True if `var` (RANK:STEP) names this rank and step of a fresh run.
bool fault_here(const char* var, int world_rank, int step, bool resumed) {
  const std::optional<std::string> v = env::get(var);
  if (!v || resumed) return false;
  const std::string& s = *v;
  const auto colon = s.find(':');
  const auto rank = colon == std::string::npos ? std::nullopt : units::parse_int(s.substr(0, colon));
  const auto at = colon == std::string::npos ? std::nullopt : units::parse_int(s.substr(colon + 1));
  if (!rank || !at) throw ConfigError(std::string(var) + " = \"" + s + "\": expected RANK:STEP (two integers)");
  return *rank == world_rank && *at == step;
}
}  // namespace

void maybe_inject_kill(const char* var, int world_rank, int step, bool resumed) {
  if (!fault_here(var, world_rank, step, resumed)) return;
  std::fprintf(stderr, "[rank %d] fault injection (%s): killing this rank at step %d\n", world_rank, var, step);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

void maybe_inject_hang(const char* var, int world_rank, int step, bool resumed) {
  if (!fault_here(var, world_rank, step, resumed)) return;
  std::fprintf(stderr, "[rank %d] fault injection (%s): this rank stops at step %d and sleeps until killed\n",
               world_rank, var, step);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace atlas::runtime

namespace atlas::runtime {

void maybe_inject_config_error(const char* var, int world_rank, int step, bool resumed) {
  if (!fault_requested(var, world_rank, step, resumed)) return;
  throw ConfigError(std::string(var) + ": injected error on rank " + std::to_string(world_rank) + " at step " +
                    std::to_string(step));
}

bool fault_requested(const char* var, int world_rank, int step, bool resumed) {
  if (!fault_here(var, world_rank, step, resumed)) return false;
  std::fprintf(stderr, "[rank %d] fault injection (%s): at step %d\n", world_rank, var, step);
  std::fflush(stderr);
  return true;
}

}  // namespace atlas::runtime
