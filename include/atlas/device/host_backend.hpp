// SPDX-License-Identifier: MIT
// The host backend: OpenBLAS cblas_sgemm for matrix products, plain C++ with OpenMP for the rest.
// The reference implementation every other backend is compared against.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atlas/device/backend.hpp"

namespace atlas::device {

/// Host threads for a rank: `requested` if > 0, else hardware threads / ranks on this node
/// (OMPI_COMM_WORLD_LOCAL_SIZE, 1 if unset), at least 1.
[[nodiscard]] int resolve_host_threads(int requested);

/// Ranks that share this machine's cores: ATLAS_HOST_RANKS (set by scripts/wan/run_emulated.sh,
/// whose namespaces Open MPI counts as nodes of their own), else the MPI node-local size, else 1.
[[nodiscard]] int host_local_ranks();

/// Call first in main, before MPI or any thread starts. When more ranks share this machine than
/// it has hardware threads (ATLAS_HOST_RANKS, else the MPI node-local size), the process switches
/// to SCHED_BATCH: a rank waking from a poll then no longer preempts a rank that computes (measured
/// on the default deck, 8 ranks on 2 cores: 182-184 -> 168-169 ms a step), and every thread started
/// later inherits it (`mode` Auto). The deck key device.sched_batch chooses: make_backend calls it
/// again with the deck's mode when that is not auto (false: back to the default policy, true:
/// SCHED_BATCH). Returns a line for the run's header, "" when SCHED_BATCH is not in force.
std::string prepare_host_scheduling(SchedBatch mode = SchedBatch::Auto);
/// What prepare_host_scheduling did ("" if nothing or not called).
[[nodiscard]] const std::string& host_scheduling_note();
/// "BOOT_ID AUTOGROUP" of this process when kernel.sched_autogroup_enabled = 1 (every session a
/// scheduling group of its own), else "".
[[nodiscard]] std::string scheduling_group();
/// Given every rank's scheduling_group(): a run-header note for `rank` when the ranks on its
/// machine fill its hardware threads and sit in more than one autogroup, else "".
[[nodiscard]] std::string autogroup_note(const std::vector<std::string>& groups, int rank);

/// A host backend running `threads` OpenMP threads (0 = resolve_host_threads(0)). Also sets the
/// OpenBLAS thread count of this process to the same number. `precision` (resolved, not Auto):
/// Fp32 is the reference; Bf16 / Tf32 emulate the GPU's matmul numerics (docs/precision.md): every
/// gemm operand and the attention's matmul operands rounded round-to-nearest-even into scratch
/// the backend keeps, products and sums in fp32, storage fp32.
[[nodiscard]] std::unique_ptr<Backend> make_host_backend(int threads, Precision precision = Precision::Fp32);

}  // namespace atlas::device
