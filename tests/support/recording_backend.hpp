// SPDX-License-Identifier: MIT
// RecordingBackend: a host stand-in for CUDA graphs, so that CI checks what graph recording asks
// of the code that uses it (device::GraphCache, the model's block graphs) without a GPU. It wraps
// a host backend and forwards every call; between begin_capture() and end_capture() the calls are
// recorded (their arguments by value, as a CUDA graph keeps a kernel's parameters) and not run,
// and a graph launch runs them again in order. Recording refuses host transfers, waits, host
// values (sq_norm) and allocations, as the CUDA backend does. So the CALLER's work that reads a
// host value at replay, allocates, or depends on having run eagerly shows up as a result that
// differs from the plain host backend's, or as a refusal. What it does not model: the CUDA
// backend's own host-side state behind a call (cuBLASLt's bf16 weight copies and A-operand reuse,
// its workspaces and their epoch), which a launch here decides again and a CUDA graph fixes at
// its recording; test_cuda_graphs checks that on the GPU. Test-only.
#pragma once

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/device/backend.hpp"

namespace atlas::testutil {

class RecordingBackend final : public device::Backend {
 public:
  explicit RecordingBackend(Precision precision = Precision::Fp32) {
    DeviceCfg cfg;
    cfg.backend = atlas::Backend::Host;
    cfg.precision = precision;
    cfg.threads = 1;
    m_inner = device::make_backend(cfg);
  }

  // test knobs and counters
  /// Every later end_capture() gives no graph (as a CUDA capture that failed).
  void refuse_captures(bool refuse) { m_refuse = refuse; }
  /// Moves the graph epoch (as a workspace that grew): every graph is stale.
  void bump_epoch() { ++m_epoch; }
  /// Every later begin_capture() throws (as a cudaStreamBeginCapture that failed).
  void fail_begin_capture(bool fail) { m_fail_begin = fail; }
  [[nodiscard]] long long launches() const { return m_launches; }
  [[nodiscard]] long long recordings() const { return m_recordings; }
  [[nodiscard]] bool capturing() const { return m_capturing; }
  [[nodiscard]] long long aborts() const { return m_aborts; }

  [[nodiscard]] atlas::Backend kind() const noexcept override { return atlas::Backend::Host; }
  [[nodiscard]] std::string describe() const override { return "recording (" + m_inner->describe() + ")"; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] Precision precision() const noexcept override { return m_inner->precision(); }

  // ---- graphs ----
  [[nodiscard]] bool can_capture() const noexcept override { return true; }
  void begin_capture() override {
    ATLAS_ASSERT(!m_capturing, "begin_capture twice");
    if (m_fail_begin) ATLAS_THROW(Internal, "begin_capture failed (the test)");
    m_capturing = true;
    m_recorded.clear();
  }
  [[nodiscard]] std::unique_ptr<device::Graph> end_capture(std::string* why) override {
    ATLAS_ASSERT(m_capturing, "end_capture without begin_capture");
    m_capturing = false;
    auto calls = std::move(m_recorded);
    m_recorded.clear();
    if (m_refuse) {
      if (why != nullptr) *why = "refused by the test";
      return nullptr;
    }
    ++m_recordings;
    auto g = std::make_unique<Recorded>();
    g->calls = std::move(calls);
    return g;
  }
  void abort_capture() noexcept override {
    m_capturing = false;
    m_recorded.clear();
    ++m_aborts;
  }
  void launch_graph(device::Graph& graph) override {
    ATLAS_ASSERT(!m_capturing, "launch_graph while recording");
    auto* g = dynamic_cast<Recorded*>(&graph);
    ATLAS_ASSERT(g != nullptr, "a graph of another backend");
    ++m_launches;
    for (auto& call : g->calls) call();
  }
  [[nodiscard]] std::uint64_t graph_epoch() const noexcept override { return m_epoch; }

  // ---- calls a recording refuses ----
  void upload(void* dst, const void* src, std::size_t bytes) override {
    refuse("upload");
    m_inner->upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    refuse("download");
    m_inner->download(dst, src, bytes);
  }
  void synchronize() override {
    refuse("synchronize");
    m_inner->synchronize();
  }
  [[nodiscard]] double sq_norm(const float* x, std::size_t n) override {
    refuse("sq_norm");
    return m_inner->sq_norm(x, n);
  }
  [[nodiscard]] double sq_norm_multi(std::span<const device::ConstFloats> ranges) override {
    refuse("sq_norm_multi");
    return m_inner->sq_norm_multi(ranges);
  }
  [[nodiscard]] std::size_t attention_saved_floats(int b, int s, int h, int d) const override {
    return m_inner->attention_saved_floats(b, s, h, d);
  }
  [[nodiscard]] std::size_t attention_workspace_floats(int b, int s, int h, int d) const override {
    return m_inner->attention_workspace_floats(b, s, h, d);
  }

  // ---- calls recorded while capturing, run otherwise ----
  void copy(void* dst, const void* src, std::size_t bytes) override {
    run([=, this] { m_inner->copy(dst, src, bytes); });
  }
  void fill(float* x, float value, std::size_t n) override {
    run([=, this] { m_inner->fill(x, value, n); });
  }
  void scale(float* x, float alpha, std::size_t n) override {
    run([=, this] { m_inner->scale(x, alpha, n); });
  }
  void to_bf16(device::Bf16Bits* out, const float* in, std::size_t n) override {
    run([=, this] { m_inner->to_bf16(out, in, n); });
  }
  void from_bf16(float* out, const device::Bf16Bits* in, std::size_t n) override {
    run([=, this] { m_inner->from_bf16(out, in, n); });
  }
  void gemm(device::Trans ta, device::Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    run([=, this] { m_inner->gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void gemm_bf16_b(device::Trans ta, device::Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                   const device::Bf16Bits* b, int ldb, float beta, float* c, int ldc) override {
    run([=, this] { m_inner->gemm_bf16_b(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void gemm_bf16_a(device::Trans ta, device::Trans tb, int m, int n, int k, float alpha, const device::Bf16Bits* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    run([=, this] { m_inner->gemm_bf16_a(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
  }
  void add_bias(float* out, const float* bias, int rows, int cols) override {
    run([=, this] { m_inner->add_bias(out, bias, rows, cols); });
  }
  void bias_grad(float* dbias, const float* dout, int rows, int cols) override {
    run([=, this] { m_inner->bias_grad(dbias, dout, rows, cols); });
  }
  void add(float* out, const float* a, const float* b, std::size_t n) override {
    run([=, this] { m_inner->add(out, a, b, n); });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                         int rows, int cols) override {
    run([=, this] { m_inner->layernorm_forward(out, mean, rstd, in, w, b, rows, cols); });
  }
  void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                          const float* mean, const float* rstd, int rows, int cols) override {
    run([=, this] { m_inner->layernorm_backward(din, dw, db, dout, in, w, mean, rstd, rows, cols); });
  }
  void gelu_forward(float* out, const float* in, std::size_t n) override {
    run([=, this] { m_inner->gelu_forward(out, in, n); });
  }
  void gelu_backward(float* din, const float* in, const float* dout, std::size_t n) override {
    run([=, this] { m_inner->gelu_backward(din, in, dout, n); });
  }
  void attention_forward(float* out, float* saved, const float* qkv, int b, int s, int h, int d,
                         float* ws) override {
    run([=, this] { m_inner->attention_forward(out, saved, qkv, b, s, h, d, ws); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* saved,
                          int b, int s, int h, int d, float* ws) override {
    run([=, this] { m_inner->attention_backward(dqkv, dout, qkv, out, saved, b, s, h, d, ws); });
  }
  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe, int b, int s,
                         int c) override {
    run([=, this] { m_inner->embedding_forward(out, tokens, wte, wpe, b, s, c); });
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int b, int s,
                          int c) override {
    run([=, this] { m_inner->embedding_backward(dwte, dwpe, dout, tokens, b, s, c); });
  }
  void softmax_xent_forward(float* losses, float* probs, const float* logits, const std::int32_t* targets,
                            int rows, int vocab) override {
    run([=, this] { m_inner->softmax_xent_forward(losses, probs, logits, targets, rows, vocab); });
  }
  void softmax_xent_backward(float* dlogits, const float* probs, const std::int32_t* targets, int rows, int vocab,
                             float scale) override {
    run([=, this] { m_inner->softmax_xent_backward(dlogits, probs, targets, rows, vocab, scale); });
  }
  void adamw_update(float* p, const float* g, float* m, float* v, std::size_t n,
                    const device::AdamWArgs& args) override {
    run([=, this] { m_inner->adamw_update(p, g, m, v, n, args); });
  }
  void linear_forward(float* out, float* pre, const float* in, const float* w, const float* bias, int rows,
                      int in_f, int out_f, device::Activation act) override {
    run([=, this] { m_inner->linear_forward(out, pre, in, w, bias, rows, in_f, out_f, act); });
  }
  void linear_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                       const float* in_pre, int rows, int in_f, int out_f, device::Activation act) override {
    run([=, this] { m_inner->linear_backward(din, dw, db, dout, in, w, in_pre, rows, in_f, out_f, act); });
  }
  void linear_backward_weight(float* dw, float* db, const float* dout, const float* in, int rows, int in_f,
                              int out_f) override {
    run([=, this] { m_inner->linear_backward_weight(dw, db, dout, in, rows, in_f, out_f); });
  }
  void linear_forward_bf16_in(float* out, float* pre, const device::Bf16Bits* in, const float* w,
                              const float* bias, int rows, int in_f, int out_f, device::Activation act) override {
    run([=, this] { m_inner->linear_forward_bf16_in(out, pre, in, w, bias, rows, in_f, out_f, act); });
  }
  void linear_backward_bf16_in(float* din, float* dw, float* db, const float* dout, const device::Bf16Bits* in,
                               const float* w, const float* in_pre, int rows, int in_f, int out_f,
                               device::Activation act) override {
    run([=, this] { m_inner->linear_backward_bf16_in(din, dw, db, dout, in, w, in_pre, rows, in_f, out_f, act); });
  }
  void linear_backward_weight_bf16_in(float* dw, float* db, const float* dout, const device::Bf16Bits* in,
                                      int rows, int in_f, int out_f) override {
    run([=, this] { m_inner->linear_backward_weight_bf16_in(dw, db, dout, in, rows, in_f, out_f); });
  }
  void residual_layernorm_forward(float* res, float* ln_out, float* mean, float* rstd, const float* x,
                                  const float* delta, const float* bias, const float* ln_w, const float* ln_b,
                                  int rows, int cols) override {
    run([=, this] {
      m_inner->residual_layernorm_forward(res, ln_out, mean, rstd, x, delta, bias, ln_w, ln_b, rows, cols);
    });
  }
  void softmax_xent_fused(float* losses, float* dlogits, const float* logits, const std::int32_t* targets,
                          int rows, int vocab, float scale) override {
    run([=, this] { m_inner->softmax_xent_fused(losses, dlogits, logits, targets, rows, vocab, scale); });
  }
  void adamw_update_multi(std::span<const device::AdamWTensor> tensors, const device::AdamWArgs& args) override {
    std::vector<device::AdamWTensor> copy(tensors.begin(), tensors.end());
    run([=, this] { m_inner->adamw_update_multi(copy, args); });
  }

 protected:
  void* allocate(std::size_t bytes) override {
    refuse("an allocation");
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    ATLAS_ASSERT(p != nullptr, "out of host memory");
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* ptr, std::size_t /*bytes*/) noexcept override { std::free(ptr); }

 private:
  struct Recorded final : device::Graph {
    std::vector<std::function<void()>> calls;
  };
  void refuse(const char* what) const {
    if (m_capturing) ATLAS_THROW(Internal, "recording backend: " << what << " inside a graph recording");
  }
  void run(std::function<void()> call) {
    if (m_capturing) m_recorded.push_back(std::move(call));
    else call();
  }

  std::unique_ptr<device::Backend> m_inner;
  bool m_capturing = false;
  bool m_refuse = false;
  bool m_fail_begin = false;
  std::uint64_t m_epoch = 1;
  long long m_launches = 0;
  long long m_recordings = 0;
  long long m_aborts = 0;
  std::vector<std::function<void()>> m_recorded;
};

}  // namespace atlas::testutil
