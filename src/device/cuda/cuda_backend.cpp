// SPDX-License-Identifier: MIT
// The CUDA backend: device selection, memory, GEMMs at device.precision (cuBLAS fp32 or
// cuBLASLt, row-major through the usual transpose trick), the fused calls, and the registration
// of its factory with device::make_backend(). Attention is in cuda_attention.cpp.
#include "cuda_backend.hpp"

#include <algorithm>
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

std::string describe_precision(Precision p) {
  switch (p) {
    case Precision::Tf32: return "GEMMs tf32 (cuBLASLt)";
    case Precision::Bf16: return "GEMMs bf16 in, fp32 accumulate (cuBLASLt)";
    default: return "GEMMs fp32, TF32 off";
  }
}

std::string describe_device(int device, int count, int local_rank, const cudaDeviceProp& prop,
                            cublasHandle_t handle, Precision precision) {
  int cublas_version = 0;
  ATLAS_CUBLAS_CHECK(cublasGetVersion(handle, &cublas_version));
  int runtime = 0;
  ATLAS_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return fmt::format("cuda (device {} of {} for local rank {}: {}, {}, sm_{}{}, CUDA {}.{}, "
                     "cuBLAS {}, {})",
                     device, count, local_rank, prop.name,
                     units::format_bytes_human(static_cast<double>(prop.totalGlobalMem)),
                     prop.major, prop.minor, runtime / 1000, (runtime % 1000) / 10,
                     cublas_version, describe_precision(precision));
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
  auto backend = std::make_unique<CudaBackend>(local_rank % probe.count, probe.count, local_rank,
                                               effective_precision(cfg));
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

std::size_t device_bytes_held() { return device_bytes().held(); }

long epilogue_fallbacks_of(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->epilogue_fallbacks() : -1;
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

CudaBackend::CudaBackend(int device, int device_count, int local_rank, Precision precision)
    : m_device(activate(device)),
      m_cublas(m_stream.get()),
      m_norm_scratch(kNormMaxBlocks + 1),
      m_bad_target(1),
      m_host_bad(1),
      m_host_double(1),
      m_lt(m_stream.get(), m_cublas.get(),
           precision == Precision::Auto ? Precision::Bf16 : precision) {
  cudaDeviceProp prop{};
  ATLAS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char bus[32] = {};
  ATLAS_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus) - 1, device));
  m_pci_bus_id = bus;
  m_description = describe_device(device, device_count, local_rank, prop, m_cublas.get(),
                                  m_lt.precision());
  ATLAS_CUDA_CHECK(cudaMemsetAsync(m_bad_target.get(), 0xff, sizeof(kernels::BadTarget), m_stream.get()));
  // cuBLAS's recommended workspace on Hopper, as cuBLASLt's (lt_gemm.cpp).
  m_cublas_workspace = DeviceArray<unsigned char>(std::size_t{32} << 20);
  ATLAS_CUBLAS_CHECK(cublasSetWorkspace(m_cublas.get(), m_cublas_workspace.get(), m_cublas_workspace.size()));
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
  not_while_capturing("an allocation");
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
  device_bytes().add(bytes);
  return ptr;
}

void CudaBackend::release(void* ptr, std::size_t bytes) noexcept {
  m_lt.invalidate(ptr, bytes, /*release=*/true);  // a later allocation may reuse the address
  // While the stream records a graph: the recorded work may name this Buffer, so the graph is
  // refused (end_capture; a launch would write freed memory), and the cudaFree, which would break
  // the recording without a word, waits for its end.
  if (m_capturing) {
    m_capture_violation = "a Buffer was released during the recording (the graph would name freed memory)";
    try {
      m_deferred_frees.emplace_back(ptr, bytes);
      return;
    } catch (...) {  // no room to defer it: freed now, which ends the recording as a failure too
    }
  }
  // cudaFree waits for the device; an error here (a failed context) cannot be acted upon.
  (void)cudaFree(ptr);
  device_bytes().sub(bytes);
}

std::size_t CudaBackend::peak_bytes() const { return device_bytes().peak(); }

void CudaBackend::free_deferred() noexcept {
  for (const auto& [ptr, bytes] : m_deferred_frees) {
    (void)cudaFree(ptr);
    device_bytes().sub(bytes);
  }
  m_deferred_frees.clear();
}

void CudaBackend::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  not_while_capturing("upload (a host-to-device copy)");
  m_lt.invalidate(dst, bytes);
  if (bytes <= kStageBytes) {
    // Small uploads (a micro-batch's token ids and targets, every micro-batch) go through a
    // pinned slot: the source is copied there on the host, so it may be reused on return, and
    // neither the host nor the stream waits (a pageable source makes the driver stage it, which
    // may synchronise). A slot is reused once the copy out of it has finished.
    if (m_stage.empty()) {
      m_stage.resize(kStageSlots);
      for (StageSlot& s : m_stage) s.bytes = PinnedArray<unsigned char>(kStageBytes);
    }
    StageSlot& slot = m_stage[m_stage_next];
    m_stage_next = (m_stage_next + 1) % kStageSlots;
    if (slot.used) slot.copied.synchronize();
    std::memcpy(slot.bytes.get(), src, bytes);
    ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, slot.bytes.get(), bytes, cudaMemcpyHostToDevice, m_stream.get()));
    slot.copied.record(m_stream.get());
    slot.used = true;
    return;
  }
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, m_stream.get()));
  // The contract says the source may be reused on return; pageable memory gives no such promise.
  sync();
}

void CudaBackend::download(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  not_while_capturing("download (a device-to-host copy)");
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, m_stream.get()));
  sync();
}

void CudaBackend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  m_lt.invalidate(dst, bytes);
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m_stream.get()));
}

void CudaBackend::fill(float* x, float value, std::size_t n) {
  m_lt.invalidate(x, n * sizeof(float));
  kernels::fill(x, value, n, m_stream.get());
}

void CudaBackend::scale(float* x, float alpha, std::size_t n) {
  m_lt.invalidate(x, n * sizeof(float));
  kernels::scale(x, alpha, n, m_stream.get());
}

void CudaBackend::synchronize() { sync(); }

void CudaBackend::sync() {
  not_while_capturing("a wait for the device");
  m_stream.synchronize();
  if (!m_target_check_pending) return;
  m_target_check_pending = false;
  const kernels::BadTarget bad = m_host_bad[0];
  const int vocab = m_target_vocab;
  m_target_vocab = 0;
  if (bad == kernels::kNoBadTarget) return;
  // Re-arm the flag (the backend stays usable after the error).
  ATLAS_CUDA_CHECK(cudaMemsetAsync(m_bad_target.get(), 0xff, sizeof bad, m_stream.get()));
  const auto row = static_cast<int>(bad >> 32U);
  const auto target = static_cast<std::int32_t>(static_cast<std::uint32_t>(bad & 0xffffffffULL));
  const std::string range =
      vocab > 0 ? fmt::format("the vocabulary [0, {})", vocab) : std::string("its call's vocabulary");
  ATLAS_THROW(Internal, "cross-entropy target " << target << " at row " << row << " is outside " << range
                                                << " (found at the stream's first synchronisation after the "
                                                   "softmax cross-entropy call that read it)");
}

void CudaBackend::to_bf16(Bf16Bits* out, const float* in, std::size_t n) {
  kernels::to_bf16(reinterpret_cast<__nv_bfloat16*>(out), in, n, m_stream.get());
}

void CudaBackend::from_bf16(float* out, const Bf16Bits* in, std::size_t n) {
  m_lt.invalidate(out, n * sizeof(float));
  kernels::from_bf16(out, reinterpret_cast<const __nv_bfloat16*>(in), n, m_stream.get());
}

// ---- dense algebra ----

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and the
// m/n roles, keep each operand's own transpose flag and leading dimension.
void CudaBackend::gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                       const float* a, int lda, const float* b, int ldb, float beta, float* c,
                       int ldc) {
  if (m == 0 || n == 0) return;
  if (m_lt.precision() != Precision::Fp32 && k > 0) {
    // tf32 / bf16: every operand at the run's precision (docs/precision.md).
    LtCall call;
    call.trans_a = trans_a;
    call.trans_b = trans_b;
    call.m = m;
    call.n = n;
    call.k = k;
    call.alpha = alpha;
    call.a = a;
    call.lda = lda;
    call.b = b;
    call.ldb = ldb;
    call.beta = beta;
    call.c = c;
    call.ldc = ldc;
    (void)m_lt.run(call);  // Epilogue::None with k > 0: always issued
    return;
  }
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

void CudaBackend::gemm_bf16_b(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                              const float* a, int lda, const Bf16Bits* b, int ldb, float beta,
                              float* c, int ldc) {
  gemm_stored_bf16("gemm_bf16_b", trans_a, trans_b, m, n, k, alpha, a, nullptr, lda, nullptr, b, ldb,
                   beta, c, ldc);
}

void CudaBackend::gemm_bf16_a(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha,
                              const Bf16Bits* a, int lda, const float* b, int ldb, float beta,
                              float* c, int ldc) {
  gemm_stored_bf16("gemm_bf16_a", trans_a, trans_b, m, n, k, alpha, nullptr, a, lda, b, nullptr, ldb,
                   beta, c, ldc);
}

void CudaBackend::gemm_stored_bf16(const char* what, Trans trans_a, Trans trans_b, int m, int n,
                                   int k, float alpha, const float* a, const Bf16Bits* a_bf16,
                                   int lda, const float* b, const Bf16Bits* b_bf16, int ldb,
                                   float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  ATLAS_ASSERT(m_lt.precision() == Precision::Bf16,
               what << " at precision " << to_string(m_lt.precision())
                    << ": bf16-stored operands are used only at bf16");
  if (k == 0) {  // C = beta C: no operand is read (cublasSgemm gets the fp32 one twice)
    const float* any = a != nullptr ? a : b;
    ATLAS_CUBLAS_CHECK(cublasSgemm(m_cublas.get(), op(trans_b), op(trans_a), n, m, k, &alpha, any,
                                   std::max(1, ldb), any, std::max(1, lda), &beta, c, ldc));
    return;
  }
  LtCall call;
  call.trans_a = trans_a;
  call.trans_b = trans_b;
  call.m = m;
  call.n = n;
  call.k = k;
  call.alpha = alpha;
  call.a = a;
  call.a_bf16 = reinterpret_cast<const __nv_bfloat16*>(a_bf16);
  call.lda = lda;
  call.b = b;
  call.b_bf16 = reinterpret_cast<const __nv_bfloat16*>(b_bf16);
  call.ldb = ldb;
  call.beta = beta;
  call.c = c;
  call.ldc = ldc;
  (void)m_lt.run(call);  // Epilogue::None with k > 0: always issued
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
  sync();
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
  kernels::softmax_xent_forward(losses, probs, logits, targets, rows, vocab, m_bad_target.get(),
                                m_stream.get());
  queue_target_check(vocab);
}

void CudaBackend::softmax_xent_backward(float* dlogits, const float* probs,
                                        const std::int32_t* targets, int rows, int vocab,
                                        float scale) {
  kernels::softmax_xent_backward(dlogits, probs, targets, rows, vocab, scale, m_bad_target.get(),
                                 m_stream.get());
  queue_target_check(vocab);
}

void CudaBackend::queue_target_check(int vocab) {
  not_while_capturing("a cross-entropy's target check (host-side state)");
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_host_bad.get(), m_bad_target.get(), sizeof(kernels::BadTarget),
                                   cudaMemcpyDeviceToHost, m_stream.get()));
  m_target_vocab = !m_target_check_pending || m_target_vocab == vocab ? vocab : -1;
  m_target_check_pending = true;
}

// ---- optimizer ----

void CudaBackend::adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n,
                               const AdamWArgs& a) {
  m_lt.invalidate(param, n * sizeof(float));
  const kernels::AdamW args{a.lr,           a.beta1,          a.beta2,
                            a.eps,          a.weight_decay,   a.bias_correction1,
                            a.bias_correction2, a.grad_scale};
  kernels::adamw(param, grad, m, v, n, args, m_stream.get());
}

// ---- fused calls ----

void CudaBackend::linear_forward(float* out, float* pre_act, const float* in, const float* w,
                                 const float* bias, int rows, int in_f, int out_f,
                                 Activation act) {
  const bool gelu = act == Activation::Gelu;
  if (bias == nullptr && !gelu && m_lt.precision() == Precision::Fp32) {
    gemm(Trans::No, Trans::Yes, rows, out_f, in_f, 1.0F, in, in_f, w, in_f, 0.0F, out, out_f);
    return;
  }
  // fp32 is the reference: GELU by the backend's own kernel (the host's formula), not cuBLASLt's
  // epilogue, which may use the hardware tanh approximation; the bias still rides on the GEMM.
  if (gelu && bias != nullptr && m_lt.precision() == Precision::Fp32 && in_f > 0) {
    linear_forward(pre_act, nullptr, in, w, bias, rows, in_f, out_f, Activation::None);
    gelu_forward(out, pre_act, static_cast<std::size_t>(rows) * static_cast<std::size_t>(out_f));
    return;
  }
  if (lt_linear_forward(out, pre_act, in, nullptr, w, bias, rows, in_f, out_f, gelu)) return;
  Backend::linear_forward(out, pre_act, in, w, bias, rows, in_f, out_f, act);
}

bool CudaBackend::lt_linear_forward(float* out, float* pre_act, const float* in,
                                    const Bf16Bits* in_bf16, const float* w, const float* bias,
                                    int rows, int in_f, int out_f, bool gelu) {
  // The GELU epilogue's saved pre-activation needs a leading dimension divisible by 8.
  if ((gelu && out_f % 8 != 0) || (gelu && bias == nullptr) || in_f <= 0) return false;
  LtCall call;
  call.trans_b = Trans::Yes;
  call.m = rows;
  call.n = out_f;
  call.k = in_f;
  call.a = in;
  call.a_bf16 = reinterpret_cast<const __nv_bfloat16*>(in_bf16);
  call.lda = in_f;
  call.b = w;
  call.ldb = in_f;
  call.c = out;
  call.ldc = out_f;
  call.epilogue = gelu ? Epilogue::GeluAuxBias : bias != nullptr ? Epilogue::Bias : Epilogue::None;
  call.bias = bias;
  call.aux = gelu ? pre_act : nullptr;
  call.cache_b = true;  // w: a weight (its bf16 copy is kept until w is written)
  return m_lt.run(call);
}

float* CudaBackend::dbias_scratch(std::size_t n) {
  if (m_dbias_scratch.size() < n) {
    not_while_capturing("growing the bias-gradient scratch");
    ++m_epoch;
    m_dbias_scratch = DeviceArray<float>();  // cudaFree waits for any reader
    m_dbias_scratch = DeviceArray<float>(n);
  }
  return m_dbias_scratch.get();
}

void CudaBackend::linear_backward_weight(float* dweight, float* dbias, const float* dout,
                                         const float* in, int rows, int in_f, int out_f) {
  // dweight += dout^T in, with dbias = sum over rows of dout from the same pass (BGRADB writes,
  // so it lands in scratch and is added: dbias accumulates over micro-batches).
  LtCall dw;
  dw.trans_a = Trans::Yes;
  dw.m = out_f;
  dw.n = in_f;
  dw.k = rows;
  dw.a = dout;
  dw.lda = out_f;
  dw.b = in;
  dw.ldb = in_f;
  dw.beta = 1.0F;
  dw.c = dweight;
  dw.ldc = in_f;
  // BGRADB only at fp32: at bf16 it would sum the bf16-rounded dout, and the precision contract
  // (docs/precision.md) keeps the bias gradient a sum of the fp32 values (as the host does).
  const bool bgrad = m_lt.precision() == Precision::Fp32 && dbias != nullptr;
  dw.epilogue = bgrad ? Epilogue::BgradA : Epilogue::None;
  dw.bias_grad = bgrad ? dbias_scratch(static_cast<std::size_t>(out_f)) : nullptr;
  if (bgrad && m_lt.run(dw)) {
    kernels::add(dbias, dbias, dw.bias_grad, static_cast<std::size_t>(out_f), m_stream.get());
  } else {
    if (dbias != nullptr) bias_grad(dbias, dout, rows, out_f);
    gemm(Trans::Yes, Trans::No, out_f, in_f, rows, 1.0F, dout, out_f, in, in_f, 1.0F, dweight,
         in_f);
  }
}

void CudaBackend::linear_backward(float* din, float* dweight, float* dbias, const float* dout,
                                  const float* in, const float* w, const float* in_pre, int rows,
                                  int in_f, int out_f, Activation in_act) {
  const bool gelu = in_act == Activation::Gelu;
  ATLAS_ASSERT(!gelu || in_pre != nullptr, "linear_backward through GELU needs in_pre");
  ATLAS_ASSERT(dweight != nullptr || dbias == nullptr,
               "linear_backward with a bias gradient but no weight gradient (a split backward's "
               "input half gives neither)");
  // dweight null: the input half of a split backward (linear_backward_weight runs later).
  if (dweight != nullptr) linear_backward_weight(dweight, dbias, dout, in, rows, in_f, out_f);
  linear_backward_din(din, dout, w, in_pre, rows, in_f, out_f, in_act, dweight != nullptr);
}

void CudaBackend::linear_forward_bf16_in(float* out, float* pre_act, const Bf16Bits* in,
                                         const float* w, const float* bias, int rows, int in_f,
                                         int out_f, Activation act) {
  ATLAS_ASSERT(m_lt.precision() == Precision::Bf16,
               "linear_forward_bf16_in at precision " << to_string(m_lt.precision())
                                                      << ": bf16-stored operands are used only at bf16");
  // As linear_forward at bf16, with cuBLASLt reading the stored bf16 input as it is.
  if (lt_linear_forward(out, pre_act, nullptr, in, w, bias, rows, in_f, out_f, act == Activation::Gelu)) return;
  Backend::linear_forward_bf16_in(out, pre_act, in, w, bias, rows, in_f, out_f, act);
}

void CudaBackend::linear_backward_bf16_in(float* din, float* dweight, float* dbias,
                                          const float* dout, const Bf16Bits* in, const float* w,
                                          const float* in_pre, int rows, int in_f, int out_f,
                                          Activation in_act) {
  ATLAS_ASSERT(in_act != Activation::Gelu || in_pre != nullptr,
               "linear_backward through GELU needs in_pre");
  // bf16 only (gemm_bf16_b checks): the bias gradient sums the fp32 dout (bias_grad), and
  // dweight += dout^T in reads the stored bf16 `in` as it is.
  // A null dweight: the input half of a split backward (linear_backward_weight_bf16_in later).
  ATLAS_ASSERT(dweight != nullptr || dbias == nullptr,
               "linear_backward_bf16_in with a bias gradient but no weight gradient");
  if (dweight != nullptr) linear_backward_weight_bf16_in(dweight, dbias, dout, in, rows, in_f, out_f);
  linear_backward_din(din, dout, w, in_pre, rows, in_f, out_f, in_act, dweight != nullptr);
}

void CudaBackend::linear_backward_din(float* din, const float* dout, const float* w,
                                      const float* in_pre, int rows, int in_f, int out_f,
                                      Activation in_act, bool reuse_dout) {
  const bool gelu = in_act == Activation::Gelu;
  // din = dout w, times gelu'(in_pre) in the epilogue when the input went through GELU.
  LtCall dx;
  dx.m = rows;
  dx.n = in_f;
  dx.k = out_f;
  dx.a = dout;
  dx.lda = out_f;
  dx.b = w;
  dx.ldb = in_f;
  dx.c = din;
  dx.ldc = in_f;
  dx.epilogue = gelu ? Epilogue::Dgelu : Epilogue::None;
  dx.aux = const_cast<float*>(in_pre);  // read, not written, by DGELU
  dx.cache_b = true;                    // w: a weight
  // dout, as the dW GEMM just converted it (not in a split backward's input half: the last
  // conversion may then be of other data at the same address)
  dx.reuse_a = reuse_dout;
  // fp32 without GELU: cublasSgemm, as gemm() (exact fp32, TF32 off).
  // At fp32, cublasSgemm and the backend's GELU kernel (the host's formula), as gemm() does.
  const bool lt = m_lt.precision() != Precision::Fp32 && (!gelu || in_f % 8 == 0);
  if (lt && out_f > 0 && m_lt.run(dx)) return;
  gemm(Trans::No, Trans::No, rows, in_f, out_f, 1.0F, dout, out_f, w, in_f, 0.0F, din, in_f);
  if (gelu) {
    gelu_backward(din, in_pre, din, static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_f));
  }
}

void CudaBackend::residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                             const float* x, const float* delta,
                                             const float* bias, const float* ln_weight,
                                             const float* ln_bias, int rows, int cols) {
  kernels::residual_layernorm_forward(res, ln_out, mean, rstd, x, delta, bias, ln_weight, ln_bias,
                                      rows, cols, m_stream.get());
}

void CudaBackend::softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                                     const std::int32_t* targets, int rows, int vocab,
                                     float scale) {
  kernels::softmax_xent_fused(losses, dlogits, logits, targets, rows, vocab, scale,
                              m_bad_target.get(), m_stream.get());
  queue_target_check(vocab);
}

void CudaBackend::prepare_table(TensorTable& table,
                                const std::vector<kernels::TensorEntry>& entries,
                                const std::vector<std::size_t>& sizes) {
  not_while_capturing("a multi-tensor table (host-side state)");
  auto same = [](const kernels::TensorEntry& x, const kernels::TensorEntry& y) {
    return x.param == y.param && x.grad == y.grad && x.m == y.m && x.v == y.v &&
           x.weight_decay == y.weight_decay;
  };
  if (table.sizes == sizes &&
      std::equal(entries.begin(), entries.end(), table.entries.begin(), table.entries.end(), same))
    return;
  std::vector<kernels::Chunk> chunks;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t start = 0; start < sizes[t]; start += kernels::kChunkElements) {
      const std::size_t count = std::min(kernels::kChunkElements, sizes[t] - start);
      chunks.push_back({static_cast<int>(t), static_cast<unsigned>(count), start});
    }
  }
  // Launches issued with the old table may still read it: wait before replacing it.
  sync();
  if (table.d_entries.size() < entries.size())
    table.d_entries = DeviceArray<kernels::TensorEntry>(entries.size());
  if (table.d_chunks.size() < chunks.size())
    table.d_chunks = DeviceArray<kernels::Chunk>(chunks.size());
  upload(table.d_entries.get(), entries.data(), entries.size() * sizeof(kernels::TensorEntry));
  upload(table.d_chunks.get(), chunks.data(), chunks.size() * sizeof(kernels::Chunk));
  table.entries = entries;
  table.sizes = sizes;
  table.chunk_count = static_cast<int>(chunks.size());
}

void CudaBackend::adamw_update_multi(std::span<const AdamWTensor> tensors, const AdamWArgs& a) {
  std::vector<kernels::TensorEntry> entries;
  std::vector<std::size_t> sizes;
  entries.reserve(tensors.size());
  sizes.reserve(tensors.size());
  for (const AdamWTensor& t : tensors) {
    entries.push_back({t.param, t.grad, t.m, t.v, t.weight_decay});
    sizes.push_back(t.n);
    m_lt.invalidate(t.param, t.n * sizeof(float));
  }
  prepare_table(m_adamw_table, entries, sizes);
  const kernels::AdamW args{a.lr,           a.beta1,          a.beta2,
                            a.eps,          a.weight_decay,   a.bias_correction1,
                            a.bias_correction2, a.grad_scale};
  kernels::adamw_multi(m_adamw_table.d_entries.get(), m_adamw_table.d_chunks.get(),
                       m_adamw_table.chunk_count, args, m_stream.get());
}

double CudaBackend::sq_norm_multi(std::span<const ConstFloats> ranges) {
  std::vector<kernels::TensorEntry> entries;
  std::vector<std::size_t> sizes;
  entries.reserve(ranges.size());
  sizes.reserve(ranges.size());
  for (const ConstFloats& r : ranges) {
    entries.push_back({nullptr, r.data, nullptr, nullptr, 0.0F});
    sizes.push_back(r.n);
  }
  prepare_table(m_norm_table, entries, sizes);
  const auto need = static_cast<std::size_t>(m_norm_table.chunk_count) + 1;
  if (m_norm_partials.size() < need) {
    m_norm_partials = DeviceArray<double>();
    m_norm_partials = DeviceArray<double>(need);
  }
  double* total = m_norm_partials.get() + (need - 1);
  kernels::sq_norm_multi(m_norm_table.d_entries.get(), m_norm_table.d_chunks.get(),
                         m_norm_table.chunk_count, m_norm_partials.get(), total, m_stream.get());
  ATLAS_CUDA_CHECK(cudaMemcpyAsync(m_host_double.get(), total, sizeof(double),
                                   cudaMemcpyDeviceToHost, m_stream.get()));
  sync();
  return m_host_double[0];
}

}  // namespace atlas::device::cuda
