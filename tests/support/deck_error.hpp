// SPDX-License-Identifier: MIT
// The deck checks' message for a small 2-DC deck (2 stages per DC, 8 layers, 8 micro-batches,
// 4 ranks) with `overrides`: what the schedule tests assert deck errors against.
#pragma once

#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"

namespace atlas::testing {

/// The ConfigError's text, or "" when the deck is valid. `world_size` -1: the deck is only
/// modelled (schedule, simulate, plan), not launched.
inline std::string two_dc_deck_error(const std::vector<std::string>& overrides, int world_size = 4) {
  const std::string text =
      "cluster.dcs = a b\ncluster.gpus_per_dc = 2 2\ncluster.latency_ms = 0 10 10 0\n"
      "cluster.bandwidth_gbps = 100 1 1 100\nparallel.stages_per_dc = 2 2\nparallel.dp_size = 1\n"
      "model.layers = 8\nmodel.hidden = 64\nmodel.heads = 4\nmodel.seq_len = 16\nmodel.vocab = 256\n"
      "train.micro_batches = 8\n";
  try {
    deck::JobShape shape;
    shape.world_size = world_size;
    (void)deck::parse_and_validate("test.deck", text, overrides, shape);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace atlas::testing
