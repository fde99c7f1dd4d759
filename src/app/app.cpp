// SPDX-License-Identifier: MIT
// Subcommand table and top-level error handling.
#include "atlas/app/app.hpp"

#include <cstdio>

namespace atlas::app {

int run_app(mpi::Environment& env, int argc, char** argv) {
  (void)env;
  (void)argv;
  if (argc < 2) {
    std::fprintf(stderr, "usage: atlas <train|plan|simulate|schedule|report|bench|profile> ...\n");
    return 1;
  }
  return 0;
}

}  // namespace atlas::app
