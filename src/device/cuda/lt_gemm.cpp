// SPDX-License-Identifier: MIT
// LtGemm: row-major GEMMs through cuBLASLt (see lt_gemm.hpp). Row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T, so cuBLASLt's A is our B and its B is our A; each keeps its
// own transpose flag and leading dimension (as in CudaBackend::gemm's cublasSgemm call).
#include "lt_gemm.hpp"

#include <algorithm>
#include <cstdint>

#include "atlas/core/check.hpp"
#include "kernels.hpp"

namespace atlas::device::cuda {

namespace {

// cuBLASLt's recommended workspace on Hopper (32 MiB) also serves Ampere.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

cublasOperation_t op(Trans t) { return t == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::Dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::BgradA: return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

/// Largest power of two (<= 256) that divides every non-null address.
std::uint32_t alignment_of(std::initializer_list<const void*> ptrs) {
  std::uintptr_t bits = 256;
  for (const void* p : ptrs) {
    if (p == nullptr) continue;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    bits = std::min(bits, a & (~a + 1));
  }
  return static_cast<std::uint32_t>(bits == 0 ? 256 : bits);
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  ATLAS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

}  // namespace

LtGemm::LtGemm(cudaStream_t stream, cublasHandle_t cublas, Precision precision)
    : m_stream(stream), m_cublas(cublas), m_precision(precision), m_workspace(kWorkspaceBytes) {
  ATLAS_ASSERT(precision != Precision::Auto, "LtGemm needs a resolved precision");
  ATLAS_CUBLAS_CHECK(cublasLtCreate(&m_handle));
}

LtGemm::~LtGemm() {
  for (auto& [key, plan] : m_plans) {
    if (plan.a != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c != nullptr) (void)cublasLtMatrixLayoutDestroy(plan.c);
    if (plan.desc != nullptr) (void)cublasLtMatmulDescDestroy(plan.desc);
  }
  if (m_handle != nullptr) (void)cublasLtDestroy(m_handle);
}

void LtGemm::invalidate(const void* ptr, std::size_t bytes, bool release) noexcept {
  if (m_weights.empty() || bytes == 0) return;
  const auto* lo = static_cast<const unsigned char*>(ptr);
  const unsigned char* hi = lo + bytes;
  // Entries start below hi; one that starts below lo may still reach into the range.
  auto it = m_weights.lower_bound(reinterpret_cast<const float*>(hi));
  while (it != m_weights.begin()) {
    --it;
    const auto* start = reinterpret_cast<const unsigned char*>(it->first);
    const unsigned char* end = start + it->second.copy.size() * sizeof(float);
    if (end <= lo) continue;
    if (m_capturing && m_violation.empty() && (release || it->second.valid))
      m_violation = "the recorded work writes or frees a GEMM weight, whose bf16 copy a replay would not renew";
    if (release) {
      it = m_weights.erase(it);  // cudaFree waits for any GEMM still reading the copy
      ++m_epoch;
    } else {
      // Kept allocated: the next conversion is ordered after every GEMM that read it (one stream).
      it->second.valid = false;
      m_any_stale = true;
    }
  }
}

std::size_t LtGemm::cached_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const auto& [ptr, w] : m_weights)
    if (w.valid) bytes += w.copy.size() * sizeof(__nv_bfloat16);
  return bytes;
}

const void* LtGemm::operand(const float* src, int rows_stored, int cols, int ld,
                            DeviceArray<__nv_bfloat16>& ws, bool cache) {
  if (m_precision != Precision::Bf16) return src;
  // The stored extent, ld kept: the bf16 copy has the fp32 operand's layout.
  const std::size_t extent =
      static_cast<std::size_t>(rows_stored - 1) * static_cast<std::size_t>(ld) +
      static_cast<std::size_t>(cols);
  if (cache) {
    auto it = m_weights.find(src);
    if (m_capturing && (it == m_weights.end() || it->second.copy.size() != extent || !it->second.valid))
      ATLAS_THROW(Internal, "a GEMM weight without a current bf16 copy inside a graph recording (its copy "
                            "would be made or renewed only at the recording, not at each replay)");
    if (it != m_weights.end() && it->second.copy.size() != extent) {
      m_weights.erase(it);
      it = m_weights.end();
      ++m_epoch;
    }
    if (it == m_weights.end()) it = m_weights.emplace(src, WeightCopy{DeviceArray<__nv_bfloat16>(extent), false}).first;
    WeightCopy& w = it->second;
    if (!w.valid) {
      kernels::to_bf16(w.copy.get(), src, extent, m_stream);
      w.valid = true;
    }
    return w.copy.get();
  }
  if (ws.size() < extent) {
    if (m_capturing)
      ATLAS_THROW(Internal, "a GEMM's bf16 workspace must grow inside a graph recording (it would move "
                            "under the graphs that read it)");
    ++m_epoch;
    // cudaFree (in the old array's destructor) waits for the device: no call still reads it.
    ws = DeviceArray<__nv_bfloat16>();
    ws = DeviceArray<__nv_bfloat16>(extent + extent / 4);
  }
  kernels::to_bf16(ws.get(), src, extent, m_stream);
  return ws.get();
}

void LtGemm::set_capturing(bool on) noexcept {
  m_capturing = on;
  if (on) m_violation.clear();
}

void LtGemm::refresh_weights() {
  if (!m_any_stale) return;
  ATLAS_ASSERT(!m_capturing, "refresh_weights inside a graph recording");
  for (auto& [src, w] : m_weights) {
    if (w.valid) continue;
    kernels::to_bf16(w.copy.get(), src, w.copy.size(), m_stream);
    w.valid = true;
  }
  m_any_stale = false;
}

LtGemm::Plan& LtGemm::plan_for(const LtCall& call) {
  const std::uint32_t align =
      alignment_of({call.a, call.b, call.c, call.bias, call.bias_grad, call.aux, call.b_bf16,
                    call.a_bf16});
  const Key key{static_cast<int>(call.trans_a), static_cast<int>(call.trans_b), call.m, call.n,
                call.k, call.lda, call.ldb, call.ldc, static_cast<int>(call.epilogue) * 512 +
                                                          static_cast<int>(align) +
                                                          (call.b_bf16 != nullptr ? 1 << 20 : 0) +
                                                          (call.a_bf16 != nullptr ? 1 << 21 : 0),
                call.beta != 0.0F};
  auto [it, inserted] = m_plans.try_emplace(key);
  Plan& plan = it->second;
  if (!inserted) return plan;

  const bool bf16 = m_precision == Precision::Bf16;
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      m_precision == Precision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ATLAS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F));
  set_attr(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, op(call.trans_b));
  set_attr(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, op(call.trans_a));
  set_attr(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(call.epilogue));
  // Column-major views: our B (k x n, or n x k stored) is cuBLASLt's A, and so on.
  const bool tb = call.trans_b == Trans::Yes;
  const bool ta = call.trans_a == Trans::Yes;
  ATLAS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, in_type, tb ? call.k : call.n,
                                                tb ? call.n : call.k, call.ldb));
  ATLAS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, in_type, ta ? call.m : call.k,
                                                ta ? call.k : call.m, call.lda));
  ATLAS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, call.n, call.m, call.ldc));
  if (call.epilogue == Epilogue::GeluAuxBias || call.epilogue == Epilogue::Dgelu) {
    const auto ld = static_cast<std::int64_t>(call.ldc);
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(call.aux));
  }
  if (call.epilogue == Epilogue::Bias || call.epilogue == Epilogue::GeluAuxBias) {
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(call.bias));
  }
  if (call.epilogue == Epilogue::BgradA) {
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(call.bias_grad));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  ATLAS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = kWorkspaceBytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  // Operands in bf16 workspaces are 256-byte aligned; fp32 operands and a caller's bf16 A or B
  // (a_bf16, b_bf16) as the caller's addresses (align covers them all).
  const std::uint32_t in_align = bf16 && call.b_bf16 == nullptr && call.a_bf16 == nullptr ? 256U : align;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &in_align, sizeof in_align);
  }
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(m_handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                        1, &result, &found);
  }
  (void)cublasLtMatmulPreferenceDestroy(pref);
  plan.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan.ok) plan.algo = result.algo;
  return plan;
}

bool LtGemm::run(const LtCall& call) {
  // An empty product (n == 0: a layer without inputs) has no D to write, but its bias-gradient
  // epilogue still owes the m sums over k: the caller's fallback computes them (returning true
  // left the caller adding uninitialised scratch into its bias gradient).
  if ((call.m == 0 || call.n == 0) && call.bias_grad != nullptr && call.m + call.n > 0) return false;
  if (call.m == 0 || call.n == 0) return true;
  if (call.k == 0) return false;  // no operand to convert; the caller scales C itself
  ATLAS_ASSERT(call.epilogue != Epilogue::Dgelu || call.beta == 0.0F,
               "the DGELU epilogue needs beta = 0");
  Plan& plan = plan_for(call);
  if (!plan.ok && call.epilogue != Epilogue::None) {
    ++m_fallbacks;
    return false;
  }
  // Per-call pointers (the plan is shared by every call of this shape).
  if (call.epilogue == Epilogue::GeluAuxBias || call.epilogue == Epilogue::Dgelu)
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(call.aux));
  if (call.epilogue == Epilogue::Bias || call.epilogue == Epilogue::GeluAuxBias)
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(call.bias));
  if (call.epilogue == Epilogue::BgradA)
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(call.bias_grad));

  const bool ta = call.trans_a == Trans::Yes;
  const bool tb = call.trans_b == Trans::Yes;
  const int a_rows = ta ? call.k : call.m;
  const int a_cols = ta ? call.m : call.k;
  const std::size_t a_extent = static_cast<std::size_t>(a_rows - 1) * static_cast<std::size_t>(call.lda) +
                               static_cast<std::size_t>(a_cols);
  ATLAS_ASSERT(call.a_bf16 == nullptr || m_precision == Precision::Bf16,
               "a bf16-stored GEMM operand at precision " << to_string(m_precision)
                                                          << " (bf16 storage is used only at bf16)");
  const void* a = call.a_bf16;
  if (a == nullptr) {  // else m_bf16_a (and what it holds: m_last_a) stays as it is
    const bool reuse = m_precision == Precision::Bf16 && call.reuse_a && call.a == m_last_a &&
                       a_extent == m_last_a_extent;
    a = reuse ? m_bf16_a.get() : operand(call.a, a_rows, a_cols, call.lda, m_bf16_a, false);
    m_last_a = call.a;
    m_last_a_extent = a_extent;
  }
  ATLAS_ASSERT(call.b_bf16 == nullptr || m_precision == Precision::Bf16,
               "a bf16-stored GEMM operand at precision " << to_string(m_precision)
                                                          << " (bf16 storage is used only at bf16)");
  const void* b = call.b_bf16 != nullptr
                      ? static_cast<const void*>(call.b_bf16)
                      : operand(call.b, tb ? call.n : call.k, tb ? call.k : call.n, call.ldb,
                                m_bf16_b, call.cache_b);
  if (!plan.ok) {
    // A plain GEMM cuBLASLt has no algorithm for (odd leading dimensions of bf16 operands):
    // cuBLAS's GEMM on the same operands and compute type.
    const cudaDataType_t in_type = m_precision == Precision::Bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        m_precision == Precision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    ATLAS_CUBLAS_CHECK(cublasGemmEx(m_cublas, op(call.trans_b), op(call.trans_a), call.n, call.m,
                                    call.k, &call.alpha, b, in_type, call.ldb, a, in_type,
                                    call.lda, &call.beta, call.c, CUDA_R_32F, call.ldc, compute,
                                    CUBLAS_GEMM_DEFAULT));
    return true;
  }
  const cublasStatus_t st =
      cublasLtMatmul(m_handle, plan.desc, &call.alpha, b, plan.a, a, plan.b, &call.beta, call.c,
                     plan.c, call.c, plan.c, &plan.algo, m_workspace.get(), kWorkspaceBytes,
                     m_stream);
  if (st != CUBLAS_STATUS_SUCCESS && call.epilogue != Epilogue::None) {
    // An epilogue this build of cuBLASLt refuses for these types: remembered, so later calls of
    // this shape go the unfused way at once (nothing was issued).
    plan.ok = false;
    ++m_fallbacks;
    return false;
  }
  ATLAS_CUBLAS_CHECK(st);
  return true;
}

}  // namespace atlas::device::cuda
