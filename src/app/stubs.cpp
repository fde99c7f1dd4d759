// SPDX-License-Identifier: MIT
// Build facts the subcommands need (the CUDA build replaces this answer).
#include "atlas/app/commands.hpp"

namespace atlas::app {

bool cuda_built() { return false; }

}  // namespace atlas::app
