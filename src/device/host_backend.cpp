// SPDX-License-Identifier: MIT
// The host backend: OpenBLAS for GEMM, plain C++ loops with OpenMP for every other kernel.
// Reductions run over fixed blocks in a fixed order, so results do not depend on the thread
// count. This is the reference the CUDA backend is checked against; keep it simple and exact.
#include "atlas/device/host_backend.hpp"

#include <cblas.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/env.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/units.hpp"
#include "atlas/device/rounding.hpp"

namespace atlas::device {

namespace {

constexpr std::size_t kAlign = 64;
constexpr float kLnEps = 1e-5F;
// Column block for per-column reductions (bias and LayerNorm weight gradients, embeddings).
constexpr int kColBlock = 64;
// Element block for sq_norm partial sums.
constexpr std::size_t kNormBlock = 1 << 14;
// Below this much work (element operations) a kernel runs on the calling thread: a parallel
// region costs a fork/join, which is expensive when ranks share cores with other processes.
constexpr std::size_t kParallelWork = std::size_t{1} << 16;

int col_blocks(int cols) { return (cols + kColBlock - 1) / kColBlock; }

// Row-major storage extent (elements) of an operand op(X)[rows, cols] stored with row stride ld.
std::size_t extent(Trans t, int rows, int cols, int ld) {
  const int stored_rows = t == Trans::Yes ? cols : rows;
  const int stored_cols = t == Trans::Yes ? rows : cols;
  if (stored_rows == 0 || stored_cols == 0) return 0;
  return static_cast<std::size_t>(stored_rows - 1) * static_cast<std::size_t>(ld) +
         static_cast<std::size_t>(stored_cols);
}

class HostBackend final : public Backend {
 public:
  HostBackend(int threads, Precision precision) : m_threads(threads), m_precision(precision) {
    ATLAS_ASSERT(precision != Precision::Auto, "the host backend needs a resolved precision (effective_precision)");
    openblas_set_num_threads(threads);
  }

  [[nodiscard]] atlas::Backend kind() const noexcept override { return atlas::Backend::Host; }
  [[nodiscard]] std::string describe() const override {
    const char* emulation = m_precision == Precision::Bf16   ? ", bf16 matmul inputs emulated"
                            : m_precision == Precision::Tf32 ? ", tf32 matmul inputs emulated"
                                                             : "";
    return fmt::format("host (OpenBLAS, {} thread{}{})", m_threads, m_threads == 1 ? "" : "s", emulation);
  }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] Precision precision() const noexcept override { return m_precision; }
  /// The rank's peak resident set (Linux reports ru_maxrss in KiB): its Buffers, the model's
  /// host-side state, MPI and the libraries, as `atlas bench` and the tests read it.
  [[nodiscard]] std::size_t peak_bytes() const override {
    rusage u{};
    if (getrusage(RUSAGE_SELF, &u) != 0) return buffer_peak_bytes();
    return std::max(static_cast<std::size_t>(u.ru_maxrss) * 1024, buffer_peak_bytes());
  }

  // ---- memory ----
  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void fill(float* x, float value, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t i = 0; i < count; ++i) x[i] = value;
  }
  void scale(float* x, float alpha, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t i = 0; i < count; ++i) x[i] *= alpha;
  }
  void synchronize() override {}
  void to_bf16(Bf16Bits* out, const float* in, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t i = 0; i < count; ++i) out[i] = float_to_bf16_bits(in[i]);
  }
  void from_bf16(float* out, const Bf16Bits* in, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t i = 0; i < count; ++i) out[i] = bf16_bits_to_float(in[i]);
  }

  // ---- dense algebra ----
  void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    if (m_precision != Precision::Fp32 && k > 0) {
      // docs/precision.md: both operands rounded (RNE) into reusable scratch, products and sums fp32.
      a = rounded(a, extent(trans_a, m, k, lda), m_gemm_a);
      b = rounded(b, extent(trans_b, k, n, ldb), m_gemm_b);
    }
    cblas_sgemm(CblasRowMajor, trans_a == Trans::Yes ? CblasTrans : CblasNoTrans,
                trans_b == Trans::Yes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
  }
  // B widened (exactly) into the scratch gemm() rounds B into, then the fp32 gemm of A at this
  // backend's precision: bitwise gemm() of the tensor B was rounded from, at Bf16 (and at Tf32,
  // whose rounding keeps every bf16 value).
  void gemm_bf16_b(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const Bf16Bits* b, int ldb, float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    const std::size_t nb = k > 0 ? extent(trans_b, k, n, ldb) : 0;
    if (m_gemm_b.size() < nb) m_gemm_b.resize(nb);
    from_bf16(m_gemm_b.data(), b, nb);
    if (m_precision != Precision::Fp32 && k > 0) a = rounded(a, extent(trans_a, m, k, lda), m_gemm_a);
    cblas_sgemm(CblasRowMajor, trans_a == Trans::Yes ? CblasTrans : CblasNoTrans,
                trans_b == Trans::Yes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                m_gemm_b.data(), ldb, beta, c, ldc);
  }
  // A widened into the gemm's A scratch (exact), B rounded as gemm() rounds it.
  void gemm_bf16_a(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const Bf16Bits* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    const std::size_t na = k > 0 ? extent(trans_a, m, k, lda) : 0;
    if (m_gemm_a.size() < na) m_gemm_a.resize(na);
    from_bf16(m_gemm_a.data(), a, na);
    if (m_precision != Precision::Fp32 && k > 0) b = rounded(b, extent(trans_b, k, n, ldb), m_gemm_b);
    cblas_sgemm(CblasRowMajor, trans_a == Trans::Yes ? CblasTrans : CblasNoTrans,
                trans_b == Trans::Yes ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                m_gemm_a.data(), lda, b, ldb, beta, c, ldc);
  }
  void add_bias(float* out, const float* bias, int rows, int cols) override {
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * cols))
    for (int r = 0; r < rows; ++r) {
      float* o = out + static_cast<std::size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) o[c] += bias[c];
    }
  }
  void bias_grad(float* dbias, const float* dout, int rows, int cols) override {
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * cols))
    for (int blk = 0; blk < col_blocks(cols); ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = std::min(cols, c0 + kColBlock);
      double acc[kColBlock] = {};
      for (int r = 0; r < rows; ++r) {
        const float* d = dout + static_cast<std::size_t>(r) * cols;
        for (int c = c0; c < c1; ++c) acc[c - c0] += d[c];
      }
      for (int c = c0; c < c1; ++c) dbias[c] += static_cast<float>(acc[c - c0]);
    }
  }
  void add(float* out, const float* a, const float* b, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
  }
  double sq_norm(const float* x, std::size_t n) override {
    const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(blocks, 0.0);
    const auto nblocks = static_cast<std::ptrdiff_t>(blocks);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
    for (std::ptrdiff_t blk = 0; blk < nblocks; ++blk) {
      const std::size_t i0 = static_cast<std::size_t>(blk) * kNormBlock;
      const std::size_t i1 = std::min(n, i0 + kNormBlock);
      double acc = 0.0;
      for (std::size_t i = i0; i < i1; ++i) acc += static_cast<double>(x[i]) * x[i];
      partial[static_cast<std::size_t>(blk)] = acc;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
  }

  // ---- layers ----
  void layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                         const float* weight, const float* bias, int rows, int cols) override {
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(3 * static_cast<std::size_t>(rows) * cols))
    for (int r = 0; r < rows; ++r) {
      const float* x = in + static_cast<std::size_t>(r) * cols;
      float* o = out + static_cast<std::size_t>(r) * cols;
      double sum = 0.0;
      for (int c = 0; c < cols; ++c) sum += x[c];
      const double mu = sum / cols;
      double var = 0.0;
      for (int c = 0; c < cols; ++c) {
        const double d = x[c] - mu;
        var += d * d;
      }
      const auto m = static_cast<float>(mu);
      const auto s = static_cast<float>(1.0 / std::sqrt(var / cols + kLnEps));
      for (int c = 0; c < cols; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[r] = m;
      rstd[r] = s;
    }
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                          const float* in, const float* weight, const float* mean,
                          const float* rstd, int rows, int cols) override {
    // Input gradient: rows are independent.
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(3 * static_cast<std::size_t>(rows) * cols))
    for (int r = 0; r < rows; ++r) {
      const std::size_t off = static_cast<std::size_t>(r) * cols;
      const float* x = in + off;
      const float* d = dout + off;
      float* dx = din + off;
      const float m = mean[r];
      const float s = rstd[r];
      double dnorm_mean = 0.0;
      double dnorm_norm_mean = 0.0;
      for (int c = 0; c < cols; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += static_cast<double>(dnorm) * norm;
      }
      const auto a = static_cast<float>(dnorm_mean / cols);
      const auto b = static_cast<float>(dnorm_norm_mean / cols);
      for (int c = 0; c < cols; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        dx[c] += (dnorm - a - norm * b) * s;
      }
    }
    // Weight and bias gradients: one thread per column block, rows summed in order.
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * cols))
    for (int blk = 0; blk < col_blocks(cols); ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = std::min(cols, c0 + kColBlock);
      double dw[kColBlock] = {};
      double db[kColBlock] = {};
      for (int r = 0; r < rows; ++r) {
        const std::size_t off = static_cast<std::size_t>(r) * cols;
        const float m = mean[r];
        const float s = rstd[r];
        for (int c = c0; c < c1; ++c) {
          const float norm = (in[off + c] - m) * s;
          dw[c - c0] += static_cast<double>(norm) * dout[off + c];
          db[c - c0] += dout[off + c];
        }
      }
      for (int c = c0; c < c1; ++c) {
        dweight[c] += static_cast<float>(dw[c - c0]);
        dbias[c] += static_cast<float>(db[c - c0]);
      }
    }
  }
  void gelu_forward(float* out, const float* in, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(8 * n))
    for (std::ptrdiff_t i = 0; i < count; ++i) {
      const float x = in[i];
      const float cube = 0.044715F * x * x * x;
      out[i] = 0.5F * x * (1.0F + fast_tanh(kGeluScale * (x + cube)));
    }
  }
  void gelu_backward(float* din, const float* in, const float* dout, std::size_t n) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(8 * n))
    for (std::ptrdiff_t i = 0; i < count; ++i) {
      const float x = in[i];
      const float cube = 0.044715F * x * x * x;
      const float t = fast_tanh(kGeluScale * (x + cube));
      const float sech2 = 1.0F - t * t;
      const float local = 0.5F * (1.0F + t) +
                          0.5F * x * sech2 * kGeluScale * (1.0F + 3.0F * 0.044715F * x * x);
      din[i] = local * dout[i];
    }
  }

  [[nodiscard]] std::size_t attention_saved_floats(int batch, int seq, int heads,
                                                   int /*head_dim*/) const override {
    return static_cast<std::size_t>(batch) * heads * seq * seq;
  }
  [[nodiscard]] std::size_t attention_workspace_floats(int, int, int, int) const override {
    return 0;
  }
  void attention_forward(float* out, float* saved, const float* qkv, int batch, int seq,
                         int heads, int head_dim, float* /*workspace*/) override {
    if (m_precision == Precision::Fp32) {
      attention_forward_impl<Precision::Fp32>(out, saved, qkv, batch, seq, heads, head_dim);
      return;
    }
    // docs/precision.md: q, k, v rounded; scores and softmax in fp32; P rounded before P.V.
    const float* rqkv = rounded(qkv, 3 * static_cast<std::size_t>(batch) * seq * heads * head_dim, m_att_qkv);
    if (m_precision == Precision::Bf16)
      attention_forward_impl<Precision::Bf16>(out, saved, rqkv, batch, seq, heads, head_dim);
    else
      attention_forward_impl<Precision::Tf32>(out, saved, rqkv, batch, seq, heads, head_dim);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, int batch, int seq, int heads, int head_dim,
                          float* /*workspace*/) override {
    if (m_precision == Precision::Fp32) {
      attention_backward_impl<Precision::Fp32>(dqkv, dout, qkv, out, saved, batch, seq, heads, head_dim);
      return;
    }
    // docs/precision.md: q, k, v and dout rounded; P rounded before dV = P^T.dO; dP, the row sums
    // and dS in fp32; dS rounded before dQ = dS.K and dK = dS^T.Q.
    const std::size_t tokens = static_cast<std::size_t>(batch) * seq;
    const float* rqkv = rounded(qkv, 3 * tokens * heads * head_dim, m_att_qkv);
    const float* rdout = rounded(dout, tokens * heads * head_dim, m_att_dout);
    if (m_precision == Precision::Bf16)
      attention_backward_impl<Precision::Bf16>(dqkv, rdout, rqkv, out, saved, batch, seq, heads, head_dim);
    else
      attention_backward_impl<Precision::Tf32>(dqkv, rdout, rqkv, out, saved, batch, seq, heads, head_dim);
  }

  void embedding_forward(float* out, const std::int32_t* tokens, const float* wte,
                         const float* wpe, int batch, int seq, int channels) override {
    const int rows = batch * seq;
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * channels))
    for (int r = 0; r < rows; ++r) {
      const float* e = wte + static_cast<std::size_t>(tokens[r]) * channels;
      const float* p = wpe + static_cast<std::size_t>(r % seq) * channels;
      float* o = out + static_cast<std::size_t>(r) * channels;
      for (int c = 0; c < channels; ++c) o[c] = e[c] + p[c];
    }
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout,
                          const std::int32_t* tokens, int batch, int seq,
                          int channels) override {
    const int rows = batch * seq;
    // Token table: one thread per column block, tokens in order (repeated tokens never race).
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * channels))
    for (int blk = 0; blk < col_blocks(channels); ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = std::min(channels, c0 + kColBlock);
      for (int r = 0; r < rows; ++r) {
        float* dw = dwte + static_cast<std::size_t>(tokens[r]) * channels;
        const float* d = dout + static_cast<std::size_t>(r) * channels;
        for (int c = c0; c < c1; ++c) dw[c] += d[c];
      }
    }
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * channels))
    for (int t = 0; t < seq; ++t) {
      float* dp = dwpe + static_cast<std::size_t>(t) * channels;
      for (int b = 0; b < batch; ++b) {
        const float* d = dout + (static_cast<std::size_t>(b) * seq + t) * channels;
        for (int c = 0; c < channels; ++c) dp[c] += d[c];
      }
    }
  }
  void softmax_xent_forward(float* losses, float* probs, const float* logits,
                            const std::int32_t* targets, int rows, int vocab) override {
    check_targets(targets, rows, vocab);
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(2 * static_cast<std::size_t>(rows) * vocab))
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<std::size_t>(r) * vocab;
      float* p = probs + static_cast<std::size_t>(r) * vocab;
      float maxv = -INFINITY;
      for (int v = 0; v < vocab; ++v) maxv = std::max(maxv, z[v]);
      const float zt = z[targets[r]];  // before p (which may alias z) is written
      double sum = 0.0;
      for (int v = 0; v < vocab; ++v) {
        p[v] = std::exp(z[v] - maxv);
        sum += p[v];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      // -log p[t] = log(sum) - (z[t] - max), from the logits: the normalised p[t] underflows to 0
      // for a logit ~88 below the row's max, and a floor on it capped the loss (at -log(1e-30) =
      // 69.08) however far a diverging model went.
      losses[r] = static_cast<float>(std::log(sum) - static_cast<double>(zt - maxv));
      for (int v = 0; v < vocab; ++v) p[v] *= inv;
    }
  }
  void softmax_xent_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                             int rows, int vocab, float scale) override {
    check_targets(targets, rows, vocab);
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(static_cast<std::size_t>(rows) * vocab))
    for (int r = 0; r < rows; ++r) {
      const float* p = probs + static_cast<std::size_t>(r) * vocab;
      float* d = dlogits + static_cast<std::size_t>(r) * vocab;
      for (int v = 0; v < vocab; ++v) d[v] = p[v] * scale;
      d[targets[r]] -= scale;
    }
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, std::size_t n,
                    const AdamWArgs& a) override {
    const auto count = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(4 * n))
    for (std::ptrdiff_t i = 0; i < count; ++i) {
      const float g = grad[i] * a.grad_scale;
      m[i] = a.beta1 * m[i] + (1.0F - a.beta1) * g;
      v[i] = a.beta2 * v[i] + (1.0F - a.beta2) * g * g;
      const float mhat = m[i] / a.bias_correction1;
      const float vhat = v[i] / a.bias_correction2;
      param[i] -= a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * param[i]);
    }
  }

 protected:
  void* allocate(std::size_t bytes) override {
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* ptr = std::aligned_alloc(kAlign, rounded);
    if (ptr == nullptr) {
      ATLAS_THROW(Device, "host backend: cannot allocate "
                              << units::format_bytes_human(static_cast<double>(bytes))
                              << " (out of memory?)");
    }
    std::memset(ptr, 0, rounded);
    return ptr;
  }
  void release(void* ptr, std::size_t /*bytes*/) noexcept override { std::free(ptr); }

 private:
  [[nodiscard]] bool parallel(std::size_t work) const noexcept {
    return m_threads > 1 && work >= kParallelWork;
  }

  // x rounded to precision P's matmul input (the identity for Fp32).
  template <Precision P>
  static float round_as(float x) noexcept {
    if constexpr (P == Precision::Bf16) return round_to_bf16(x);
    else if constexpr (P == Precision::Tf32) return round_to_tf32(x);
    else return x;
  }

  // The first n elements of x rounded to this backend's precision, in `scratch` (grown to the
  // largest n seen, never shrunk: no allocation per call once warm). Returns scratch's data.
  const float* rounded(const float* x, std::size_t n, std::vector<float>& scratch) {
    if (scratch.size() < n) scratch.resize(n);
    float* r = scratch.data();
    const auto count = static_cast<std::ptrdiff_t>(n);
    if (m_precision == Precision::Bf16) {
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
      for (std::ptrdiff_t i = 0; i < count; ++i) r[i] = round_to_bf16(x[i]);
    } else {
#pragma omp parallel for num_threads(m_threads) schedule(static) if (parallel(n))
      for (std::ptrdiff_t i = 0; i < count; ++i) r[i] = round_to_tf32(x[i]);
    }
    return r;
  }

  // Causal attention forward (see Backend::attention_forward). P = Fp32: the reference; else `qkv`
  // holds rounded values and P is rounded before P.V (the stored probabilities stay fp32).
  template <Precision P>
  void attention_forward_impl(float* out, float* saved, const float* qkv, int batch, int seq, int heads,
                              int head_dim) {
    const int hd = head_dim;
    const std::size_t row = 3 * static_cast<std::size_t>(heads) * hd;  // qkv floats per token
    const std::size_t orow = static_cast<std::size_t>(heads) * hd;
    const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
    const std::ptrdiff_t total = static_cast<std::ptrdiff_t>(batch) * heads * seq;
#pragma omp parallel for num_threads(m_threads) \
    schedule(dynamic, 4) if (parallel(static_cast<std::size_t>(total) * seq * hd))
    for (std::ptrdiff_t idx = 0; idx < total; ++idx) {
      const int t = static_cast<int>(idx % seq);
      const int h = static_cast<int>((idx / seq) % heads);
      const int b = static_cast<int>(idx / (static_cast<std::ptrdiff_t>(seq) * heads));
      const float* q = qkv + (static_cast<std::size_t>(b) * seq + t) * row + h * hd;
      float* att = saved + ((static_cast<std::size_t>(b) * heads + h) * seq + t) * seq;
      float maxv = -INFINITY;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* k = qkv + (static_cast<std::size_t>(b) * seq + t2) * row + orow + h * hd;
        float dot = 0.0F;
        for (int d = 0; d < hd; ++d) dot += q[d] * k[d];
        dot *= scale;
        att[t2] = dot;
        maxv = std::max(maxv, dot);
      }
      float sum = 0.0F;
      for (int t2 = 0; t2 <= t; ++t2) {
        att[t2] = std::exp(att[t2] - maxv);
        sum += att[t2];
      }
      const float inv = 1.0F / sum;
      for (int t2 = 0; t2 <= t; ++t2) att[t2] *= inv;
      for (int t2 = t + 1; t2 < seq; ++t2) att[t2] = 0.0F;
      float* o = out + (static_cast<std::size_t>(b) * seq + t) * orow + h * hd;
      for (int d = 0; d < hd; ++d) o[d] = 0.0F;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* v =
            qkv + (static_cast<std::size_t>(b) * seq + t2) * row + 2 * orow + h * hd;
        const float a = round_as<P>(att[t2]);
        for (int d = 0; d < hd; ++d) o[d] += a * v[d];
      }
    }
  }
  // Attention backward (see Backend::attention_backward). P = Fp32: the reference (the row sum
  // is sum_t2 P dP). Else `qkv` and `dout` hold rounded values, the row sum is rowsum(dO * O) (as a
  // fused kernel computes it), P is rounded for dV and dS for dQ and dK.
  template <Precision P>
  void attention_backward_impl(float* dqkv, const float* dout, const float* qkv, [[maybe_unused]] const float* out,
                               const float* saved, int batch, int seq, int heads, int head_dim) {
    const int hd = head_dim;
    const std::size_t row = 3 * static_cast<std::size_t>(heads) * hd;
    const std::size_t orow = static_cast<std::size_t>(heads) * hd;
    const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
    // One (b, h) per iteration: it owns the q/k/v slices of head h of sample b, so no races.
#pragma omp parallel for num_threads(m_threads) \
    schedule(static) if (parallel(2 * static_cast<std::size_t>(batch) * heads * seq * seq * hd))
    for (int bh = 0; bh < batch * heads; ++bh) {
      const int b = bh / heads;
      const int h = bh % heads;
      std::vector<float> datt(static_cast<std::size_t>(seq));
      const std::size_t base = static_cast<std::size_t>(b) * seq * row + h * hd;
      for (int t = 0; t < seq; ++t) {
        float* dq = dqkv + base + t * row;
        for (int d = 0; d < hd; ++d) dq[d] = dq[orow + d] = dq[2 * orow + d] = 0.0F;
      }
      for (int t = 0; t < seq; ++t) {
        const float* att = saved + ((static_cast<std::size_t>(b) * heads + h) * seq + t) * seq;
        const float* dy = dout + (static_cast<std::size_t>(b) * seq + t) * orow + h * hd;
        const float* q = qkv + base + t * row;
        float* dq = dqkv + base + t * row;
        // dL/datt and dL/dv
        float weighted = 0.0F;
        if constexpr (P != Precision::Fp32) {
          const float* o = out + (static_cast<std::size_t>(b) * seq + t) * orow + h * hd;
          for (int d = 0; d < hd; ++d) weighted += dy[d] * o[d];
        }
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + base + t2 * row + 2 * orow;
          float* dv = dqkv + base + t2 * row + 2 * orow;
          const float p = round_as<P>(att[t2]);
          float dot = 0.0F;
          for (int d = 0; d < hd; ++d) {
            dot += dy[d] * v[d];
            dv[d] += p * dy[d];
          }
          datt[static_cast<std::size_t>(t2)] = dot;
          if constexpr (P == Precision::Fp32) weighted += att[t2] * dot;
        }
        // softmax backward, then the scaled dot product
        for (int t2 = 0; t2 <= t; ++t2) {
          const float dp = datt[static_cast<std::size_t>(t2)];
          const float dpre = P == Precision::Fp32 ? att[t2] * (dp - weighted) * scale
                                                  : round_as<P>(att[t2] * (dp - weighted)) * scale;
          const float* k = qkv + base + t2 * row + orow;
          float* dk = dqkv + base + t2 * row + orow;
          for (int d = 0; d < hd; ++d) {
            dq[d] += dpre * k[d];
            dk[d] += dpre * q[d];
          }
        }
      }
    }
  }


  static constexpr float kGeluScale = 0.7978845608028654F;  // sqrt(2/pi)

  // tanh through one expf: 1 - 2 / (exp(2u) + 1). Several times cheaper than tanhf (which goes
  // through expm1f) and within a few ulp of 1 in absolute terms; saturates correctly at +-inf.
  static float fast_tanh(float u) noexcept { return 1.0F - 2.0F / (std::exp(2.0F * u) + 1.0F); }

  // Targets index rows of probs: an out-of-range id would read or write out of bounds.
  static void check_targets(const std::int32_t* targets, int rows, int vocab) {
    for (int r = 0; r < rows; ++r) {
      if (targets[r] < 0 || targets[r] >= vocab) {
        ATLAS_THROW(Internal, "cross-entropy target " << targets[r] << " at row " << r
                                                      << " is outside the vocabulary [0, "
                                                      << vocab << ")");
      }
    }
  }

  int m_threads;
  Precision m_precision;
  // Rounded copies of matmul inputs (bf16/tf32 emulation only; empty at fp32).
  std::vector<float> m_gemm_a, m_gemm_b, m_att_qkv, m_att_dout;
};

/// Ranks that share this machine's cores. ATLAS_HOST_RANKS first: in the emulated WAN every DC is a
/// network namespace that Open MPI counts as a node of its own, so its local size undercounts the
/// ranks on these cores (2 ranks in 2 namespaces on 2 cores each took 2 threads: steps 5x slower).
int local_ranks_from_env() {
  for (const char* var : {"ATLAS_HOST_RANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const std::optional<std::string> value = env::get(var);
    if (!value) continue;
    const std::optional<std::int64_t> n = units::parse_int(*value);
    if (n && *n > 0 && *n <= 1'000'000) return static_cast<int>(*n);
    // The user's variable is theirs to fix (garbage such as "4x" or 4294967297, which a cast made
    // 1, fell through to the launcher's count silently); a launcher's is skipped.
    if (std::string_view(var) == "ATLAS_HOST_RANKS")
      throw ConfigError(fmt::format("ATLAS_HOST_RANKS = '{}' is not a rank count\n  hint: the number of ranks that "
                                    "share this machine's cores, 1 to 1000000, or unset it",
                                    *value));
  }
  return 1;
}

std::string g_sched_note;  // what prepare_host_scheduling did (the run header prints it)

/// Sets `policy` on every thread of this process (sched_setscheduler changes one thread, and the
/// deck's device.sched_batch is applied after MPI_Init and the BLAS pool started theirs). Returns
/// 0, or the errno of the first thread that refused.
int set_policy_all_threads(int policy) {
  sched_param p{};
  p.sched_priority = 0;
  int first_error = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const auto tid = units::parse_int(task.path().filename().string());
    if (!tid) continue;
    const int current = ::sched_getscheduler(static_cast<pid_t>(*tid));
    if (current < 0 || current == policy) continue;  // gone meanwhile, or already there
    if (::sched_setscheduler(static_cast<pid_t>(*tid), policy, &p) != 0 && first_error == 0) first_error = errno;
  }
  if (ec) {  // no /proc: this thread only
    if (::sched_getscheduler(0) != policy && ::sched_setscheduler(0, policy, &p) != 0) return errno;
  }
  return first_error;
}

}  // namespace

int host_local_ranks() { return local_ranks_from_env(); }

std::string prepare_host_scheduling(SchedBatch mode) {
  const int ranks = local_ranks_from_env();
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Auto with a core per rank leaves the policy alone (a user's `chrt -b` stays).
  if (mode == SchedBatch::Auto && ranks <= hw) return g_sched_note = "";
  if (mode == SchedBatch::Off) {
    // device.sched_batch = false after main's automatic switch: every thread back to the default.
    (void)set_policy_all_threads(SCHED_OTHER);
    return g_sched_note = "";
  }
  if (const int err = set_policy_all_threads(SCHED_BATCH); err != 0) {
    g_sched_note = fmt::format("# host: {} ranks share {} hardware threads; SCHED_BATCH refused ({}), default "
                               "scheduling\n",
                               ranks, hw, std::strerror(err));
  } else {
    g_sched_note = fmt::format("# host: {} ranks share {} hardware threads: SCHED_BATCH (a rank waking from a poll "
                               "does not preempt one that computes; device.sched_batch = false turns it off)\n",
                               ranks, hw);
  }
  return g_sched_note;
}

const std::string& host_scheduling_note() { return g_sched_note; }

std::string scheduling_group() {
  std::ifstream enabled("/proc/sys/kernel/sched_autogroup_enabled");
  int on = 0;
  if (!(enabled >> on) || on != 1) return "";
  std::ifstream boot("/proc/sys/kernel/random/boot_id"), group("/proc/self/autogroup");
  std::string machine, name;
  if (!(boot >> machine) || !(group >> name)) return "";
  return machine + " " + name;
}

std::string autogroup_note(const std::vector<std::string>& groups, int rank) {
  const std::string& mine = groups.at(static_cast<std::size_t>(rank));
  if (mine.empty()) return "";
  const std::string machine = mine.substr(0, mine.find(' '));
  std::set<std::string> distinct;
  int here = 0;
  for (const std::string& g : groups)
    if (g.rfind(machine + " ", 0) == 0) {
      ++here;
      distinct.insert(g);
    }
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (distinct.size() < 2 || here < hw) return "";
  return fmt::format(
      "# host: kernel.sched_autogroup_enabled = 1 and the {} ranks on this machine ({} hardware threads) are in {} "
      "session groups: the scheduler shares a core between groups by their load on it, and a rank's WAN helper "
      "threads can wait tens of ms for a core another rank computes on (sysctl kernel.sched_autogroup_enabled=0 "
      "removes that)\n",
      here, hw, distinct.size());
}

int resolve_host_threads(int requested) {
  if (requested > 0) return requested;
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, hw / local_ranks_from_env());
}

std::unique_ptr<Backend> make_host_backend(int threads, Precision precision) {
  return std::make_unique<HostBackend>(resolve_host_threads(threads), precision);
}

}  // namespace atlas::device
