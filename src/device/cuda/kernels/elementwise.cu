// SPDX-License-Identifier: MIT
// Element-wise kernels: fill, scale, add, bias add, GELU forward/backward, AdamW. Grid-stride
// loops; formulas written exactly as in the host backend (same tanh through one expf).
#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

constexpr float kGeluScale = 0.7978845608028654F;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715F;

__device__ __forceinline__ float fast_tanh(float u) { return 1.0F - 2.0F / (expf(2.0F * u) + 1.0F); }

__global__ void fill_kernel(float* x, float value, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

__global__ void scale_kernel(float* x, float alpha, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    x[i] *= alpha;
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void add_bias_kernel(float* out, const float* bias, std::size_t n, int cols) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] += bias[i % static_cast<std::size_t>(cols)];
}

__global__ void gelu_forward_kernel(float* out, const float* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float x = in[i];
    const float cube = kGeluCube * x * x * x;
    out[i] = 0.5F * x * (1.0F + fast_tanh(kGeluScale * (x + cube)));
  }
}

__global__ void gelu_backward_kernel(float* din, const float* in, const float* dout,
                                     std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float x = in[i];
    const float cube = kGeluCube * x * x * x;
    const float t = fast_tanh(kGeluScale * (x + cube));
    const float sech2 = 1.0F - t * t;
    const float local =
        0.5F * (1.0F + t) + 0.5F * x * sech2 * kGeluScale * (1.0F + 3.0F * kGeluCube * x * x);
    din[i] = local * dout[i];
  }
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, std::size_t n,
                             AdamW a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float g = grad[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0F - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0F - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / a.bias_correction1;
    const float vhat = vi / a.bias_correction2;
    const float p = param[i];
    param[i] = p - a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.weight_decay * p);
  }
}

}  // namespace

void fill(float* x, float value, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, value, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void scale(float* x, float alpha, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, alpha, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void add(float* out, const float* a, const float* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, a, b, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void add_bias(float* out, const float* bias, int rows, int cols, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, bias, n, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void gelu_forward(float* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* din, const float* in, const float* dout, std::size_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(din, in, dout, n);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n, const AdamW& args,
           cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(param, grad, m, v, n, args);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
