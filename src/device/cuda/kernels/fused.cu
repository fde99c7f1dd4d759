// SPDX-License-Identifier: MIT
// Fused kernels of the CUDA backend: fp32 <-> bf16 conversion (GEMM operands, bf16-stored
// activations; RNE one way, exact the other), residual
// add + bias + LayerNorm, softmax cross-entropy loss and gradient in one pass, and the
// multi-tensor AdamW step and squared norm over a device-side chunk table. Formulas follow the
// host backend's unfused calls (docs: Backend's fused calls); not for attention (attention.cu).
#include <cmath>

#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

constexpr float kLnEps = 1e-5F;

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);  // round to nearest even; NaN stays NaN
}

__global__ void from_bf16_kernel(float* out, const __nv_bfloat16* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = __bfloat162float(in[i]);  // exact
}

// One warp per row. res = (x + delta) + bias, rounded as the host's add then add_bias; then the
// LayerNorm of res with statistics in double (as layernorm.cu).
__global__ void residual_layernorm_kernel(float* res, float* ln_out, float* mean, float* rstd,
                                          const float* x, const float* delta, const float* bias,
                                          const float* ln_w, const float* ln_b, int rows,
                                          int cols) {
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;  // uniform per warp
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
  double sum = 0.0;
  for (int c = lane; c < cols; c += kWarp) {
    float v = __fadd_rn(x[off + c], delta[off + c]);
    if (bias != nullptr) v = __fadd_rn(v, bias[c]);
    res[off + c] = v;  // each lane rereads only what it wrote
    sum += v;
  }
  if (ln_out == nullptr) return;
  const double mu = warp_sum(sum) / cols;
  double var = 0.0;
  for (int c = lane; c < cols; c += kWarp) {
    const double d = res[off + c] - mu;
    var += d * d;
  }
  var = warp_sum(var);
  const auto m = static_cast<float>(mu);
  const auto s = static_cast<float>(1.0 / sqrt(var / cols + static_cast<double>(kLnEps)));
  for (int c = lane; c < cols; c += kWarp)
    ln_out[off + c] = (res[off + c] - m) * s * ln_w[c] + ln_b[c];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// One block per row: max, sum of exp (double), then loss and dlogits in one write pass.
// dlogits may alias logits: every thread rewrites only entries it read itself, after the
// block-wide reductions that needed them.
__global__ void softmax_xent_fused_kernel(float* losses, float* dlogits, const float* logits,
                                          const std::int32_t* targets, int vocab, float scale,
                                          BadTarget* bad_target) {
  __shared__ float fshared[kWarpsPerBlock];
  __shared__ double dshared[kWarpsPerBlock];
  const int r = static_cast<int>(blockIdx.x);
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(vocab);
  const float* z = logits + off;
  float* d = dlogits + off;
  float maxv = -INFINITY;
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) maxv = fmaxf(maxv, z[v]);
  maxv = block_max(maxv, fshared);
  double sum = 0.0;
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) sum += expf(z[v] - maxv);
  sum = block_sum(sum, dshared);
  const auto inv = static_cast<float>(1.0 / sum);
  const std::int32_t target = targets[r];
  const bool bad = target < 0 || target >= vocab;
  if (threadIdx.x == 0) {
    if (bad) {
      atomicMin(bad_target, pack_bad_target(r, target));
      losses[r] = NAN;
    } else {
      // log(sum) - (z[t] - max): -log of the normalised p[t] underflows ~88 below the max (a
      // floor on it capped the loss at 69.08 however far a diverging model went).
      losses[r] = static_cast<float>(log(sum) - static_cast<double>(z[target] - maxv));
    }
  }
  __syncthreads();  // thread 0 has read z[target] before anyone overwrites it
  for (int v = static_cast<int>(threadIdx.x); v < vocab; v += kThreads) {
    const float p = __fmul_rn(expf(z[v] - maxv), inv);
    float g = __fmul_rn(p, scale);
    if (v == target) g -= scale;
    d[v] = g;
  }
}

__global__ void adamw_multi_kernel(const TensorEntry* tensors, const Chunk* chunks, AdamW a) {
  const Chunk ch = chunks[blockIdx.x];
  const TensorEntry t = tensors[ch.tensor];
  const std::size_t end = ch.start + ch.count;
  for (std::size_t i = ch.start + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.grad[i] * a.grad_scale;
    const float mi = a.beta1 * t.m[i] + (1.0F - a.beta1) * g;
    const float vi = a.beta2 * t.v[i] + (1.0F - a.beta2) * g * g;
    t.m[i] = mi;
    t.v[i] = vi;
    const float mhat = mi / a.bias_correction1;
    const float vhat = vi / a.bias_correction2;
    const float p = t.param[i];
    t.param[i] = p - a.lr * (mhat / (sqrtf(vhat) + a.eps) + t.weight_decay * p);
  }
}

__global__ void sq_norm_multi_kernel(const TensorEntry* tensors, const Chunk* chunks,
                                     double* partial) {
  __shared__ double shared[kWarpsPerBlock];
  const Chunk ch = chunks[blockIdx.x];
  const float* x = tensors[ch.tensor].grad;
  const std::size_t end = ch.start + ch.count;
  double acc = 0.0;
  for (std::size_t i = ch.start + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace

void to_bf16(__nv_bfloat16* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void from_bf16(float* out, const __nv_bfloat16* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                const float* x, const float* delta, const float* bias,
                                const float* ln_weight, const float* ln_bias, int rows, int cols,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  residual_layernorm_kernel<<<blocks, kThreads, 0, stream>>>(res, ln_out, mean, rstd, x, delta,
                                                             bias, ln_weight, ln_bias, rows, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                        const std::int32_t* targets, int rows, int vocab, float scale,
                        BadTarget* bad, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return;
  softmax_xent_fused_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      losses, dlogits, logits, targets, vocab, scale, bad);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void adamw_multi(const TensorEntry* tensors, const Chunk* chunks, int chunk_count,
                 const AdamW& args, cudaStream_t stream) {
  if (chunk_count == 0) return;
  adamw_multi_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(tensors, chunks,
                                                                                  args);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void sq_norm_multi(const TensorEntry* tensors, const Chunk* chunks, int chunk_count,
                   double* partial, double* out, cudaStream_t stream) {
  if (chunk_count == 0) {
    ATLAS_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  sq_norm_multi_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(tensors,
                                                                                    chunks, partial);
  ATLAS_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<double><<<1, kThreads, 0, stream>>>(partial, chunk_count, out);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
