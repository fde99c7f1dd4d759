// SPDX-License-Identifier: MIT
// Softmax cross-entropy forward (one block per row: max, exp with a double sum as on the host,
// normalise, loss) and backward (element-wise). A target outside the vocabulary is reported
// through *bad (row and target packed) instead of indexing out of bounds; the backend turns it
// into an error at its next synchronisation.
#include <cmath>

#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

__global__ void softmax_xent_forward_kernel(float* losses, float* probs, const float* logits,
                                            const std::int32_t* targets, int vocab,
                                            BadTarget* bad) {
  __shared__ float fshared[kWarpsPerBlock];
  __shared__ double dshared[kWarpsPerBlock];
  const int r = static_cast<int>(blockIdx.x);
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(vocab);
  const float* z = logits + off;
  float* p = probs + off;  // may alias z: every thread only rewrites the entries it read
  float maxv = -INFINITY;
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) maxv = fmaxf(maxv, z[v]);
  maxv = block_max(maxv, fshared);
  // The target's shifted logit, kept before p (which may alias z) overwrites it: the loss is
  // log(sum) - (z[t] - max), not -log of the normalised p[t], which underflows to 0 ~88 below the
  // max (a floor on it capped the loss at 69.08 however far a diverging model went).
  __shared__ float zt;
  const std::int32_t target_r = targets[r];
  double sum = 0.0;
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) {
    if (v == target_r) zt = z[v] - maxv;
    const float e = expf(z[v] - maxv);
    p[v] = e;
    sum += e;
  }
  sum = block_sum(sum, dshared);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) p[v] *= inv;
  __syncthreads();  // thread 0 reads an entry another thread normalised
  if (threadIdx.x == 0) {
    const std::int32_t target = targets[r];
    if (target < 0 || target >= vocab) {
      atomicMin(bad, pack_bad_target(r, target));
      losses[r] = NAN;
    } else {
      losses[r] = static_cast<float>(log(sum) - static_cast<double>(zt));
    }
  }
}

__global__ void softmax_xent_backward_kernel(float* dlogits, const float* probs,
                                             const std::int32_t* targets, std::size_t n,
                                             int vocab, float scale, BadTarget* bad) {
  const auto cols = static_cast<std::size_t>(vocab);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = i / cols;
    const auto v = static_cast<int>(i % cols);
    const std::int32_t target = targets[r];
    // __fmul_rn: no fused multiply-add, so the result rounds exactly as the host's two steps.
    float d = __fmul_rn(probs[i], scale);
    if (v == target) d -= scale;
    if (v == 0 && (target < 0 || target >= vocab)) atomicMin(bad, pack_bad_target(static_cast<int>(r), target));
    dlogits[i] = d;
  }
}

}  // namespace

void softmax_xent_forward(float* losses, float* probs, const float* logits,
                          const std::int32_t* targets, int rows, int vocab, BadTarget* bad,
                          cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return;
  softmax_xent_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      losses, probs, logits, targets, vocab, bad);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void softmax_xent_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                           int rows, int vocab, float scale, BadTarget* bad, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab);
  if (n == 0) return;
  softmax_xent_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dlogits, probs, targets, n,
                                                                     vocab, scale, bad);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
