// SPDX-License-Identifier: MIT
// The CUDA backend's causal attention: the fused flash kernel (kernels/flash_attention.cu; fp32
// or bf16 numerics, memory linear in seq_len) and the unfused reference (cuBLAS strided-batched
// GEMMs around the softmax kernels of attention.cu, a [B,H,T,T] probability tensor), which runs
// when AttentionOptions::fused is off and for head_dim > kFlashMaxHeadDim. docs/attention.md.
#include <cmath>
#include <mutex>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "cuda_backend_impl.hpp"
#include "flash_attention.hpp"
#include "kernels.hpp"

namespace atlas::device::cuda {

namespace {

std::size_t square_floats(int batch, int seq, int heads) {
  return kernels::flash_row_floats(batch, seq, heads) * static_cast<std::size_t>(seq);
}

}  // namespace

bool CudaBackend::fused_attention(int head_dim) const {
  if (!m_attention.fused) return false;
  if (kernels::flash_supports(head_dim)) {
    const kernels::FlashFit fit =
        kernels::flash_fit(head_dim, m_attention.bf16 ? kernels::AttentionMath::Bf16 : kernels::AttentionMath::Fp32);
    if (fit.fits()) return true;
    // sm_86/sm_89 (A10, L4, RTX 30/40) offer 99 KiB a block: fp32 tiles at head_dim 33-128 need more.
    static std::once_flag small;
    std::call_once(small, [head_dim, fit, this] {
      log::info("note: the fused attention of head_dim {} at {} needs {} bytes of shared memory per block, this GPU "
                "offers {}: the cuda backend runs the unfused attention (a [B,H,T,T] probability tensor per "
                "layer; device.precision = bf16 uses smaller tiles; docs/attention.md)",
                head_dim, m_attention.bf16 ? "bf16" : "fp32", fit.needed, fit.offered);
    });
    return false;
  }
  static std::once_flag noted;
  std::call_once(noted, [head_dim] {
    log::info("note: attention head_dim {} is above the fused kernel's {}: the cuda backend runs "
              "the unfused fp32 attention (a [B,H,T,T] probability tensor per layer; "
              "docs/attention.md)",
              head_dim, kernels::kFlashMaxHeadDim);
  });
  return false;
}

std::size_t CudaBackend::attention_saved_floats(int batch, int seq, int heads,
                                                int head_dim) const {
  return fused_attention(head_dim) ? kernels::flash_row_floats(batch, seq, heads)
                                   : square_floats(batch, seq, heads);
}

std::size_t CudaBackend::attention_workspace_floats(int batch, int seq, int heads,
                                                    int head_dim) const {
  return fused_attention(head_dim) ? kernels::flash_row_floats(batch, seq, heads)
                                   : square_floats(batch, seq, heads);
}

void CudaBackend::attention_forward(float* out, float* saved, const float* qkv, int batch,
                                    int seq, int heads, int head_dim, float* /*workspace*/) {
  if (!fused_attention(head_dim)) {
    attention_forward_unfused(out, saved, qkv, batch, seq, heads, head_dim);
    return;
  }
  kernels::flash_attention_forward(
      out, saved, qkv, batch, seq, heads, head_dim,
      m_attention.bf16 ? kernels::AttentionMath::Bf16 : kernels::AttentionMath::Fp32,
      m_stream.get());
}

void CudaBackend::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                     const float* out, const float* saved, int batch, int seq,
                                     int heads, int head_dim, float* workspace) {
  if (!fused_attention(head_dim)) {
    attention_backward_unfused(dqkv, dout, qkv, saved, batch, seq, heads, head_dim, workspace);
    return;
  }
  ATLAS_ASSERT(workspace != nullptr || kernels::flash_row_floats(batch, seq, heads) == 0,
               "attention_backward on the cuda backend needs attention_workspace_floats() = "
                   << kernels::flash_row_floats(batch, seq, heads) << " floats of workspace");
  kernels::flash_attention_backward(
      dqkv, workspace, dout, qkv, out, saved, batch, seq, heads, head_dim,
      m_attention.bf16 ? kernels::AttentionMath::Bf16 : kernels::AttentionMath::Fp32,
      m_stream.get());
}

// ---- the unfused reference ----

// qkv [B,T,3,H,D]: head h of sample b is a T x D matrix with row stride 3HD starting at
// qkv + b*T*3HD + h*D (queries), + HD (keys), + 2HD (values); consecutive heads are D apart, so
// one strided-batched GEMM per sample covers all H heads.
void CudaBackend::attention_forward_unfused(float* out, float* saved, const float* qkv,
                                            int batch, int seq, int heads, int head_dim) {
  const int t = seq;
  const int d = head_dim;
  const long long row = 3LL * heads * d;
  const long long orow = static_cast<long long>(heads) * d;
  const long long tt = static_cast<long long>(t) * t;
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + b * t * row;
    // scores = scale * Q K^T for every (t, t2); the softmax masks t2 > t.
    gemm_batched(Trans::No, Trans::Yes, t, t, d, scale, q, static_cast<int>(row), d, q + orow,
                 static_cast<int>(row), d, 0.0F, saved + b * heads * tt, t, tt, heads);
  }
  kernels::causal_softmax_forward(saved, batch * heads * t, t, m_stream.get());
  for (int b = 0; b < batch; ++b) {
    const float* v = qkv + b * t * row + 2 * orow;
    // out_h = P_h V_h into out [B,T,H,D]
    gemm_batched(Trans::No, Trans::No, t, d, t, 1.0F, saved + b * heads * tt, t, tt, v,
                 static_cast<int>(row), d, 0.0F, out + b * t * orow, static_cast<int>(orow), d,
                 heads);
  }
}

void CudaBackend::attention_backward_unfused(float* dqkv, const float* dout, const float* qkv,
                                             const float* saved, int batch, int seq, int heads,
                                             int head_dim, float* workspace) {
  const int t = seq;
  const int d = head_dim;
  const long long row = 3LL * heads * d;
  const long long orow = static_cast<long long>(heads) * d;
  const long long tt = static_cast<long long>(t) * t;
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  ATLAS_ASSERT(workspace != nullptr || batch * heads * tt == 0,
               "attention_backward on the cuda backend needs attention_workspace_floats() = "
                   << batch * heads * tt << " floats of workspace");
  for (int b = 0; b < batch; ++b) {
    const float* v = qkv + b * t * row + 2 * orow;
    const float* p = saved + b * heads * tt;
    const float* dy = dout + b * t * orow;
    float* dv = dqkv + b * t * row + 2 * orow;
    // dV_h = P_h^T dY_h (overwrites the value slice of dqkv)
    gemm_batched(Trans::Yes, Trans::No, t, d, t, 1.0F, p, t, tt, dy, static_cast<int>(orow), d,
                 0.0F, dv, static_cast<int>(row), d, heads);
    // dP_h = dY_h V_h^T
    gemm_batched(Trans::No, Trans::Yes, t, t, d, 1.0F, dy, static_cast<int>(orow), d, v,
                 static_cast<int>(row), d, 0.0F, workspace + b * heads * tt, t, tt, heads);
  }
  // dS = P * (dP - rowsum(P * dP)) * scale, in place in the workspace
  kernels::causal_softmax_backward(workspace, saved, batch * heads * t, t, scale, m_stream.get());
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + b * t * row;
    const float* ds = workspace + b * heads * tt;
    float* dq = dqkv + b * t * row;
    // dQ_h = dS_h K_h, dK_h = dS_h^T Q_h (overwrite the query and key slices)
    gemm_batched(Trans::No, Trans::No, t, d, t, 1.0F, ds, t, tt, q + orow, static_cast<int>(row),
                 d, 0.0F, dq, static_cast<int>(row), d, heads);
    gemm_batched(Trans::Yes, Trans::No, t, d, t, 1.0F, ds, t, tt, q, static_cast<int>(row), d,
                 0.0F, dq + orow, static_cast<int>(row), d, heads);
  }
}

}  // namespace atlas::device::cuda
