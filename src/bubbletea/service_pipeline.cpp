// SPDX-License-Identifier: MIT
// The service's messages: releases and prefill-done notices to the dispatcher, memory tracking,
// and poll() (activations along the DC pipeline, releases, the decode worker's socket), all
// without waiting.
#include "atlas/bubbletea/service.hpp"

#include <algorithm>
#include <cstring>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"

namespace atlas::bubbletea {

void Service::prefilled_here(std::int64_t request) {
  if (m_index == 0) {
    --m_in_flight;
    return;
  }
  notify_dispatcher(-request - 1);
}

void Service::released_here(std::int64_t request) {
  if (m_index == 0) {
    release(request, 0);
    return;
  }
  notify_dispatcher(request);
}

void Service::notify_dispatcher(std::int64_t message) {
  PendingSend s;
  s.bytes.resize(sizeof(std::int64_t));
  std::memcpy(s.bytes.data(), &message, sizeof(std::int64_t));
  ATLAS_MPI_CHECK(MPI_Isend(s.bytes.data(), 1, MPI_INT64_T, 0, kTagRelease, m_comm.get(), &s.req));
  m_sends.push_back(std::move(s));
  ++m_releases_sent;
}

void Service::release(std::int64_t request, int from) {
  (void)from;
  if (request < 0) {  // the last DC rank finished the request's prefill (prefilled_here)
    --m_in_flight;
    return;
  }
  if (++m_release_count[request] < m_size) return;
  m_release_count.erase(request);
  const Request& r = m_requests[static_cast<std::size_t>(request)];
  m_reserved -= m_reserve_per_token * r.prompt.size();
}

void Service::track_memory() {
  std::uint64_t b = m_fixed_bytes + m_out.pending_bytes();
  for (const auto& [id, a] : m_active) b += a.cache.bytes();
  for (const auto& s : m_sends) b += s.bytes.size();
  for (const auto& r : m_recvs) b += r.bytes.size();
  for (const auto& r : m_ready) b += r.bytes.size();
  m_stats.peak_bytes = std::max<std::uint64_t>(m_stats.peak_bytes, b);
}

void Service::poll() {
  // Sends that completed free their buffers.
  for (auto& s : m_sends) {
    int done = 0;
    ATLAS_MPI_CHECK(MPI_Test(&s.req, &done, MPI_STATUS_IGNORE));
  }
  std::erase_if(m_sends, [](const PendingSend& s) { return s.req == MPI_REQUEST_NULL; });
  // Activations from the previous rank: matched now, received without waiting, used in order.
  if (m_index > 0) {
    while (true) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      ATLAS_MPI_CHECK(MPI_Improbe(m_index - 1, kTagChunk, m_comm.get(), &flag, &msg, &st));
      if (!flag) break;
      int count = 0;
      ATLAS_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
      PendingRecv r;
      r.bytes.resize(static_cast<std::size_t>(count));
      ATLAS_MPI_CHECK(MPI_Imrecv(r.bytes.data(), count, MPI_BYTE, &msg, &r.req));
      m_recvs.push_back(std::move(r));
    }
    while (!m_recvs.empty()) {
      int done = 0;
      ATLAS_MPI_CHECK(MPI_Test(&m_recvs.front().req, &done, MPI_STATUS_IGNORE));
      if (!done) break;
      Incoming in;
      in.bytes = std::move(m_recvs.front().bytes);
      std::memcpy(&in.h, in.bytes.data(), sizeof(ChunkHeader));
      m_recvs.pop_front();
      m_ready.push_back(std::move(in));
      ++m_chunks_received;
    }
  }
  // Releases (the dispatcher): small messages, already complete when matched.
  if (m_index == 0 && m_size > 1) {
    while (true) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      ATLAS_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kTagRelease, m_comm.get(), &flag, &msg, &st));
      if (!flag) break;
      std::int64_t id = 0;
      ATLAS_MPI_CHECK(MPI_Mrecv(&id, 1, MPI_INT64_T, &msg, MPI_STATUS_IGNORE));
      ++m_releases_received;
      release(id, st.MPI_SOURCE);
    }
  }
  // The decode worker: write what it takes; DC rank 0 reads results. A failed worker is reported
  // (once) and BubbleTea keeps prefilling; training is never stopped by it.
  if (!m_sock.valid() || !m_worker_failure.empty()) return;
  try {
    m_out.flush_some();
    for (std::int64_t id : m_out.take_written()) released_here(id);
    if (m_index == 0) {
      const bool open = m_in.read_some(m_sock.get());
      while (auto f = m_in.next()) {
        if (f->type == wire::Type::Result) {
          const wire::Result res = wire::decode_result(f->payload);
          RequestRecord& rec = m_records[static_cast<int>(res.request)];
          rec.tokens = res.tokens;
          rec.decode_wait_s = res.wait_s;
          rec.decode_s = res.decode_s;
        } else if (f->type == wire::Type::Done) {
          m_worker_done = true;
        } else if (f->type == wire::Type::Fail) {
          ATLAS_THROW(Comm, "the decode worker failed: " << std::string(f->payload.begin(), f->payload.end()));
        }
      }
      if (!open && !m_worker_done) ATLAS_THROW(Comm, "the decode worker closed its connection");
    }
  } catch (const Error& e) {
    m_worker_failure = e.what();
    m_worker_failure_reported = true;
    log::warn("BubbleTea: {}; prefills continue, their decoding is lost", m_worker_failure);
    for (std::int64_t id : m_out.drop_all()) released_here(id);
  }
}

}  // namespace atlas::bubbletea
