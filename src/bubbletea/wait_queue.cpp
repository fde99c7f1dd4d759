// SPDX-License-Identifier: MIT
// WaitQueue (see wait_queue.hpp): a segment tree of (smallest first chunk, longest prompt) over
// the requests in arrival order; both admission queries descend it once.
#include "atlas/bubbletea/wait_queue.hpp"

#include <algorithm>

#include "atlas/core/check.hpp"

namespace atlas::bubbletea {

WaitQueue::WaitQueue(int slots) : m_slots(std::max(0, slots)) {
  while (m_leaves < m_slots) m_leaves *= 2;
  m_tree.assign(static_cast<std::size_t>(2 * m_leaves), Node{});
}

void WaitQueue::set(int slot, Node leaf) {
  std::size_t i = static_cast<std::size_t>(m_leaves + slot);
  m_tree[i] = leaf;
  for (i /= 2; i >= 1; i /= 2) {
    const Node& l = m_tree[2 * i];
    const Node& r = m_tree[2 * i + 1];
    m_tree[i] = Node{std::min(l.min_first, r.min_first), std::max(l.max_prompt, r.max_prompt)};
  }
}

void WaitQueue::push(int slot, int first_chunk_tokens, int prompt_tokens) {
  ATLAS_ASSERT(slot >= 0 && slot < m_slots, "wait queue: slot " << slot << " outside [0, " << m_slots << ")");
  ATLAS_ASSERT(m_tree[static_cast<std::size_t>(m_leaves + slot)].max_prompt < 0,
               "wait queue: request at slot " << slot << " is already waiting");
  ATLAS_ASSERT(first_chunk_tokens >= 1 && prompt_tokens >= first_chunk_tokens,
               "wait queue: request at slot " << slot << " has a first chunk of " << first_chunk_tokens
                                              << " tokens and a prompt of " << prompt_tokens);
  set(slot, Node{first_chunk_tokens, prompt_tokens});
  ++m_size;
}

void WaitQueue::erase(int slot) {
  ATLAS_ASSERT(slot >= 0 && slot < m_slots && m_tree[static_cast<std::size_t>(m_leaves + slot)].max_prompt >= 0,
               "wait queue: no request waiting at slot " << slot);
  set(slot, Node{});
  --m_size;
}

int WaitQueue::first_over(long long limit) const {
  if (m_tree[1].max_prompt <= limit) return m_leaves;
  std::size_t i = 1;
  while (i < static_cast<std::size_t>(m_leaves)) i = m_tree[2 * i].max_prompt > limit ? 2 * i : 2 * i + 1;
  return static_cast<int>(i) - m_leaves;
}

int WaitQueue::first_fitting(const std::function<bool(int)>& fits) const {
  if (m_tree[1].min_first == kNone || !fits(m_tree[1].min_first)) return m_leaves;
  // Monotone `fits`: a subtree holds a fitting request iff its smallest first chunk fits.
  std::size_t i = 1;
  while (i < static_cast<std::size_t>(m_leaves)) {
    const Node& l = m_tree[2 * i];
    i = l.min_first != kNone && fits(l.min_first) ? 2 * i : 2 * i + 1;
  }
  return static_cast<int>(i) - m_leaves;
}

int WaitQueue::pick(long long max_prompt_tokens, const std::function<bool(int)>& fits) const {
  if (m_size == 0) return -1;
  const int fit = first_fitting(fits);
  if (fit >= m_leaves) return -1;
  // The scan stops at the first request the memory cannot hold, fitting or not.
  return fit < first_over(max_prompt_tokens) ? fit : -1;
}

}  // namespace atlas::bubbletea
