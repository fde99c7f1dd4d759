// SPDX-License-Identifier: MIT
// The CUDA fused attention kernels (src/device/cuda/kernels/flash_attention_kernels.cuh) run on
// the CPU through the cuda_emu shim (tests/support/cuda_emu): forward and backward, fp32 and bf16
// numerics, against a double-precision reference and the host backend. This checks the tiling,
// masking, online softmax, LSE recomputation, padding of T and D, shared-memory layouts (wmma
// alignment, sizes within sm_80's and sm_90's limits) and the barrier discipline (fibers run in
// random order between barriers; shared memory is poisoned with NaN before each block) without a
// GPU. What it cannot check (the GPU tests do: tests/gpu/test_cuda_attention.cpp): the real wmma
// hardware path, the launchers, speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "atlas/device/host_backend.hpp"
#include "support/attention_shape.hpp"
#include "unit/test_model_util.hpp"
// After the atlas headers: the shim defines CUDA's vocabulary (threadIdx, __device__, ...).
#include "flash_attention_kernels.cuh"

namespace atlas::device::cuda::kernels::flash {
/// The kernels' `extern __shared__ smem[]`: 227 KiB, sm_90's per-block opt-in maximum.
alignas(128) unsigned char smem[227 * 1024];
}  // namespace atlas::device::cuda::kernels::flash

namespace {

namespace fl = atlas::device::cuda::kernels::flash;
using atlas::testutil::random_vec;

constexpr std::size_t kSm80SharedOptin = 163 * 1024;  // A100's per-block opt-in maximum

// Every layout the launchers use fits an A100 (and so an H100/H200).
static_assert(fl::FwdLayout<float, 32, fl::kFwdKeys<32>>::kBytes <= kSm80SharedOptin);
static_assert(fl::FwdLayout<float, 64, fl::kFwdKeys<64>>::kBytes <= kSm80SharedOptin);
static_assert(fl::FwdLayout<float, 128, fl::kFwdKeys<128>>::kBytes <= kSm80SharedOptin);
static_assert(fl::FwdLayout<fl::bf16, 32, fl::kFwdKeys<32>>::kBytes <= kSm80SharedOptin);
static_assert(fl::FwdLayout<fl::bf16, 64, fl::kFwdKeys<64>>::kBytes <= kSm80SharedOptin);
static_assert(fl::FwdLayout<fl::bf16, 128, fl::kFwdKeys<128>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<float, 32, fl::kBwdWarps<32>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<float, 64, fl::kBwdWarps<64>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<float, 128, fl::kBwdWarps<128>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<fl::bf16, 32, fl::kBwdWarps<32>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<fl::bf16, 64, fl::kBwdWarps<64>>::kBytes <= kSm80SharedOptin);
static_assert(fl::BwdLayout<fl::bf16, 128, fl::kBwdWarps<128>>::kBytes <= kSm80SharedOptin);

// What the backend's fallback (CudaBackend::fused_attention through kernels::flash_fit) compares
// with a GPU's opt-in: sm_86/sm_89 (A10, L4, RTX 30/40) offer 99 KiB a block, where the fp32 tiles
// at head_dim 33-128 do not fit (those GPUs threw "run on an sm_80 or newer GPU" although they are
// newer); bf16 tiles and fp32 up to 32 do. Every size fits an A100.
constexpr std::size_t kSm86SharedOptin = 99 * 1024;
static_assert(fl::shared_bytes<float>(128) > kSm86SharedOptin);
static_assert(fl::shared_bytes<float>(65) == fl::shared_bytes<float>(128));
static_assert(fl::shared_bytes<float>(33) > kSm86SharedOptin);
static_assert(fl::shared_bytes<float>(32) <= kSm86SharedOptin);
static_assert(fl::shared_bytes<fl::bf16>(128) <= kSm86SharedOptin);
static_assert(fl::shared_bytes<float>(129) == 0);
static_assert(fl::shared_bytes<float>(128) <= kSm80SharedOptin && fl::shared_bytes<fl::bf16>(128) <= kSm80SharedOptin);
static_assert(fl::shared_bytes<float>(128) == std::max(fl::FwdLayout<float, 128, fl::kFwdKeys<128>>::kBytes,
                                                       fl::BwdLayout<float, 128, fl::kBwdWarps<128>>::kBytes));
static_assert(fl::shared_bytes<fl::bf16>(20) == std::max(fl::FwdLayout<fl::bf16, 32, fl::kFwdKeys<32>>::kBytes,
                                                         fl::BwdLayout<fl::bf16, 32, fl::kBwdWarps<32>>::kBytes));

using Shape = atlas::testutil::AttentionShape;

void poison() { std::memset(fl::smem, 0xff, sizeof fl::smem); }  // NaN as float and as bf16

// ---- the launchers' geometry, on the emulator ----

template <class E, int Dp>
void emu_forward(std::vector<float>& out, std::vector<float>& lse, const std::vector<float>& qkv,
                 const Shape& s) {
  using F = fl::ForwardLaunch<E, Dp>;
  static_assert(F::Layout::kBytes <= sizeof fl::smem);
  cuda_emu::launch(
      F::grid(s.batch, s.seq, s.heads), dim3(F::kThreadsPerBlock),
      [&] {
        F::kernel()(out.data(), lse.data(), qkv.data(), s.seq, s.heads, s.head_dim,
                    fl::attention_scale(s.head_dim));
      },
      poison);
}

template <class E, int Dp>
void emu_backward(std::vector<float>& dqkv, const std::vector<float>& dout,
                  const std::vector<float>& qkv, const std::vector<float>& out,
                  const std::vector<float>& lse, const Shape& s) {
  using B = fl::BackwardLaunch<E, Dp>;
  static_assert(B::Layout::kBytes <= sizeof fl::smem);
  std::vector<float> delta(static_cast<std::size_t>(s.batch) * s.heads * s.seq, NAN);
  const int rows = s.batch * s.seq * s.heads;
  cuda_emu::launch(B::prep_grid(rows), dim3(B::kPrepThreads), [&] {
    B::prep_kernel()(delta.data(), dqkv.data(), dout.data(), out.data(), rows, s.seq, s.heads,
                     s.head_dim);
  });
  cuda_emu::launch(
      B::grid(s.batch, s.seq, s.heads), dim3(B::kThreadsPerBlock),
      [&] {
        B::kernel()(dqkv.data(), dout.data(), qkv.data(), lse.data(), delta.data(), s.seq,
                    s.heads, s.head_dim, fl::attention_scale(s.head_dim));
      },
      poison);
}

template <class E>
void emu_attention(std::vector<float>& out, std::vector<float>& lse, std::vector<float>& dqkv,
                   const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s) {
  if (s.head_dim <= 32) {
    emu_forward<E, 32>(out, lse, qkv, s);
    emu_backward<E, 32>(dqkv, dout, qkv, out, lse, s);
  } else if (s.head_dim <= 64) {
    emu_forward<E, 64>(out, lse, qkv, s);
    emu_backward<E, 64>(dqkv, dout, qkv, out, lse, s);
  } else {
    emu_forward<E, 128>(out, lse, qkv, s);
    emu_backward<E, 128>(dqkv, dout, qkv, out, lse, s);
  }
}

// ---- double-precision reference (materialised probabilities) ----

struct Ref {
  std::vector<double> out, lse, dqkv;
};

Ref reference(const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s) {
  const int t_n = s.seq;
  const int d_n = s.head_dim;
  const std::size_t hd = s.hd();
  Ref r{std::vector<double>(s.tokens() * hd), std::vector<double>(static_cast<std::size_t>(s.batch) * s.heads * t_n),
        std::vector<double>(s.tokens() * 3 * hd)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_n));
  auto at = [&](int b, int t, int which, int h) {
    return (static_cast<std::size_t>(b) * t_n + t) * 3 * hd + which * hd + static_cast<std::size_t>(h) * d_n;
  };
  auto oat = [&](int b, int t, int h) {
    return (static_cast<std::size_t>(b) * t_n + t) * hd + static_cast<std::size_t>(h) * d_n;
  };
  std::vector<double> p(static_cast<std::size_t>(t_n));
  std::vector<double> dp(static_cast<std::size_t>(t_n));
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < t_n; ++t) {
        double m = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int d = 0; d < d_n; ++d) dot += static_cast<double>(qkv[at(b, t, 0, h) + d]) * qkv[at(b, u, 1, h) + d];
          p[u] = dot * scale;
          m = std::max(m, p[u]);
        }
        double l = 0.0;
        for (int u = 0; u <= t; ++u) l += (p[u] = std::exp(p[u] - m));
        for (int u = 0; u <= t; ++u) p[u] /= l;
        r.lse[(static_cast<std::size_t>(b) * s.heads + h) * t_n + t] = m + std::log(l);
        for (int d = 0; d < d_n; ++d) {
          double acc = 0.0;
          for (int u = 0; u <= t; ++u) acc += p[u] * qkv[at(b, u, 2, h) + d];
          r.out[oat(b, t, h) + d] = acc;
        }
        double delta = 0.0;
        for (int u = 0; u <= t; ++u) {
          double acc = 0.0;
          for (int d = 0; d < d_n; ++d) acc += static_cast<double>(dout[oat(b, t, h) + d]) * qkv[at(b, u, 2, h) + d];
          dp[u] = acc;
          delta += p[u] * acc;
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = p[u] * (dp[u] - delta) * scale;
          for (int d = 0; d < d_n; ++d) {
            r.dqkv[at(b, t, 0, h) + d] += ds * qkv[at(b, u, 1, h) + d];
            r.dqkv[at(b, u, 1, h) + d] += ds * qkv[at(b, t, 0, h) + d];
            r.dqkv[at(b, u, 2, h) + d] += p[u] * dout[oat(b, t, h) + d];
          }
        }
      }
  return r;
}

/// max |got - want| / max |want|.
double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    norm = std::max(norm, std::abs(want[i]));
    if (std::isnan(got[i])) return INFINITY;
  }
  return norm == 0.0 ? diff : diff / norm;
}

/// max |got - want| (the log-sum-exp is O(1): absolute).
double absdiff(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(got[i] - want[i]));
  }
  return diff;
}

const Shape kShapes[] = {
    {1, 1, 1, 64},   // one token
    {2, 19, 3, 32},  // T below one tile, several heads and samples
    {1, 130, 2, 64}, // T = 2 tiles + 2: a nearly empty last tile
    {1, 70, 1, 128}, // the 32-key tiles of D = 128
    {1, 33, 2, 48},  // D padded to 64
    {2, 40, 1, 8},   // small D padded to 32
    {2, 100, 2, 64}, // several samples and heads over two tiles
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

template <class E>
Result run(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  Result r{std::vector<float>(s.tokens() * s.hd(), NAN),
        std::vector<float>(static_cast<std::size_t>(s.batch) * s.heads * s.seq, NAN),
        random_vec(s.tokens() * 3 * s.hd(), 99)};  // must be overwritten, not accumulated
  emu_attention<E>(r.out, r.lse, r.dqkv, qkv, dout, s);
  return r;
}

/// Inputs, both numerics and the reference of every shape, computed once for both tests.
struct Case {
  Shape s;
  std::vector<float> qkv, dout;
  Result fp32, bf16;
  Ref want;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    for (const Shape& s : kShapes) {
      Case c{s, random_vec(s.tokens() * 3 * s.hd(), 50, -2.0F, 2.0F),
             random_vec(s.tokens() * s.hd(), 51), {}, {}, {}};
      c.fp32 = run<float>(s, c.qkv, c.dout);
      c.bf16 = run<fl::bf16>(s, c.qkv, c.dout);
      c.want = reference(c.qkv, c.dout, s);
      v.push_back(std::move(c));
    }
    return v;
  }();
  return all;
}

TEST(FlashAttentionEmulated, Fp32MatchesTheDoubleReferenceAndTheHostBackend) {
  auto host = atlas::device::make_host_backend(1);
  for (const Case& c : cases()) {
    const Shape& s = c.s;
    const Result& got = c.fp32;
    // fp32 FMA against double: sums of up to T (softmax, P.V) and D (scores) fp32 terms.
    EXPECT_LE(rel(got.out, c.want.out), 1e-5) << s.tag();
    EXPECT_LE(absdiff(got.lse, c.want.lse), 1e-5) << s.tag();
    EXPECT_LE(rel(got.dqkv, c.want.dqkv), 1e-4) << s.tag();

    // The host backend (unfused, materialised probabilities) on the same inputs.
    auto hq = atlas::testutil::upload(*host, c.qkv);
    auto hdy = atlas::testutil::upload(*host, c.dout);
    auto hout = host->alloc_floats(s.tokens() * s.hd());
    auto hdqkv = host->alloc_floats(s.tokens() * 3 * s.hd());
    auto saved = host->alloc_floats(host->attention_saved_floats(s.batch, s.seq, s.heads, s.head_dim));
    auto ws = host->alloc_floats(host->attention_workspace_floats(s.batch, s.seq, s.heads, s.head_dim));
    host->attention_forward(hout.f32(), saved.f32(), hq.f32(), s.batch, s.seq, s.heads, s.head_dim, ws.f32());
    host->attention_backward(hdqkv.f32(), hdy.f32(), hq.f32(), hout.f32(), saved.f32(), s.batch, s.seq,
                             s.heads, s.head_dim, ws.f32());
    EXPECT_LE(atlas::testutil::max_rel_diff(got.out, atlas::testutil::download(*host, hout)), 1e-5) << s.tag();
    EXPECT_LE(atlas::testutil::max_rel_diff(got.dqkv, atlas::testutil::download(*host, hdqkv)), 1e-4)
        << s.tag();
  }
}

TEST(FlashAttentionEmulated, Bf16IsWithinTheBf16ToleranceAndRoundsItsOperands) {
  for (const Case& c : cases()) {
    const Shape& s = c.s;
    const double e_out = rel(c.bf16.out, c.want.out);
    const double e_lse = absdiff(c.bf16.lse, c.want.lse);
    const double e_dqkv = rel(c.bf16.dqkv, c.want.dqkv);
    std::cout << "bf16 " << s.tag() << ": out " << e_out << ", lse " << e_lse << ", dqkv "
              << e_dqkv << " (max-norm relative; lse absolute)\n";
    // bf16 operands (8-bit mantissa, relative rounding 2^-9) with fp32 accumulation: the
    // tolerances of docs/attention.md.
    EXPECT_LE(e_out, 2e-2) << s.tag();
    EXPECT_LE(e_lse, 5e-2) << s.tag();
    EXPECT_LE(e_dqkv, 5e-2) << s.tag();
    EXPECT_NE(c.bf16.out, c.fp32.out) << s.tag() << ": bf16 must round its operands";
  }
}

}  // namespace
