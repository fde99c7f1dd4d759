// SPDX-License-Identifier: MIT
// The service's admission and chunks: the dispatcher (a DC's first inference rank) admits
// arrived requests by memory reservation and in-flight count; every rank runs the chunk
// predicted to fit what is left of a bubble, pausing between blocks when training's data comes.
#include "atlas/bubbletea/service.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

#include "atlas/core/check.hpp"
#include "atlas/runtime/emulated.hpp"

namespace atlas::bubbletea {

void Service::admit_arrivals(double now_job) {
  const int chunk_tokens = m_cfg.bubbletea.chunk_tokens;
  while (m_next_arrival < m_mine.size() &&
         m_requests[static_cast<std::size_t>(m_mine[m_next_arrival])].arrival_s <= now_job) {
    const auto p = static_cast<int>(m_requests[static_cast<std::size_t>(m_mine[m_next_arrival])].prompt.size());
    m_waiting.push(static_cast<int>(m_next_arrival), chunk_tokens > 0 ? std::min(chunk_tokens, p) : p, p);
    ++m_next_arrival;
  }
}

int Service::max_in_flight() const {
  return m_cfg.bubbletea.max_in_flight > 0 ? m_cfg.bubbletea.max_in_flight : 2 * m_size;
}

bool Service::starved() const {
  if (m_running.active) return false;
  if (m_index > 0) return m_ready.empty();
  return m_started.empty() && (m_waiting.empty() || m_in_flight >= max_in_flight());
}

bool Service::run_one(double remaining_ms, const std::function<bool()>& stop) {
  if (m_running.active) {
    // A paused chunk goes on first (nothing else may run on the model before it ends): if what
    // is left of it fits.
    const int blocks = m_model->range().count;
    const double left_ms = m_cost.predict_ms(m_running.h.n, m_running.h.pos) *
                           static_cast<double>(blocks - m_running.blocks_done) / static_cast<double>(blocks);
    if (left_ms > remaining_ms) return false;
    continue_chunk(stop, m_profiler.now());
    return true;
  }
  const int chunk_tokens = m_cfg.bubbletea.chunk_tokens;
  auto header_for = [&](const Request& r, int chunk) {
    const auto p = static_cast<int>(r.prompt.size());
    const int n_chunks = static_cast<int>(chunk_sizes(p, chunk_tokens).size());
    const int pos = chunk_tokens > 0 ? chunk * chunk_tokens : 0;
    ChunkHeader h{};
    h.request = r.id;
    h.chunk = chunk;
    h.n_chunks = n_chunks;
    h.pos = pos;
    h.n = chunk_tokens > 0 ? std::min(chunk_tokens, p - pos) : p;
    h.prompt_tokens = p;
    h.max_new_tokens = r.max_new_tokens;
    h.arrival_s = r.arrival_s;
    return h;
  };
  if (m_index == 0) {
    // Requests already started come first (they hold KV), then new ones in arrival order.
    for (std::size_t i = 0; i < m_started.size(); ++i) {
      const Request& r = m_requests[static_cast<std::size_t>(m_started[i])];
      ChunkHeader h = header_for(r, m_active[r.id].next_chunk);
      if (m_cost.predict_ms(h.n, h.pos) > remaining_ms) continue;
      h.start_s = m_records[r.id].start_s;
      if (h.chunk + 1 == h.n_chunks) m_started.erase(m_started.begin() + static_cast<std::ptrdiff_t>(i));
      run_chunk(h, r.prompt.data() + h.pos, nullptr, stop);
      return true;
    }
    // Keep the pipeline's inner queues short (bubbletea.max_in_flight; 0: 2 x its ranks).
    if (m_in_flight >= max_in_flight()) return false;
    // The earliest arrival whose first chunk fits, unless an earlier one does not fit the memory
    // reservation (first come, first served): O(log n) on the queue (WaitQueue), where a scan of
    // a queue of thousands, at every chunk, took the cores training wakes up on.
    const long long max_prompt = m_reserve_per_token > 0
                                     ? static_cast<long long>((m_reserve_budget - m_reserved) / m_reserve_per_token)
                                     : std::numeric_limits<long long>::max();
    const int slot = m_waiting.pick(max_prompt, [&](int n) { return m_cost.predict_ms(n, 0) <= remaining_ms; });
    if (slot >= 0) {
      const Request& r = m_requests[static_cast<std::size_t>(m_mine[static_cast<std::size_t>(slot)])];
      const std::uint64_t need = m_reserve_per_token * r.prompt.size();
      ChunkHeader h = header_for(r, 0);
      m_reserved += need;
      ++m_in_flight;
      m_waiting.erase(slot);
      RequestRecord& rec = m_records[r.id];
      rec.start_s = job_now();
      h.start_s = rec.start_s;
      if (h.n_chunks > 1) m_started.push_back(r.id);
      run_chunk(h, r.prompt.data(), nullptr, stop);
      return true;
    }
    return false;
  }
  // Later ranks: chunks in arrival order; a request's chunks never overtake each other.
  std::set<std::int64_t> blocked;
  for (auto it = m_ready.begin(); it != m_ready.end(); ++it) {
    if (blocked.count(it->h.request)) continue;
    if (m_cost.predict_ms(it->h.n, it->h.pos) > remaining_ms) {
      blocked.insert(it->h.request);
      continue;
    }
    Incoming in = std::move(*it);
    m_ready.erase(it);
    run_chunk(in.h, nullptr, reinterpret_cast<const float*>(in.bytes.data() + sizeof(ChunkHeader)), stop);
    return true;
  }
  return false;
}

void Service::run_chunk(const ChunkHeader& h, const std::int32_t* tokens, const float* act_in,
                        const std::function<bool()>& stop) {
  ATLAS_ASSERT(!m_running.active, "chunk of request " << h.request << " started while request " << m_running.h.request
                                                      << "'s chunk is paused");
  const double t0 = m_profiler.now();
  auto [it, fresh] = m_active.try_emplace(h.request);
  Active& a = it->second;
  if (fresh) a.cache = m_model->make_cache(h.prompt_tokens);
  ATLAS_ASSERT(a.next_chunk == h.chunk && a.cache.len == h.pos,
               "request " << h.request << ": chunk " << h.chunk << " at position " << h.pos << " arrived out of order");
  m_model->forward_begin(a.cache, h.n, tokens, act_in);
  m_running = Running{true, h, 0, 0.0};
  continue_chunk(stop, t0);
}

void Service::continue_chunk(const std::function<bool()>& stop, double t0) {
  const ChunkHeader h = m_running.h;
  const LayerRange& range = m_model->range();
  auto it = m_active.find(h.request);
  ATLAS_ASSERT(it != m_active.end(), "paused chunk of request " << h.request << " without its KV cache");
  Active& a = it->second;
  // One block at least per call (a call is admitted only when the rest fits); stop between blocks.
  for (bool first = true; m_running.blocks_done < range.count; first = false) {
    if (!first && stop && stop()) {
      const double t1 = m_profiler.now();
      m_running.spent_s += t1 - t0;
      ++m_stats.pauses;
      record_chunk_event(h, t0, t1);
      return;
    }
    if (m_cfg.device.backend == Backend::Emulated) {
      // device.backend = emulated: the block takes its share of the chunk's calibrated time (not
      // the online prediction, which learns the sleep's overshoot: following it ran away), no
      // arithmetic (the embedding, the head and the KV cache stay real; they are small).
      runtime::emulate_compute(m_cost.emulated_ms(h.n, h.pos) * 1e-3 / range.count);
      m_model->skip_block(h.n, m_running.blocks_done++);
    } else {
      m_model->forward_block(a.cache, h.n, m_running.blocks_done++);
    }
  }
  m_running.active = false;
  const bool last = h.chunk + 1 == h.n_chunks;
  std::vector<float> logits;
  if (range.has_head) {
    if (last) logits.resize(static_cast<std::size_t>(m_model->shape().vocab));
    m_model->forward_end(a.cache, h.n, nullptr, last ? logits.data() : nullptr);
  } else {
    PendingSend s;
    s.bytes.resize(sizeof(ChunkHeader) + static_cast<std::size_t>(h.n) * static_cast<std::size_t>(m_model->shape().hidden) *
                                             sizeof(float));
    std::memcpy(s.bytes.data(), &h, sizeof h);
    m_model->forward_end(a.cache, h.n, reinterpret_cast<float*>(s.bytes.data() + sizeof h), nullptr);
    ATLAS_MPI_CHECK(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, m_index + 1, kTagChunk,
                              m_comm.get(), &s.req));
    m_sends.push_back(std::move(s));
    ++m_chunks_sent;
  }
  ++a.next_chunk;
  if (m_index == 0) ++m_records[h.request].chunks;
  if (last) {
    // KV handoff: this rank's layers of the request go to the decode worker; the cache is freed.
    const bool worker_ok = m_sock.valid() && m_worker_failure.empty();
    if (worker_ok) m_out.push(wire::Type::Kv, wire::encode_kv(h.request, *m_model, a.cache), h.request);
    if (range.has_head) {
      wire::FirstToken f;
      f.request = h.request;
      f.prompt_tokens = h.prompt_tokens;
      f.first_token = InferenceModel::argmax(logits);
      f.max_new_tokens = h.max_new_tokens;
      f.first_token_s = job_now();
      if (worker_ok) m_out.push(wire::Type::First, wire::encode(f));
      RequestRecord& rec = m_records[static_cast<int>(h.request)];
      rec.id = static_cast<int>(h.request);
      rec.first_token_s = f.first_token_s;
      rec.start_s = std::max(rec.start_s, h.start_s);
      rec.arrival_s = h.arrival_s;
      rec.prompt_tokens = h.prompt_tokens;
      rec.max_new_tokens = h.max_new_tokens;
      rec.tokens = {f.first_token};
      if (m_emulated) {
        // No worker: the decode is timed on the DC's decode clock (one request after another).
        const EmulatedDecoder::Timing t = m_decoder.submit(f.first_token_s, h.prompt_tokens, h.max_new_tokens);
        rec.decode_wait_s = t.wait_s;
        rec.decode_s = t.decode_s;
        rec.tokens.assign(static_cast<std::size_t>(std::max(1, h.max_new_tokens)), f.first_token);
      }
    }
    track_memory();  // the cache and its handoff frame, both held at this moment
    m_active.erase(it);
    if (m_index + 1 == m_size) prefilled_here(h.request);
    if (!worker_ok) released_here(h.request);  // else once the frame is in the socket (poll)
  } else {
    track_memory();
  }
  const double t1 = m_profiler.now();
  m_cost.observe(h.n, h.pos, (m_running.spent_s + t1 - t0) * 1e3);
  ++m_stats.chunks;
  m_stats.tokens += h.n;
  record_chunk_event(h, t0, t1);
}

void Service::record_chunk_event(const ChunkHeader& h, double t0, double t1) {
  runtime::SlotEvent e;
  e.world_rank = m_comms.world.rank();
  e.step = -1;
  e.slot_index = -1;
  e.kind = static_cast<int>(sched::SlotKind::Prefill);
  e.micro = h.chunk;
  e.request = static_cast<std::int32_t>(h.request);
  e.bytes = static_cast<std::int64_t>(h.n);
  e.start_s = t0;
  e.end_s = t1;
  e.complete_s = t1;
  e.predicted_ms = m_cost.predict_ms(h.n, h.pos);
  m_profiler.record(e);
}

}  // namespace atlas::bubbletea
