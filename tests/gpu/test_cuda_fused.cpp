// SPDX-License-Identifier: MIT
// The CUDA backend's fused calls and precisions against the host backend (label gpu):
// - at fp32, each fused call (cuBLASLt BIAS / BGRADB epilogues, fused.cu kernels; GELU by the
//   backend's kernel) vs the host's default, which composes the unfused calls; tolerances stated
//   at each check;
// - at bf16, GEMMs and linear layers vs the host on inputs rounded to bf16 here (RNE): bf16 x
//   bf16 products are exact in fp32, so only the fp32 summation order differs; and vs the
//   unrounded fp32 host with a bf16 tolerance (and a lower bound: the rounding really happens);
// - at tf32, GEMMs vs fp32 with a tf32 tolerance.
// Without a visible GPU every comparison skips with the runtime's reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "cuda_backend.hpp"
#include "gpu/cuda_test_util.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::device {
namespace {

using testutil::no_device_reason;
using testutil::random_vec;

/// fp32 -> bf16 -> fp32, round to nearest even (NaN kept), written out here on purpose: the test
/// must not share the rounding code it checks.
float round_bf16(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000U) == 0x7f800000U && (u & 0x007fffffU) != 0) return x;  // NaN
  u += 0x7fffU + ((u >> 16) & 1U);
  u &= 0xffff0000U;
  float y = 0.0F;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

/// max |got - want| / max |want|.
double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return testutil::max_rel_diff(got, want);
}

class CudaFused : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device visible (" << reason << "): skipped";
    host = make_host_backend(2);
  }
  void TearDown() override {
    for (auto* be : {&fp32, &bf16, &tf32}) {
      if (*be) std::cout << "[ info ] " << (*be)->describe() << ": epilogue fallbacks "
                         << cuda::epilogue_fallbacks_of(**be) << "\n";
    }
  }
  std::unique_ptr<Backend> make(Precision p) {
    DeviceCfg cfg;
    cfg.backend = atlas::Backend::Cuda;
    cfg.precision = p;
    return make_backend(cfg);
  }
  static Buffer up(Backend& be, const std::vector<float>& v) { return testutil::upload(be, v); }
  static std::vector<float> down(Backend& be, const Buffer& b) { return testutil::download(be, b); }

  std::unique_ptr<Backend> host, fp32, bf16, tf32;
};

// ---- precision plumbing ----

TEST_F(CudaFused, PrecisionComesFromTheDeckAndAutoIsBf16) {
  EXPECT_THAT(make(Precision::Auto)->describe(), ::testing::HasSubstr("GEMMs bf16"));
  EXPECT_THAT(make(Precision::Bf16)->describe(), ::testing::HasSubstr("GEMMs bf16"));
  EXPECT_THAT(make(Precision::Tf32)->describe(), ::testing::HasSubstr("GEMMs tf32"));
  EXPECT_THAT(make(Precision::Fp32)->describe(), ::testing::HasSubstr("TF32 off"));
}

// ---- fused calls at fp32 vs the host's composition ----

TEST_F(CudaFused, LinearForwardBiasAndGeluEpilogues) {
  fp32 = make(Precision::Fp32);
  const int rows = 96, in_f = 80;
  for (int out_f : {128, 44}) {  // 44: the GELU epilogue's leading dimension is not a multiple of 8
    const auto x = random_vec(static_cast<std::size_t>(rows) * in_f, 1);
    const auto w = random_vec(static_cast<std::size_t>(out_f) * in_f, 2, -0.3F, 0.3F);
    const auto b = random_vec(static_cast<std::size_t>(out_f), 3);
    for (Activation act : {Activation::None, Activation::Gelu}) {
      const std::string tag = std::string(act == Activation::Gelu ? "gelu" : "none") +
                              " out_f " + std::to_string(out_f);
      std::vector<float> outs[2], pres[2];
      int i = 0;
      for (Backend* be : {host.get(), fp32.get()}) {
        Buffer bx = up(*be, x), bw = up(*be, w), bb = up(*be, b);
        Buffer out = be->alloc_floats(static_cast<std::size_t>(rows) * out_f);
        Buffer pre = be->alloc_floats(static_cast<std::size_t>(rows) * out_f);
        be->linear_forward(out.f32(), pre.f32(), bx.f32(), bw.f32(), bb.f32(), rows, in_f, out_f,
                           act);
        outs[i] = down(*be, out);
        pres[i++] = down(*be, pre);
      }
      // fp32 GEMM in another order: 1e-5 of the max-norm; at fp32 GELU is the backend's kernel
      // with the host's formula (1e-5 relative): 2e-5.
      EXPECT_LE(rel(outs[1], outs[0]), 2e-5) << "out " << tag;
      if (act == Activation::Gelu) {
        EXPECT_LE(rel(pres[1], pres[0]), 1e-5) << "pre_act " << tag;
      }
    }
  }
}

TEST_F(CudaFused, LinearBackwardBgradAndDgeluEpiloguesAccumulate) {
  fp32 = make(Precision::Fp32);
  const int rows = 96, out_f = 64;
  for (int in_f : {128, 44}) {
    const auto dy = random_vec(static_cast<std::size_t>(rows) * out_f, 4);
    const auto x = random_vec(static_cast<std::size_t>(rows) * in_f, 5);
    const auto w = random_vec(static_cast<std::size_t>(out_f) * in_f, 6, -0.3F, 0.3F);
    const auto pre = random_vec(static_cast<std::size_t>(rows) * in_f, 7, -3.0F, 3.0F);
    const auto dw0 = random_vec(static_cast<std::size_t>(out_f) * in_f, 8);
    const auto db0 = random_vec(static_cast<std::size_t>(out_f), 9);
    for (Activation act : {Activation::None, Activation::Gelu}) {
      const std::string tag = std::string(act == Activation::Gelu ? "gelu" : "none") +
                              " in_f " + std::to_string(in_f);
      std::vector<float> din[2], dw[2], db[2];
      int i = 0;
      for (Backend* be : {host.get(), fp32.get()}) {
        Buffer bdy = up(*be, dy), bx = up(*be, x), bw = up(*be, w), bpre = up(*be, pre);
        Buffer bdin = be->alloc_floats(static_cast<std::size_t>(rows) * in_f);
        Buffer bdw = up(*be, dw0), bdb = up(*be, db0);
        for (int rep = 0; rep < 2; ++rep) {  // twice: dweight and dbias accumulate
          be->linear_backward(bdin.f32(), bdw.f32(), bdb.f32(), bdy.f32(), bx.f32(), bw.f32(),
                              bpre.f32(), rows, in_f, out_f, act);
        }
        din[i] = down(*be, bdin);
        dw[i] = down(*be, bdw);
        db[i++] = down(*be, bdb);
      }
      EXPECT_LE(rel(din[1], din[0]), 2e-5) << "din " << tag;  // GEMM order (+ GELU' formula)
      EXPECT_LE(rel(dw[1], dw[0]), 1e-5) << "dweight " << tag;
      EXPECT_LE(rel(db[1], db[0]), 1e-5) << "dbias " << tag;  // fp32 epilogue sum vs double
    }
  }
}

TEST_F(CudaFused, ResidualLayerNorm) {
  fp32 = make(Precision::Fp32);
  const int rows = 37, cols = 200;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const auto x = random_vec(n, 10), d = random_vec(n, 11), b = random_vec(cols, 12);
  const auto g = random_vec(cols, 13, 0.5F, 1.5F), beta = random_vec(cols, 14);
  for (bool with_ln : {true, false}) {
    std::vector<float> res[2], ln[2], mean[2], rstd[2];
    int i = 0;
    for (Backend* be : {host.get(), fp32.get()}) {
      Buffer bx = up(*be, x), bd = up(*be, d), bb = up(*be, b), bg = up(*be, g), bbeta = up(*be, beta);
      Buffer bln = be->alloc_floats(n), bm = be->alloc_floats(rows), bs = be->alloc_floats(rows);
      // In place over x, as the model's residual stream may be.
      be->residual_layernorm_forward(bx.f32(), with_ln ? bln.f32() : nullptr, bm.f32(), bs.f32(),
                                     bx.f32(), bd.f32(), bb.f32(), bg.f32(), bbeta.f32(), rows, cols);
      res[i] = down(*be, bx);
      ln[i] = down(*be, bln);
      mean[i] = down(*be, bm);
      rstd[i++] = down(*be, bs);
    }
    EXPECT_EQ(res[1], res[0]) << "residual: the same two IEEE additions, bitwise";
    if (with_ln) {
      EXPECT_LE(rel(ln[1], ln[0]), 1e-5) << "layernorm out";
      EXPECT_LE(rel(mean[1], mean[0]), 1e-6) << "mean";
      EXPECT_LE(rel(rstd[1], rstd[0]), 1e-6) << "rstd";
    }
  }
}

TEST_F(CudaFused, SoftmaxXentLossAndGradientInOnePass) {
  fp32 = make(Precision::Fp32);
  const int rows = 33, vocab = 50'257;  // the GPT-2 vocabulary: not a multiple of anything
  const auto z = random_vec(static_cast<std::size_t>(rows) * vocab, 15, -6.0F, 6.0F);
  std::vector<std::int32_t> t(rows);
  for (int r = 0; r < rows; ++r) t[static_cast<std::size_t>(r)] = (r * 1543) % vocab;
  const float scale = 1.0F / (4.0F * rows);
  std::vector<float> loss[2], grad[2];
  int i = 0;
  for (Backend* be : {host.get(), fp32.get()}) {
    Buffer logits = up(*be, z), losses = be->alloc_floats(rows);
    Buffer tg = testutil::upload_ids(*be, t);
    be->softmax_xent_fused(losses.f32(), logits.f32(), logits.f32(), tg.i32(), rows, vocab, scale);
    loss[i] = down(*be, losses);
    grad[i++] = down(*be, logits);
  }
  // Same formulas (double sum of expf, one rounding each): 1e-5 relative.
  EXPECT_LE(rel(loss[1], loss[0]), 1e-5) << "losses";
  EXPECT_LE(rel(grad[1], grad[0]), 1e-5) << "dlogits";
  // A target outside the vocabulary is the same clear error as the unfused forward's.
  Buffer logits = up(*fp32, z), losses = fp32->alloc_floats(rows);
  std::vector<std::int32_t> bad = t;
  bad[2] = vocab;
  Buffer tg = testutil::upload_ids(*fp32, bad);
  // Reported at the stream's next synchronisation (the call itself does not wait).
  fp32->softmax_xent_fused(losses.f32(), logits.f32(), logits.f32(), tg.i32(), rows, vocab, 1.0F);
  try {
    fp32->synchronize();
    FAIL() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cross-entropy target 50257 at row 2 is outside"));
  }
}

TEST_F(CudaFused, MultiTensorAdamWAndNormOverOneTable) {
  fp32 = make(Precision::Fp32);
  const std::vector<std::size_t> sizes = {1, 16'384, 16'385, 70'001, 0, 3};
  AdamWArgs args;
  args.lr = 3e-3F;
  args.bias_correction1 = 0.19F;
  args.bias_correction2 = 0.0975F;
  args.grad_scale = 0.8F;
  struct Set {
    std::vector<Buffer> p, g, m, v;
  } sets[2];
  Backend* bes[2] = {host.get(), fp32.get()};
  for (int s = 0; s < 2; ++s) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      sets[s].p.push_back(up(*bes[s], random_vec(sizes[t], 100 + t)));
      sets[s].g.push_back(up(*bes[s], random_vec(sizes[t], 200 + t, -0.1F, 0.1F)));
      sets[s].m.push_back(up(*bes[s], random_vec(sizes[t], 300 + t, -0.01F, 0.01F)));
      sets[s].v.push_back(up(*bes[s], random_vec(sizes[t], 400 + t, 0.0F, 1e-4F)));
    }
  }
  auto table = [&](Set& set, std::size_t count) {
    std::vector<AdamWTensor> out;
    for (std::size_t t = 0; t < count; ++t) {
      out.push_back({set.p[t].f32(), set.g[t].f32(), set.m[t].f32(), set.v[t].f32(), sizes[t],
                     t % 2 == 0 ? 0.1F : 0.0F});
    }
    return out;
  };
  // Three steps with the full list (the device table is reused), one with a shorter list (it
  // is rebuilt).
  for (std::size_t count : {sizes.size(), sizes.size(), sizes.size(), std::size_t{3}}) {
    for (int s = 0; s < 2; ++s) bes[s]->adamw_update_multi(table(sets[s], count), args);
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const std::string tag = "tensor " + std::to_string(t);
    // Same formula as adamw_update (whose host/cuda tolerance is 1e-5 relative).
    EXPECT_LE(rel(down(*fp32, sets[1].p[t]), down(*host, sets[0].p[t])), 1e-5) << "param " << tag;
    EXPECT_LE(rel(down(*fp32, sets[1].m[t]), down(*host, sets[0].m[t])), 1e-5) << "m " << tag;
    EXPECT_LE(rel(down(*fp32, sets[1].v[t]), down(*host, sets[0].v[t])), 1e-5) << "v " << tag;
  }
  for (std::size_t count : {sizes.size(), std::size_t{2}, sizes.size()}) {
    std::vector<ConstFloats> ranges[2];
    for (int s = 0; s < 2; ++s)
      for (std::size_t t = 0; t < count; ++t) ranges[s].push_back({sets[s].g[t].f32(), sizes[t]});
    const double want = host->sq_norm_multi(ranges[0]);
    // Double sums of fp32 squares in different orders: 1e-12 relative.
    EXPECT_NEAR(fp32->sq_norm_multi(ranges[1]), want, 1e-12 * want) << count << " ranges";
  }
  EXPECT_EQ(fp32->sq_norm_multi({}), 0.0);
}

// ---- precisions ----

TEST_F(CudaFused, Bf16GemmRoundsEveryOperandAndAccumulatesInFp32) {
  bf16 = make(Precision::Bf16);
  const int m = 67, n = 45, k = 515, pad = 3;
  for (Trans ta : {Trans::No, Trans::Yes}) {
    for (Trans tb : {Trans::No, Trans::Yes}) {
      const std::string tag = std::string(ta == Trans::Yes ? "T" : "N") + (tb == Trans::Yes ? "T" : "N");
      const int a_rows = ta == Trans::Yes ? k : m, a_cols = ta == Trans::Yes ? m : k;
      const int b_rows = tb == Trans::Yes ? n : k, b_cols = tb == Trans::Yes ? k : n;
      const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
      const auto a = random_vec(static_cast<std::size_t>(a_rows) * lda, 30);
      const auto b = random_vec(static_cast<std::size_t>(b_rows) * ldb, 31);
      const auto c0 = random_vec(static_cast<std::size_t>(m) * ldc, 32);
      auto run = [&](Backend& be, const std::vector<float>& av, const std::vector<float>& bv) {
        Buffer ba = up(be, av), bb = up(be, bv), bc = up(be, c0);
        be.gemm(ta, tb, m, n, k, 0.5F, ba.f32(), lda, bb.f32(), ldb, 1.0F, bc.f32(), ldc);
        return down(be, bc);
      };
      const auto got = run(*bf16, a, b);
      const auto emulated = run(*host, rounded(a), rounded(b));
      const auto exact = run(*host, a, b);
      // Exact bf16 products, fp32 sums of 515 terms in another order: 1e-5 of the max-norm.
      EXPECT_LE(rel(got, emulated), 1e-5) << "bf16 vs host on rounded operands, " << tag;
      // vs fp32: each operand off by <= 2^-9 relative; random signs keep the sum's error near
      // 2^-9 / sqrt(k) of the max-norm: at most 1e-2, and not below 1e-5 (rounding happened).
      const double to_fp32 = rel(got, exact);
      EXPECT_LE(to_fp32, 1e-2) << "bf16 vs fp32, " << tag;
      EXPECT_GE(to_fp32, 1e-5) << "bf16 vs fp32, " << tag << ": no rounding seen";
    }
  }
}

// The footer's peak memory (Backend::peak_bytes) counts the backend's scratch too, not only its
// Buffers: the bf16 operand copies a GEMM makes (it left out ~1 GB of the LM head's copy before).
TEST_F(CudaFused, PeakMemoryCountsTheBackendsScratch) {
  const std::size_t before = cuda::device_bytes_held();
  bf16 = make(Precision::Bf16);
  const int m = 256, n = 64, k = 1024;
  Buffer a = bf16->alloc_floats(static_cast<std::size_t>(m) * k), b = bf16->alloc_floats(static_cast<std::size_t>(k) * n);
  Buffer c = bf16->alloc_floats(static_cast<std::size_t>(m) * n);
  bf16->gemm(Trans::No, Trans::No, m, n, k, 1.0F, a.f32(), k, b.f32(), n, 0.0F, c.f32(), n);
  bf16->synchronize();
  const std::size_t buffers = (static_cast<std::size_t>(m) * k + static_cast<std::size_t>(k) * n +
                               static_cast<std::size_t>(m) * n) * sizeof(float);
  const std::size_t held = cuda::device_bytes_held() - before;
  // The Buffers plus bf16 copies of both operands (2 bytes an element).
  EXPECT_GE(held, buffers + (static_cast<std::size_t>(m) * k + static_cast<std::size_t>(k) * n) * 2)
      << "held " << held << " B, Buffers " << buffers << " B";
  EXPECT_GE(bf16->peak_bytes(), cuda::device_bytes_held()) << "the peak is at least what is held now";
}

// bf16 activation storage (docs/precision.md, "Storage of saved activations"): to_bf16 / from_bf16
// round and widen as the host does, bitwise; gemm_bf16_b and linear_backward_bf16_in (cuBLASLt
// reading the stored bf16 B directly) match the fp32-operand calls on the same values.
TEST_F(CudaFused, Bf16StoredOperandsMatchTheFp32OperandCalls) {
  bf16 = make(Precision::Bf16);
  const int rows = 96, in_f = 80, out_f = 64;
  const auto x = random_vec(static_cast<std::size_t>(rows) * in_f, 50);
  const auto dy = random_vec(static_cast<std::size_t>(rows) * out_f, 51);
  const auto w = random_vec(static_cast<std::size_t>(out_f) * in_f, 52, -0.3F, 0.3F);
  const auto pre = random_vec(static_cast<std::size_t>(rows) * in_f, 53);
  // rounding and widening, bitwise vs the host
  std::vector<std::uint16_t> bits[2];
  std::vector<float> wide[2];
  int i = 0;
  for (Backend* be : {host.get(), bf16.get()}) {
    Buffer bx = up(*be, x);
    Buffer b16 = be->alloc(x.size() * sizeof(Bf16Bits));
    Buffer back = be->alloc_floats(x.size());
    be->to_bf16(b16.bf16(), bx.f32(), x.size());
    be->from_bf16(back.f32(), b16.bf16(), x.size());
    bits[i].resize(x.size());
    be->download(bits[i].data(), b16.data(), b16.bytes());
    wide[i++] = down(*be, back);
  }
  EXPECT_EQ(bits[1], bits[0]) << "to_bf16";
  EXPECT_EQ(wide[1], rounded(x)) << "from_bf16";
  // linear_backward with the stored bf16 input vs linear_backward with its fp32 input
  for (Activation act : {Activation::None, Activation::Gelu}) {
    Buffer bx = up(*bf16, x), bdy = up(*bf16, dy), bw = up(*bf16, w), bpre = up(*bf16, pre);
    Buffer b16 = bf16->alloc(x.size() * sizeof(Bf16Bits));
    bf16->to_bf16(b16.bf16(), bx.f32(), x.size());
    std::vector<float> din[2], dw[2], db[2];
    for (int k = 0; k < 2; ++k) {
      Buffer bdin = bf16->alloc_floats(x.size()), bdw = bf16->alloc_floats(w.size()),
             bdb = bf16->alloc_floats(static_cast<std::size_t>(out_f));
      if (k == 0) {
        bf16->linear_backward(bdin.f32(), bdw.f32(), bdb.f32(), bdy.f32(), bx.f32(), bw.f32(),
                              bpre.f32(), rows, in_f, out_f, act);
      } else {
        bf16->linear_backward_bf16_in(bdin.f32(), bdw.f32(), bdb.f32(), bdy.f32(), b16.bf16(),
                                      bw.f32(), bpre.f32(), rows, in_f, out_f, act);
      }
      din[k] = down(*bf16, bdin);
      dw[k] = down(*bf16, bdw);
      db[k] = down(*bf16, bdb);
    }
    // the same bf16 operands; only the GEMM's algorithm may differ: 1e-5 of the max-norm
    EXPECT_LE(rel(dw[1], dw[0]), 1e-5) << "dweight";
    EXPECT_EQ(din[1], din[0]) << "din (the same call)";
    EXPECT_EQ(db[1], db[0]) << "dbias (the same kernel)";
  }
  // linear_forward with the stored bf16 input vs linear_forward with its fp32 input
  for (Activation act : {Activation::None, Activation::Gelu}) {
    const auto bias = random_vec(static_cast<std::size_t>(out_f), 54);
    Buffer bx = up(*bf16, x), bw = up(*bf16, random_vec(w.size(), 55, -0.3F, 0.3F)), bb = up(*bf16, bias);
    Buffer b16 = bf16->alloc(x.size() * sizeof(Bf16Bits));
    bf16->to_bf16(b16.bf16(), bx.f32(), x.size());
    std::vector<float> y[2], p[2];
    for (int k = 0; k < 2; ++k) {
      Buffer by = bf16->alloc_floats(static_cast<std::size_t>(rows) * out_f);
      Buffer bp = bf16->alloc_floats(static_cast<std::size_t>(rows) * out_f);
      if (k == 0) {
        bf16->linear_forward(by.f32(), bp.f32(), bx.f32(), bw.f32(), bb.f32(), rows, in_f, out_f, act);
      } else {
        bf16->linear_forward_bf16_in(by.f32(), bp.f32(), b16.bf16(), bw.f32(), bb.f32(), rows, in_f, out_f, act);
      }
      y[k] = down(*bf16, by);
      p[k] = down(*bf16, bp);
    }
    EXPECT_LE(rel(y[1], y[0]), 1e-5) << "linear_forward_bf16_in out";
    if (act == Activation::Gelu) {
      EXPECT_LE(rel(p[1], p[0]), 1e-5) << "linear_forward_bf16_in pre_act";
    }
  }
  // at fp32 the bf16-operand GEMM is refused (the model stores bf16 only at bf16)
  fp32 = make(Precision::Fp32);
  Buffer a = up(*fp32, dy), c = fp32->alloc_floats(w.size());
  Buffer b16 = fp32->alloc(x.size() * sizeof(Bf16Bits));
  EXPECT_THROW(fp32->gemm_bf16_b(Trans::Yes, Trans::No, out_f, in_f, rows, 1.0F, a.f32(), out_f,
                                 b16.bf16(), in_f, 1.0F, c.f32(), in_f),
               Error);
}

TEST_F(CudaFused, Bf16LinearLayersMatchTheHostOnRoundedOperands) {
  bf16 = make(Precision::Bf16);
  const int rows = 128, in_f = 96, out_f = 256;
  const auto x = rounded(random_vec(static_cast<std::size_t>(rows) * in_f, 40));
  const auto w = rounded(random_vec(static_cast<std::size_t>(out_f) * in_f, 41, -0.3F, 0.3F));
  const auto b = random_vec(static_cast<std::size_t>(out_f), 42);
  const auto dy = rounded(random_vec(static_cast<std::size_t>(rows) * out_f, 43));
  const auto pre_in = random_vec(static_cast<std::size_t>(rows) * in_f, 44, -3.0F, 3.0F);
  std::vector<float> out[2], pre[2], din[2], dw[2], db[2];
  int i = 0;
  for (Backend* be : {host.get(), bf16.get()}) {
    Buffer bx = up(*be, x), bw = up(*be, w), bb = up(*be, b), bdy = up(*be, dy), bp = up(*be, pre_in);
    Buffer o = be->alloc_floats(static_cast<std::size_t>(rows) * out_f);
    Buffer p = be->alloc_floats(static_cast<std::size_t>(rows) * out_f);
    be->linear_forward(o.f32(), p.f32(), bx.f32(), bw.f32(), bb.f32(), rows, in_f, out_f,
                       Activation::Gelu);
    Buffer bdin = be->alloc_floats(static_cast<std::size_t>(rows) * in_f);
    Buffer bdw = be->alloc_floats(static_cast<std::size_t>(out_f) * in_f);
    Buffer bdb = be->alloc_floats(static_cast<std::size_t>(out_f));
    be->linear_backward(bdin.f32(), bdw.f32(), bdb.f32(), bdy.f32(), bx.f32(), bw.f32(), bp.f32(),
                        rows, in_f, out_f, Activation::Gelu);
    out[i] = down(*be, o);
    pre[i] = down(*be, p);
    din[i] = down(*be, bdin);
    dw[i] = down(*be, bdw);
    db[i++] = down(*be, bdb);
  }
  // Operands already bf16: rounding them again changes nothing, so only summation order (and
  // the GELU formula) differ.
  EXPECT_LE(rel(pre[1], pre[0]), 1e-5) << "pre_act";
  // cuBLASLt's GELU / DGELU epilogues (used below fp32) may use the hardware tanh approximation
  // (about 2^-11 relative): 1e-3 of the max-norm.
  EXPECT_LE(rel(out[1], out[0]), 1e-3) << "out (GELU epilogue)";
  EXPECT_LE(rel(din[1], din[0]), 1e-3) << "din (DGELU epilogue)";
  EXPECT_LE(rel(dw[1], dw[0]), 1e-5) << "dweight";
  EXPECT_LE(rel(db[1], db[0]), 1e-6) << "dbias (fp32 values, double sum, as the host)";
}

TEST_F(CudaFused, Bf16WeightCopiesFollowEveryWriteToTheWeight) {
  // The bf16 copy of a weight is cached between calls; each way a weight is written must make
  // the next call see the new values (compared with the host on rounded operands).
  bf16 = make(Precision::Bf16);
  const int rows = 64, in_f = 48, out_f = 32;
  const std::size_t nw = static_cast<std::size_t>(out_f) * in_f;
  const auto x = rounded(random_vec(static_cast<std::size_t>(rows) * in_f, 60));
  Buffer hx = up(*host, x), cx = up(*bf16, x);
  Buffer hw = up(*host, rounded(random_vec(nw, 61))), cw = up(*bf16, rounded(random_vec(nw, 61)));
  Buffer hy = host->alloc_floats(static_cast<std::size_t>(rows) * out_f);
  Buffer cy = bf16->alloc_floats(static_cast<std::size_t>(rows) * out_f);
  auto check = [&](const std::string& after) {
    host->linear_forward(hy.f32(), nullptr, hx.f32(), hw.f32(), nullptr, rows, in_f, out_f,
                         Activation::None);
    bf16->linear_forward(cy.f32(), nullptr, cx.f32(), cw.f32(), nullptr, rows, in_f, out_f,
                         Activation::None);
    EXPECT_LE(rel(down(*bf16, cy), down(*host, hy)), 1e-5) << "after " << after;
  };
  check("the first call");
  check("a second call (cached copy)");
  const auto w2 = rounded(random_vec(nw, 62));
  host->upload(hw.data(), w2.data(), nw * sizeof(float));
  bf16->upload(cw.data(), w2.data(), nw * sizeof(float));
  check("upload");
  host->scale(hw.f32(), 0.5F, nw);  // halving keeps bf16 values exact
  bf16->scale(cw.f32(), 0.5F, nw);
  check("scale");
  host->fill(hw.f32() + 5, 0.25F, 100);
  bf16->fill(cw.f32() + 5, 0.25F, 100);
  check("fill of part of the weight");
  Buffer hsrc = up(*host, w2), csrc = up(*bf16, w2);
  host->copy(hw.data(), hsrc.data(), nw * sizeof(float));
  bf16->copy(cw.data(), csrc.data(), nw * sizeof(float));
  check("copy");
  // AdamW moves the fp32 weight off the bf16 grid: the host rounds its operand here, the GPU
  // must convert again.
  const auto g = random_vec(nw, 63);
  Buffer hg = up(*host, g), cg = up(*bf16, g);
  Buffer hm = host->alloc_floats(nw), hv = host->alloc_floats(nw);
  Buffer cm = bf16->alloc_floats(nw), cv = bf16->alloc_floats(nw);
  AdamWArgs args;
  args.lr = 0.05F;
  host->adamw_update_multi(std::vector<AdamWTensor>{{hw.f32(), hg.f32(), hm.f32(), hv.f32(), nw, 0.0F}}, args);
  bf16->adamw_update_multi(std::vector<AdamWTensor>{{cw.f32(), cg.f32(), cm.f32(), cv.f32(), nw, 0.0F}}, args);
  const auto moved = rounded(down(*bf16, cw));
  host->upload(hw.data(), moved.data(), nw * sizeof(float));
  check("adamw_update_multi");
}

TEST_F(CudaFused, Tf32GemmIsWithinTf32Tolerance) {
  tf32 = make(Precision::Tf32);
  const int m = 130, n = 70, k = 300;
  const auto a = random_vec(static_cast<std::size_t>(m) * k, 50);
  const auto b = random_vec(static_cast<std::size_t>(k) * n, 51);
  std::vector<float> c[2];
  int i = 0;
  for (Backend* be : {host.get(), tf32.get()}) {
    Buffer ba = up(*be, a), bb = up(*be, b), bc = be->alloc_floats(static_cast<std::size_t>(m) * n);
    be->gemm(Trans::No, Trans::No, m, n, k, 1.0F, ba.f32(), k, bb.f32(), n, 0.0F, bc.f32(), n);
    c[i++] = down(*be, bc);
  }
  // 10-bit mantissas: each operand off by <= 2^-11 relative: 5e-3 of the max-norm at most.
  EXPECT_LE(rel(c[1], c[0]), 5e-3);
}

}  // namespace
}  // namespace atlas::device
