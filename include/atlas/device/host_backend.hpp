// SPDX-License-Identifier: MIT
// The host backend: OpenBLAS cblas_sgemm for matrix products, plain C++ with OpenMP for the rest.
// The reference implementation every other backend is compared against.
#pragma once

#include <memory>

#include "atlas/device/backend.hpp"

namespace atlas::device {

/// Host threads for a rank: `requested` if > 0, else hardware threads / ranks on this node
/// (OMPI_COMM_WORLD_LOCAL_SIZE, 1 if unset), at least 1.
[[nodiscard]] int resolve_host_threads(int requested);

/// A host backend running `threads` OpenMP threads (0 = resolve_host_threads(0)). Also sets the
/// OpenBLAS thread count of this process to the same number.
[[nodiscard]] std::unique_ptr<Backend> make_host_backend(int threads);

}  // namespace atlas::device
