// SPDX-License-Identifier: MIT
// Token + position embedding forward and backward. The token-table gradient scatters with
// atomicAdd (a token may repeat in a micro-batch); the position-table gradient sums the batch in
// order, exactly as the host backend does.
#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* wte,
                                         const float* wpe, std::size_t n, int seq, int channels) {
  const auto cols = static_cast<std::size_t>(channels);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = i / cols;
    const std::size_t c = i % cols;
    const std::size_t t = r % static_cast<std::size_t>(seq);
    out[i] = wte[static_cast<std::size_t>(tokens[r]) * cols + c] + wpe[t * cols + c];
  }
}

__global__ void embedding_backward_wte_kernel(float* dwte, const float* dout,
                                              const std::int32_t* tokens, std::size_t n,
                                              int channels) {
  const auto cols = static_cast<std::size_t>(channels);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = i / cols;
    const std::size_t c = i % cols;
    atomicAdd(dwte + static_cast<std::size_t>(tokens[r]) * cols + c, dout[i]);
  }
}

__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, std::size_t n,
                                              int batch, int seq, int channels) {
  const std::size_t stride = static_cast<std::size_t>(seq) * static_cast<std::size_t>(channels);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < batch; ++b) acc += dout[static_cast<std::size_t>(b) * stride + i];
    dwpe[i] = acc;
  }
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int batch, int seq, int channels, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq) *
                        static_cast<std::size_t>(channels);
  if (n == 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, tokens, wte, wpe, n, seq,
                                                                 channels);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int batch, int seq, int channels, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq) *
                        static_cast<std::size_t>(channels);
  if (n == 0) return;
  embedding_backward_wte_kernel<<<grid_for(n), kThreads, 0, stream>>>(dwte, dout, tokens, n,
                                                                      channels);
  ATLAS_CUDA_CHECK_LAUNCH();
  const std::size_t n_pos = static_cast<std::size_t>(seq) * static_cast<std::size_t>(channels);
  embedding_backward_wpe_kernel<<<grid_for(n_pos), kThreads, 0, stream>>>(dwpe, dout, n_pos, batch,
                                                                          seq, channels);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
