// SPDX-License-Identifier: MIT
// Subcommands whose rooms have not landed yet: each says so and exits with a usage error.
#include "atlas/app/commands.hpp"

namespace atlas::app {

namespace {
int not_yet(const char* name) {
  throw UsageError(std::string("atlas ") + name + " is not available in this build yet");
}
}  // namespace

int cmd_plan(Context&) { return not_yet("plan"); }
int cmd_simulate(Context&) { return not_yet("simulate"); }
int cmd_profile(Context&) { return not_yet("profile"); }

}  // namespace atlas::app
