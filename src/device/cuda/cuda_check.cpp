// SPDX-License-Identifier: MIT
// The throwing halves of ATLAS_CUDA_CHECK / ATLAS_CUBLAS_CHECK / ATLAS_NCCL_CHECK: one message
// format for the three libraries ("<lib> call '<call>' failed: <name> (<text>)").
#include "cuda_check.hpp"

#include <sstream>
#include <string>

#include "atlas/core/error.hpp"

namespace atlas::device::cuda::detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // The runtime also keeps a failed call's error as its "last error": taken here, so a caller that
  // catches this (a failed scratch allocation, say) is not told of it again by the next correct
  // launch's ATLAS_CUDA_CHECK_LAUNCH (a false out-of-memory there). A sticky error (a kernel's
  // illegal access) stays: every later call reports it anyway.
  (void)cudaGetLastError();
  std::ostringstream os;
  os << "CUDA call '" << call << "' failed: " << cudaGetErrorName(err) << " ("
     << cudaGetErrorString(err) << ")";
  if (err == cudaErrorMemoryAllocation) {
    os << "\n  hint: the model does not fit this GPU's memory; lower train.micro_batch_size or "
          "model.seq_len, or spread the layers over more pipeline stages";
  }
  ::atlas::detail::throw_error(ExitCode::Device, os.str(), file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "cuBLAS call '" << call << "' failed: " << cublasGetStatusName(status) << " ("
     << cublasGetStatusString(status) << ")";
  ::atlas::detail::throw_error(ExitCode::Device, os.str(), file, line);
}

void throw_nccl_error(ncclResult_t result, ncclComm_t comm, const char* call, const char* file,
                      int line) {
  std::ostringstream os;
  os << "NCCL call '" << call << "' failed: " << ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') os << ": " << last;
  if (result == ncclSystemError || result == ncclRemoteError) {
    os << "\n  hint: NCCL_DEBUG=WARN (or INFO) shows which peer or interface failed";
  }
  ::atlas::detail::throw_error(ExitCode::Device, os.str(), file, line);
}

}  // namespace atlas::device::cuda::detail
