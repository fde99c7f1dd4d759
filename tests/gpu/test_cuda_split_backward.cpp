// SPDX-License-Identifier: MIT
// The split backward on the CUDA backend (issue 24 item 5): linear_backward without dweight
// (B: its din GEMM converts dout itself rather than reuse the dW GEMM's bf16 copy) plus
// linear_backward_weight (W: the same BGRADB call) equal one linear_backward bit for bit at fp32
// and bf16; and a StageModel's backward_input + deferred backward_weight match backward() (not
// bit for bit on the GPU: flash attention's dQ and the embedding gradient add with atomicAdd, so
// not even two whole backwards are; the measured distance is printed). Label gpu; skips without
// a device.
#include <gtest/gtest.h>

#include <iostream>

#include "atlas/device/backend.hpp"
#include "cuda_backend.hpp"
#include "gpu/cuda_test_util.hpp"
#include "unit/split_backward_driver.hpp"
#include "unit/test_model_util.hpp"

namespace atlas {
namespace {

using testutil::download;
using testutil::random_vec;
using testutil::upload;

std::unique_ptr<device::Backend> cuda(Precision p) { return testutil::make_cuda(p); }

class CudaSplit : public testutil::CudaDeviceTest {};

TEST_F(CudaSplit, LinearBackwardIsItsInputHalfPlusItsWeightHalfBitwise) {
  for (Precision prec : {Precision::Fp32, Precision::Bf16}) {
    auto be = cuda(prec);
    const int rows = 64, in_f = 32, out_f = 48;
    for (const bool gelu : {false, true}) {
      const auto dout = upload(*be, random_vec(rows * out_f, 1));
      const auto in = upload(*be, random_vec(rows * in_f, 2));
      const auto w = upload(*be, random_vec(out_f * in_f, 3));
      const auto pre = upload(*be, random_vec(rows * in_f, 4));
      const auto dw0 = random_vec(out_f * in_f, 5);
      const auto db0 = random_vec(out_f, 6);
      auto din_a = be->alloc_floats(rows * in_f), din_b = be->alloc_floats(rows * in_f);
      auto dw_a = upload(*be, dw0), dw_b = upload(*be, dw0), db_a = upload(*be, db0), db_b = upload(*be, db0);
      const auto act = gelu ? device::Activation::Gelu : device::Activation::None;
      be->linear_backward(din_a.f32(), dw_a.f32(), db_a.f32(), dout.f32(), in.f32(), w.f32(), pre.f32(), rows, in_f,
                          out_f, act);
      // another dout converted in between: B must not reuse a stale bf16 copy
      const auto other = upload(*be, random_vec(rows * out_f, 7));
      auto scratch = be->alloc_floats(out_f * in_f);
      be->linear_backward_weight(scratch.f32(), nullptr, other.f32(), in.f32(), rows, in_f, out_f);
      be->linear_backward(din_b.f32(), nullptr, nullptr, dout.f32(), in.f32(), w.f32(), pre.f32(), rows, in_f, out_f,
                          act);
      be->linear_backward_weight(dw_b.f32(), db_b.f32(), dout.f32(), in.f32(), rows, in_f, out_f);
      const std::string what = std::string(prec == Precision::Bf16 ? "bf16" : "fp32") + (gelu ? " gelu" : "");
      EXPECT_EQ(download(*be, din_b), download(*be, din_a)) << what;
      EXPECT_EQ(download(*be, dw_b), download(*be, dw_a)) << what;
      EXPECT_EQ(download(*be, db_b), download(*be, db_a)) << what;
    }
  }
}

TEST_F(CudaSplit, StageModelSplitBackwardMatchesBackward) {
  ModelCfg cfg;
  cfg.layers = 4;
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.seq_len = 32;
  cfg.vocab = 96;
  cfg.init_std = 0.1;
  for (Precision prec : {Precision::Fp32, Precision::Bf16}) {
    auto be = cuda(prec);
    for (const auto& [stage, pp] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}}) {
      const model::StageSpec spec{stage, pp, 0, 1, 1};
      const auto whole = testutil::run_stage(cfg, 2, spec, *be, nullptr, false, 3);
      const auto split = testutil::run_stage(cfg, 2, spec, *be, nullptr, true, 3);
      double worst = 0.0;
      for (std::size_t i = 0; i < whole.grads.size(); ++i)
        worst = std::max(worst, testutil::max_rel_diff(split.grads[i], whole.grads[i]));
      for (std::size_t u = 0; u < whole.grad_in.size(); ++u)
        worst = std::max(worst, testutil::max_rel_diff(split.grad_in[u], whole.grad_in[u]));
      const std::string what = "stage " + std::to_string(stage) + " of " + std::to_string(pp) +
                               (prec == Precision::Bf16 ? " bf16" : " fp32");
      std::cout << what << ": split vs whole backward, max-norm relative distance " << worst << "\n";
      EXPECT_LE(worst, prec == Precision::Bf16 ? 2e-2 : 1e-5) << what;
    }
  }
}

}  // namespace
}  // namespace atlas
