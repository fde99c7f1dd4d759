// SPDX-License-Identifier: MIT
// AdamW against a step computed by hand (bias correction, decoupled decay of decay tensors only,
// gradient scaling for clipping), the global-norm clip factor, and the warm-up + cosine schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "atlas/device/host_backend.hpp"
#include "atlas/model/optimizer.hpp"
#include "test_model_util.hpp"

namespace atlas::model {
namespace {

using testutil::download;
using testutil::upload;

ParamTensor make_param(device::Backend& be, const std::string& name, std::vector<float> value,
                       std::vector<float> grad, bool decay) {
  ParamTensor p;
  p.name = name;
  p.full_shape = {static_cast<std::int64_t>(value.size())};
  p.shard_offset = {0};
  p.shard_shape = p.full_shape;
  p.value = upload(be, value);
  p.grad = upload(be, grad);
  p.adam_m = be.alloc_floats(value.size());
  p.adam_v = be.alloc_floats(value.size());
  p.decay = decay;
  return p;
}

TEST(AdamW, TwoStepsMatchTheHandComputedUpdate) {
  auto be = device::make_host_backend(1);
  TrainCfg train;
  train.beta1 = 0.9;
  train.beta2 = 0.95;
  train.eps = 1e-8;
  train.weight_decay = 0.1;
  std::vector<ParamTensor> params;
  params.push_back(make_param(*be, "w", {1.0F, -2.0F}, {0.5F, 0.1F}, true));
  params.push_back(make_param(*be, "b", {1.0F}, {0.5F}, false));
  AdamW opt(train);

  // Step 1 by hand, element w[0]: g = 0.5 * 0.5 (clip scale) = 0.25; m = 0.025; v = 0.003125;
  // mhat = 0.25; vhat = 0.0625; update = 0.25 / 0.25 = 1; w = 1 - 0.1 * (1 + 0.1 * 1) = 0.89.
  opt.step(params, *be, 0.1, 0.5);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_NEAR(download(*be, params[0].value)[0], 0.89, 1e-6);
  // b is not decayed: 1 - 0.1 * 1 = 0.9
  EXPECT_NEAR(download(*be, params[1].value)[0], 0.9, 1e-6);
  EXPECT_NEAR(download(*be, params[0].adam_m)[0], 0.025, 1e-8);
  EXPECT_NEAR(download(*be, params[0].adam_v)[0], 0.003125, 1e-9);

  // Step 2 with a new gradient, written out in double.
  be->upload(params[0].grad.data(), std::vector<float>{-0.2F, 0.1F}.data(), 2 * sizeof(float));
  opt.step(params, *be, 0.05, 1.0);
  double m = 0.9 * 0.025 + 0.1 * -0.2;
  double v = 0.95 * 0.003125 + 0.05 * 0.04;
  const double mhat = m / (1 - 0.9 * 0.9);
  const double vhat = v / (1 - 0.95 * 0.95);
  const double want = 0.89 - 0.05 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.1 * 0.89);
  EXPECT_NEAR(download(*be, params[0].value)[0], want, 1e-6);
  // w[1]: the same gradient twice, g = 0.05 then 0.1
  m = 0.9 * 0.005 + 0.1 * 0.1;
  v = 0.95 * (0.05 * 0.0025) + 0.05 * 0.01;
  const double w1_step1 = -2.0 - 0.1 * (1.0 + 0.1 * -2.0);
  const double w1 =
      w1_step1 - 0.05 * ((m / 0.19) / (std::sqrt(v / (1 - 0.9025)) + 1e-8) + 0.1 * w1_step1);
  EXPECT_NEAR(download(*be, params[0].value)[1], w1, 1e-6);
}

TEST(AdamW, ClipScaleKeepsTheNormAtTheLimit) {
  EXPECT_NEAR(clip_scale(2.0, 1.0), 0.5, 1e-6);
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_scale(100.0, 0.0), 1.0) << "grad_clip = 0 disables clipping";
}

TEST(LrSchedule, WarmupPeakCosineAndFloor) {
  TrainCfg train;
  train.lr = 1e-3;
  train.min_lr = 1e-4;
  train.warmup_steps = 10;
  const int total = 101;  // decay over steps 10..100
  EXPECT_NEAR(lr_at(0, train, total), 1e-4, 1e-12);
  EXPECT_NEAR(lr_at(4, train, total), 5e-4, 1e-12);
  EXPECT_NEAR(lr_at(9, train, total), 1e-3, 1e-12);   // end of warm-up: peak
  EXPECT_NEAR(lr_at(10, train, total), 1e-3, 1e-12);  // start of the cosine: peak
  EXPECT_NEAR(lr_at(55, train, total), 5.5e-4, 1e-12);  // halfway: the mean of peak and floor
  EXPECT_NEAR(lr_at(100, train, total), 1e-4, 1e-12);   // last step: the floor
  EXPECT_NEAR(lr_at(500, train, total), 1e-4, 1e-12);   // beyond: stays at the floor
  for (int s = 10; s < 100; ++s) EXPECT_LT(lr_at(s + 1, train, total), lr_at(s, train, total));
  train.warmup_steps = 0;
  EXPECT_NEAR(lr_at(0, train, total), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(0, train, 1), 1e-3, 1e-12) << "a one-step run uses the peak";
}

}  // namespace
}  // namespace atlas::model
