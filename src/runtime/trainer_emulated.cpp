// SPDX-License-Identifier: MIT
// The executor's emulated gradient sums (device.backend = emulated): the DP all-reduce of this
// stage's gradient size in bucket-sized pieces, from two scratch buckets (two sums in flight, as
// the real run's buckets overlap), and our half of the tied-embedding exchange. No parameter is
// read: the bytes are scratch, only their count and path are the real job's.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>

#include "atlas/core/check.hpp"

namespace atlas::runtime {

namespace {
constexpr int kEmbeddingTag = mpi::tags::kEmbedding;
}  // namespace

void Trainer::emulated_start_sums() {
  ATLAS_ASSERT(m_emu, "emulated_start_sums on a run with a model");
  m_buckets_early = 0;
  m_buckets_step = 0;
  if (!m_dp) return;
  std::size_t done = 0;
  std::size_t k = 0;
  while (done < m_emu->grad_floats) {
    Bucket& b = m_buckets[k % m_buckets.size()];
    if (b.sum) {  // the bucket's previous piece must be summed before it is reused
      wait_sum(b, "emulated");
      b.sum.reset();
    }
    const std::size_t take = std::min(m_emu->bucket_floats, m_emu->grad_floats - done);
    b.sum = m_dp->start_allreduce_sum(b.buf, take);
    done += take;
    ++k;
    ++m_buckets_step;
  }
}

void Trainer::emulated_end_sums() {
  for (Bucket& b : m_buckets)
    if (b.sum) {
      wait_sum(b, "emulated");
      b.sum.reset();
    }
  if (!m_embed.null()) {
    m_embed_host.resize(m_emu->embed_floats);
    if (m_embed_wan_partner >= 0)
      m_boundary->post_exchange_send(m_embed_wan_partner, kEmbeddingTag, m_embed_host.data(), m_embed_host.size());
  }
}

}  // namespace atlas::runtime
