// SPDX-License-Identifier: MIT
// One attention problem of the fused-attention tests (the GPU test and its CPU-emulated twin):
// batch B, sequence T, heads H of head_dim D, over the Backend's qkv [B,T,3,H,D] layout.
#pragma once

#include <cstddef>
#include <string>

namespace atlas::testutil {

struct AttentionShape {
  int batch, seq, heads, head_dim;
  [[nodiscard]] std::string tag() const {
    return "B" + std::to_string(batch) + " T" + std::to_string(seq) + " H" + std::to_string(heads) + " D" +
           std::to_string(head_dim);
  }
  [[nodiscard]] std::size_t tokens() const { return static_cast<std::size_t>(batch) * seq; }
  [[nodiscard]] std::size_t hd() const { return static_cast<std::size_t>(heads) * head_dim; }
};

}  // namespace atlas::testutil
