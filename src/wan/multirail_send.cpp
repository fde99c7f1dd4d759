// SPDX-License-Identifier: MIT
// The multirail engine's send path: posting sends and receives, then the output: choosing rails,
// queueing data and control frames, sealing, writing, and acknowledgements.
#include "multirail_engine.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace atlas::wan::mr {

// ---- operations ----

void Engine::start_send(std::shared_ptr<SendOp> op) {
  Peer& p = *m_peers[static_cast<std::size_t>(peer_index(op->peer()))];
  if (!p.failed.empty()) return fail(op, p.failed);
  if (p.gone)
    return fail(op, fmt::format("WAN peer {} has shut its transport down; cannot send to it", p.rank));
  // The window first: a refused send takes no message id and no place in its tag's order (the
  // receiver's next irecv on the tag would be matched with the send after it).
  if (!p.sends.empty() && p.next_msg_id - p.sends.begin()->first >= kMsgWindow)
    return fail(op, fmt::format("WAN send to peer {}: more than {} sends outstanding", p.rank, kMsgWindow));
  op->m_posted = m_now;
  op->m_msg_id = p.next_msg_id++;
  op->m_tag_seq = p.send_seq[op->tag()]++;
  op->m_chunks = std::max<std::uint64_t>(1, (op->m_total + m_opts.chunk_bytes - 1) / m_opts.chunk_bytes);
  const std::uint64_t in_use = p.credit_used - p.credit_back;
  const std::uint64_t avail = p.peer_credit > in_use ? p.peer_credit - in_use : 0;
  if (p.params_known && op->m_total <= avail) {
    op->m_eager = true;
    op->m_cleared = true;
    p.credit_used += op->m_total;
    p.ready[op->m_msg_id] = op.get();
  } else {
    p.ctrl.push_back(Ctrl{FrameType::Rts, op->m_msg_id, op->m_total, op->tag(), op->m_tag_seq});
  }
  p.sends[op->m_msg_id] = std::move(op);
  p.dirty = true;
}

void Engine::start_recv(std::shared_ptr<RecvOp> op) {
  Peer& p = *m_peers[static_cast<std::size_t>(peer_index(op->peer()))];
  if (!p.failed.empty()) return fail(op, p.failed);
  TagState& ts = p.tags[op->tag()];
  auto a = ts.arrived.find(ts.next_post);
  // After the peer's goodbye only what arrived whole before it can still be received (peer_gone).
  if (p.gone && a == ts.arrived.end())
    return fail(op, fmt::format("WAN peer {} has shut its transport down; nothing more will come "
                                "from it",
                                p.rank));
  op->m_tag_seq = ts.next_post++;
  op->m_posted = m_now;
  if (a == ts.arrived.end()) {
    ts.posted[op->m_tag_seq] = std::move(op);
    return;
  }
  const std::uint64_t id = a->second;
  ts.arrived.erase(a);
  bind(p, p.in.at(id), std::move(op));
}

// ---- output ----

Conn* Engine::least_loaded(Peer& p, bool for_data) {
  Conn* best = nullptr;
  for (auto& s : p.rails) {
    Conn* c = s.conn;
    if (!c || c->dead || c->st != ConnState::Ready) continue;
    // A rail whose own queue is full enough to keep its socket busy takes no more chunks.
    if (for_data && c->unwritten_bytes >= m_high_water) continue;
    // Load = bytes not yet acknowledged on the rail (in user space, in the kernel, on the wire):
    // a rail that drains slowly (small window, loss) gets fewer new chunks.
    if (!best || c->queued_bytes < best->queued_bytes) best = c;
  }
  return best;
}

// The lowest-numbered rail whose socket still takes bytes at once: nothing blocked in its kernel
// send buffer and less than one eager batch waiting in user space. Filling low rails first keeps
// the set of busy sockets as small as the path allows: on a path without a per-flow limit (loopback,
// a LAN) one socket's buffer absorbs a whole message and the others stay idle (no extra syscalls,
// wake-ups or cache traffic); on a WAN each socket's buffer (its window) fills within one message,
// so the next rail opens and a transfer still spreads over as many rails as its size needs.
Conn* Engine::first_open(Peer& p) {
  for (auto& s : p.rails) {
    Conn* c = s.conn;
    if (!c || c->dead || c->st != ConnState::Ready || c->want_out) continue;
    if (c->unwritten_bytes < kEagerFlush) return c;
  }
  return nullptr;
}

bool Engine::next_chunk(Peer& p, Chunk& ch) {
  if (!p.resend.empty()) {
    ch = std::move(p.resend.front());
    p.resend.pop_front();
    return true;
  }
  while (!p.ready.empty()) {
    SendOp* op = p.ready.begin()->second;
    if (op->m_handed >= op->m_chunks) {
      p.ready.erase(p.ready.begin());
      continue;
    }
    const std::uint64_t off = op->m_handed * m_opts.chunk_bytes;
    ch.op = p.sends.at(op->m_msg_id);
    ch.offset = off;
    ch.len = static_cast<std::uint32_t>(std::min(m_opts.chunk_bytes, op->m_total - off));
    if (++op->m_handed == op->m_chunks) p.ready.erase(p.ready.begin());
    return true;
  }
  return false;
}

// Where a control frame may go: after every frame whose writing started (and so was sealed with
// its frame number).
std::size_t Engine::boundary(const Conn* c) {
  std::size_t i = c->unwritten;
  if (i < c->q.size() && c->q[i].written > 0) ++i;
  return std::max(i, c->sealed);
}

void Engine::push_data(Peer& p, Conn* c, Chunk ch, bool resend) {
  OutFrame f;
  f.type = FrameType::Data;
  f.reliable = true;
  f.len = ch.len;
  f.payload = ch.op->m_data + ch.offset;
  FrameHeader h;
  h.type = FrameType::Data;
  h.flags = ch.op->m_eager ? kFlagEager : 0;
  h.length = ch.len;
  if (m_opts.auth == FrameAuth::Crc) h.payload_crc = crc32c(f.payload, ch.len);
  if (p.corrupt_next) {
    h.payload_crc ^= 0x5A5A5A5Au;
    f.corrupt = true;
    p.corrupt_next = false;
  }
  h.msg_id = ch.op->m_msg_id;
  h.offset = ch.offset;
  h.total = ch.op->m_total;
  h.tag_seq = ch.op->m_tag_seq;
  h.tag = ch.op->tag();
  encode_header(h, f.hdr);
  if (resend) {
    p.c_resent_chunks.fetch_add(1, std::memory_order_relaxed);
    p.c_resent_bytes.fetch_add(ch.len, std::memory_order_relaxed);
  }
  f.chunk = std::move(ch);
  c->unwritten_bytes += f.size();
  c->queued_bytes += f.size();
  c->q.push_back(std::move(f));
}

void Engine::push_ctrl(Conn* c, const Ctrl& ctrl) {
  OutFrame f;
  f.type = ctrl.type;
  f.reliable = true;
  f.ctrl = ctrl;
  FrameHeader h;
  h.type = ctrl.type;
  h.msg_id = ctrl.msg_id;
  h.total = ctrl.total;
  h.tag = ctrl.tag;
  h.tag_seq = ctrl.tag_seq;
  encode_header(h, f.hdr);
  c->unwritten_bytes += f.size();
  c->queued_bytes += f.size();
  c->q.insert(c->q.begin() + static_cast<std::ptrdiff_t>(boundary(c)), std::move(f));
}

void Engine::push_credit(Peer& p, Conn* c) {
  push_ctrl(c, Ctrl{FrameType::Credit, 0, p.credit_returned, 0, 0});
  p.credit_dirty = false;
}

void Engine::service(Peer& p) {
  for (int round = 0; round < 8; ++round) {
    if (!p.failed.empty()) return;
    // Control frames first, at the head of the least-loaded rail.
    while (!p.ctrl.empty() || p.credit_dirty) {
      Conn* c = least_loaded(p, false);
      if (!c) break;
      if (p.credit_dirty) {
        push_credit(p, c);
        continue;
      }
      push_ctrl(c, p.ctrl.front());
      p.ctrl.pop_front();
    }
    // Chunks: to the first rail whose socket still takes bytes (written through at once, one
    // eager batch at a time), and once every socket is full, to the rail with the fewest bytes
    // not yet acknowledged.
    for (;;) {
      Conn* c = first_open(p);
      const bool eager = c != nullptr;
      if (!eager) c = least_loaded(p, true);
      if (!c) break;
      const bool resend = !p.resend.empty();
      Chunk ch;
      if (!next_chunk(p, ch)) break;
      push_data(p, c, std::move(ch), resend);
      if (eager && c->unwritten_bytes >= kEagerFlush) flush(c);
      if (!p.failed.empty()) return;
    }
    bool drained = false;
    for (auto& s : p.rails) {
      Conn* c = s.conn;
      if (!c || c->dead) continue;
      if (c->unwritten < c->q.size() || c->ack_dirty) drained |= flush(c) && !c->dead;
    }
    if (!p.failed.empty()) return;
    const bool more = !p.resend.empty() || !p.ready.empty() || !p.ctrl.empty() || p.credit_dirty;
    if (!more || !drained) return;
  }
  p.dirty = true;  // still work left: come back next iteration
}

void Engine::output() {
  for (auto& p : m_peers) {
    if (!p->dirty) continue;
    p->dirty = false;
    service(*p);
  }
}

bool Engine::flush(Conn* c) {
  if (c->dead || c->st != ConnState::Ready) return false;
  if (c->hs_out_off < c->hs_out.size() && !write_hs(c)) return false;
  if (c->ack_dirty) {
    OutFrame f;
    f.type = FrameType::Ack;
    FrameHeader h;
    h.type = FrameType::Ack;
    h.offset = c->recv_seq;
    encode_header(h, f.hdr);
    c->unwritten_bytes += f.size();
    c->queued_bytes += f.size();
    c->q.insert(c->q.begin() + static_cast<std::ptrdiff_t>(boundary(c)), std::move(f));
    c->ack_dirty = false;
  }
  while (c->unwritten < c->q.size()) {
    iovec iov[kMaxIov];
    int n = 0;
    std::size_t bytes = 0;
    for (std::size_t i = c->unwritten; i < c->q.size() && n + 2 <= kMaxIov && bytes < kWriteBatch; ++i) {
      OutFrame& f = c->q[i];
      if (!f.sealed) seal(c, f);  // frames are sealed in queue order: i == c->sealed here
      if (f.written < kHeaderBytes) {
        iov[n].iov_base = f.hdr.data() + f.written;
        iov[n].iov_len = kHeaderBytes - f.written;
        bytes += iov[n++].iov_len;
      }
      const std::size_t pw = f.written > kHeaderBytes ? f.written - kHeaderBytes : 0;
      if (f.len > pw) {
        iov[n].iov_base = const_cast<std::uint8_t*>(f.payload) + pw;
        iov[n].iov_len = f.len - pw;
        bytes += iov[n++].iov_len;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t w = ::sendmsg(c->fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c->want_out = true;
        set_events(c);
        return false;
      }
      conn_failed(c, fmt::format("send failed: {}", std::strerror(errno)));
      return false;
    }
    advance(c, static_cast<std::size_t>(w));
  }
  // Everything is written, but the socket may be full all the same: a chunk the size of the
  // per-flow window fills it without a short write (the kernel lets the last segment overshoot
  // the buffer). Such a rail waits for EPOLLOUT like a blocked one, so first_open passes it over;
  // the next chunk would otherwise queue behind a whole window, one round trip, while another rail
  // is idle (issue 24: on the emulated WAN every second 256 KiB tensor took two round trips).
  // poll says what epoll will: writable = at least a third of the buffer free.
  pollfd pf{c->fd.get(), POLLOUT, 0};
  const bool full = ::poll(&pf, 1, 0) == 0;
  if (c->want_out != full) {
    c->want_out = full;
    set_events(c);
  }
  return true;
}

void Engine::advance(Conn* c, std::size_t w) {
  while (w > 0) {
    OutFrame& f = c->q[c->unwritten];
    const std::size_t take = std::min(f.size() - f.written, w);
    if (f.written == 0 && f.reliable) {
      f.seq = ++c->sent_seq;
      if (c->unacked++ == 0) c->ack_clock = m_now;
    }
    f.written += take;
    w -= take;
    c->unwritten_bytes -= take;
    if (f.written == f.size()) {
      if (f.cipher) give_cipher(std::move(f.cipher));
      f.payload = nullptr;
      if (f.type == FrameType::Data) {
        RailCounters& r = rc(c);
        r.frames_sent.fetch_add(1, std::memory_order_relaxed);
        r.bytes_sent.fetch_add(f.len, std::memory_order_relaxed);
        count_frame(c);
      }
      ++c->unwritten;
    }
  }
  while (!c->q.empty() && c->unwritten > 0 && !c->q.front().reliable) {
    c->queued_bytes -= c->q.front().size();
    c->q.pop_front();
    --c->unwritten;
    --c->sealed;
  }
}

void Engine::seal(Conn* c, OutFrame& f) {
  std::uint8_t* out = nullptr;
  if (m_opts.auth == FrameAuth::Encrypt && f.len > 0) {
    f.cipher = take_cipher();
    out = f.cipher.get();
  }
  c->sealer->seal(f.hdr, std::span<const std::uint8_t>(f.payload, f.len), out, f.corrupt);
  if (out) f.payload = out;
  f.sealed = true;
  ++c->sealed;
}

std::unique_ptr<std::uint8_t[]> Engine::take_cipher() {
  if (!m_ciphers.empty()) {
    auto b = std::move(m_ciphers.back());
    m_ciphers.pop_back();
    return b;
  }
  // Every frame this rank sends is at most chunk_bytes (warm-up frames are smaller).
  return std::unique_ptr<std::uint8_t[]>(new std::uint8_t[m_opts.chunk_bytes]);
}

void Engine::give_cipher(std::unique_ptr<std::uint8_t[]> buf) {
  // Kept for the next frames (a fresh large allocation is page-faulted in every time), up to
  // 64 MiB or one buffer.
  if ((m_ciphers.size() + 1) * m_opts.chunk_bytes <= (64u << 20) || m_ciphers.empty())
    m_ciphers.push_back(std::move(buf));
}

void Engine::count_frame(Conn* c) {
  RailSlot& s = peer_of(c).rails[static_cast<std::size_t>(c->rail)];
  if (s.kill_after > 0 && --s.kill_after == 0) ::shutdown(c->fd.get(), SHUT_RDWR);
}

void Engine::on_ack(Conn* c, std::uint64_t count) {
  Peer& p = peer_of(c);
  c->ack_clock = m_now;
  if (count > c->sent_seq) {
    fail_peer(p, fmt::format("frame from {}: acknowledges {} frames but only {} were sent (corrupt "
                             "stream)",
                             where(c), count, c->sent_seq));
    return;
  }
  while (!c->q.empty() && c->unwritten > 0) {
    OutFrame& f = c->q.front();
    if (f.reliable && f.seq > count) break;
    if (f.reliable) {
      --c->unacked;
      if (f.type == FrameType::Pad && c->pads_unacked > 0 && --c->pads_unacked == 0) warmed(c);
      if (f.type == FrameType::Data) {
        SendOp& op = *f.chunk.op;
        if (++op.m_acked == op.m_chunks) {
          p.c_messages_sent.fetch_add(1, std::memory_order_relaxed);
          p.c_bytes_sent.fetch_add(op.m_total, std::memory_order_relaxed);
          auto it = p.sends.find(op.m_msg_id);
          if (it != p.sends.end()) {
            complete(it->second);
            p.sends.erase(it);
          }
        }
      }
    }
    c->queued_bytes -= f.size();
    c->q.pop_front();
    --c->unwritten;
    --c->sealed;
  }
  // Acknowledged bytes free capacity on this rail: hand it more if anything waits.
  if (!p.ready.empty() || !p.resend.empty()) p.dirty = true;
}

}  // namespace atlas::wan::mr
