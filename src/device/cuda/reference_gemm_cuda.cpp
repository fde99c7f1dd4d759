// SPDX-License-Identifier: MIT
// cublasSgemm called directly on the CUDA backend's handle and stream: the baseline that
// `atlas bench gemm backend=cuda` compares CudaBackend::gemm with. Registered at load time.
#include "atlas/core/check.hpp"
#include "atlas/device/reference_gemm.hpp"
#include "cuda_backend_impl.hpp"

namespace atlas::device::cuda {

namespace {

void bare_cublas_sgemm(Backend& backend, Trans trans_a, Trans trans_b, int m, int n, int k,
                       float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                       float* c, int ldc) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  ATLAS_ASSERT(cuda != nullptr, "cublasSgemm reference on backend " << backend.describe());
  // Column-major C^T = op(B)^T op(A)^T, the same mapping a caller of cuBLAS writes by hand.
  ATLAS_CUBLAS_CHECK(cublasSgemm(cuda->cublas(), trans_b == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                 &alpha, b, ldb, a, lda, &beta, c, ldc));
  ATLAS_CUDA_CHECK(cudaStreamSynchronize(cuda->stream()));
}

[[maybe_unused]] const bool kRegistered =
    (register_reference_gemm(atlas::Backend::Cuda, &bare_cublas_sgemm, "cublasSgemm"), true);

}  // namespace

}  // namespace atlas::device::cuda
