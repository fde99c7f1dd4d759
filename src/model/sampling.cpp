// SPDX-License-Identifier: MIT
// Greedy, temperature, top-k and top-p token choice (see sampling.hpp).
#include "atlas/model/sampling.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "atlas/core/error.hpp"

namespace atlas::model {

void check_sampling(const SamplingParams& p, const char* what) {
  ProblemList problems;
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature))
    problems.add(fmt::format("{}: temperature {} must be a finite number >= 0 (0 = greedy)", what, p.temperature));
  if (p.top_k < 0) problems.add(fmt::format("{}: top-k {} must be >= 0 (0 = every token)", what, p.top_k));
  if (!(p.top_p > 0.0 && p.top_p <= 1.0))
    problems.add(fmt::format("{}: top-p {} must be in (0, 1] (1 = every token)", what, p.top_p));
  problems.throw_if_any();
}

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params, double u) {
  check_sampling(params, "sample_token");
  const auto v = static_cast<std::int32_t>(logits.size());
  std::int32_t best = -1;
  for (std::int32_t i = 0; i < v; ++i) {
    const float l = logits[static_cast<std::size_t>(i)];
    if (std::isnan(l) || l == INFINITY)
      throw ConfigError(fmt::format("the model's logit for token {} is {}: the weights give no distribution over "
                                    "the next token\n  hint: the checkpoint holds non-finite values (a diverged "
                                    "run); sample from an earlier checkpoint",
                                    i, l));
    if (l != -INFINITY && (best < 0 || l > logits[static_cast<std::size_t>(best)])) best = i;
  }
  if (best < 0)
    throw ConfigError(fmt::format("every one of the model's {} logits is -inf: no token can be drawn", v));
  if (params.temperature == 0.0) return best;

  // Candidates in descending logit order, lower id first on ties; -inf never a candidate.
  std::vector<std::int32_t> order;
  order.reserve(logits.size());
  for (std::int32_t i = 0; i < v; ++i)
    if (logits[static_cast<std::size_t>(i)] != -INFINITY) order.push_back(i);
  const auto before = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::sort(order.begin(), order.end(), before);
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < order.size()) {
    // Every token whose logit is at least the k-th largest stays (ties with it included), as
    // transformers' TopKLogitsWarper removes only the logits below the k-th.
    const float kth = logits[static_cast<std::size_t>(order[static_cast<std::size_t>(params.top_k) - 1])];
    std::size_t keep = static_cast<std::size_t>(params.top_k);
    while (keep < order.size() && logits[static_cast<std::size_t>(order[keep])] == kth) ++keep;
    order.resize(keep);
  }
  const double top = logits[static_cast<std::size_t>(best)];
  std::vector<double> w(order.size());
  for (std::size_t j = 0; j < order.size(); ++j)
    w[j] = std::exp((static_cast<double>(logits[static_cast<std::size_t>(order[j])]) - top) / params.temperature);
  double mass = std::accumulate(w.begin(), w.end(), 0.0);
  if (params.top_p < 1.0) {
    // The fewest leading tokens whose share of the mass reaches top_p (at least one).
    std::size_t keep = 0;
    double acc = 0.0;
    while (keep < w.size()) {
      acc += w[keep++];
      if (acc >= params.top_p * mass) break;
    }
    w.resize(keep);
    mass = acc;
  }
  const double target = u * mass;
  double acc = 0.0;
  for (std::size_t j = 0; j < w.size(); ++j) {
    acc += w[j];
    if (target < acc) return order[j];
  }
  return order[w.size() - 1];  // u * mass rounded up to the total
}

}  // namespace atlas::model
