// SPDX-License-Identifier: MIT
// Check macros for CUDA runtime, cuBLAS and NCCL calls. A failure throws atlas::Error(Device)
// with the call text, the library's own message (and NCCL's last-error detail) and the call
// site. Internal to src/device/cuda/: the only place that may include the CUDA headers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace atlas::device::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
[[noreturn]] void throw_nccl_error(ncclResult_t result, ncclComm_t comm, const char* call,
                                   const char* file, int line);
}  // namespace atlas::device::cuda::detail

/// CUDA runtime call returning cudaError_t.
#define ATLAS_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    const cudaError_t atlas_cuda_err_ = (call);                                               \
    if (atlas_cuda_err_ != cudaSuccess)                                                       \
      ::atlas::device::cuda::detail::throw_cuda_error(atlas_cuda_err_, #call, __FILE__,       \
                                                      __LINE__);                              \
  } while (0)

/// cuBLAS call returning cublasStatus_t.
#define ATLAS_CUBLAS_CHECK(call)                                                              \
  do {                                                                                        \
    const cublasStatus_t atlas_cublas_st_ = (call);                                           \
    if (atlas_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::atlas::device::cuda::detail::throw_cublas_error(atlas_cublas_st_, #call, __FILE__,    \
                                                        __LINE__);                            \
  } while (0)

/// NCCL call returning ncclResult_t; the message adds ncclGetLastError(nullptr).
/// ncclInProgress (a non-blocking communicator still working) is not an error here.
#define ATLAS_NCCL_CHECK(call) ATLAS_NCCL_CHECK_COMM(call, nullptr)

/// Same, naming the communicator whose ncclGetLastError() detail goes into the message.
#define ATLAS_NCCL_CHECK_COMM(call, comm)                                                     \
  do {                                                                                        \
    const ncclResult_t atlas_nccl_res_ = (call);                                              \
    if (atlas_nccl_res_ != ncclSuccess && atlas_nccl_res_ != ncclInProgress)                  \
      ::atlas::device::cuda::detail::throw_nccl_error(atlas_nccl_res_, (comm), #call,        \
                                                      __FILE__, __LINE__);                    \
  } while (0)

/// After a kernel launch: reports a bad launch configuration at the launch site.
#define ATLAS_CUDA_CHECK_LAUNCH() ATLAS_CUDA_CHECK(cudaGetLastError())
