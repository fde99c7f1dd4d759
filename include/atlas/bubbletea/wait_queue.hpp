// SPDX-License-Identifier: MIT
// The dispatcher's queue of arrived, not yet started requests, and admission's one question on
// it (which request starts next?) answered in O(log n) instead of a scan of the queue: a
// segment tree over the DC's requests in arrival order. Decides exactly what the scan decided.
// Not the reservation, the in-flight count or the chunks: Service keeps those.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace atlas::bubbletea {

class WaitQueue {
 public:
  /// An empty queue over `slots` positions (position = the request's rank in arrival order).
  explicit WaitQueue(int slots = 0);

  /// Request at `slot` arrived: its first chunk has `first_chunk_tokens`, its prompt
  /// `prompt_tokens`. Throws Internal for a slot outside the queue or already in it.
  void push(int slot, int first_chunk_tokens, int prompt_tokens);
  /// Request at `slot` started (leaves the queue). Throws Internal when it is not in it.
  void erase(int slot);
  [[nodiscard]] std::size_t size() const noexcept { return m_size; }
  [[nodiscard]] bool empty() const noexcept { return m_size == 0; }

  /// The request admission starts now, as the scan in arrival order decided it: walk the
  /// waiting requests from the earliest; stop (none) at the first whose prompt exceeds
  /// `max_prompt_tokens` (the memory reservation, first come first served); skip one whose first
  /// chunk does not fit (`fits(first_chunk_tokens)` false); take the first that fits. `fits` must
  /// be monotone (true for n implies true for every smaller n: the cost model's coefficients are
  /// non-negative). Returns the slot, or -1. O(log n) calls of `fits`.
  [[nodiscard]] int pick(long long max_prompt_tokens, const std::function<bool(int)>& fits) const;

 private:
  struct Node {
    int min_first = kNone;  ///< smallest first-chunk size below (kNone: no request)
    int max_prompt = -1;    ///< longest prompt below (-1: no request)
  };
  static constexpr int kNone = 1 << 30;
  void set(int slot, Node leaf);
  /// First slot whose prompt exceeds `limit`, or m_leaves when none.
  [[nodiscard]] int first_over(long long limit) const;
  /// First slot whose first chunk fits, or m_leaves when none.
  [[nodiscard]] int first_fitting(const std::function<bool(int)>& fits) const;

  int m_slots = 0;
  int m_leaves = 1;  ///< a power of two >= m_slots
  std::vector<Node> m_tree;  ///< 1-based heap layout, leaves at [m_leaves, 2 m_leaves)
  std::size_t m_size = 0;
};

}  // namespace atlas::bubbletea
