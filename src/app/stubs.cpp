// SPDX-License-Identifier: MIT
// Subcommands whose rooms have not landed yet: each says so and exits with a usage error.
#include "atlas/app/commands.hpp"

namespace atlas::app {

namespace {
int not_yet(const char* name) {
  throw UsageError(std::string("atlas ") + name + " is not available in this build yet");
}
}  // namespace

bool cuda_built() { return false; }
int cmd_train(Context&) { return not_yet("train"); }
int cmd_report(Context&) { return not_yet("report"); }
int cmd_bench(Context&) { return not_yet("bench"); }

}  // namespace atlas::app
