// SPDX-License-Identifier: MIT
// The row-wise halves of the UNFUSED causal attention (the fp32 reference, and the path for
// head_dim > 128): the masked softmax of the scaled scores (forward) and the softmax backward.
// The matrix products around them are cuBLAS strided-batched GEMMs issued by the backend
// (cuda_attention.cpp). One warp per query row. The fused kernel: flash_attention*.
#include <cmath>

#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

__global__ void causal_softmax_forward_kernel(float* att, int rows, int seq) {
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;  // uniform per warp
  const int t = r % seq;
  float* row = att + static_cast<std::size_t>(r) * static_cast<std::size_t>(seq);
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += kWarp) maxv = fmaxf(maxv, row[t2]);
  maxv = warp_max(maxv);
  float sum = 0.0F;
  for (int t2 = lane; t2 <= t; t2 += kWarp) {
    const float e = expf(row[t2] - maxv);
    row[t2] = e;
    sum += e;
  }
  const float inv = 1.0F / warp_sum(sum);
  for (int t2 = lane; t2 < seq; t2 += kWarp) row[t2] = t2 <= t ? row[t2] * inv : 0.0F;
}

__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int rows, int seq,
                                               float scale) {
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;
  const int t = r % seq;
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(seq);
  const float* p = att + off;
  float* d = datt + off;
  float weighted = 0.0F;
  for (int t2 = lane; t2 <= t; t2 += kWarp) weighted += p[t2] * d[t2];
  weighted = warp_sum(weighted);
  for (int t2 = lane; t2 < seq; t2 += kWarp) d[t2] = t2 <= t ? p[t2] * (d[t2] - weighted) * scale : 0.0F;
}

unsigned row_blocks(int rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void causal_softmax_forward(float* att, int rows, int seq, cudaStream_t stream) {
  if (rows == 0 || seq == 0) return;
  causal_softmax_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(att, rows, seq);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(float* datt, const float* att, int rows, int seq, float scale,
                             cudaStream_t stream) {
  if (rows == 0 || seq == 0) return;
  causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(datt, att, rows, seq,
                                                                            scale);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
