// SPDX-License-Identifier: MIT
// Drives one StageModel through a 1F1B-like order of (micro, chunk) units, with whole backwards
// or with split ones (backward_input, then backward_weight deferred past a later B and forward:
// F0 F1 B0 F2 B1 W0 B2 W1 W2), and returns every gradient, grad_in and loss, so the two can be
// compared bit for bit (test_split_backward, test_model_split_tp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "atlas/device/backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/rng.hpp"
#include "test_model_util.hpp"

namespace atlas::testutil {

struct StageRun {
  std::vector<std::string> names;           ///< parameter names, in params() order
  std::vector<std::vector<float>> grads;    ///< per parameter, in params() order
  std::vector<std::vector<float>> grad_in;  ///< per unit (empty where the chunk embeds)
  std::vector<double> losses;               ///< per micro-batch (last stage)
  std::size_t bytes_after_first_b = 0;      ///< activation_bytes() right after the first B
};

inline std::vector<std::int32_t> seeded_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> ids(n);
  const std::uint64_t key = model::rng::key(seed, "ids");
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>(model::rng::bits(key, i) % vocab);
  return ids;
}

/// `micros` micro-batches through every chunk of `spec`'s stage; inputs are seeded (the same on
/// every TP rank); units run in micro-major order (micro 0 chunk 0, micro 0 chunk 1, ...).
inline StageRun run_stage(const ModelCfg& cfg, int batch, const model::StageSpec& spec, device::Backend& be,
                          device::Collective* tp, bool split, int micros) {
  model::StageSpec built = spec;
  built.split_backward = split;  // at bf16 storage: room for the q/k/v gradient W keeps
  model::StageModel model(cfg, batch, built, be, tp, 4321);
  model.set_loss_scale(1.0F / static_cast<float>(micros));
  model.zero_grad();
  const std::size_t n = model.tokens_per_micro();
  const std::size_t boundary = model.boundary_floats();
  struct Unit {
    int micro, chunk;
    bool embed, head;
    std::vector<std::int32_t> tokens, targets;
    device::Buffer act_in, act_out, grad_out, grad_in;
  };
  std::vector<Unit> units;
  for (int m = 0; m < micros; ++m) {
    for (int c = 0; c < spec.chunks; ++c) {
      Unit u{m, c, model.is_first() && c == 0, model.is_last() && c == spec.chunks - 1, {}, {}, {}, {}, {}, {}};
      const auto seed = static_cast<std::uint64_t>(100 * m + 10 * c);
      if (u.embed) u.tokens = seeded_ids(n, cfg.vocab, seed + 1);
      else u.act_in = upload(be, random_vec(boundary, seed + 2));
      if (u.head) u.targets = seeded_ids(n, cfg.vocab, seed + 3);
      else {
        u.act_out = be.alloc_floats(boundary);
        u.grad_out = upload(be, random_vec(boundary, seed + 4, -0.1F, 0.1F));
      }
      if (!u.embed) u.grad_in = be.alloc_floats(boundary);
      units.push_back(std::move(u));
    }
  }
  auto fwd = [&](Unit& u) {
    model.forward(u.micro, u.embed ? u.tokens.data() : nullptr, u.head ? u.targets.data() : nullptr,
                  u.embed ? nullptr : &u.act_in, u.head ? nullptr : &u.act_out, u.chunk);
  };
  auto bwd = [&](Unit& u) {
    const device::Buffer* go = u.head ? nullptr : &u.grad_out;
    device::Buffer* gi = u.embed ? nullptr : &u.grad_in;
    if (split) model.backward_input(u.micro, go, gi, u.chunk);
    else model.backward(u.micro, go, gi, nullptr, u.chunk);
  };
  auto wgt = [&](Unit& u) { model.backward_weight(u.micro, nullptr, u.chunk); };
  StageRun out;
  const std::size_t count = units.size();
  for (std::size_t k = 0; k < std::min<std::size_t>(2, count); ++k) fwd(units[k]);
  for (std::size_t k = 0; k < count; ++k) {
    bwd(units[k]);
    if (k == 0) out.bytes_after_first_b = model.activation_bytes();
    if (split && k >= 1) wgt(units[k - 1]);
    if (k + 2 < count) fwd(units[k + 2]);
  }
  if (split && count > 0) wgt(units[count - 1]);
  EXPECT_EQ(model.activation_bytes(), 0U) << "every micro-batch released";
  EXPECT_TRUE(model.weight_grads_pending().empty());
  for (const auto& p : model.params()) {
    out.names.push_back(p.name);
    out.grads.push_back(download(be, p.grad));
  }
  for (const Unit& u : units) out.grad_in.push_back(u.embed ? std::vector<float>{} : download(be, u.grad_in));
  if (model.is_last())
    for (int m = 0; m < micros; ++m) out.losses.push_back(model.micro_loss(m));
  return out;
}

/// Split and whole runs bit for bit; `what` names the case.
inline void expect_bitwise(const StageRun& split, const StageRun& whole, const std::string& what) {
  ASSERT_EQ(split.grads.size(), whole.grads.size()) << what;
  bool any_nonzero = false;
  for (std::size_t i = 0; i < whole.grads.size(); ++i) {
    EXPECT_EQ(split.grads[i], whole.grads[i]) << what << ": gradient of " << whole.names[i];
    for (float g : whole.grads[i]) any_nonzero = any_nonzero || g != 0.0F;
  }
  EXPECT_TRUE(any_nonzero) << what << ": the gradients are not all zero";
  ASSERT_EQ(split.grad_in.size(), whole.grad_in.size()) << what;
  for (std::size_t u = 0; u < whole.grad_in.size(); ++u) EXPECT_EQ(split.grad_in[u], whole.grad_in[u]) << what << ": grad_in of unit " << u;
  EXPECT_EQ(split.losses, whole.losses) << what;
}

}  // namespace atlas::testutil
