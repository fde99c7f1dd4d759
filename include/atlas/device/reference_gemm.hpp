// SPDX-License-Identifier: MIT
// The vendor GEMM called directly, without the Backend::gemm layer, on a backend's memory: the
// baseline of `atlas bench gemm`. cblas_sgemm on the host; the CUDA build registers cublasSgemm.
#pragma once

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"

namespace atlas::device {

/// Signature of a reference GEMM: Backend::gemm's arguments, on `backend`'s memory.
using ReferenceGemm = void (*)(Backend& backend, Trans trans_a, Trans trans_b, int m, int n,
                               int k, float alpha, const float* a, int lda, const float* b,
                               int ldb, float beta, float* c, int ldc);

/// Row-major C = alpha op(A) op(B) + beta C by the vendor library of backend.kind(), called
/// directly (cblas_sgemm; cublasSgemm on the backend's own handle and stream). Returns when C is
/// complete (synchronises a device backend). Throws atlas::Error (Device) if this build has no
/// reference for the kind. Not collective.
void reference_gemm(Backend& backend, Trans trans_a, Trans trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                    float* c, int ldc);

/// The reference's name for reports: "cblas_sgemm", "cublasSgemm".
[[nodiscard]] const char* reference_gemm_name(atlas::Backend kind);

/// Registration hook for a device build's reference (static initialiser, before main). A null
/// `fn` removes it. Registering the host kind is an error (it is built in).
void register_reference_gemm(atlas::Backend kind, ReferenceGemm fn, const char* name);

}  // namespace atlas::device
