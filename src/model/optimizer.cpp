// SPDX-License-Identifier: MIT
// AdamW step and the learning-rate schedule (see optimizer.hpp).
#include "atlas/model/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace atlas::model {

double lr_at(int step, const TrainCfg& train, int total_steps) {
  if (step < train.warmup_steps) {
    return train.lr * static_cast<double>(step + 1) / static_cast<double>(train.warmup_steps);
  }
  const int decay_steps = total_steps - 1 - train.warmup_steps;
  if (decay_steps <= 0 || step >= total_steps - 1) {
    return decay_steps <= 0 ? train.lr : train.min_lr;
  }
  const double ratio = static_cast<double>(step - train.warmup_steps) / decay_steps;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return train.min_lr + coeff * (train.lr - train.min_lr);
}

double clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

void AdamW::step(std::vector<ParamTensor>& params, device::Backend& backend, double lr,
                 double grad_scale) {
  ++m_step;
  const auto t = static_cast<double>(m_step);
  device::AdamWArgs args;
  args.lr = static_cast<float>(lr);
  args.beta1 = static_cast<float>(m_train.beta1);
  args.beta2 = static_cast<float>(m_train.beta2);
  args.eps = static_cast<float>(m_train.eps);
  args.bias_correction1 = static_cast<float>(1.0 - std::pow(m_train.beta1, t));
  args.bias_correction2 = static_cast<float>(1.0 - std::pow(m_train.beta2, t));
  args.grad_scale = static_cast<float>(grad_scale);
  // One call over every tensor (one launch on a device backend).
  std::vector<device::AdamWTensor> tensors;
  tensors.reserve(params.size());
  for (auto& p : params) {
    tensors.push_back({p.value.f32(), p.grad.f32(), p.adam_m.f32(), p.adam_v.f32(),
                       p.value.floats(),
                       p.decay ? static_cast<float>(m_train.weight_decay) : 0.0F});
  }
  backend.adamw_update_multi(tensors, args);
}

}  // namespace atlas::model
