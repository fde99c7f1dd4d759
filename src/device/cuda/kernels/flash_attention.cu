// SPDX-License-Identifier: MIT
// Fused causal attention, forward and backward, in the manner of flash-attention 2: Q/K/V tiles
// in shared memory, an online softmax, only the log-sum-exp kept; the backward recomputes the
// probabilities from it. One code path, two numerics: fp32 FMA, or bf16 tensor cores (wmma) with
// fp32 accumulation. This file: the launchers (tile sizes per head dim, shared memory opt-in);
// the kernels are in flash_attention_kernels.cuh. Not here: the unfused reference (attention.cu).
#include <cmath>
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "atlas/core/check.hpp"
#include "flash_attention.hpp"
#include "flash_attention_kernels.cuh"

namespace atlas::device::cuda::kernels {

namespace {

using flash::bf16;

// ---- launchers ----

/// Dynamic shared memory beyond the 48 KiB default must be opted into per kernel and device;
/// done once per (kernel, device), so later launches (and CUDA graph captures) make no such call.
/// Fails with a clear message if the device offers less than `bytes`.
template <class Kernel>
void allow_shared(Kernel kernel, std::size_t bytes, const char* what) {
  int device = 0;
  ATLAS_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({reinterpret_cast<const void*>(kernel), device}) != 0) return;
  int optin = 0;
  ATLAS_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(optin))
    ATLAS_THROW(Device, what << " needs " << bytes << " bytes of shared memory per block; device "
                             << device << " offers " << optin
                             << " (CudaBackend::fused_attention checks flash_fit first: a bug)\n  hint: device.precision "
                                "= bf16 (smaller tiles), or the unfused attention (docs/attention.md)");
  ATLAS_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done.insert({reinterpret_cast<const void*>(kernel), device});
}

template <class E, int Dp>
void forward_as(float* out, float* lse, const float* qkv, int batch, int seq, int heads,
                int head_dim, cudaStream_t stream) {
  using F = flash::ForwardLaunch<E, Dp>;
  auto* kernel = F::kernel();
  allow_shared(kernel, F::Layout::kBytes, "the fused attention forward");
  kernel<<<F::grid(batch, seq, heads), F::kThreadsPerBlock, F::Layout::kBytes, stream>>>(
      out, lse, qkv, seq, heads, head_dim, flash::attention_scale(head_dim));
  ATLAS_CUDA_CHECK_LAUNCH();
}

template <class E, int Dp>
void backward_as(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out,
                 const float* lse, int batch, int seq, int heads, int head_dim,
                 cudaStream_t stream) {
  using B = flash::BackwardLaunch<E, Dp>;
  const int rows = batch * seq * heads;
  B::prep_kernel()<<<B::prep_grid(rows), B::kPrepThreads, 0, stream>>>(delta, dqkv, dout, out,
                                                                      rows, seq, heads, head_dim);
  ATLAS_CUDA_CHECK_LAUNCH();
  auto* kernel = B::kernel();
  allow_shared(kernel, B::Layout::kBytes, "the fused attention backward");
  kernel<<<B::grid(batch, seq, heads), B::kThreadsPerBlock, B::Layout::kBytes, stream>>>(
      dqkv, dout, qkv, lse, delta, seq, heads, head_dim, flash::attention_scale(head_dim));
  ATLAS_CUDA_CHECK_LAUNCH();
}

template <class E>
void forward_padded(float* out, float* lse, const float* qkv, int batch, int seq, int heads,
                    int head_dim, cudaStream_t stream) {
  if (head_dim <= 32) return forward_as<E, 32>(out, lse, qkv, batch, seq, heads, head_dim, stream);
  if (head_dim <= 64) return forward_as<E, 64>(out, lse, qkv, batch, seq, heads, head_dim, stream);
  forward_as<E, 128>(out, lse, qkv, batch, seq, heads, head_dim, stream);
}

template <class E>
void backward_padded(float* dqkv, float* delta, const float* dout, const float* qkv,
                     const float* out, const float* lse, int batch, int seq, int heads,
                     int head_dim, cudaStream_t stream) {
  if (head_dim <= 32)
    return backward_as<E, 32>(dqkv, delta, dout, qkv, out, lse, batch, seq, heads, head_dim, stream);
  if (head_dim <= 64)
    return backward_as<E, 64>(dqkv, delta, dout, qkv, out, lse, batch, seq, heads, head_dim, stream);
  backward_as<E, 128>(dqkv, delta, dout, qkv, out, lse, batch, seq, heads, head_dim, stream);
}

}  // namespace

FlashFit flash_fit(int head_dim, AttentionMath math) {
  int device = 0;
  ATLAS_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int> optin_of;  // per device: a device attribute, read once
  int optin = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = optin_of.find(device);
    if (it == optin_of.end()) {
      ATLAS_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      it = optin_of.emplace(device, optin).first;
    }
    optin = it->second;
  }
  return {math == AttentionMath::Bf16 ? flash::shared_bytes<bf16>(head_dim) : flash::shared_bytes<float>(head_dim),
          static_cast<std::size_t>(optin)};
}

void flash_attention_forward(float* out, float* lse, const float* qkv, int batch, int seq,
                             int heads, int head_dim, AttentionMath math, cudaStream_t stream) {
  ATLAS_ASSERT(flash_supports(head_dim), "fused attention called with head_dim " << head_dim
                                             << " (supported: 1.." << kFlashMaxHeadDim << ")");
  if (batch == 0 || seq == 0 || heads == 0) return;
  if (math == AttentionMath::Bf16) {
    forward_padded<bf16>(out, lse, qkv, batch, seq, heads, head_dim, stream);
  } else {
    forward_padded<float>(out, lse, qkv, batch, seq, heads, head_dim, stream);
  }
}

void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int batch, int seq, int heads,
                              int head_dim, AttentionMath math, cudaStream_t stream) {
  ATLAS_ASSERT(flash_supports(head_dim), "fused attention called with head_dim " << head_dim
                                             << " (supported: 1.." << kFlashMaxHeadDim << ")");
  if (batch == 0 || seq == 0 || heads == 0) return;
  if (math == AttentionMath::Bf16) {
    backward_padded<bf16>(dqkv, delta, dout, qkv, out, lse, batch, seq, heads, head_dim, stream);
  } else {
    backward_padded<float>(dqkv, delta, dout, qkv, out, lse, batch, seq, heads, head_dim, stream);
  }
}

}  // namespace atlas::device::cuda::kernels
