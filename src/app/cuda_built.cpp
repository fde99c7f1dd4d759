// SPDX-License-Identifier: MIT
// Whether this binary carries the CUDA backend: true exactly when the CUDA object library is
// linked in and has registered its factory (no compile-time switch, so no #if here).
#include "atlas/app/commands.hpp"
#include "atlas/device/backend.hpp"

namespace atlas::app {

bool cuda_built() { return device::backend_available(atlas::Backend::Cuda); }

}  // namespace atlas::app
