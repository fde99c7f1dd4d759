// SPDX-License-Identifier: MIT
// The executor's gradients: DP buckets packed as the last backward finishes gradients and summed
// over dp_comm inside the DC (overlapped with the backward, train.dp_overlap), the global norm
// over the pipeline, clipping and the AdamW step. The tied-embedding exchange is trainer.cpp's.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::runtime {

void Trainer::pack_ready(std::span<model::ParamTensor* const> params) {
  const std::size_t cap = m_buckets.front().buf.floats();
  for (model::ParamTensor* p : params) {
    const auto n = static_cast<std::size_t>(p->shard_numel());
    std::size_t done = 0;
    while (done < n) {
      if (m_open == m_buckets.size()) {
        m_buckets.emplace_back();
        m_buckets.back().buf = m_backend.alloc_floats(cap);
      }
      Bucket& b = m_buckets[m_open];
      const std::size_t take = std::min(n - done, cap - b.fill);
      m_backend.copy(b.buf.f32() + b.fill, p->grad.f32() + done, take * sizeof(float));
      b.pieces.push_back({p, done, b.fill, take});
      b.fill += take;
      done += take;
      if (b.fill == cap) start_open_bucket();
    }
    ++m_packed_params;
  }
  // MPI moves a non-blocking collective on only inside MPI calls: one test per started bucket
  // at each layer boundary keeps the sums flowing while backward computes.
  for (std::size_t i = 0; i < m_open; ++i)
    if (m_buckets[i].sum) m_buckets[i].sum->test();
}

void Trainer::start_open_bucket() {
  if (m_open == m_buckets.size()) return;  // the last bucket filled up and started already
  Bucket& b = m_buckets[m_open];
  if (b.fill == 0) return;
  // A collective tells its open sums apart by tag, and the ring (parallel.dp_across_dcs) has
  // mpi::tags::kRingSumTags of them: with more sums open at once two would share a tag, and the
  // ranks, testing them in different orders, could match one's pieces into the other's buffer
  // (a wrong gradient, no error). So the oldest open sum completes before one more starts.
  constexpr std::size_t kMaxOpenSums = mpi::tags::kRingSumTags / 2;
  if (m_open >= kMaxOpenSums) {
    const std::size_t i = m_open - kMaxOpenSums;
    wait_sum(m_buckets[i], fmt::format("bucket {} of {}", i + 1, m_open));
  }
  b.sum = m_dp->start_allreduce_sum(b.buf, b.fill);
  ++m_open;
}

void Trainer::wait_sum(Bucket& b, const std::string& which) {
  if (b.sum->wait_for(m_cfg.wan.recv_timeout_s)) return;
  // A replica that stopped (hung, cut off) never joins: report it rather than wait forever.
  // Unwinding to MPI_Abort: every bucket with a sum open keeps its buffer and is never freed (not
  // settled one by one: each would wait for the silent replica again; MPI may still write into it).
  for (Bucket& o : m_buckets) {
    if (!o.sum) continue;
    (void)o.sum.release();
    auto* kept = new device::Buffer(std::move(o.buf));  // deliberately never freed
    (void)kept;
  }
  ATLAS_THROW(Comm, "rank " << m_comms.world.rank() << ": the data-parallel gradient sum (" << which
                            << ", over this stage's " << m_dp->size() << " replicas) did not complete within "
                            << m_cfg.wan.recv_timeout_s
                            << " s (wan.recv_timeout_s)\n  hint: a replica may be stuck or dead (the other ranks' "
                               "errors name it); raise wan.recv_timeout_s if its step is that slow");
}

void Trainer::finish_buckets() {
  for (std::size_t i = 0; i < m_open; ++i) {
    Bucket& b = m_buckets[i];
    wait_sum(b, fmt::format("bucket {} of {}", i + 1, m_open));
    for (const Bucket::Piece& pc : b.pieces)
      m_backend.copy(pc.p->grad.f32() + pc.tensor_offset, b.buf.f32() + pc.bucket_offset, pc.count * sizeof(float));
    b.sum.reset();
    b.pieces.clear();
    b.fill = 0;
  }
  m_open = 0;
  m_packed_params = 0;
}

double Trainer::clip_and_step(int step, const Boundary::WaitHook& fill, double& wait_s) {
  if (!m_norm_started) start_norm_sum();
  m_norm_started = false;
  m_grads_final = false;
  const double t0 = m_profiler.now();
  mpi::Request& sum = m_norm_sum;
  // The pipeline's sum crosses every DC it spans: a WAN round trip BubbleTea may fill.
  if (fill) fill([&sum] { return sum.test(); });
  wait_bounded(sum, [] { return std::string("the gradient-norm sum over the pipeline"); });
  wait_s = m_profiler.now() - t0;
  wait_over();  // before the optimizer's own work
  if (m_emu) {
    emulate_compute(m_emu->optimizer_s);  // the AdamW step's predicted time; no gradient, no norm
    return 0.0;
  }
  const double norm = std::sqrt(m_norm_sq);
  const double scale = model::clip_scale(norm, m_cfg.train.grad_clip);
  const double lr = model::lr_at(step, m_cfg.train, m_cfg.run.steps);
  m_adamw.step(m_model->params(), m_backend, lr, scale);
  return norm;
}

void Trainer::start_norm_sum() {
  m_norm_started = true;
  // A member buffer: an abandoned sum (wait_bounded) keeps it.
  m_norm_sq = m_emu ? 0.0 : m_model->local_grad_sq_norm();
  m_norm_sum = m_replica.iallreduce_sum(std::span<double>(&m_norm_sq, 1));
}

}  // namespace atlas::runtime
