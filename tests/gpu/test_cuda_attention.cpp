// SPDX-License-Identifier: MIT
// The CUDA backend's fused causal attention (kernels/flash_attention.cu) on a GPU: fp32 against
// the unfused fp32 path and the host backend, bf16 within its stated tolerance, memory linear in
// seq_len, dK/dV deterministic, the head_dim > 128 fallback. Tolerances: docs/attention.md.
// Without a visible GPU every test skips with the runtime's reason; the size rules are checked
// on any machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "cuda_backend.hpp"
#include "cuda_backend_impl.hpp"
#include "flash_attention.hpp"
#include "gpu/cuda_test_util.hpp"
#include "support/attention_shape.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::device {
namespace {

using testutil::max_rel_diff;
using testutil::no_device_reason;
using testutil::random_vec;

using Shape = testutil::AttentionShape;

// ---- without a GPU: the sizes the backend reports come from these rules ----

TEST(CudaAttentionSizes, FusedStateIsLinearInSeqLen) {
  for (const int d : {32, 64, 128}) {
    EXPECT_TRUE(cuda::kernels::flash_supports(d));
    EXPECT_EQ(cuda::kernels::flash_row_floats(4, 1024, 12), 4U * 12U * 1024U);
    EXPECT_EQ(cuda::kernels::flash_row_floats(4, 2048, 12),
              2 * cuda::kernels::flash_row_floats(4, 1024, 12));
  }
  EXPECT_FALSE(cuda::kernels::flash_supports(129));
  EXPECT_FALSE(cuda::kernels::flash_supports(0));
}

// ---- on a GPU ----

struct Outcome {
  std::vector<float> out, dqkv;
  std::size_t saved = 0, workspace = 0;
};

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device visible (" << reason << "): skipped";
    DeviceCfg cfg;
    cfg.backend = atlas::Backend::Cuda;
    cfg.precision = Precision::Fp32;
    cuda_be = make_backend(cfg);
    host_be = make_host_backend(2);
  }

  cuda::CudaBackend& cuda() { return dynamic_cast<cuda::CudaBackend&>(*cuda_be); }

  /// Forward then backward on `be` (dqkv starts as garbage: it must be overwritten).
  static Outcome run(Backend& be, const Shape& s, const std::vector<float>& qkv,
                     const std::vector<float>& dout) {
    Outcome o;
    o.saved = be.attention_saved_floats(s.batch, s.seq, s.heads, s.head_dim);
    o.workspace = be.attention_workspace_floats(s.batch, s.seq, s.heads, s.head_dim);
    Buffer q = testutil::upload(be, qkv);
    Buffer dy = testutil::upload(be, dout);
    Buffer out = be.alloc_floats(s.tokens() * s.hd());
    Buffer dq = testutil::upload(be, random_vec(s.tokens() * 3 * s.hd(), 77));
    Buffer saved = be.alloc_floats(o.saved);
    Buffer ws = be.alloc_floats(o.workspace);
    be.attention_forward(out.f32(), saved.f32(), q.f32(), s.batch, s.seq, s.heads, s.head_dim,
                         ws.f32());
    be.attention_backward(dq.f32(), dy.f32(), q.f32(), out.f32(), saved.f32(), s.batch, s.seq,
                          s.heads, s.head_dim, ws.f32());
    o.out = testutil::download(be, out);
    o.dqkv = testutil::download(be, dq);
    return o;
  }

  Outcome run_cuda(bool fused, bool bf16, const Shape& s, const std::vector<float>& qkv,
                   const std::vector<float>& dout) {
    cuda().set_attention_options({fused, bf16});
    return run(*cuda_be, s, qkv, dout);
  }

  std::unique_ptr<Backend> host_be, cuda_be;
};

const Shape kShapes[] = {
    {1, 1, 1, 64},    {2, 19, 3, 32},  {2, 64, 4, 64},  {1, 130, 2, 64},  {2, 97, 2, 128},
    {1, 200, 2, 48},  {1, 33, 2, 16},  {3, 257, 1, 64}, {1, 2048, 2, 64}, {1, 1024, 2, 128},
};

TEST_F(CudaAttention, FusedFp32MatchesTheUnfusedPathAndTheHost) {
  for (const Shape& s : kShapes) {
    const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 50, -2.0F, 2.0F);
    const auto dout = random_vec(s.tokens() * s.hd(), 51);
    const Outcome fused = run_cuda(true, false, s, qkv, dout);
    const Outcome unfused = run_cuda(false, false, s, qkv, dout);
    const Outcome host = run(*host_be, s, qkv, dout);
    // fp32 both sides, different summation order: out 1e-5, dqkv (two chained reductions)
    // 1e-4 of the max-norm, as the unfused path against the host (test_cuda_backend).
    EXPECT_LE(max_rel_diff(fused.out, unfused.out), 1e-5) << s.tag();
    EXPECT_LE(max_rel_diff(fused.dqkv, unfused.dqkv), 1e-4) << s.tag();
    EXPECT_LE(max_rel_diff(fused.out, host.out), 1e-5) << s.tag();
    EXPECT_LE(max_rel_diff(fused.dqkv, host.dqkv), 1e-4) << s.tag();
    EXPECT_EQ(fused.saved, static_cast<std::size_t>(s.batch) * s.heads * s.seq) << s.tag();
    EXPECT_EQ(unfused.saved, static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq)
        << s.tag();
  }
}

TEST_F(CudaAttention, FusedBf16IsWithinTheBf16Tolerance) {
  // The host at device.precision = bf16 (the emulation of docs/precision.md, where built) and
  // the host at fp32: bf16 operands (relative rounding 2^-9) with fp32 accumulation.
  DeviceCfg host_bf16_cfg;
  host_bf16_cfg.backend = atlas::Backend::Host;
  host_bf16_cfg.precision = Precision::Bf16;
  auto host_bf16 = make_backend(host_bf16_cfg);
  for (const Shape& s : kShapes) {
    const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 50, -2.0F, 2.0F);
    const auto dout = random_vec(s.tokens() * s.hd(), 51);
    const Outcome bf16 = run_cuda(true, true, s, qkv, dout);
    const Outcome fp32 = run_cuda(true, false, s, qkv, dout);
    for (Backend* ref : {host_be.get(), host_bf16.get()}) {
      const Outcome want = run(*ref, s, qkv, dout);
      EXPECT_LE(max_rel_diff(bf16.out, want.out), 2e-2) << s.tag();
      EXPECT_LE(max_rel_diff(bf16.dqkv, want.dqkv), 5e-2) << s.tag();
    }
    EXPECT_NE(bf16.out, fp32.out) << s.tag() << ": bf16 must round its operands";
  }
}

TEST_F(CudaAttention, KeyAndValueGradientsAreDeterministic) {
  const Shape s{2, 300, 3, 64};
  const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 60, -2.0F, 2.0F);
  const auto dout = random_vec(s.tokens() * s.hd(), 61);
  for (const bool bf16 : {false, true}) {
    const Outcome a = run_cuda(true, bf16, s, qkv, dout);
    const Outcome b = run_cuda(true, bf16, s, qkv, dout);
    EXPECT_EQ(a.out, b.out) << "forward, bf16 " << bf16;
    // dqkv [B,T,3,H,D]: the key and value slices are written once per key tile (bitwise
    // repeatable); the query slice is summed with atomicAdd (order not fixed).
    const std::size_t hd = s.hd();
    double dq_diff = 0.0;
    for (std::size_t tok = 0; tok < s.tokens(); ++tok)
      for (std::size_t i = 0; i < 3 * hd; ++i) {
        const std::size_t at = tok * 3 * hd + i;
        if (i < hd) {
          dq_diff = std::max(dq_diff, std::abs(static_cast<double>(a.dqkv[at]) - b.dqkv[at]));
        } else {
          ASSERT_EQ(a.dqkv[at], b.dqkv[at]) << "dK/dV element " << at << ", bf16 " << bf16;
        }
      }
    EXPECT_LE(dq_diff, 1e-5) << "dQ run to run, bf16 " << bf16;
  }
}

TEST_F(CudaAttention, HeadDimAbove128FallsBackToTheUnfusedPath) {
  const Shape s{1, 40, 2, 160};
  const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 70, -1.0F, 1.0F);
  const auto dout = random_vec(s.tokens() * s.hd(), 71);
  const Outcome fused = run_cuda(true, true, s, qkv, dout);  // bf16 asked: fp32 unfused runs
  const Outcome host = run(*host_be, s, qkv, dout);
  EXPECT_EQ(fused.saved, static_cast<std::size_t>(s.batch) * s.heads * s.seq * s.seq);
  EXPECT_LE(max_rel_diff(fused.out, host.out), 1e-5);
  EXPECT_LE(max_rel_diff(fused.dqkv, host.dqkv), 1e-4);
}

TEST_F(CudaAttention, LongSequenceFitsWhereTheUnfusedPathWouldNot) {
  // B*H*T*T fp32 probabilities (plus as much workspace) at T = 32768, 12 heads: 48 GiB each;
  // the fused kernel keeps 1.5 MiB.
  const Shape s{1, 32768, 12, 64};
  cuda().set_attention_options({true, true});
  EXPECT_EQ(cuda_be->attention_saved_floats(s.batch, s.seq, s.heads, s.head_dim),
            static_cast<std::size_t>(s.heads) * s.seq);
  const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 80, -1.0F, 1.0F);
  const auto dout = random_vec(s.tokens() * s.hd(), 81);
  const Outcome o = run(*cuda_be, s, qkv, dout);
  for (const float x : o.out) ASSERT_TRUE(std::isfinite(x));
  for (const float x : o.dqkv) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(CudaAttention, PrintsFusedVsUnfusedTimeSideBySide) {
  // GPT-2 124M's attention at micro-batch 8 (T = 1024, 12 heads of 64). A measurement, not an
  // assertion: forward + backward, median of 10 after 3 warm-ups, each path on the same data.
  const Shape s{8, 1024, 12, 64};
  const auto qkv = random_vec(s.tokens() * 3 * s.hd(), 90, -2.0F, 2.0F);
  const auto dout = random_vec(s.tokens() * s.hd(), 91);
  struct Mode {
    const char* name;
    bool fused, bf16;
  };
  double fp32_unfused_ms = 0.0;
  for (const Mode m : {Mode{"unfused fp32", false, false}, Mode{"fused fp32", true, false},
                       Mode{"fused bf16", true, true}}) {
    cuda().set_attention_options({m.fused, m.bf16});
    Buffer q = testutil::upload(*cuda_be, qkv);
    Buffer dy = testutil::upload(*cuda_be, dout);
    Buffer out = cuda_be->alloc_floats(s.tokens() * s.hd());
    Buffer dq = cuda_be->alloc_floats(s.tokens() * 3 * s.hd());
    Buffer saved = cuda_be->alloc_floats(
        cuda_be->attention_saved_floats(s.batch, s.seq, s.heads, s.head_dim));
    Buffer ws = cuda_be->alloc_floats(
        cuda_be->attention_workspace_floats(s.batch, s.seq, s.heads, s.head_dim));
    std::vector<double> ms;
    for (int i = 0; i < 13; ++i) {
      cuda_be->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      cuda_be->attention_forward(out.f32(), saved.f32(), q.f32(), s.batch, s.seq, s.heads,
                                 s.head_dim, ws.f32());
      cuda_be->attention_backward(dq.f32(), dy.f32(), q.f32(), out.f32(), saved.f32(), s.batch,
                                  s.seq, s.heads, s.head_dim, ws.f32());
      cuda_be->synchronize();
      const double t = std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (!m.fused) fp32_unfused_ms = median;
    // Causal attention FLOPs: forward 2 GEMMs, backward 5 (half of each under the mask).
    const double flops = 7.0 * 2.0 * s.batch * s.heads * static_cast<double>(s.seq) * s.seq *
                         s.head_dim * 0.5;
    std::printf("attention %s, %s: %.3f ms forward+backward, %.1f TFLOP/s, %.2f x unfused fp32, "
                "saved %zu floats\n",
                s.tag().c_str(), m.name, median, flops / (median * 1e-3) / 1e12,
                fp32_unfused_ms / median, saved.floats());
    const std::size_t rows = static_cast<std::size_t>(s.batch) * s.heads * s.seq;
    EXPECT_EQ(saved.floats(), m.fused ? rows : rows * s.seq) << m.name;
  }
}

}  // namespace
}  // namespace atlas::device
