// SPDX-License-Identifier: MIT
// The host backend's bf16/tf32 emulation (docs/precision.md): a gemm at bf16/tf32 is the fp32 gemm
// of round-to-nearest-even copies of both operands (bitwise; the operands themselves are left
// alone), attention follows the contract's rounding points (checked against a plain loop
// reference written from the contract), fp32 stays the reference, and make_backend honours
// device.precision.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/device/rounding.hpp"
#include "test_model_util.hpp"

namespace atlas::device {
namespace {

using testutil::download;
using testutil::random_vec;
using testutil::upload;

std::vector<float> rounded(std::vector<float> v, Precision p) {
  for (float& x : v) x = p == Precision::Bf16 ? round_to_bf16(x) : round_to_tf32(x);
  return v;
}

TEST(HostPrecision, GemmIsTheFp32GemmOfRoundedOperandsForAllTransposesAndStrides) {
  auto ref = make_host_backend(1);
  for (Precision prec : {Precision::Bf16, Precision::Tf32}) {
    auto be = make_host_backend(1, prec);
    const int m = 13, n = 11, k = 37;
    const int pad = 3;
    for (Trans ta : {Trans::No, Trans::Yes}) {
      for (Trans tb : {Trans::No, Trans::Yes}) {
        const int a_rows = ta == Trans::Yes ? k : m, a_cols = ta == Trans::Yes ? m : k;
        const int b_rows = tb == Trans::Yes ? n : k, b_cols = tb == Trans::Yes ? k : n;
        const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        const auto a = random_vec(static_cast<std::size_t>(a_rows * lda), 30);
        const auto b = random_vec(static_cast<std::size_t>(b_rows * ldb), 31);
        const auto c0 = random_vec(static_cast<std::size_t>(m * ldc), 32);
        Buffer ba = upload(*be, a), bb = upload(*be, b), bc = upload(*be, c0);
        be->gemm(ta, tb, m, n, k, 0.5F, ba.f32(), lda, bb.f32(), ldb, 1.0F, bc.f32(), ldc);
        EXPECT_EQ(download(*be, ba), a) << "the operands are rounded in copies, not in place";
        EXPECT_EQ(download(*be, bb), b);
        Buffer ra = upload(*ref, rounded(a, prec)), rb = upload(*ref, rounded(b, prec)), rc = upload(*ref, c0);
        ref->gemm(ta, tb, m, n, k, 0.5F, ra.f32(), lda, rb.f32(), ldb, 1.0F, rc.f32(), ldc);
        EXPECT_EQ(download(*be, bc), download(*ref, rc)) << to_string(prec);
        // ... and it is not the fp32 product of the raw operands.
        Buffer fa = upload(*ref, a), fb = upload(*ref, b), fc = upload(*ref, c0);
        ref->gemm(ta, tb, m, n, k, 0.5F, fa.f32(), lda, fb.f32(), ldb, 1.0F, fc.f32(), ldc);
        EXPECT_NE(download(*be, bc), download(*ref, fc)) << to_string(prec);
      }
    }
  }
}

TEST(HostPrecision, MakeBackendResolvesThePrecisionAndSaysIt) {
  DeviceCfg cfg;
  cfg.threads = 1;
  EXPECT_THAT(make_backend(cfg)->describe(), ::testing::Not(::testing::HasSubstr("emulated")));  // auto = fp32
  cfg.precision = Precision::Bf16;
  EXPECT_THAT(make_backend(cfg)->describe(), ::testing::HasSubstr("bf16 matmul inputs emulated"));
  cfg.precision = Precision::Tf32;
  EXPECT_THAT(make_backend(cfg)->describe(), ::testing::HasSubstr("tf32 matmul inputs emulated"));
  cfg.precision = Precision::Fp32;
  EXPECT_EQ(make_backend(cfg)->describe(), "host (OpenBLAS, 1 thread)");
}

// ---- attention: the contract written as plain loops ----

struct AttentionRef {
  std::vector<float> out, dqkv;
};

// qkv [B,T,3,H,D], dout [B,T,H,D]; `out_fwd` is the forward output the backward reads (the
// backend's, as the interface passes it).
AttentionRef contract_attention(const std::vector<float>& qkv_raw, const std::vector<float>& dout_raw,
                                const std::vector<float>& out_fwd, int B, int T, int H, int D) {
  auto r = [](float x) { return round_to_bf16(x); };
  const std::vector<float> qkv = rounded(qkv_raw, Precision::Bf16);
  const std::vector<float> dout = rounded(dout_raw, Precision::Bf16);
  const std::size_t row = 3 * static_cast<std::size_t>(H) * D, orow = static_cast<std::size_t>(H) * D;
  const float scale = 1.0F / std::sqrt(static_cast<float>(D));
  AttentionRef ref{std::vector<float>(static_cast<std::size_t>(B) * T * orow, 0.0F),
                   std::vector<float>(qkv.size(), 0.0F)};
  auto q = [&](int b, int t, int h) { return &qkv[(static_cast<std::size_t>(b) * T + t) * row + h * D]; };
  auto k = [&](int b, int t, int h) { return q(b, t, h) + orow; };
  auto v = [&](int b, int t, int h) { return q(b, t, h) + 2 * orow; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::vector<std::vector<float>> P(static_cast<std::size_t>(T), std::vector<float>(static_cast<std::size_t>(T), 0.0F));
      for (int t = 0; t < T; ++t) {
        auto& p = P[static_cast<std::size_t>(t)];
        float mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          float s = 0.0F;
          for (int d = 0; d < D; ++d) s += q(b, t, h)[d] * k(b, u, h)[d];
          p[static_cast<std::size_t>(u)] = s * scale;
          mx = std::max(mx, p[static_cast<std::size_t>(u)]);
        }
        float sum = 0.0F;
        for (int u = 0; u <= t; ++u) sum += (p[static_cast<std::size_t>(u)] = std::exp(p[static_cast<std::size_t>(u)] - mx));
        for (int u = 0; u <= t; ++u) p[static_cast<std::size_t>(u)] *= 1.0F / sum;
        float* o = &ref.out[(static_cast<std::size_t>(b) * T + t) * orow + h * D];
        for (int u = 0; u <= t; ++u)
          for (int d = 0; d < D; ++d) o[d] += r(p[static_cast<std::size_t>(u)]) * v(b, u, h)[d];
      }
      for (int t = 0; t < T; ++t) {
        const float* dy = &dout[(static_cast<std::size_t>(b) * T + t) * orow + h * D];
        const float* o = &out_fwd[(static_cast<std::size_t>(b) * T + t) * orow + h * D];
        float rowsum = 0.0F;
        for (int d = 0; d < D; ++d) rowsum += dy[d] * o[d];
        for (int u = 0; u <= t; ++u) {
          const float p = P[static_cast<std::size_t>(t)][static_cast<std::size_t>(u)];
          float dp = 0.0F;
          for (int d = 0; d < D; ++d) dp += dy[d] * v(b, u, h)[d];
          const float ds = r(p * (dp - rowsum));
          const std::size_t tq = (static_cast<std::size_t>(b) * T + t) * row + h * D;
          const std::size_t uk = (static_cast<std::size_t>(b) * T + u) * row + h * D;
          for (int d = 0; d < D; ++d) {
            ref.dqkv[uk + 2 * orow + d] += r(p) * dy[d];
            ref.dqkv[tq + d] += ds * scale * k(b, u, h)[d];
            ref.dqkv[uk + orow + d] += ds * scale * q(b, t, h)[d];
          }
        }
      }
    }
  return ref;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

TEST(HostPrecision, AttentionAtBf16FollowsTheContractsRoundingPoints) {
  const int B = 2, T = 11, H = 2, D = 8;
  const std::size_t n_qkv = static_cast<std::size_t>(B) * T * 3 * H * D, n_out = static_cast<std::size_t>(B) * T * H * D;
  const auto qkv = random_vec(n_qkv, 40, -2.0F, 2.0F);
  const auto dout = random_vec(n_out, 41);
  auto run = [&](Backend& be, std::vector<float>& out, std::vector<float>& dqkv) {
    Buffer bq = upload(be, qkv), bd = upload(be, dout), bo = be.alloc_floats(n_out), bg = be.alloc_floats(n_qkv);
    Buffer saved = be.alloc_floats(be.attention_saved_floats(B, T, H, D));
    be.attention_forward(bo.f32(), saved.f32(), bq.f32(), B, T, H, D, nullptr);
    be.attention_backward(bg.f32(), bd.f32(), bq.f32(), bo.f32(), saved.f32(), B, T, H, D, nullptr);
    out = download(be, bo);
    dqkv = download(be, bg);
    EXPECT_EQ(download(be, bq), qkv) << "inputs are rounded in copies";
  };
  auto bf = make_host_backend(1, Precision::Bf16);
  auto fp = make_host_backend(1);
  std::vector<float> out, dqkv, out32, dqkv32;
  run(*bf, out, dqkv);
  run(*fp, out32, dqkv32);
  const AttentionRef ref = contract_attention(qkv, dout, out, B, T, H, D);
  // The reference sums in another order: fp32 rounding differences only (and, rarely, a value
  // next to a bf16 rounding boundary that lands on the other neighbour).
  EXPECT_LE(max_diff(out, ref.out), 1e-5 * max_abs(ref.out));
  EXPECT_LE(max_diff(dqkv, ref.dqkv), 1e-4 * max_abs(ref.dqkv));
  // bf16 is not fp32: the rounding shows at the 1e-3 level.
  EXPECT_GT(max_diff(out, out32), 1e-4 * max_abs(out32));
  EXPECT_GT(max_diff(dqkv, dqkv32), 1e-4 * max_abs(dqkv32));
  EXPECT_LT(max_diff(out, out32), 3e-2 * max_abs(out32));
  EXPECT_LT(max_diff(dqkv, dqkv32), 3e-2 * max_abs(dqkv32));
}

TEST(HostPrecision, ThreadCountDoesNotChangeTheEmulatedBits) {
  // Above the parallel threshold, so rounding into scratch runs in OpenMP regions.
  const int B = 4, T = 64, H = 4, D = 16;
  const std::size_t n_qkv = static_cast<std::size_t>(B) * T * 3 * H * D, n_out = static_cast<std::size_t>(B) * T * H * D;
  const auto qkv = random_vec(n_qkv, 50);
  const auto dout = random_vec(n_out, 51);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 3}) {
    auto be = make_host_backend(threads, Precision::Bf16);
    Buffer bq = upload(*be, qkv), bd = upload(*be, dout), bo = be->alloc_floats(n_out), bg = be->alloc_floats(n_qkv);
    Buffer saved = be->alloc_floats(be->attention_saved_floats(B, T, H, D));
    be->attention_forward(bo.f32(), saved.f32(), bq.f32(), B, T, H, D, nullptr);
    be->attention_backward(bg.f32(), bd.f32(), bq.f32(), bo.f32(), saved.f32(), B, T, H, D, nullptr);
    results.push_back(download(*be, bo));
    results.push_back(download(*be, bg));
  }
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(results[1], results[3]);
}

}  // namespace
}  // namespace atlas::device
