// SPDX-License-Identifier: MIT
// The CUDA backend: device selection, memory, cuBLAS GEMMs (row-major through the usual
// transpose trick), the registration of its factory with device::make_backend(). Attention is
// in cuda_attention.cpp.
#include "cuda_backend.hpp"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/units.hpp"
#include "cuda_backend_impl.hpp"
#include "kernels.hpp"

namespace atlas::device::cuda {

namespace {

constexpr int kNormMaxBlocks = 1024;  // >= kernels::sq_norm_blocks(n) for every n

cublasOperation_t op(Trans t) { return t == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

int activate(int device) {
  ATLAS_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

std::string describe_device(int device, int count, int local_rank, const cudaDeviceProp& prop,
                            cublasHandle_t handle) {
  int cublas_version = 0;
  ATLAS_CUBLAS_CHECK(cublasGetVersion(handle, &cublas_version));
  int runtime = 0;
  ATLAS_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return fmt::format("cuda (device {} of {} for local rank {}: {}, {}, sm_{}{}, CUDA {}.{}, "
                     "cuBLAS {}, TF32 off)",
                     device, count, local_rank, prop.name,
                     units::format_bytes_human(static_cast<double>(prop.totalGlobalMem)),
                     prop.major, prop.minor, runtime / 1000, (runtime % 1000) / 10,
                     cublas_version);
}

}  // namespace

// ---- discovery and the factory ----

DeviceProbe probe_devices() {
  DeviceProbe probe;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    probe.error = fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
    (void)cudaGetLastError();  // clear it: later calls must not report this failure again
    return probe;
  }
  probe.count = count;
  return probe;
}

int local_rank_from_env() {
  for (const char* var :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}) {
    const std::optional<std::string> value = env::get(var);
    if (!value) continue;
    char* end = nullptr;
    const long n = std::strtol(value->c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && n >= 0 && n < INT_MAX) return static_cast<int>(n);
  }
  return 0;
}

std::unique_ptr<Backend> make_cuda_backend(const DeviceCfg& cfg) {
  const DeviceProbe probe = probe_devices();
  if (!probe.error.empty() || probe.count <= 0) {
    const std::optional<std::string> visible = env::get("CUDA_VISIBLE_DEVICES");
    ATLAS_THROW(Device,
                "device.backend = cuda, but no CUDA device is visible: cudaGetDeviceCount returned "
                    << (probe.error.empty() ? std::string("0 devices") : probe.error)
                    << (visible ? fmt::format(" (CUDA_VISIBLE_DEVICES = \"{}\")", *visible)
                                           : std::string())
                    << "\n  hint: run on a node with an NVIDIA GPU and its driver (nvidia-smi "
                       "lists them), or set device.backend = host");
  }
  const int local_rank = local_rank_from_env();
  // Host threads (device.threads) do not apply; the NCCL limit does.
  auto backend = std::make_unique<CudaBackend>(local_rank % probe.count, probe.count, local_rank);
  backend->set_nccl_timeout_s(cfg.nccl_timeout_s);
  backend->set_attention_options({true, effective_precision(cfg) == Precision::Bf16});
  return backend;
}

int device_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->device() : -1;
}

std::string pci_bus_id_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->pci_bus_id() : std::string();
}

double nccl_timeout_s_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->nccl_timeout_s() : 0.0;
}

namespace {
std::unique_ptr<Backend> factory(const DeviceCfg& cfg) { return make_cuda_backend(cfg); }
// Static registration: this object library is linked whole into the binary and the GPU tests.
[[maybe_unused]] const bool kRegistered =
    (register_backend_factory(atlas::Backend::Cuda, &factory), true);
}  // namespace

// ---- CudaBackend ----

CudaBackend::CudaBackend(int device, int device_count, int local_rank)
    : m_device(activate(device)),
      m_cublas(m_stream.get()),
      m_norm_scratch(kNormMaxBlocks + 1),
      m_bad_row(1),
      m_host_double(1),
      m_host_int(1) {
  cudaDeviceProp prop{};
  ATLAS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char bus[32] = {};
  ATLAS_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus) - 1, device));
  m_pci_bus_id = bus;
  m_description = describe_device(device, device_count, local_rank, prop, m_cublas.get());
  m_host_int[0] = INT_MAX;
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_bad_row.get(), m_host_int.get(), sizeof(int),
                                   cudaMemcpyHostToDevice, m_stream.get()));
  m_stream.synchronize();
}

CudaBackend::~CudaBackend() {
  // Buffers are released by their owners (which must not outlive this backend); finish the
  // stream's work before the handles go. Errors here would hide the one being unwound.
  (void)cudaStreamSynchronize(m_stream.get());
}

void CudaBackend::make_current() const { ATLAS_CUDA_CHECK(cudaSetDevice(m_device)); }

// ---- memory ----

void* CudaBackend::allocate(std::size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    ATLAS_THROW(Device, "cuda backend: cannot allocate "
                            << units::format_bytes_human(static_cast<double>(bytes)) << " on device "
                            << m_device << " (" << cudaGetErrorName(err) << "; "
                            << units::format_bytes_human(static_cast<double>(free_bytes))
                            << " free of "
                            << units::format_bytes_human(static_cast<double>(total_bytes))
                            << ")\n  hint: lower train.micro_batch_size or model.seq_len, or use "
                               "more pipeline stages");
  }
  // cudaMalloc aligns to at least 256 bytes; zero-fill in stream order before any later use.
  const cudaError_t zero = cudaMemsetAsync(ptr, 0, bytes, m_stream.get());
  if (zero != cudaSuccess) {
    (void)cudaFree(ptr);
    ATLAS_CUDA_CHECK(zero);
  }
  return ptr;
}

void CudaBackend::release(void* ptr, std::size_t /*bytes*/) noexcept {
  // cudaFree waits for the device; an error here (a failed context) cannot be acted upon.
  (void)cudaFree(ptr);
}

void CudaBackend::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, m_stream.get()));
  // The contract says the source may be reused on return; pageable memory gives no such promise.
  m_stream.synchronize();
}

void CudaBackend::download(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, m_stream.get()));
  m_stream.synchronize();
}

void CudaBackend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m_stream.get()));
}

void CudaBackend::fill(float* x, float value, std::size_t n) {
  kernels::fill(x, value, n, m_stream.get());
}

void CudaBackend::scale(float* x, float alpha, std::size_t n) {
  kernels::scale(x, alpha, n, m_stream.get());
}

void CudaBackend::synchronize() { m_stream.synchronize(); }

// ---- dense algebra ----

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and the
// m/n roles, keep each operand's own transpose flag and leading dimension.
void CudaBackend::gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                       const float* a, int lda, const float* b, int ldb, float beta, float* c,
                       int ldc) {
  if (m == 0 || n == 0) return;
  ATLAS_CUBLAS_CHECK(cublasSgemm(m_cublas.get(), op(trans_b), op(trans_a), n, m, k, &alpha, b,
                                 ldb, a, lda, &beta, c, ldc));
}

void CudaBackend::gemm_batched(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                               const float* a, int lda, long long stride_a, const float* b,
                               int ldb, long long stride_b, float beta, float* c, int ldc,
                               long long stride_c, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  ATLAS_CUBLAS_CHECK(cublasSgemmStridedBatched(m_cublas.get(), op(trans_b), op(trans_a), n, m, k,
                                               &alpha, b, ldb, stride_b, a, lda, stride_a, &beta,
                                               c, ldc, stride_c, batch));
}

void CudaBackend::add_bias(float* out, const float* bias, int rows, int cols) {
  kernels::add_bias(out, bias, rows, cols, m_stream.get());
}

void CudaBackend::bias_grad(float* dbias, const float* dout, int rows, int cols) {
  kernels::bias_grad(dbias, dout, rows, cols, m_stream.get());
}

void CudaBackend::add(float* out, const float* a, const float* b, std::size_t n) {
  kernels::add(out, a, b, n, m_stream.get());
}

double CudaBackend::sq_norm(const float* x, std::size_t n) {
  if (n == 0) return 0.0;
  double* partial = m_norm_scratch.get();
  double* total = partial + kNormMaxBlocks;
  kernels::sq_norm(x, n, partial, total, m_stream.get());
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_host_double.get(), total, sizeof(double),
                                   cudaMemcpyDeviceToHost, m_stream.get()));
  m_stream.synchronize();
  return m_host_double[0];
}

// ---- layers ----

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                                    const float* weight, const float* bias, int rows, int cols) {
  kernels::layernorm_forward(out, mean, rstd, in, weight, bias, rows, cols, m_stream.get());
}

void CudaBackend::layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                                     const float* in, const float* weight, const float* mean,
                                     const float* rstd, int rows, int cols) {
  kernels::layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, rows, cols,
                              m_stream.get());
}

void CudaBackend::gelu_forward(float* out, const float* in, std::size_t n) {
  kernels::gelu_forward(out, in, n, m_stream.get());
}

void CudaBackend::gelu_backward(float* din, const float* in, const float* dout, std::size_t n) {
  kernels::gelu_backward(din, in, dout, n, m_stream.get());
}

// attention_*: cuda_attention.cpp (fused flash kernel, unfused reference).

void CudaBackend::embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                                    const float* wpe, int batch, int seq, int channels) {
  kernels::embedding_forward(out, tokens, wte, wpe, batch, seq, channels, m_stream.get());
}

void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                     const std::int32_t* tokens, int batch, int seq,
                                     int channels) {
  kernels::embedding_backward(dwte, dwpe, dout, tokens, batch, seq, channels, m_stream.get());
}

void CudaBackend::softmax_xent_forward(float* losses, float* probs, const float* logits,
                                       const std::int32_t* targets, int rows, int vocab) {
  kernels::softmax_xent_forward(losses, probs, logits, targets, rows, vocab, m_bad_row.get(),
                                m_stream.get());
  check_targets(targets, vocab);
}

void CudaBackend::softmax_xent_backward(float* dlogits, const float* probs,
                                        const std::int32_t* targets, int rows, int vocab,
                                        float scale) {
  kernels::softmax_xent_backward(dlogits, probs, targets, rows, vocab, scale, m_bad_row.get(),
                                 m_stream.get());
  check_targets(targets, vocab);
}

void CudaBackend::check_targets(const std::int32_t* targets, int vocab) {
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_host_int.get(), m_bad_row.get(), sizeof(int),
                                   cudaMemcpyDeviceToHost, m_stream.get()));
  m_stream.synchronize();
  const int row = m_host_int[0];
  if (row == INT_MAX) return;
  // Re-arm the flag (the backend stays usable after the error) and fetch the bad target.
  m_host_int[0] = INT_MAX;
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_bad_row.get(), m_host_int.get(), sizeof(int),
                                   cudaMemcpyHostToDevice, m_stream.get()));
  std::int32_t target = 0;
  download(&target, targets + row, sizeof target);
  ATLAS_THROW(Internal, "cross-entropy target " << target << " at row " << row
                                                << " is outside the vocabulary [0, " << vocab
                                                << ")");
}

// ---- optimizer ----

void CudaBackend::adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n,
                               const AdamWArgs& a) {
  const kernels::AdamW args{a.lr,           a.beta1,          a.beta2,
                            a.eps,          a.weight_decay,   a.bias_correction1,
                            a.bias_correction2, a.grad_scale};
  kernels::adamw(param, grad, m, v, n, args, m_stream.get());
}

}  // namespace atlas::device::cuda
