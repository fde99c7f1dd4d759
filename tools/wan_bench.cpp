// SPDX-License-Identifier: MIT
// atlas-wan-bench: the WAN benchmark (atlas::wan::run_wan_bench) as a program of its own, for
// scripts/wan/bench_wan.sh; `atlas bench wan` runs the same function.
#include <cstdio>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/wan/bench.hpp"

int main(int argc, char** argv) {
  atlas::mpi::Environment env(argc, argv, atlas::mpi::ThreadLevel::Funneled);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return atlas::wan::run_wan_bench(env, args);
  } catch (const atlas::ConfigError& e) {
    if (env.world_rank() == 0) std::fprintf(stderr, "atlas-wan-bench: deck error:\n%s\n", e.what());
    return static_cast<int>(atlas::ExitCode::Config);
  } catch (const atlas::Error& e) {
    std::fprintf(stderr, "[rank %d] atlas-wan-bench: %s\n", env.world_rank(), e.what());
    atlas::mpi::Environment::abort(static_cast<int>(e.code()));
  }
}
