// SPDX-License-Identifier: MIT
// Launchers of the CUDA backend's own kernels (src/device/cuda/kernels/*.cu). Each enqueues on
// `stream`, checks the launch, and returns at once. Pointers are device addresses; shapes and
// semantics are those of the matching device::Backend call. Internal to src/device/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace atlas::device::cuda::kernels {

/// Scalars of one AdamW update (a plain copy of device::AdamWArgs for nvcc-compiled code).
struct AdamW {
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, grad_scale;
};

// ---- element-wise (elementwise.cu) ----
void fill(float* x, float value, std::size_t n, cudaStream_t stream);
void scale(float* x, float alpha, std::size_t n, cudaStream_t stream);
void add(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream);
void add_bias(float* out, const float* bias, int rows, int cols, cudaStream_t stream);
void gelu_forward(float* out, const float* in, std::size_t n, cudaStream_t stream);
void gelu_backward(float* din, const float* in, const float* dout, std::size_t n,
                   cudaStream_t stream);
void adamw(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& args,
           cudaStream_t stream);

// ---- reductions (reduce.cu) ----
/// Blocks sq_norm_partial uses for n elements (the length of its `partial` array).
[[nodiscard]] int sq_norm_blocks(std::size_t n);
/// partial[b] = sum of x[i]^2 over block b's share (double); then out[0] = sum of partial.
void sq_norm(const float* x, std::size_t n, double* partial, double* out, cudaStream_t stream);
/// dbias[c] += sum_r dout[r, c] (double accumulation, fixed order: deterministic).
void bias_grad(float* dbias, const float* dout, int rows, int cols, cudaStream_t stream);

// ---- LayerNorm (layernorm.cu) ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int rows, int cols, cudaStream_t stream);
/// din += ..., dweight += ..., dbias += ... (all accumulate; deterministic).
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                        const float* in, const float* weight, const float* mean,
                        const float* rstd, int rows, int cols, cudaStream_t stream);

// ---- attention softmax (attention.cu); the matrix products are cuBLAS calls ----
/// att is [rows = B*H*T, T] of scaled scores; row r is query t = r % T. In place: causal
/// softmax over t2 <= t, zeros above the diagonal.
void causal_softmax_forward(float* att, int rows, int seq, cudaStream_t stream);
/// datt [rows, T] holds dL/d(probabilities); in place it becomes dL/d(unscaled scores):
/// att * (datt - sum(att * datt)) * scale for t2 <= t, zero above the diagonal.
void causal_softmax_backward(float* datt, const float* att, int rows, int seq, float scale,
                             cudaStream_t stream);

// ---- embedding (embedding.cu) ----
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int batch, int seq, int channels, cudaStream_t stream);
/// dwte via atomicAdd (order of repeated tokens is not fixed); dwpe deterministic.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int batch, int seq, int channels, cudaStream_t stream);

// ---- softmax cross-entropy (xent.cu) ----
/// A target outside [0, vocab), packed for one 64-bit atomicMin: row << 32 | the target's 32
/// bits, so the first bad row wins and carries its own target (the caller reads it later, when
/// the targets buffer may hold other ids). kNoBadTarget (all ones): none.
using BadTarget = unsigned long long;
constexpr BadTarget kNoBadTarget = ~BadTarget{0};
#ifdef __CUDACC__
__device__ __forceinline__ BadTarget pack_bad_target(int row, std::int32_t target) {
  return static_cast<BadTarget>(static_cast<unsigned>(row)) << 32U | static_cast<std::uint32_t>(target);
}
#endif
/// A bad target stores min(pack(row, target)) into *bad (kNoBadTarget before the first) and
/// that row's loss is NaN; nothing is written out of bounds.
void softmax_xent_forward(float* losses, float* probs, const float* logits,
                          const std::int32_t* targets, int rows, int vocab, BadTarget* bad,
                          cudaStream_t stream);
void softmax_xent_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                           int rows, int vocab, float scale, BadTarget* bad, cudaStream_t stream);

// ---- fused kernels (fused.cu) ----
/// One tensor of a multi-tensor table (adamw_multi uses every field, sq_norm_multi only grad).
struct TensorEntry {
  float* param;
  const float* grad;
  float* m;
  float* v;
  float weight_decay;
};
/// A block's share of the table: elements [start, start + count) of tensor `tensor`.
struct Chunk {
  int tensor;
  unsigned count;
  std::size_t start;
};
/// Elements per chunk of a multi-tensor table (one block each).
constexpr std::size_t kChunkElements = 16384;

/// out[i] = bf16(in[i]), round to nearest even (NaN stays NaN).
void to_bf16(__nv_bfloat16* out, const float* in, std::size_t n, cudaStream_t stream);
/// out[i] = the fp32 value of in[i] (exact).
void from_bf16(float* out, const __nv_bfloat16* in, std::size_t n, cudaStream_t stream);
/// Backend::residual_layernorm_forward (bias and ln_out may be null; then mean, rstd unused).
void residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                const float* x, const float* delta, const float* bias,
                                const float* ln_weight, const float* ln_bias, int rows, int cols,
                                cudaStream_t stream);
/// Backend::softmax_xent_fused; bad targets as softmax_xent_forward (through *bad).
void softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                        const std::int32_t* targets, int rows, int vocab, float scale,
                        BadTarget* bad, cudaStream_t stream);
/// AdamW over every chunk of a device-side table, one launch (args.weight_decay unused).
void adamw_multi(const TensorEntry* tensors, const Chunk* chunks, int chunk_count,
                 const AdamW& args, cudaStream_t stream);
/// partial[c] = sum of grad^2 over chunk c (double), then out[0] = their sum in a fixed order.
void sq_norm_multi(const TensorEntry* tensors, const Chunk* chunks, int chunk_count,
                   double* partial, double* out, cudaStream_t stream);

}  // namespace atlas::device::cuda::kernels
