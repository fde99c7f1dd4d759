// SPDX-License-Identifier: MIT
// The direct vendor GEMM behind `atlas bench gemm` (see reference_gemm.hpp): cblas_sgemm here,
// others registered by device builds, so no #if in this file.
#include "atlas/device/reference_gemm.hpp"

#include <cblas.h>

#include "atlas/core/check.hpp"

namespace atlas::device {

namespace {

struct Entry {
  ReferenceGemm fn = nullptr;
  const char* name = nullptr;
};

// Function-local static: safe to use from other translation units' static initialisers.
Entry& device_entry() {
  static Entry entry;
  return entry;
}

}  // namespace

void register_reference_gemm(atlas::Backend kind, ReferenceGemm fn, const char* name) {
  ATLAS_ASSERT(kind != atlas::Backend::Host, "the host reference GEMM is built in");
  device_entry() = Entry{fn, fn != nullptr ? name : nullptr};
}

const char* reference_gemm_name(atlas::Backend kind) {
  if (kind == atlas::Backend::Host) return "cblas_sgemm";
  return device_entry().name != nullptr ? device_entry().name : "(none in this build)";
}

void reference_gemm(Backend& backend, Trans trans_a, Trans trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                    float* c, int ldc) {
  if (backend.kind() == atlas::Backend::Host) {
    cblas_sgemm(CblasRowMajor, trans_a == Trans::Yes ? CblasTrans : CblasNoTrans,
                trans_b == Trans::Yes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
    return;
  }
  const ReferenceGemm fn = device_entry().fn;
  if (fn == nullptr) {
    ATLAS_THROW(Device, "no reference GEMM for backend " << backend.describe()
                                                         << " in this build");
  }
  fn(backend, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace atlas::device
