// SPDX-License-Identifier: MIT
// Device helpers shared by the kernels: launch geometry, warp and block reductions.
#pragma once

#include <cstddef>

#include "cuda_check.hpp"

namespace atlas::device::cuda::kernels {

constexpr int kThreads = 256;      // threads per block of the 1-D kernels
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffU;

/// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  constexpr std::size_t kMaxBlocks = 65535;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

/// Sum over a block of kThreads threads; every thread gets the result. `shared` holds
/// kWarpsPerBlock elements. Ends with a barrier, so `shared` may be reused right after.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) total += shared[w];
  __syncthreads();
  return total;
}

/// One block of kThreads threads adds `count` partial sums in a fixed order (deterministic) into
/// out[0]. A template so that every kernel file may launch it (kernels do not link across files).
template <class T>
__global__ void sum_partials_kernel(const T* partial, int count, T* out) {
  __shared__ T shared[kWarpsPerBlock];
  T acc = 0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) out[0] = acc;
}

/// Max over a block of kThreads threads; every thread gets the result.
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) m = fmaxf(m, shared[w]);
  __syncthreads();
  return m;
}

}  // namespace atlas::device::cuda::kernels
