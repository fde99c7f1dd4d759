// SPDX-License-Identifier: MIT
// The fused Backend calls' default implementations (src/device/backend.cpp) on the host backend:
// each must give, to the bit, what the sequence of unfused calls it replaces gives (the host
// training path and its bitwise loss tests rely on it). The CUDA overrides are compared with the
// host in tests/gpu/test_cuda_backend.cpp (label gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/host_backend.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::device {
namespace {

using testutil::download;
using testutil::random_vec;
using testutil::upload;

/// Bitwise equality (NaN-safe), naming the first differing element.
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t g = 0;
    std::uint32_t w = 0;
    std::memcpy(&g, &got[i], sizeof g);
    std::memcpy(&w, &want[i], sizeof w);
    ASSERT_EQ(g, w) << what << "[" << i << "]: fused " << got[i] << ", sequence " << want[i];
  }
}

class FusedDefaults : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_host_backend(2);
  // Odd shapes: no size is a multiple of a block or a SIMD width.
  static constexpr int kRows = 37;
  static constexpr int kIn = 24;
  static constexpr int kOut = 40;
};

TEST_F(FusedDefaults, LinearForwardIsGemmBiasGelu) {
  const auto x = random_vec(kRows * kIn, 1);
  const auto w = random_vec(kOut * kIn, 2, -0.5F, 0.5F);
  const auto b = random_vec(kOut, 3);
  Buffer in = upload(*be, x), wt = upload(*be, w), bias = upload(*be, b);
  for (Activation act : {Activation::None, Activation::Gelu}) {
    Buffer out = be->alloc_floats(kRows * kOut), pre = be->alloc_floats(kRows * kOut);
    be->linear_forward(out.f32(), pre.f32(), in.f32(), wt.f32(), bias.f32(), kRows, kIn, kOut, act);
    Buffer ref = be->alloc_floats(kRows * kOut), ref_pre = be->alloc_floats(kRows * kOut);
    float* y = act == Activation::Gelu ? ref_pre.f32() : ref.f32();
    be->gemm(Trans::No, Trans::Yes, kRows, kOut, kIn, 1.0F, in.f32(), kIn, wt.f32(), kIn, 0.0F, y,
             kOut);
    be->add_bias(y, bias.f32(), kRows, kOut);
    if (act == Activation::Gelu) {
      be->gelu_forward(ref.f32(), ref_pre.f32(), kRows * kOut);
      expect_bitwise(download(*be, pre), download(*be, ref_pre), "pre_act");
    }
    expect_bitwise(download(*be, out), download(*be, ref), "out");
  }
}

TEST_F(FusedDefaults, LinearBackwardIsBiasGradTwoGemmsGeluBackward) {
  const auto dy = random_vec(kRows * kOut, 4);
  const auto x = random_vec(kRows * kIn, 5);
  const auto w = random_vec(kOut * kIn, 6, -0.5F, 0.5F);
  const auto pre = random_vec(kRows * kIn, 7, -3.0F, 3.0F);
  const auto dw0 = random_vec(kOut * kIn, 8);  // gradients accumulate: start non-zero
  const auto db0 = random_vec(kOut, 9);
  Buffer dout = upload(*be, dy), in = upload(*be, x), wt = upload(*be, w), in_pre = upload(*be, pre);
  for (Activation act : {Activation::None, Activation::Gelu}) {
    Buffer din = be->alloc_floats(kRows * kIn), dw = upload(*be, dw0), db = upload(*be, db0);
    be->linear_backward(din.f32(), dw.f32(), db.f32(), dout.f32(), in.f32(), wt.f32(),
                        in_pre.f32(), kRows, kIn, kOut, act);
    Buffer rdin = be->alloc_floats(kRows * kIn), rdw = upload(*be, dw0), rdb = upload(*be, db0);
    be->bias_grad(rdb.f32(), dout.f32(), kRows, kOut);
    be->gemm(Trans::Yes, Trans::No, kOut, kIn, kRows, 1.0F, dout.f32(), kOut, in.f32(), kIn, 1.0F,
             rdw.f32(), kIn);
    be->gemm(Trans::No, Trans::No, kRows, kIn, kOut, 1.0F, dout.f32(), kOut, wt.f32(), kIn, 0.0F,
             rdin.f32(), kIn);
    if (act == Activation::Gelu) be->gelu_backward(rdin.f32(), in_pre.f32(), rdin.f32(), kRows * kIn);
    expect_bitwise(download(*be, din), download(*be, rdin), "din");
    expect_bitwise(download(*be, dw), download(*be, rdw), "dweight");
    expect_bitwise(download(*be, db), download(*be, rdb), "dbias");
  }
}

TEST_F(FusedDefaults, WithoutBiasTheLinearCallsAreTheirGemms) {
  // The tied LM head and the row-parallel projections: no bias (added after the TP sum).
  const auto x = random_vec(kRows * kIn, 30);
  const auto w = random_vec(kOut * kIn, 31, -0.5F, 0.5F);
  const auto dy = random_vec(kRows * kOut, 32);
  const auto dw0 = random_vec(kOut * kIn, 33);
  Buffer in = upload(*be, x), wt = upload(*be, w), dout = upload(*be, dy);
  Buffer out = be->alloc_floats(kRows * kOut), ref = be->alloc_floats(kRows * kOut);
  be->linear_forward(out.f32(), nullptr, in.f32(), wt.f32(), nullptr, kRows, kIn, kOut,
                     Activation::None);
  be->gemm(Trans::No, Trans::Yes, kRows, kOut, kIn, 1.0F, in.f32(), kIn, wt.f32(), kIn, 0.0F,
           ref.f32(), kOut);
  expect_bitwise(download(*be, out), download(*be, ref), "out");
  Buffer din = be->alloc_floats(kRows * kIn), dw = upload(*be, dw0);
  be->linear_backward(din.f32(), dw.f32(), nullptr, dout.f32(), in.f32(), wt.f32(), nullptr,
                      kRows, kIn, kOut, Activation::None);
  Buffer rdin = be->alloc_floats(kRows * kIn), rdw = upload(*be, dw0);
  be->gemm(Trans::Yes, Trans::No, kOut, kIn, kRows, 1.0F, dout.f32(), kOut, in.f32(), kIn, 1.0F,
           rdw.f32(), kIn);
  be->gemm(Trans::No, Trans::No, kRows, kIn, kOut, 1.0F, dout.f32(), kOut, wt.f32(), kIn, 0.0F,
           rdin.f32(), kIn);
  expect_bitwise(download(*be, din), download(*be, rdin), "din");
  expect_bitwise(download(*be, dw), download(*be, rdw), "dweight");
}

TEST_F(FusedDefaults, GeluNeedsItsSavedBuffer) {
  Buffer a = be->alloc_floats(kRows * kIn), w = be->alloc_floats(kOut * kIn),
         b = be->alloc_floats(kOut), out = be->alloc_floats(kRows * kOut);
  EXPECT_THROW(be->linear_forward(out.f32(), nullptr, a.f32(), w.f32(), b.f32(), kRows, kIn, kOut,
                                  Activation::Gelu),
               Error);
  Buffer din = be->alloc_floats(kRows * kIn), dw = be->alloc_floats(kOut * kIn);
  EXPECT_THROW(be->linear_backward(din.f32(), dw.f32(), b.f32(), out.f32(), a.f32(), w.f32(),
                                   nullptr, kRows, kIn, kOut, Activation::Gelu),
               Error);
}

TEST_F(FusedDefaults, ResidualLayerNormIsAddBiasLayerNorm) {
  const auto x = random_vec(kRows * kOut, 10);
  const auto d = random_vec(kRows * kOut, 11);
  const auto b = random_vec(kOut, 12);
  const auto g = random_vec(kOut, 13, 0.5F, 1.5F);
  const auto beta = random_vec(kOut, 14);
  Buffer bx = upload(*be, x), bd = upload(*be, d), bb = upload(*be, b), bg = upload(*be, g),
         bbeta = upload(*be, beta);
  // With LayerNorm and bias, out of place.
  Buffer res = be->alloc_floats(kRows * kOut), ln = be->alloc_floats(kRows * kOut),
         mean = be->alloc_floats(kRows), rstd = be->alloc_floats(kRows);
  be->residual_layernorm_forward(res.f32(), ln.f32(), mean.f32(), rstd.f32(), bx.f32(), bd.f32(),
                                 bb.f32(), bg.f32(), bbeta.f32(), kRows, kOut);
  Buffer rres = be->alloc_floats(kRows * kOut), rln = be->alloc_floats(kRows * kOut),
         rmean = be->alloc_floats(kRows), rrstd = be->alloc_floats(kRows);
  be->add(rres.f32(), bx.f32(), bd.f32(), kRows * kOut);
  be->add_bias(rres.f32(), bb.f32(), kRows, kOut);
  be->layernorm_forward(rln.f32(), rmean.f32(), rrstd.f32(), rres.f32(), bg.f32(), bbeta.f32(),
                        kRows, kOut);
  expect_bitwise(download(*be, res), download(*be, rres), "res");
  expect_bitwise(download(*be, ln), download(*be, rln), "ln");
  expect_bitwise(download(*be, mean), download(*be, rmean), "mean");
  expect_bitwise(download(*be, rstd), download(*be, rrstd), "rstd");
  // Residual only (no bias, no LayerNorm), in place over x.
  Buffer inplace = upload(*be, x);
  be->residual_layernorm_forward(inplace.f32(), nullptr, nullptr, nullptr, inplace.f32(),
                                 bd.f32(), nullptr, nullptr, nullptr, kRows, kOut);
  Buffer radd = be->alloc_floats(kRows * kOut);
  be->add(radd.f32(), bx.f32(), bd.f32(), kRows * kOut);
  expect_bitwise(download(*be, inplace), download(*be, radd), "residual in place");
}

TEST_F(FusedDefaults, SoftmaxXentFusedIsForwardThenBackward) {
  constexpr int kVocab = 53;
  const auto z = random_vec(kRows * kVocab, 15, -4.0F, 4.0F);
  std::vector<std::int32_t> t(kRows);
  for (int r = 0; r < kRows; ++r) t[static_cast<std::size_t>(r)] = (r * 7) % kVocab;
  Buffer targets = testutil::upload_ids(*be, t);
  const float scale = 1.0F / (3.0F * kRows);
  Buffer logits = upload(*be, z), losses = be->alloc_floats(kRows);
  be->softmax_xent_fused(losses.f32(), logits.f32(), logits.f32(), targets.i32(), kRows, kVocab,
                         scale);  // in place, as the model calls it
  Buffer rlogits = upload(*be, z), rlosses = be->alloc_floats(kRows);
  be->softmax_xent_forward(rlosses.f32(), rlogits.f32(), rlogits.f32(), targets.i32(), kRows, kVocab);
  be->softmax_xent_backward(rlogits.f32(), rlogits.f32(), targets.i32(), kRows, kVocab, scale);
  expect_bitwise(download(*be, losses), download(*be, rlosses), "losses");
  expect_bitwise(download(*be, logits), download(*be, rlogits), "dlogits");
}

TEST_F(FusedDefaults, AdamWMultiIsOneUpdatePerTensorWithItsOwnDecay) {
  const std::size_t sizes[] = {1, 100, 4099};
  const float decay[] = {0.0F, 0.1F, 0.05F};
  AdamWArgs args;
  args.lr = 1e-3F;
  args.weight_decay = 123.0F;  // ignored by the multi call: each tensor has its own
  args.bias_correction1 = 0.19F;
  args.bias_correction2 = 0.0975F;
  args.grad_scale = 0.7F;
  std::vector<Buffer> p, g, m, v, rp, rm, rv;
  std::vector<AdamWTensor> tensors;
  for (int i = 0; i < 3; ++i) {
    const std::size_t n = sizes[i];
    const auto seed = static_cast<std::uint64_t>(20 + 4 * i);
    for (auto* set : {&p, &rp}) set->push_back(upload(*be, random_vec(n, seed)));
    g.push_back(upload(*be, random_vec(n, seed + 1)));
    for (auto* set : {&m, &rm}) set->push_back(upload(*be, random_vec(n, seed + 2, -0.1F, 0.1F)));
    for (auto* set : {&v, &rv}) set->push_back(upload(*be, random_vec(n, seed + 3, 0.0F, 0.1F)));
  }
  for (int i = 0; i < 3; ++i) {
    const auto k = static_cast<std::size_t>(i);
    tensors.push_back({p[k].f32(), g[k].f32(), m[k].f32(), v[k].f32(), sizes[i], decay[i]});
  }
  be->adamw_update_multi(tensors, args);
  for (int i = 0; i < 3; ++i) {
    const auto k = static_cast<std::size_t>(i);
    AdamWArgs one = args;
    one.weight_decay = decay[i];
    be->adamw_update(rp[k].f32(), g[k].f32(), rm[k].f32(), rv[k].f32(), sizes[i], one);
    expect_bitwise(download(*be, p[k]), download(*be, rp[k]), "param");
    expect_bitwise(download(*be, m[k]), download(*be, rm[k]), "m");
    expect_bitwise(download(*be, v[k]), download(*be, rv[k]), "v");
  }
}

TEST_F(FusedDefaults, SqNormMultiIsTheSumOfSqNormsInOrder) {
  std::vector<Buffer> bufs;
  std::vector<ConstFloats> ranges;
  double want = 0.0;
  for (std::size_t n : {std::size_t{3}, std::size_t{5000}, std::size_t{0}, std::size_t{777}}) {
    bufs.push_back(upload(*be, random_vec(n, 40 + n)));
  }
  for (const Buffer& b : bufs) {
    ranges.push_back({b.f32(), b.floats()});
    want += be->sq_norm(b.f32(), b.floats());
  }
  EXPECT_EQ(be->sq_norm_multi(ranges), want);
  EXPECT_GT(want, 0.0);
  EXPECT_EQ(be->sq_norm_multi({}), 0.0);
}

}  // namespace
}  // namespace atlas::device
