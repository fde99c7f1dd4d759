// SPDX-License-Identifier: MIT
// Choosing the next token from a model's logits (atlas sample): greedy, temperature, top-k and
// top-p (nucleus) sampling, driven by a counter-based uniform draw so a seed gives the same text
// on any machine. The filters compose as in Hugging Face transformers' generate(): temperature
// first, then top-k, then top-p over what top-k kept. Not the forward pass (bubbletea/model.hpp).
#pragma once

#include <cstdint>
#include <span>

namespace atlas::model {

/// How the next token is chosen.
struct SamplingParams {
  double temperature = 1.0;  ///< >= 0; 0 = greedy (the largest logit, the lowest id on ties)
  int top_k = 0;             ///< >= 0; keep the k most likely tokens and any tied with the k-th (0 = all)
  double top_p = 1.0;        ///< in (0, 1]; keep the fewest most likely tokens whose mass reaches p
};

/// Throws atlas::ConfigError (naming `what`, e.g. "atlas sample") when a field is out of range.
void check_sampling(const SamplingParams& params, const char* what);

/// The token drawn from `logits` (one per vocabulary id) with `params`, using `u` in [0, 1) as
/// the one uniform draw: the kept tokens in descending probability (ties: lower id first) are
/// laid end to end on [0, 1) by probability and `u` picks one. Temperature 0 is greedy (`u`
/// unused); top-k 1 with tied largest logits draws among them, as transformers does. Probabilities are computed in
/// double from softmax(logits / temperature). -inf logits have probability 0. Throws
/// atlas::ConfigError when a logit is NaN or +inf, or every logit is -inf (the model produced
/// no distribution).
[[nodiscard]] std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params, double u);

}  // namespace atlas::model
