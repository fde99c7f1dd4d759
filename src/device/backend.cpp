// SPDX-License-Identifier: MIT
// Buffer ownership and the backend factory/registry. The only place that decides which backend a
// deck gets; the CUDA build adds itself through register_backend_factory(), so no #if here.
#include "atlas/device/backend.hpp"

#include <array>
#include <utility>

#include "atlas/core/check.hpp"
#include "atlas/device/host_backend.hpp"

namespace atlas::device {

// ---- Buffer ----

Buffer::Buffer(Buffer&& other) noexcept
    : m_owner(std::exchange(other.m_owner, nullptr)),
      m_ptr(std::exchange(other.m_ptr, nullptr)),
      m_bytes(std::exchange(other.m_bytes, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    m_owner = std::exchange(other.m_owner, nullptr);
    m_ptr = std::exchange(other.m_ptr, nullptr);
    m_bytes = std::exchange(other.m_bytes, 0);
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() noexcept {
  if (m_ptr != nullptr && m_owner != nullptr) {
    m_owner->release(m_ptr, m_bytes);
    m_owner->forget(m_bytes);
  }
  m_owner = nullptr;
  m_ptr = nullptr;
  m_bytes = 0;
}

Buffer Backend::alloc(std::size_t bytes) {
  if (bytes == 0) return Buffer();
  void* ptr = allocate(bytes);
  ATLAS_ASSERT(ptr != nullptr, "backend " << describe() << " returned null for " << bytes
                                          << " bytes");
  m_bytes.add(bytes);
  return Buffer(this, ptr, bytes);
}

// ---- fused calls: defaults that compose the unfused calls ----

void Backend::begin_capture() {
  ATLAS_THROW(Internal, describe() << ": this backend records no graphs (can_capture() is false)");
}

std::unique_ptr<Graph> Backend::end_capture(std::string* why) {
  if (why != nullptr) *why = describe() + " records no graphs";
  return nullptr;
}

void Backend::launch_graph(Graph& /*graph*/) {
  ATLAS_THROW(Internal, describe() << ": launch_graph on a backend that records no graphs");
}

void Backend::linear_forward(float* out, float* pre_act, const float* in, const float* w,
                             const float* bias, int rows, int in_f, int out_f, Activation act) {
  const bool gelu = act == Activation::Gelu;
  ATLAS_ASSERT(!gelu || pre_act != nullptr, "linear_forward with GELU needs a pre_act buffer");
  float* y = gelu ? pre_act : out;
  gemm(Trans::No, Trans::Yes, rows, out_f, in_f, 1.0F, in, in_f, w, in_f, 0.0F, y, out_f);
  if (bias != nullptr) add_bias(y, bias, rows, out_f);
  if (gelu) {
    gelu_forward(out, pre_act, static_cast<std::size_t>(rows) * static_cast<std::size_t>(out_f));
  }
}

void Backend::linear_backward(float* din, float* dweight, float* dbias, const float* dout,
                              const float* in, const float* w, const float* in_pre, int rows,
                              int in_f, int out_f, Activation in_act) {
  const bool gelu = in_act == Activation::Gelu;
  ATLAS_ASSERT(!gelu || in_pre != nullptr, "linear_backward through GELU needs in_pre");
  ATLAS_ASSERT(dweight != nullptr || dbias == nullptr,
               "linear_backward with a bias gradient but no weight gradient (a split backward's "
               "input half gives neither)");
  if (dweight != nullptr) linear_backward_weight(dweight, dbias, dout, in, rows, in_f, out_f);
  gemm(Trans::No, Trans::No, rows, in_f, out_f, 1.0F, dout, out_f, w, in_f, 0.0F, din, in_f);
  if (gelu) {
    gelu_backward(din, in_pre, din, static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_f));
  }
}

void Backend::linear_backward_weight(float* dweight, float* dbias, const float* dout,
                                     const float* in, int rows, int in_f, int out_f) {
  if (dbias != nullptr) bias_grad(dbias, dout, rows, out_f);
  gemm(Trans::Yes, Trans::No, out_f, in_f, rows, 1.0F, dout, out_f, in, in_f, 1.0F, dweight,
       in_f);
}

void Backend::linear_forward_bf16_in(float* out, float* pre_act, const Bf16Bits* in,
                                     const float* w, const float* bias, int rows, int in_f,
                                     int out_f, Activation act) {
  const bool gelu = act == Activation::Gelu;
  ATLAS_ASSERT(!gelu || pre_act != nullptr, "linear_forward with GELU needs a pre_act buffer");
  float* y = gelu ? pre_act : out;
  gemm_bf16_a(Trans::No, Trans::Yes, rows, out_f, in_f, 1.0F, in, in_f, w, in_f, 0.0F, y, out_f);
  if (bias != nullptr) add_bias(y, bias, rows, out_f);
  if (gelu) {
    gelu_forward(out, pre_act, static_cast<std::size_t>(rows) * static_cast<std::size_t>(out_f));
  }
}

void Backend::linear_backward_bf16_in(float* din, float* dweight, float* dbias,
                                      const float* dout, const Bf16Bits* in, const float* w,
                                      const float* in_pre, int rows, int in_f, int out_f,
                                      Activation in_act) {
  const bool gelu = in_act == Activation::Gelu;
  ATLAS_ASSERT(!gelu || in_pre != nullptr, "linear_backward through GELU needs in_pre");
  ATLAS_ASSERT(dweight != nullptr || dbias == nullptr,
               "linear_backward_bf16_in with a bias gradient but no weight gradient (a split "
               "backward's input half gives neither)");
  if (dweight != nullptr) linear_backward_weight_bf16_in(dweight, dbias, dout, in, rows, in_f, out_f);
  gemm(Trans::No, Trans::No, rows, in_f, out_f, 1.0F, dout, out_f, w, in_f, 0.0F, din, in_f);
  if (gelu) {
    gelu_backward(din, in_pre, din, static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_f));
  }
}

void Backend::linear_backward_weight_bf16_in(float* dweight, float* dbias, const float* dout,
                                             const Bf16Bits* in, int rows, int in_f, int out_f) {
  if (dbias != nullptr) bias_grad(dbias, dout, rows, out_f);
  gemm_bf16_b(Trans::Yes, Trans::No, out_f, in_f, rows, 1.0F, dout, out_f, in, in_f, 1.0F,
              dweight, in_f);
}

void Backend::residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd,
                                         const float* x, const float* delta, const float* bias,
                                         const float* ln_weight, const float* ln_bias, int rows,
                                         int cols) {
  add(res, x, delta, static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  if (bias != nullptr) add_bias(res, bias, rows, cols);
  if (ln_out != nullptr) layernorm_forward(ln_out, mean, rstd, res, ln_weight, ln_bias, rows, cols);
}

void Backend::softmax_xent_fused(float* losses, float* dlogits, const float* logits,
                                 const std::int32_t* targets, int rows, int vocab, float scale) {
  softmax_xent_forward(losses, dlogits, logits, targets, rows, vocab);
  softmax_xent_backward(dlogits, dlogits, targets, rows, vocab, scale);
}

void Backend::adamw_update_multi(std::span<const AdamWTensor> tensors, const AdamWArgs& args) {
  AdamWArgs one = args;
  for (const AdamWTensor& t : tensors) {
    one.weight_decay = t.weight_decay;
    adamw_update(t.param, t.grad, t.m, t.v, t.n, one);
  }
}

double Backend::sq_norm_multi(std::span<const ConstFloats> ranges) {
  double sum = 0.0;
  for (const ConstFloats& r : ranges) sum += sq_norm(r.data, r.n);
  return sum;
}

// ---- factory registry ----

namespace {
// Function-local static: safe to use from other translation units' static initialisers.
std::array<BackendFactory, 2>& registry() {
  static std::array<BackendFactory, 2> factories{};
  return factories;
}
std::size_t slot(atlas::Backend kind) { return kind == atlas::Backend::Host ? 0 : 1; }
}  // namespace

void register_backend_factory(atlas::Backend kind, BackendFactory factory) {
  ATLAS_ASSERT(kind != atlas::Backend::Host, "the host backend is built in; do not register it");
  registry()[slot(kind)] = factory;
}

bool backend_available(atlas::Backend kind) {
  return kind == atlas::Backend::Host || kind == atlas::Backend::Emulated || registry()[slot(kind)] != nullptr;
}

std::unique_ptr<Backend> make_backend(const DeviceCfg& cfg) {
  if (cfg.threads < 0) {
    throw ConfigError("device.threads = " + std::to_string(cfg.threads) +
                      " is negative\n  hint: use 0 (auto) or a positive thread count");
  }
  switch (cfg.backend) {
    case atlas::Backend::Host:
      // main applied the automatic policy before any thread started; the deck may override it.
      if (cfg.sched_batch != SchedBatch::Auto) (void)prepare_host_scheduling(cfg.sched_batch);
      return make_host_backend(cfg.threads, effective_precision(cfg));
    case atlas::Backend::Emulated:
      // No arithmetic happens (the runtime sleeps each compute slot's predicted time); one host
      // thread serves the host-memory buffers of the DP sums and a BubbleTea service. Ranks that
      // sleep need prompt wake-ups, not SCHED_BATCH's protection of computing ranks: main's
      // automatic switch is undone unless the deck asks for it.
      (void)prepare_host_scheduling(cfg.sched_batch == SchedBatch::On ? SchedBatch::On : SchedBatch::Off);
      return make_host_backend(1);
    case atlas::Backend::Cuda: {
      const BackendFactory factory = registry()[slot(cfg.backend)];
      if (factory == nullptr) {
        throw ConfigError(
            "device.backend = cuda, but this binary was built without CUDA\n"
            "  hint: rebuild with -DATLAS_ENABLE_CUDA=ON (cmake --preset cuda-release), or set "
            "device.backend = host");
      }
      return factory(cfg);
    }
  }
  throw ConfigError("device.backend has an unknown value");
}

}  // namespace atlas::device
