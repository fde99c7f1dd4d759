// SPDX-License-Identifier: MIT
// Model FLOPs utilization (MFU): the model FLOPs of the tokens trained per second over the
// devices' peak. The formula (docs/gpu.md): 6 N + 12 L T C FLOPs per token. Pure arithmetic; the
// progress line (app/train_output.cpp) and the peer benchmark (bench/gpt_peer.py) use the same.
#pragma once

#include "atlas/deck/config.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::sched {

/// Model FLOPs of one trained token, forward and backward: 6 N (N = model.parameter_count(),
/// embeddings included, tied ones once: 2 N forward, 4 N backward) + 12 L T C (attention's QK^T
/// and AV, L = model.layers, T = model.seq_len, C = model.hidden; PaLM, Chowdhery et al. 2022,
/// appendix B, without halving for causality). Recomputation is not counted (model FLOPs).
[[nodiscard]] double model_flops_per_token(const ModelCfg& m);

/// Dense peak FLOP/s of one device for a run at `precision`: bf16 -> peak_tflops, tf32 ->
/// peak_tflops_tf32, fp32 -> peak_tflops_fp32 (each falling back to peak_tflops when the profile
/// gives none). Auto counts as bf16.
[[nodiscard]] double peak_flops(const DeviceProfile& p, Precision precision);

/// MFU in [0, ...): tokens_per_s x flops_per_token / (devices x peak_flops_per_device); 0 when a
/// divisor is not positive.
[[nodiscard]] double mfu(double tokens_per_s, double flops_per_token, double peak_flops_per_device, int devices);

}  // namespace atlas::sched
