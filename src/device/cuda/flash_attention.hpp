// SPDX-License-Identifier: MIT
// Launchers of the fused causal attention (kernels/flash_attention.cu, docs/attention.md): tiles
// in shared memory, online softmax, only the log-sum-exp saved; the backward recomputes the
// probabilities. Internal to src/device/cuda/; the unfused path is in kernels.hpp.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace atlas::device::cuda::kernels {

/// Numerics of the fused kernels (one code path): Fp32 = fp32 FMA throughout; Bf16 = q, k, v,
/// dout, P and dS rounded to bf16 (RNE) as tensor-core operands, fp32 accumulation and softmax
/// (the contract of docs/precision.md).
enum class AttentionMath { Fp32, Bf16 };

/// Largest head_dim the fused kernels take; heads are zero-padded to 32, 64 or 128 columns.
constexpr int kFlashMaxHeadDim = 128;

/// True if the fused kernels take `head_dim` (1 .. kFlashMaxHeadDim).
[[nodiscard]] constexpr bool flash_supports(int head_dim) noexcept {
  return head_dim >= 1 && head_dim <= kFlashMaxHeadDim;
}

/// Floats the fused forward saves (the log-sum-exp [B,H,T]) and the fused backward's scratch
/// (D = rowsum(dout * out), [B,H,T]): linear in seq.
[[nodiscard]] constexpr std::size_t flash_row_floats(int batch, int seq, int heads) noexcept {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(heads) *
         static_cast<std::size_t>(seq);
}

/// Whether this GPU (the current device) gives a block the shared memory the fused kernels need
/// for `head_dim` at `math`: `needed` and `offered` bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin,
/// read once per device). fp32 tiles at head_dim 33-128 do not fit sm_86/sm_89 GPUs.
struct FlashFit {
  std::size_t needed = 0;
  std::size_t offered = 0;
  [[nodiscard]] bool fits() const noexcept { return needed <= offered; }
};
[[nodiscard]] FlashFit flash_fit(int head_dim, AttentionMath math);

/// out [B,T,H,D] and lse [B,H,T] (log-sum-exp of each query's scaled, masked scores) from
/// qkv [B,T,3,H,D]; causal, scale 1/sqrt(D). Requires flash_supports(head_dim).
void flash_attention_forward(float* out, float* lse, const float* qkv, int batch, int seq,
                             int heads, int head_dim, AttentionMath math, cudaStream_t stream);

/// dqkv [B,T,3,H,D] OVERWRITTEN with dL/dqkv from dout [B,T,H,D], given the forward's qkv, out
/// and lse. `delta` is scratch of flash_row_floats() floats. dK and dV are written once by the
/// block owning their key tile (deterministic); dQ is summed over key tiles with atomicAdd (the
/// order of those fp32 additions is not fixed).
void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int batch, int seq, int heads,
                              int head_dim, AttentionMath math, cudaStream_t stream);

}  // namespace atlas::device::cuda::kernels
