// SPDX-License-Identifier: MIT
// LayerNorm forward and backward (eps 1e-5). One warp per row for the per-row work (statistics
// in double, as on the host); weight and bias gradients are per-column sums in a fixed order,
// so the backward pass is deterministic.
#include "common.cuh"
#include "kernels.hpp"

namespace atlas::device::cuda::kernels {

namespace {

constexpr float kLnEps = 1e-5F;
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

__device__ __forceinline__ int warp_row() {
  return static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / kWarp;
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* in,
                                         const float* weight, const float* bias, int rows,
                                         int cols) {
  const int r = warp_row();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;  // uniform per warp
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
  const float* x = in + off;
  float* o = out + off;
  double sum = 0.0;
  for (int c = lane; c < cols; c += kWarp) sum += x[c];
  const double mu = warp_sum(sum) / cols;
  double var = 0.0;
  for (int c = lane; c < cols; c += kWarp) {
    const double d = x[c] - mu;
    var += d * d;
  }
  var = warp_sum(var);
  const auto m = static_cast<float>(mu);
  const auto s = static_cast<float>(1.0 / sqrt(var / cols + static_cast<double>(kLnEps)));
  for (int c = lane; c < cols; c += kWarp) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

__global__ void layernorm_backward_input_kernel(float* din, const float* dout, const float* in,
                                                const float* weight, const float* mean,
                                                const float* rstd, int rows, int cols) {
  const int r = warp_row();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;
  const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
  const float* x = in + off;
  const float* d = dout + off;
  float* dx = din + off;
  const float m = mean[r];
  const float s = rstd[r];
  double dnorm_mean = 0.0;
  double dnorm_norm_mean = 0.0;
  for (int c = lane; c < cols; c += kWarp) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * d[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += static_cast<double>(dnorm) * norm;
  }
  const auto a = static_cast<float>(warp_sum(dnorm_mean) / cols);
  const auto b = static_cast<float>(warp_sum(dnorm_norm_mean) / cols);
  for (int c = lane; c < cols; c += kWarp) {
    const float norm = (x[c] - m) * s;
    const float dnorm = weight[c] * d[c];
    dx[c] += (dnorm - a - norm * b) * s;
  }
}

__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout,
                                                 const float* in, const float* mean,
                                                 const float* rstd, int rows, int cols) {
  __shared__ double dw_part[kRowLanes][kColTile + 1];
  __shared__ double db_part[kRowLanes][kColTile + 1];
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const int c = static_cast<int>(blockIdx.x) * kColTile + tx;
  double dw = 0.0;
  double db = 0.0;
  if (c < cols) {
    for (int r = ty; r < rows; r += kRowLanes) {
      const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + c;
      const float norm = (in[i] - mean[r]) * rstd[r];
      dw += static_cast<double>(norm) * dout[i];
      db += dout[i];
    }
  }
  dw_part[ty][tx] = dw;
  db_part[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < cols) {
    double tw = 0.0;
    double tb = 0.0;
    for (int k = 0; k < kRowLanes; ++k) {
      tw += dw_part[k][tx];
      tb += db_part[k][tx];
    }
    dweight[c] += static_cast<float>(tw);
    dbias[c] += static_cast<float>(tb);
  }
}

unsigned row_blocks(int rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  layernorm_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(out, mean, rstd, in, weight,
                                                                      bias, rows, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                        const float* in, const float* weight, const float* mean,
                        const float* rstd, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  layernorm_backward_input_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      din, dout, in, weight, mean, rstd, rows, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile));
  layernorm_backward_params_kernel<<<grid, block, 0, stream>>>(dweight, dbias, dout, in, mean,
                                                               rstd, rows, cols);
  ATLAS_CUDA_CHECK_LAUNCH();
}

}  // namespace atlas::device::cuda::kernels
