// SPDX-License-Identifier: MIT
// Trains a small one-stage model for a few steps (3 micro-batches a step: forwards, then
// backwards, or with the split backward B's then W's; AdamW) with block graphs on or off, and
// returns the losses, the final weights and the graph counts: test_model_graphs (host, recording
// backend) and test_cuda_graphs (GPU).
#pragma once

#include <cstdint>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/device/graph_cache.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"
#include "split_backward_driver.hpp"
#include "test_model_util.hpp"

namespace atlas::testutil {

inline ModelCfg small_model() {
  ModelCfg cfg;
  cfg.layers = 3;
  cfg.hidden = 32;
  cfg.heads = 4;
  cfg.seq_len = 16;
  cfg.vocab = 64;
  cfg.init_std = 0.1;
  return cfg;
}

struct Trained {
  std::vector<double> losses;              // per step and micro-batch
  std::vector<std::vector<float>> params;  // after the last step
  device::GraphStats stats;
};

/// `steps` steps of 3 micro-batches (forwards, then backwards; split: B's, then W's) and AdamW
/// on a one-stage model.
inline Trained train(device::Backend& be, bool graphs, bool split, int steps = 4) {
  model::StageSpec spec;
  spec.graphs = graphs;
  spec.split_backward = split;
  const ModelCfg cfg = small_model();
  model::StageModel model(cfg, 2, spec, be, nullptr, 99);
  TrainCfg tc;
  tc.weight_decay = 0.1;
  model::AdamW opt(tc);
  const int micros = 3;
  model.set_loss_scale(1.0F / micros);
  Trained out;
  const std::size_t n = model.tokens_per_micro();
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    std::vector<std::vector<std::int32_t>> tokens, targets;
    for (int m = 0; m < micros; ++m) {
      tokens.push_back(testutil::seeded_ids(n, cfg.vocab, 1000 * step + 2 * m));
      targets.push_back(testutil::seeded_ids(n, cfg.vocab, 1000 * step + 2 * m + 1));
      model.forward(m, tokens.back().data(), targets.back().data(), nullptr, nullptr);
    }
    for (int m = 0; m < micros; ++m) {
      if (split) model.backward_input(m, nullptr, nullptr);
      else model.backward(m, nullptr, nullptr);
    }
    if (split)
      for (int m = 0; m < micros; ++m) model.backward_weight(m);
    for (int m = 0; m < micros; ++m) out.losses.push_back(model.micro_loss(m));
    opt.step(model.params(), be, 1e-2, 1.0);
  }
  for (const auto& p : model.params()) out.params.push_back(testutil::download(be, p.value));
  out.stats = model.graph_stats();
  return out;
}

}  // namespace atlas::testutil
