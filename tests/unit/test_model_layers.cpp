// SPDX-License-Identifier: MIT
// Every layer's backward against central finite differences of its forward, through the
// device::Backend interface (host backend), in fp32 with small shapes. The scalar checked is
// L = sum(out * R) for a fixed random R, so backward is called with dout = R.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "atlas/device/host_backend.hpp"
#include "test_model_util.hpp"

namespace atlas::model {
namespace {

using device::Buffer;
using device::Trans;
using testutil::download;
using testutil::expect_close;
using testutil::random_vec;
using testutil::upload;
using testutil::upload_ids;

constexpr float kEps = 4e-3F;
constexpr double kAtol = 1e-3;
constexpr double kRtol = 1e-2;

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Central differences of `loss` with respect to every element of `x` (restored afterwards).
std::vector<double> numeric_grad(std::vector<float>& x, const std::function<double()>& loss) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + kEps;
    const double up = loss();
    x[i] = saved - kEps;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2.0 * static_cast<double>(kEps));
  }
  return g;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class Layers : public ::testing::Test {
 protected:
  std::unique_ptr<device::Backend> be = device::make_host_backend(2);
};

TEST_F(Layers, LinearBackwardMatchesFiniteDifferences) {
  const int n = 4, in = 5, out = 3;
  auto x = random_vec(static_cast<std::size_t>(n * in), 1);
  auto w = random_vec(static_cast<std::size_t>(out * in), 2);
  auto b = random_vec(static_cast<std::size_t>(out), 3);
  const auto r = random_vec(static_cast<std::size_t>(n * out), 4);
  // y = x w^T + b, as StageModel runs its column-parallel layers
  auto forward = [&] {
    Buffer bx = upload(*be, x), bw = upload(*be, w), bb = upload(*be, b);
    Buffer y = be->alloc_floats(static_cast<std::size_t>(n * out));
    be->gemm(Trans::No, Trans::Yes, n, out, in, 1.0F, bx.f32(), in, bw.f32(), in, 0.0F, y.f32(),
             out);
    be->add_bias(y.f32(), bb.f32(), n, out);
    return dot(download(*be, y), r);
  };
  Buffer bx = upload(*be, x), bw = upload(*be, w), dy = upload(*be, r);
  Buffer dx = be->alloc_floats(x.size()), dw = be->alloc_floats(w.size()),
         db = be->alloc_floats(b.size());
  be->gemm(Trans::No, Trans::No, n, in, out, 1.0F, dy.f32(), out, bw.f32(), in, 0.0F, dx.f32(),
           in);
  be->gemm(Trans::Yes, Trans::No, out, in, n, 1.0F, dy.f32(), out, bx.f32(), in, 1.0F, dw.f32(),
           in);
  be->bias_grad(db.f32(), dy.f32(), n, out);
  expect_close(to_double(download(*be, dx)), numeric_grad(x, forward), kAtol, kRtol, "dx");
  expect_close(to_double(download(*be, dw)), numeric_grad(w, forward), kAtol, kRtol, "dw");
  expect_close(to_double(download(*be, db)), numeric_grad(b, forward), kAtol, kRtol, "db");
}

TEST_F(Layers, LayerNormBackwardMatchesFiniteDifferencesAndAccumulates) {
  const int rows = 3, cols = 8;
  auto x = random_vec(static_cast<std::size_t>(rows * cols), 10, -2.0F, 2.0F);
  auto w = random_vec(static_cast<std::size_t>(cols), 11, 0.5F, 1.5F);
  auto b = random_vec(static_cast<std::size_t>(cols), 12);
  const auto r = random_vec(x.size(), 13);
  Buffer mean = be->alloc_floats(rows), rstd = be->alloc_floats(rows);
  Buffer y = be->alloc_floats(x.size());
  auto forward = [&] {
    Buffer bx = upload(*be, x), bw = upload(*be, w), bb = upload(*be, b);
    be->layernorm_forward(y.f32(), mean.f32(), rstd.f32(), bx.f32(), bw.f32(), bb.f32(), rows,
                          cols);
    return dot(download(*be, y), r);
  };
  forward();
  // the forward itself: each row normalised to mean 0, variance ~1 before the affine part
  const auto m = download(*be, mean);
  for (int i = 0; i < rows; ++i) {
    double mu = 0.0;
    for (int c = 0; c < cols; ++c) mu += x[static_cast<std::size_t>(i * cols + c)];
    EXPECT_NEAR(m[static_cast<std::size_t>(i)], mu / cols, 1e-6);
  }
  Buffer bx = upload(*be, x), bw = upload(*be, w), dy = upload(*be, r);
  Buffer din = be->alloc_floats(x.size()), dw = be->alloc_floats(w.size()),
         db = be->alloc_floats(b.size());
  be->layernorm_backward(din.f32(), dw.f32(), db.f32(), dy.f32(), bx.f32(), bw.f32(), mean.f32(),
                         rstd.f32(), rows, cols);
  const auto din1 = download(*be, din);
  expect_close(to_double(din1), numeric_grad(x, forward), kAtol, kRtol, "din");
  expect_close(to_double(download(*be, dw)), numeric_grad(w, forward), kAtol, kRtol, "dweight");
  expect_close(to_double(download(*be, db)), numeric_grad(b, forward), kAtol, kRtol, "dbias");
  // a second call adds the same gradient again (the residual stream relies on +=)
  be->layernorm_backward(din.f32(), dw.f32(), db.f32(), dy.f32(), bx.f32(), bw.f32(), mean.f32(),
                         rstd.f32(), rows, cols);
  const auto din2 = download(*be, din);
  for (std::size_t i = 0; i < din1.size(); ++i) EXPECT_FLOAT_EQ(din2[i], 2.0F * din1[i]);
}

TEST_F(Layers, GeluBackwardMatchesFiniteDifferences) {
  auto x = random_vec(24, 20, -3.0F, 3.0F);
  const auto r = random_vec(x.size(), 21);
  auto forward = [&] {
    Buffer bx = upload(*be, x);
    be->gelu_forward(bx.f32(), bx.f32(), x.size());  // in place is allowed
    return dot(download(*be, bx), r);
  };
  // the tanh approximation at a few points
  Buffer probe = upload(*be, {-1.0F, 0.0F, 1.0F, 3.0F});
  be->gelu_forward(probe.f32(), probe.f32(), 4);
  const auto g = download(*be, probe);
  EXPECT_NEAR(g[0], -0.158808, 1e-5);
  EXPECT_EQ(g[1], 0.0F);
  EXPECT_NEAR(g[2], 0.841192, 1e-5);
  EXPECT_NEAR(g[3], 2.996363, 1e-5);
  Buffer bx = upload(*be, x), dy = upload(*be, r);
  be->gelu_backward(dy.f32(), bx.f32(), dy.f32(), x.size());  // din aliases dout
  expect_close(to_double(download(*be, dy)), numeric_grad(x, forward), kAtol, kRtol, "dx");
}

TEST_F(Layers, AttentionBackwardMatchesFiniteDifferences) {
  const int batch = 2, seq = 5, heads = 2, hd = 3;
  const std::size_t qkv_n = static_cast<std::size_t>(batch * seq * 3 * heads * hd);
  const std::size_t out_n = static_cast<std::size_t>(batch * seq * heads * hd);
  auto qkv = random_vec(qkv_n, 30, -1.5F, 1.5F);
  const auto r = random_vec(out_n, 31);
  Buffer saved = be->alloc_floats(be->attention_saved_floats(batch, seq, heads, hd));
  Buffer ws = be->alloc_floats(be->attention_workspace_floats(batch, seq, heads, hd));
  Buffer y = be->alloc_floats(out_n);
  auto forward = [&] {
    Buffer bq = upload(*be, qkv);
    be->attention_forward(y.f32(), saved.f32(), bq.f32(), batch, seq, heads, hd, ws.f32());
    return dot(download(*be, y), r);
  };
  forward();
  const auto y0 = download(*be, y);
  Buffer bq = upload(*be, qkv), dy = upload(*be, r);
  Buffer dqkv = upload(*be, std::vector<float>(qkv_n, 7.0F));  // must be overwritten
  be->attention_backward(dqkv.f32(), dy.f32(), bq.f32(), y.f32(), saved.f32(), batch, seq, heads,
                         hd, ws.f32());
  expect_close(to_double(download(*be, dqkv)), numeric_grad(qkv, forward), kAtol, kRtol, "dqkv");

  // causality: changing the last token's keys and values leaves earlier outputs unchanged
  for (int b = 0; b < batch; ++b) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(3 * heads * hd); ++j) {
      qkv[(static_cast<std::size_t>(b) * seq + seq - 1) * 3 * heads * hd + j] += 0.5F;
    }
  }
  forward();
  const auto y1 = download(*be, y);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      for (int j = 0; j < heads * hd; ++j) {
        const std::size_t i = (static_cast<std::size_t>(b) * seq + t) * heads * hd + j;
        if (t < seq - 1) {
          EXPECT_EQ(y1[i], y0[i]) << "future token leaked into t=" << t;
        }
      }
    }
  }
  // the first token attends only to itself: its output is its own value vector
  for (int h = 0; h < heads; ++h) {
    for (int d = 0; d < hd; ++d) {
      EXPECT_NEAR(y0[static_cast<std::size_t>(h * hd + d)],
                  qkv[static_cast<std::size_t>(2 * heads * hd + h * hd + d)], 1e-6);
    }
  }
}

TEST_F(Layers, EmbeddingBackwardMatchesFiniteDifferences) {
  const int vocab = 7, channels = 4, batch = 2, seq = 3;
  const std::vector<std::int32_t> tokens = {1, 3, 1, 6, 1, 0};  // token 1 repeats
  auto wte = random_vec(static_cast<std::size_t>(vocab * channels), 40);
  auto wpe = random_vec(static_cast<std::size_t>(seq * channels), 41);
  const auto r = random_vec(static_cast<std::size_t>(batch * seq * channels), 42);
  Buffer ids = upload_ids(*be, tokens);
  auto forward = [&] {
    Buffer te = upload(*be, wte), pe = upload(*be, wpe);
    Buffer y = be->alloc_floats(r.size());
    be->embedding_forward(y.f32(), ids.i32(), te.f32(), pe.f32(), batch, seq, channels);
    return dot(download(*be, y), r);
  };
  Buffer dy = upload(*be, r);
  Buffer dte = be->alloc_floats(wte.size()), dpe = be->alloc_floats(wpe.size());
  be->embedding_backward(dte.f32(), dpe.f32(), dy.f32(), ids.i32(), batch, seq, channels);
  expect_close(to_double(download(*be, dte)), numeric_grad(wte, forward), kAtol, kRtol, "dwte");
  expect_close(to_double(download(*be, dpe)), numeric_grad(wpe, forward), kAtol, kRtol, "dwpe");
}

TEST_F(Layers, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int rows = 4, vocab = 6;
  auto logits = random_vec(static_cast<std::size_t>(rows * vocab), 50, -3.0F, 3.0F);
  const std::vector<std::int32_t> targets = {0, 5, 2, 2};
  Buffer ids = upload_ids(*be, targets);
  Buffer probs = be->alloc_floats(logits.size()), losses = be->alloc_floats(rows);
  auto forward = [&] {
    Buffer z = upload(*be, logits);
    be->softmax_xent_forward(losses.f32(), probs.f32(), z.f32(), ids.i32(), rows, vocab);
    double sum = 0.0;
    for (float v : download(*be, losses)) sum += v;
    return sum;
  };
  forward();
  // loss = -log softmax, computed here in double
  const auto l = download(*be, losses);
  for (int i = 0; i < rows; ++i) {
    double z_max = -1e30, sum = 0.0;
    for (int v = 0; v < vocab; ++v)
      z_max = std::max<double>(z_max, logits[static_cast<std::size_t>(i * vocab + v)]);
    for (int v = 0; v < vocab; ++v)
      sum += std::exp(logits[static_cast<std::size_t>(i * vocab + v)] - z_max);
    const double want =
        -(logits[static_cast<std::size_t>(i * vocab + targets[static_cast<std::size_t>(i)])] -
          z_max - std::log(sum));
    EXPECT_NEAR(l[static_cast<std::size_t>(i)], want, 1e-5);
  }
  const float scale = 0.25F;
  auto want = numeric_grad(logits, forward);
  for (double& g : want) g *= scale;
  forward();  // probs of the unperturbed logits
  be->softmax_xent_backward(probs.f32(), probs.f32(), ids.i32(), rows, vocab, scale);
  expect_close(to_double(download(*be, probs)), want, kAtol * scale, kRtol, "dlogits");
}

}  // namespace
}  // namespace atlas::model
