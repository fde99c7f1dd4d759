// SPDX-License-Identifier: MIT
// cuBLASLt GEMMs of the CUDA backend at the run's precision: fp32 (exact fp32, no TF32), tf32
// (CUBLAS_COMPUTE_32F_FAST_TF32 on the fp32 operands) or bf16 (both operands rounded to bf16,
// RNE, into reusable workspaces; fp32 accumulation and fp32 output), with the bias, GELU and
// bias-gradient epilogues. Descriptors, layouts and the chosen algorithm are cached per shape.
// Internal to src/device/cuda/; not for the attention GEMMs (attention.cu / H3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "cuda_handles.hpp"

namespace atlas::device::cuda {

/// The epilogue of one LtGemm call (row-major terms, C[m, n] = op(A)[m, k] op(B)[k, n]).
enum class Epilogue {
  None,         ///< D = alpha op(A) op(B) + beta C
  Bias,         ///< D[i, j] = ... + bias[j]
  GeluAuxBias,  ///< aux[i, j] = ... + bias[j] (written); D = gelu(aux) (tanh approximation)
  Dgelu,        ///< D = (alpha op(A) op(B)) * gelu'(aux) (aux read; beta must be 0)
  BgradA,       ///< D as None; bias_grad[i] = sum_k op(A)[i, k] (written, not accumulated)
};

/// One row-major GEMM with an epilogue. Pointers are device addresses.
struct LtCall {
  Trans trans_a = Trans::No;
  Trans trans_b = Trans::No;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0F;
  const float* a = nullptr;
  int lda = 0;
  const float* b = nullptr;
  int ldb = 0;
  float beta = 0.0F;
  float* c = nullptr;
  int ldc = 0;
  Epilogue epilogue = Epilogue::None;
  const float* bias = nullptr;  ///< Bias, GeluAuxBias: n elements
  float* bias_grad = nullptr;   ///< BgradA: m elements
  float* aux = nullptr;         ///< GeluAuxBias (written) / Dgelu (read): [m, n], row stride ldc
  /// B is a weight: at bf16 its converted copy is kept (per address and extent) and reused
  /// until invalidate() covers it.
  bool cache_b = false;
  /// B already stored as bf16 (bf16 precision only): read as it is (no conversion), and `b`
  /// is ignored. Backend::gemm_bf16_b / linear_backward_bf16_in (bf16-stored activations).
  const __nv_bfloat16* b_bf16 = nullptr;
  /// A already stored as bf16 (bf16 precision only), as b_bf16; `a` and reuse_a are ignored.
  const __nv_bfloat16* a_bf16 = nullptr;
  /// A (same address and extent) is unchanged since the previous run() converted it: its bf16
  /// workspace copy is reused (linear_backward's two GEMMs on dout).
  bool reuse_a = false;
};

class LtGemm {
 public:
  /// Issues on `stream`; `cublas` (bound to the same stream) serves plain GEMMs cuBLASLt has no
  /// algorithm for.
  LtGemm(cudaStream_t stream, cublasHandle_t cublas, Precision precision);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  [[nodiscard]] Precision precision() const noexcept { return m_precision; }
  /// Issues the GEMM on the stream. Returns false, having issued nothing, when cuBLASLt offers no
  /// algorithm for this shape and epilogue (the caller then composes unfused calls), or k = 0.
  /// A plain (Epilogue::None) call with k > 0 always runs: where cuBLASLt has no algorithm it
  /// goes through cublasGemmEx on the same operands and compute type.
  bool run(const LtCall& call);
  /// Marks every cached bf16 weight copy overlapping [ptr, ptr + bytes) stale (the backend calls
  /// this for every write it makes: upload, copy, fill, scale, AdamW, collective sums); a stale
  /// copy is converted again, in place, at its next use. `release` = true (the memory is being
  /// freed) frees the copies instead.
  void invalidate(const void* ptr, std::size_t bytes, bool release = false) noexcept;
  /// Bytes of cached bf16 weight copies (tests).
  [[nodiscard]] std::size_t cached_bytes() const noexcept;
  /// Calls with an epilogue that returned false so far (the GPU tests print it).
  [[nodiscard]] long fallbacks() const noexcept { return m_fallbacks; }

  // ---- graph recording (CudaBackend::begin_capture ... end_capture) ----
  /// While on, a call that would allocate, move a workspace or convert a weight throws
  /// atlas::Error (Internal), and an invalidate() of a cached weight copy is remembered
  /// (capture_violation): a replay would not repeat it. Turning it on clears the violation.
  void set_capturing(bool on) noexcept;
  /// Why the recording under way is unusable (empty: usable).
  [[nodiscard]] const std::string& capture_violation() const noexcept { return m_violation; }
  /// Converts every stale cached weight copy now, in stream order: before a recording and before
  /// each graph launch, whose GEMMs read the copies as they are.
  void refresh_weights();
  /// Forgets what the A workspace holds (a graph ran or was recorded behind run()'s back).
  void forget_last_a() noexcept {
    m_last_a = nullptr;
    m_last_a_extent = 0;
  }
  /// Changes whenever a workspace or a cached weight copy is reallocated or freed (graphs that
  /// read the old one are stale).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return m_epoch; }

 private:
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, bool>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr;  // cuBLASLt's A: our B (column-major view)
    cublasLtMatrixLayout_t b = nullptr;  // cuBLASLt's B: our A
    cublasLtMatrixLayout_t c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;  // an algorithm was found
  };
  Plan& plan_for(const LtCall& call);
  /// The operand at the GEMM's input type: `src` itself (fp32, tf32) or its bf16 copy in `ws`.
  const void* operand(const float* src, int rows_stored, int cols, int ld,
                      DeviceArray<__nv_bfloat16>& ws, bool cache);

  cudaStream_t m_stream;
  cublasHandle_t m_cublas;
  Precision m_precision;
  cublasLtHandle_t m_handle = nullptr;
  DeviceArray<unsigned char> m_workspace;
  DeviceArray<__nv_bfloat16> m_bf16_a;
  DeviceArray<__nv_bfloat16> m_bf16_b;
  std::map<Key, Plan> m_plans;
  struct WeightCopy {
    DeviceArray<__nv_bfloat16> copy;  // extent = copy.size() fp32 elements from the key address
    bool valid = false;
  };
  std::map<const float*, WeightCopy> m_weights;  // bf16 copies by fp32 address
  const float* m_last_a = nullptr;  // what m_bf16_a holds (address, extent)
  std::size_t m_last_a_extent = 0;
  long m_fallbacks = 0;
  bool m_capturing = false;
  bool m_any_stale = false;  // some cached weight copy may be stale (refresh_weights)
  std::string m_violation;
  std::uint64_t m_epoch = 0;
};

}  // namespace atlas::device::cuda
