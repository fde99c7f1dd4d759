// SPDX-License-Identifier: MIT
// The multirail engine's receive path: the messages being received (matching irecvs, early
// buffers, completion), then the input: reading frames, headers, RTS/CTS, data and pad payloads.
#include "multirail_engine.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace atlas::wan::mr {

InMsg* Engine::new_msg(Peer& p, Conn* c, const FrameHeader& h, bool eager) {
  // Bounded before anything is allocated for it (the per-chunk bitmap).
  if (chunks_of(h.total, p.peer_chunk) > kMaxMessageChunks) {
    fail_peer(p, fmt::format("frame from {}: {} message id {} claims {} bytes, more than {} chunks of "
                             "{} bytes (the largest message a sender may announce; corrupt stream)",
                             where(c), eager ? "eager" : "request-to-send for", h.msg_id, h.total,
                             kMaxMessageChunks, p.peer_chunk));
    return nullptr;
  }
  TagState& ts = p.tags[h.tag];
  if (ts.arrived.count(h.tag_seq) || (h.tag_seq < ts.next_post && !ts.posted.count(h.tag_seq))) {
    fail_peer(p, fmt::format("frame from {}: message id {} claims tag {} #{}, which another "
                             "message already has (corrupt stream)",
                             where(c), h.msg_id, h.tag, h.tag_seq));
    return nullptr;
  }
  auto po = ts.posted.find(h.tag_seq);
  if (!eager && po == ts.posted.end() && p.rts_unbound >= m_opts.max_unbound_rts) {
    fail_peer(p, fmt::format("frame from {}: request-to-send for message id {} while {} messages it announced "
                             "wait for a receive on this rank, the most this rank holds (a runaway or "
                             "corrupt sender)",
                             where(c), h.msg_id, p.rts_unbound));
    return nullptr;
  }
  InMsg& m = p.in[h.msg_id];
  if (eager) p.eager_open += h.total;
  else ++p.rts_unbound;
  m.id = h.msg_id;
  m.tag = h.tag;
  m.tag_seq = h.tag_seq;
  m.total = h.total;
  m.eager = eager;
  m.chunk = p.peer_chunk;
  m.n_chunks = chunks_of(h.total, m.chunk);
  // An eager message's chunks may come before its receive; a request-to-send's come only after
  // this rank's clear-to-send, so its bitmap is made when a receive binds it (bind): an
  // announced message costs no memory of its size until then.
  if (eager) m.done.assign(m.n_chunks, 0);
  if (po == ts.posted.end()) {
    ts.arrived[h.tag_seq] = h.msg_id;
  } else {
    auto op = std::move(po->second);
    ts.posted.erase(po);
    bind(p, m, std::move(op));
    if (!p.failed.empty()) return nullptr;
  }
  auto it = p.in.find(h.msg_id);  // bind may have completed (and erased) it
  return it == p.in.end() ? nullptr : &it->second;
}

void Engine::bind(Peer& p, InMsg& m, std::shared_ptr<RecvOp> op) {
  if (m.total != op->m_bytes) {
    const std::string why = fmt::format(
        "WAN message size mismatch: peer {} sent {} bytes with tag {} (message id {}) but the "
        "matching irecv posted {} bytes",
        p.rank, m.total, m.tag, m.id, op->m_bytes);
    p.tags[op->tag()].posted[op->m_tag_seq] = std::move(op);  // fail_peer fails it with `why`
    fail_peer(p, why);  // clears p.in: `m` is gone after this
    return;
  }
  m.op = std::move(op);
  if (!m.eager) {
    m.done.assign(m.n_chunks, 0);
    --p.rts_unbound;
    p.ctrl.push_back(Ctrl{FrameType::Cts, m.id, m.total, m.tag, m.tag_seq});
    p.dirty = true;
    return;
  }
  if (m.unexpected && m.chunks_done > 0) {
    if (m.chunks_done == m.n_chunks) {
      if (m.total > 0) std::memcpy(m.op->m_data, m.unexpected.get(), m.total);
    } else {
      for (std::uint64_t k = 0; k < m.n_chunks; ++k) {
        if (!m.done[k]) continue;
        const std::uint64_t off = k * m.chunk;
        std::memcpy(m.op->m_data + off, m.unexpected.get() + off, std::min(m.chunk, m.total - off));
      }
    }
  }
  if (m.chunks_done == m.n_chunks) complete_recv(p, m);
}

void Engine::complete_recv(Peer& p, InMsg& m) {
  p.c_messages_received.fetch_add(1, std::memory_order_relaxed);
  p.c_bytes_received.fetch_add(m.total, std::memory_order_relaxed);
  complete(m.op);
  if (m.eager) {
    p.eager_open -= m.total;
    p.credit_returned += m.total;
    p.credit_dirty = true;
    p.dirty = true;
  }
  const std::uint64_t id = m.id;
  recycle(m);
  p.in.erase(id);
  mark_done(p, id);
}

void Engine::mark_done(Peer& p, std::uint64_t id) {
  if (id != p.done_below) {
    p.done_above.insert(id);
    return;
  }
  ++p.done_below;
  while (!p.done_above.empty() && *p.done_above.begin() == p.done_below) {
    p.done_above.erase(p.done_above.begin());
    ++p.done_below;
  }
}

std::uint8_t* Engine::early_buffer(InMsg& m) {
  if (m.unexpected) return m.unexpected.get();
  // The smallest spare that holds the message and is not wastefully larger.
  std::size_t best = m_spares.size();
  for (std::size_t i = 0; i < m_spares.size(); ++i) {
    const std::uint64_t cap = m_spares[i].cap;
    if (cap >= m.total && cap <= 2 * m.total + kSpareSlack && (best == m_spares.size() || cap < m_spares[best].cap))
      best = i;
  }
  if (best < m_spares.size()) {
    m.unexpected = std::move(m_spares[best].buf);
    m.unexpected_cap = m_spares[best].cap;
    m_spare_bytes -= m.unexpected_cap;
    m_spares.erase(m_spares.begin() + static_cast<std::ptrdiff_t>(best));
  } else {
    m.unexpected.reset(new std::uint8_t[std::max<std::uint64_t>(m.total, 1)]);
    m.unexpected_cap = std::max<std::uint64_t>(m.total, 1);
  }
  return m.unexpected.get();
}

void Engine::recycle(InMsg& m) {
  if (!m.unexpected) return;
  const std::uint64_t limit = std::max(m_opts.eager_credit_bytes, kSpareSlack);
  if (m.unexpected_cap > limit) return;  // freed with the message
  // Keep the newest buffers, within one eager credit's worth of memory.
  while (!m_spares.empty() && m_spare_bytes + m.unexpected_cap > limit) {
    m_spare_bytes -= m_spares.front().cap;
    m_spares.erase(m_spares.begin());
  }
  m_spare_bytes += m.unexpected_cap;
  m_spares.push_back({std::move(m.unexpected), m.unexpected_cap});
  m.unexpected_cap = 0;
}

// ---- input ----

void Engine::on_readable(Conn* c) {
  // The budget bounds what is read from the socket in one go (fairness between connections),
  // not the handling of bytes already staged: frames left in the staging buffer after the last
  // read would wait for the socket's next bytes (epoll reports the socket, not the buffer), up
  // to wan.recv_timeout_s when that read had emptied it.
  std::size_t budget = kReadBudget;
  while (!c->dead) {
    if (!c->in_payload) {
      if (c->in_end - c->in_begin >= kHeaderBytes) {
        parse_header(c);
        continue;
      }
      if (budget == 0 || !fill(c, budget)) break;
      continue;
    }
    const std::uint64_t need = c->cur.length - c->got;
    const std::size_t avail = c->in_end - c->in_begin;
    if (avail > 0) {
      const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(need, avail));
      if (c->dest_kind != Dest::Discard) std::memcpy(c->dest + c->got, c->in.data() + c->in_begin, take);
      c->in_begin += take;
      c->got += take;
      if (c->got == c->cur.length) finish_payload(c);
      continue;
    }
    if (budget == 0) break;  // nothing staged is left to handle; the socket is read next time
    if (need >= kDirectRecvMin && c->dest_kind != Dest::Discard) {
      const ssize_t n = ::recv(c->fd.get(), c->dest + c->got, need, 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        conn_failed(c, fmt::format("receive failed: {}", std::strerror(errno)));
        break;
      }
      if (n == 0) {
        conn_failed(c, "the connection was closed by the peer mid-frame");
        break;
      }
      c->got += static_cast<std::uint64_t>(n);
      budget -= std::min(budget, static_cast<std::size_t>(n));
      if (c->got == c->cur.length) finish_payload(c);
      continue;
    }
    if (!fill(c, budget)) break;
  }
  if (!c->dead && c->ack_dirty) peer_of(c).dirty = true;
}

bool Engine::fill(Conn* c, std::size_t& budget) {
  if (c->in_begin == c->in_end) {
    c->in_begin = c->in_end = 0;
  } else if (c->in_begin > 0 && c->in.size() - c->in_end < kHeaderBytes * 4) {
    std::memmove(c->in.data(), c->in.data() + c->in_begin, c->in_end - c->in_begin);
    c->in_end -= c->in_begin;
    c->in_begin = 0;
  }
  for (;;) {
    const ssize_t n = ::recv(c->fd.get(), c->in.data() + c->in_end, c->in.size() - c->in_end, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      conn_failed(c, fmt::format("receive failed: {}", std::strerror(errno)));
      return false;
    }
    if (n == 0) {
      conn_failed(c, c->in_payload || c->in_end > c->in_begin
                         ? "the connection was closed by the peer mid-frame"
                         : "the connection was closed by the peer");
      return false;
    }
    c->in_end += static_cast<std::size_t>(n);
    budget -= std::min(budget, static_cast<std::size_t>(n));
    return true;
  }
}

void Engine::parse_header(Conn* c) {
  Peer& p = peer_of(c);
  FrameHeader h;
  const auto bytes = std::span<const std::uint8_t, kHeaderBytes>(c->in.data() + c->in_begin, kHeaderBytes);
  // The tag first: whatever fails it came from the path, not from the peer (a rail error, the
  // rail is reset); whatever passes it and is still wrong came from the peer (a peer error).
  if (const std::string bad = c->opener->open_header(bytes); !bad.empty()) {
    conn_failed(c, fmt::format("frame from {} rejected: {}; the connection is reset and its "
                               "unacknowledged frames resent",
                               where(c), bad));
    return;
  }
  const std::string why = decode_header(bytes, m_opts.max_frame_bytes, h);
  if (!why.empty()) {
    fail_peer(p, fmt::format("frame from {} rejected: {}", where(c), why));
    return;
  }
  c->in_begin += kHeaderBytes;
  switch (h.type) {
    case FrameType::Ack: on_ack(c, h.offset); return;
    case FrameType::Bye: on_bye(c); return;
    case FrameType::Credit:
      ++c->recv_seq;
      c->ack_dirty = true;
      p.credit_back = std::max(p.credit_back, h.total);
      if (p.credit_back > p.credit_used)
        fail_peer(p, fmt::format("frame from {}: returns {} bytes of credit but only {} were used "
                                 "(corrupt stream)",
                                 where(c), p.credit_back, p.credit_used));
      return;
    case FrameType::Rts:
      ++c->recv_seq;
      c->ack_dirty = true;
      on_rts(p, c, h);
      return;
    case FrameType::Cts:
      ++c->recv_seq;
      c->ack_dirty = true;
      on_cts(p, c, h);
      return;
    case FrameType::Data: begin_data(c, h); return;
    case FrameType::Pad: begin_pad(c, h); return;
  }
}

void Engine::on_rts(Peer& p, Conn* c, const FrameHeader& h) {
  if (h.msg_id < p.done_below || p.done_above.count(h.msg_id) || p.in.count(h.msg_id)) return;  // resent
  if (h.msg_id >= p.done_below + kMsgWindow) {
    fail_peer(p, fmt::format("frame from {}: unknown message id {} in a request-to-send (expected "
                             "ids from {})",
                             where(c), h.msg_id, p.done_below));
    return;
  }
  new_msg(p, c, h, false);
}

void Engine::on_cts(Peer& p, Conn* c, const FrameHeader& h) {
  auto it = p.sends.find(h.msg_id);
  if (it == p.sends.end()) {
    if (h.msg_id >= p.next_msg_id)
      fail_peer(p, fmt::format("frame from {}: clear-to-send for unknown message id {} (only {} "
                               "messages were sent)",
                               where(c), h.msg_id, p.next_msg_id));
    return;  // a resent CTS of a finished message
  }
  SendOp& op = *it->second;
  if (op.m_cleared) return;
  op.m_cleared = true;
  p.ready[op.m_msg_id] = &op;
  p.dirty = true;
}

void Engine::begin_data(Conn* c, const FrameHeader& h) {
  Peer& p = peer_of(c);
  c->cur = h;
  c->got = 0;
  c->in_payload = true;
  c->dest = nullptr;
  c->dest_kind = Dest::Discard;
  if (h.msg_id < p.done_below || p.done_above.count(h.msg_id)) {
    if (h.length == 0) finish_payload(c);
    return;  // a resent chunk of a delivered message
  }
  if (h.msg_id >= p.done_below + kMsgWindow) {
    fail_peer(p, fmt::format("frame from {} rejected: unknown message id {} (expected ids from {})",
                             where(c), h.msg_id, p.done_below));
    return;
  }
  InMsg* m = nullptr;
  if (auto it = p.in.find(h.msg_id); it != p.in.end()) {
    m = &it->second;
    if (m->tag != h.tag || m->total != h.total || m->tag_seq != h.tag_seq ||
        m->eager != ((h.flags & kFlagEager) != 0)) {
      fail_peer(p, fmt::format("frame from {} rejected: message id {} header (tag {}, {} bytes) "
                               "disagrees with its first frame (tag {}, {} bytes)",
                               where(c), h.msg_id, h.tag, h.total, m->tag, m->total));
      return;
    }
  } else {
    if (!(h.flags & kFlagEager)) {
      fail_peer(p, fmt::format("frame from {} rejected: unknown message id {}: data of a message "
                               "that was never announced (no request-to-send seen)",
                               where(c), h.msg_id));
      return;
    }
    if (h.total > m_opts.eager_credit_bytes) {
      fail_peer(p, fmt::format("frame from {} rejected: eager message id {} of {} bytes exceeds the "
                               "credit of {} bytes this rank granted",
                               where(c), h.msg_id, h.total, m_opts.eager_credit_bytes));
      return;
    }
    if (p.eager_open + h.total > m_opts.eager_credit_bytes) {
      fail_peer(p, fmt::format("frame from {} rejected: eager message id {} of {} bytes while {} bytes of "
                               "earlier eager messages are undelivered: more than the credit of {} bytes "
                               "this rank granted (a sender must wait for credit to come back)",
                               where(c), h.msg_id, h.total, p.eager_open, m_opts.eager_credit_bytes));
      return;
    }
    m = new_msg(p, c, h, true);
    if (!m) {
      if (!p.failed.empty()) return;
      // Completed at once by bind (cannot happen for a data frame: nothing received yet).
      return;
    }
  }
  const std::uint64_t k = h.offset / m->chunk;
  const std::uint64_t want_len = k < m->n_chunks ? std::min(m->chunk, m->total - std::min(m->total, h.offset)) : 0;
  if (h.offset % m->chunk != 0 || k >= m->n_chunks || h.length != want_len) {
    fail_peer(p, fmt::format("frame from {} rejected: offset {} / length {} do not fit message id {} "
                             "({} bytes in chunks of {})",
                             where(c), h.offset, h.length, h.msg_id, m->total, m->chunk));
    return;
  }
  c->chunk_index = k;
  if (!m->eager && !m->op) {
    // A request-to-send's data comes only after this rank's clear-to-send, which it sends once
    // the receive is bound (op set): data before it would make this rank buffer a message of any
    // announced size (and its bitmap does not exist yet).
    fail_peer(p, fmt::format("frame from {} rejected: data for message id {} ({} bytes, announced by a "
                             "request-to-send) before this rank's clear-to-send",
                             where(c), h.msg_id, m->total));
    return;
  }
  if (m->done[k]) {
    // duplicate: stays Discard
  } else if (m->writers.count(k)) {
    c->temp.resize(h.length);
    c->dest = c->temp.data();
    c->dest_kind = Dest::Temp;
  } else {
    m->writers[k] = c;
    if (m->op) {
      c->dest = m->op->m_data + h.offset;
      c->dest_kind = Dest::Direct;
    } else {
      c->dest = early_buffer(*m) + h.offset;
      c->dest_kind = Dest::Unexpected;
    }
  }
  if (h.length == 0) finish_payload(c);
}

void Engine::begin_pad(Conn* c, const FrameHeader& h) {
  c->cur = h;
  c->got = 0;
  c->in_payload = true;
  c->temp.resize(h.length);
  c->dest = c->temp.data();
  c->dest_kind = Dest::Temp;
  if (h.length == 0) finish_payload(c);
}

void Engine::finish_payload(Conn* c) {
  Peer& p = peer_of(c);
  // Authenticated (encrypt: decrypted in place) before anything is marked done or delivered. A
  // duplicate being dropped (Discard) is not kept, so not checked: it is never delivered.
  if (m_opts.auth != FrameAuth::Crc && c->dest_kind != Dest::Discard) {
    if (const std::string bad = c->opener->open_payload(c->dest, c->cur.length); !bad.empty()) {
      conn_failed(c, fmt::format("frame from {} rejected: {} ({}); not delivered, the connection is "
                                 "reset and the chunk resent",
                                 where(c), bad,
                                 c->cur.type == FrameType::Pad
                                     ? std::string("a warm-up frame")
                                     : fmt::format("message id {} at offset {}", c->cur.msg_id,
                                                   c->cur.offset)));
      return;
    }
  }
  c->in_payload = false;
  ++c->recv_seq;
  c->ack_dirty = true;
  p.dirty = true;
  if (c->cur.type == FrameType::Pad) {  // warm-up: checked, acknowledged, dropped
    c->dest_kind = Dest::None;
    if (m_opts.auth != FrameAuth::Crc) return;
    if (const std::uint32_t crc = crc32c(c->dest, c->cur.length); crc != c->cur.payload_crc)
      fail_peer(p, fmt::format("frame from {} rejected: payload CRC32C mismatch (computed 0x{:08x}, "
                               "header says 0x{:08x}) in a warm-up frame ({} bytes)",
                               where(c), crc, c->cur.payload_crc, c->cur.length));
    return;
  }
  p.last_data = m_now;
  RailCounters& r = rc(c);
  r.frames_received.fetch_add(1, std::memory_order_relaxed);
  r.bytes_received.fetch_add(c->cur.length, std::memory_order_relaxed);
  count_frame(c);
  const Dest kind = c->dest_kind;
  c->dest_kind = Dest::None;
  if (kind == Dest::Discard) {
    p.c_duplicates.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const FrameHeader& h = c->cur;
  // wan.auth = crc only: under mac/encrypt the tag checked above covers the payload.
  if (const std::uint32_t crc = m_opts.auth == FrameAuth::Crc ? crc32c(c->dest, h.length) : 0;
      m_opts.auth == FrameAuth::Crc && crc != h.payload_crc) {
    fail_peer(p, fmt::format("frame from {} rejected: payload CRC32C mismatch (computed 0x{:08x}, "
                             "header says 0x{:08x}) in message id {} at offset {} ({} bytes)",
                             where(c), crc, h.payload_crc, h.msg_id, h.offset, h.length));
    return;
  }
  auto it = p.in.find(h.msg_id);
  if (it == p.in.end()) {  // the message completed from another copy meanwhile
    p.c_duplicates.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  InMsg& m = it->second;
  const std::uint64_t k = c->chunk_index;
  if (kind != Dest::Temp) {
    auto w = m.writers.find(k);
    if (w != m.writers.end() && w->second == c) m.writers.erase(w);
  }
  if (m.done[k]) {
    p.c_duplicates.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (kind == Dest::Temp && h.length > 0) {
    std::uint8_t* base = m.op ? m.op->m_data : early_buffer(m);
    std::memcpy(base + h.offset, c->dest, h.length);
  } else if (kind == Dest::Unexpected && m.op && h.length > 0) {
    std::memcpy(m.op->m_data + h.offset, m.unexpected.get() + h.offset, h.length);
  }
  m.done[k] = 1;
  ++m.chunks_done;
  m.bytes_done += h.length;
  m.last_rail = c->rail;
  // Another connection still writing this chunk in place must stop: the chunk is done, and
  // the buffer may be handed back to the application any moment.
  if (auto w = m.writers.find(k); w != m.writers.end()) {
    w->second->dest_kind = Dest::Discard;
    m.writers.erase(w);
  }
  if (m.chunks_done == m.n_chunks && m.op) complete_recv(p, m);
}

}  // namespace atlas::wan::mr
