// SPDX-License-Identifier: MIT
// Reductions: the squared norm (two passes, double accumulation, a fixed block count so the
// result does not depend on timing) and per-column sums (bias gradient) with a fixed row order.
#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

constexpr int kNormMaxBlocks = 1024;
constexpr int kColTile = 32;  // columns per block of the column reductions
constexpr int kRowLanes = 8;  // threads per column, striding over rows

__global__ void sq_norm_partial_kernel(const float* x, std::size_t n, double* partial) {
  __shared__ double shared[kWarpsPerBlock];
  double acc = 0.0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Block (kColTile, kRowLanes): thread (tx, ty) sums rows ty, ty + kRowLanes, ... of column
// blockIdx.x * kColTile + tx; the kRowLanes partial sums are then added in a fixed order.
__global__ void column_sum_kernel(float* dbias, const float* dout, int rows, int cols) {
  __shared__ double partial[kRowLanes][kColTile + 1];
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int c = static_cast<int>(blockIdx.x) * kColTile + tx;
  double acc = 0.0;
  if (c < cols) {
    for (int r = ty; r < rows; r += kRowLanes)
      acc += dout[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + c];
  }
  partial[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < cols) {
    double total = 0.0;
    for (int k = 0; k < kRowLanes; ++k) total += partial[k][tx];
    dbias[c] += static_cast<float>(total);
  }
}

}  // namespace

int sq_norm_blocks(std::size_t n) {
  const std::size_t want = (n + kThreads - 1) / kThreads;
  return static_cast<int>(want == 0 ? 1 : (want < kNormMaxBlocks ? want : kNormMaxBlocks));
}

void sq_norm(const float* x, std::size_t n, double* partial, double* out, cudaStream_t stream) {
  const int blocks = sq_norm_blocks(n);
  sq_norm_partial_kernel<<<blocks, kThreads, 0, stream>>>(x, n, partial);
  ATLAS_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<double><<<1, kThreads, 0, stream>>>(partial, blocks, out);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void bias_grad(float* dbias, const float* dout, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile));
  column_sum_kernel<<<grid, block, 0, stream>>>(dbias, dout, rows, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
