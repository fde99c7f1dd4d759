// SPDX-License-Identifier: MIT
// AdamW with decoupled weight decay (weight matrices and embeddings only: decays_by_role), bias
// correction and global-norm clipping, and the warm-up + cosine learning-rate schedule. The optimizer state (moments) lives in each
// ParamTensor so checkpoints see it; the step count lives here.
#pragma once

#include <cstdint>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/model/gpt.hpp"

namespace atlas::model {

/// Learning rate of 0-based optimizer step `step` of `total_steps`: linear warm-up
/// lr * (step + 1) / warmup_steps for step < warmup_steps, then a cosine decay from lr to
/// min_lr reached at step total_steps - 1 (min_lr from then on).
[[nodiscard]] double lr_at(int step, const TrainCfg& train, int total_steps);

/// Gradient multiplier for global-norm clipping: min(1, max_norm / (global_norm + 1e-6));
/// 1 when max_norm <= 0 (clipping disabled).
[[nodiscard]] double clip_scale(double global_norm, double max_norm);

/// AdamW over a stage's parameters. Hyper-parameters from TrainCfg (beta1, beta2, eps,
/// weight_decay); weight decay applies only to ParamTensor::decay tensors (decays_by_role: every
/// weight matrix and embedding, no bias and no LayerNorm parameter).
class AdamW {
 public:
  explicit AdamW(const TrainCfg& train) : m_train(train) {}

  /// One update of every tensor in `params` with learning rate `lr` and gradients multiplied by
  /// `grad_scale` (clip_scale of the global norm). Increments the step count first, so bias
  /// correction uses t = step_count() >= 1. Local (not collective).
  void step(std::vector<ParamTensor>& params, device::Backend& backend, double lr,
            double grad_scale);
  /// Updates applied so far (t); saved in and restored from checkpoints.
  [[nodiscard]] std::int64_t step_count() const noexcept { return m_step; }
  void set_step_count(std::int64_t t) noexcept { m_step = t; }

 private:
  TrainCfg m_train;
  std::int64_t m_step = 0;
};

}  // namespace atlas::model
