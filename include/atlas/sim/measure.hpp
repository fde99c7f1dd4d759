// SPDX-License-Identifier: MIT
// `atlas profile`'s measurement: time one transformer block's forward and backward on this
// machine, for a set of shapes, into a device profile's measured table. The timer is pluggable:
// the default times the block's GEMMs with OpenBLAS sgemm; the model room can later pass a
// timer that runs its real block forward/backward.
#pragma once

#include <functional>
#include <vector>

#include "atlas/sim/profile.hpp"

namespace atlas::sim {

struct BlockShape {
  int hidden = 0;
  int heads = 0;
  int seq_len = 0;
  int micro_batch_size = 1;
  int tp = 1;  ///< the block's matrices split over tp ranks; this rank computes 1/tp
};

struct BlockTiming {
  double fwd_ms = 0.0;  ///< one micro-batch through the block on this rank
  double bwd_ms = 0.0;
};

/// Times one block of `shape` (forward, backward) in milliseconds. Must not throw for a valid
/// shape; may throw atlas::Error if it cannot run one (e.g. out of memory).
using BlockTimer = std::function<BlockTiming(const BlockShape&)>;

/// The default timer: the block's GEMMs with OpenBLAS sgemm (QKV, attention scores and values
/// per head, output projection, MLP up and down; backward = two GEMMs per forward GEMM), the
/// median of `repeats` runs after one warm-up. Elementwise work (softmax, norms, GELU) is not
/// timed. `threads` > 0 sets OpenBLAS's thread count (process-wide: openblas_set_num_threads)
/// before each measurement. Not thread-safe; one process, no MPI.
BlockTimer sgemm_block_timer(int repeats = 3, int threads = 1);

/// Shapes `atlas profile` measures (quick: a smaller, faster set for tests).
std::vector<BlockShape> default_host_shapes(bool quick);

/// `base` (name, memory, bandwidths, sources) with a measured table from `timer` over `shapes`;
/// peak_tflops becomes the best measured forward rate and achievable_fraction 1.
DeviceProfile measure_device_profile(const BlockTimer& timer, const std::vector<BlockShape>& shapes,
                                     DeviceProfile base);

/// This machine's memory in GiB (MemTotal of /proc/meminfo), 0 if unknown.
double host_memory_gib();

}  // namespace atlas::sim
