// SPDX-License-Identifier: MIT
// The multirail engine's connections: the listener (accept, the caps on unauthenticated
// connections, back-off when out of descriptors), connection attempts, the handshake, a ready
// rail's warm-up, and rail health (close, failure, goodbye, a peer that is gone or failed).
#include "multirail_engine.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace atlas::wan::mr {

// ---- connections ----

Conn* Engine::add_conn(Fd fd, bool active, int peer, int rail, ConnState st) {
  auto c = std::make_unique<Conn>();
  c->key = m_next_key++;
  c->fd = std::move(fd);
  c->active = active;
  c->peer = peer;
  c->rail = rail;
  c->st = st;
  c->remote = peer_name(c->fd.get());
  Conn* raw = c.get();
  m_conns[raw->key] = std::move(c);
  raw->events = EPOLLIN | EPOLLRDHUP | (st == ConnState::Connecting ? EPOLLOUT : 0u);
  epoll_event ev{};
  ev.events = raw->events;
  ev.data.u64 = raw->key;
  if (epoll_ctl(m_epoll.get(), EPOLL_CTL_ADD, raw->fd.get(), &ev) < 0)
    ATLAS_THROW(Comm, fmt::format("epoll_ctl(ADD): {}", std::strerror(errno)));
  return raw;
}

void Engine::set_events(Conn* c) {
  const bool out = c->want_out || c->st == ConnState::Connecting || c->hs_out_off < c->hs_out.size();
  const std::uint32_t want = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0u);
  if (want == c->events || c->dead) return;
  c->events = want;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c->key;
  epoll_ctl(m_epoll.get(), EPOLL_CTL_MOD, c->fd.get(), &ev);
}

void Engine::accept_all() {
  // Bounded per event: a flood of connections cannot hold up the rails' traffic.
  for (int k = 0; k < kAcceptBatch; ++k) {
    Fd fd(::accept4(m_listen.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EMFILE || err == ENFILE) return out_of_descriptors(err);
      // ENOBUFS, ENOMEM, ...: the connection stays queued, so back off too (no busy loop).
      m_warn_accept.warn(m_now, fmt::format("WAN listener on port {}: accept failed: {}; not "
                                            "accepting for {} ms",
                                            m_port, std::strerror(err), kListenBackoff.count()));
      pause_listener();
      return;
    }
    if (m_stopping) continue;
    std::string source = peer_name(fd.get());
    if (const auto colon = source.rfind(':'); colon != std::string::npos) source.resize(colon);
    make_room(source);
    tune_socket(fd.get(), m_opts.socket_buffer_bytes);  // congestion control: the listener's
    Conn* c = add_conn(std::move(fd), false, -1, -1, ConnState::AwaitHello);
    c->source = std::move(source);
    c->hs_need = kHelloBytes;
    c->hs_deadline = m_now + to_duration(m_opts.connect_timeout_s);
    // A peer sends its Hello right behind the TCP handshake: usually it is here already, and
    // once checked the connection is safe from make_room (a waiting one may not be).
    read_hs(c);
  }
}

// Before a new incoming connection from `source` is kept: the oldest one that has not yet sent a
// Hello with a valid MAC from the same address gives way when that address is at its cap, else
// the oldest of all such when the listener is. A real peer's Hello follows its TCP handshake at
// once and proves the pair secret, after which its connection is not counted here and never
// evicted for a newer unproven one (see keep_proven for its own bound): a stranger who opens
// connections faster than the cap per round trip pushes out only other strangers.
void Engine::make_room(const std::string& source) {
  std::vector<Conn*> pending;
  for (auto& [key, c] : m_conns)
    if (!c->active && !c->dead && !c->proven && c->st != ConnState::Ready) pending.push_back(c.get());
  if (static_cast<int>(pending.size()) + 1 <= std::min(m_pending_cap, m_pending_per_source)) return;
  std::sort(pending.begin(), pending.end(), [](const Conn* a, const Conn* b) { return a->key < b->key; });
  Conn* victim = nullptr;
  int same = 0;
  for (Conn* c : pending) same += c->source == source;
  if (same + 1 > m_pending_per_source) {
    for (Conn* c : pending)
      if (c->source == source) {
        victim = c;
        break;
      }
  } else if (static_cast<int>(pending.size()) + 1 > m_pending_cap) {
    victim = pending.front();
  }
  if (!victim) return;
  m_warn_evict.warn(
      m_now, fmt::format("WAN listener on port {}: closed the oldest unauthenticated connection (from "
                         "{}) to make room: at most {} handshakes without a valid hello may be "
                         "pending, {} per source address (someone opens connections and does not "
                         "send a hello; the newest from {})",
                         m_port, victim->remote, m_pending_cap, m_pending_per_source, source));
  close_conn(victim);
}

// After `c`'s Hello proved the pair secret: of the proven, not yet ready incoming connections of
// its (peer, rail), the newest kMaxProvenPerRail stay and older ones are closed. A real peer has
// one attempt per rail in flight; more mean it retried (an earlier attempt is stale) or someone
// replays a Hello whose nonce this rank no longer remembers (it cannot complete the handshake:
// the Challenge's nonce is fresh); the newest wins, so the peer's next retry gets through.
void Engine::keep_proven(Conn* c) {
  std::vector<Conn*> same;
  for (auto& [key, o] : m_conns)
    if (!o->active && !o->dead && o->proven && o->st != ConnState::Ready && o->peer == c->peer &&
        o->rail == c->rail)
      same.push_back(o.get());
  if (static_cast<int>(same.size()) <= kMaxProvenPerRail) return;
  std::sort(same.begin(), same.end(), [](const Conn* a, const Conn* b) { return a->key < b->key; });
  const Peer& p = peer_of(c);
  for (std::size_t i = 0; i + kMaxProvenPerRail < same.size(); ++i) {
    m_warn_evict.warn(
        m_now, fmt::format("WAN listener on port {}: closed an older pending connection for peer {} "
                           "rail {} (from {}): a newer one sent a valid hello (the peer retried, "
                           "or someone on the path replays its hello; at most {} are kept)",
                           m_port, p.rank, c->rail, same[i]->remote, kMaxProvenPerRail));
    close_conn(same[i]);
  }
}

void Engine::out_of_descriptors(int err) {
  // The connection stays queued in the kernel and the listener readable: without a descriptor
  // to accept it, epoll would report it again at once (a busy loop). The reserve descriptor is
  // given up to accept the oldest queued connection and close it, then taken back, and the
  // listener is left alone for kListenBackoff.
  m_reserve.reset();
  Fd(::accept4(m_listen.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)).reset();
  m_reserve = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  pause_listener();
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  int pending = 0;
  for (auto& [key, c] : m_conns) pending += !c->active && !c->dead && c->st != ConnState::Ready;
  m_warn_fds.warn(
      m_now, fmt::format("WAN listener on port {}: out of file descriptors ({}; RLIMIT_NOFILE = {}): "
                         "closed a queued connection and not accepting for {} ms; {} handshake(s) "
                         "pending (cap {}). Raise the limit (ulimit -n) if this is not an attack",
                         m_port, std::strerror(err),
                         rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(rl.rlim_cur),
                         kListenBackoff.count(), pending, m_pending_cap));
}

void Engine::pause_listener() {
  if (m_listen_paused || !m_listen.valid()) return;
  epoll_event ev{};
  ev.events = 0;
  ev.data.u64 = kListenKey;
  epoll_ctl(m_epoll.get(), EPOLL_CTL_MOD, m_listen.get(), &ev);
  m_listen_paused = true;
  m_listen_resume = m_now + kListenBackoff;
}

void Engine::tune(int fd) {
  tune_socket(fd, m_opts.socket_buffer_bytes);
  if (m_cc.name.empty()) return;
  // Checked once on a probe socket (choose_congestion_control); a failure here is unexpected
  // but harmless: the rail keeps the system's algorithm.
  if (const std::string why = set_congestion_control(fd, m_cc.name); !why.empty())
    log::warn("WAN: {}", why);
}

void Engine::start_attempt(Peer& p, int rail) {
  RailSlot& s = p.rails[static_cast<std::size_t>(rail)];
  bool in_progress = false;
  std::string err;
  // Socket options go on before the SYN (the congestion control must, see fd.hpp).
  Fd fd = connect_tcp(p.addr, in_progress, err, [this](int f) { tune(f); });
  s.attempts++;
  if (!fd.valid()) {
    s.last_error = err;
    s.next_attempt = m_now + std::min<Clock::duration>(20ms * (1 << std::min(s.attempts, 5)), 500ms);
    return;
  }
  Conn* c = add_conn(std::move(fd), true, m_peer_index.at(p.rank), rail,
                     in_progress ? ConnState::Connecting : ConnState::AwaitChallenge);
  c->remote = p.addr.text;
  c->hs_deadline = std::min(s.deadline, m_now + 10s);
  s.pending = c;
  if (!in_progress) send_hello(c);
}

void Engine::send_hello(Conn* c) {
  Peer& p = peer_of(c);
  Hello h;
  h.auth = m_opts.auth;
  h.from_rank = m_opts.my_rank;
  h.to_rank = p.rank;
  h.rail = static_cast<std::uint32_t>(c->rail);
  h.rails = static_cast<std::uint32_t>(m_opts.rails);
  h.chunk_bytes = m_opts.chunk_bytes;
  h.credit_bytes = m_opts.eager_credit_bytes;
  random_bytes(h.nonce);
  c->hello = encode_hello(p.secret, h);
  c->hs_out.assign(c->hello.begin(), c->hello.end());
  c->hs_out_off = 0;
  c->st = ConnState::AwaitChallenge;
  c->hs_need = kChallengeBytes;
  c->hs_have = 0;
  write_hs(c);
}

bool Engine::write_hs(Conn* c) {
  while (c->hs_out_off < c->hs_out.size()) {
    const ssize_t n = ::send(c->fd.get(), c->hs_out.data() + c->hs_out_off,
                             c->hs_out.size() - c->hs_out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      const std::string why = fmt::format("handshake write to {}: {}", c->remote, std::strerror(errno));
      if (c->st == ConnState::Ready) conn_failed(c, why);
      else hs_failed(c, why);
      return false;
    }
    c->hs_out_off += static_cast<std::size_t>(n);
  }
  const bool done = c->hs_out_off == c->hs_out.size();
  if (done) {
    c->hs_out.clear();
    c->hs_out_off = 0;
  }
  set_events(c);
  return done;
}

void Engine::read_hs(Conn* c) {
  while (!c->dead && c->st != ConnState::Ready) {
    const ssize_t n = ::recv(c->fd.get(), c->hs_in.data() + c->hs_have, c->hs_need - c->hs_have, 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      hs_failed(c, fmt::format("handshake read from {}: {}", c->remote, std::strerror(errno)));
      return;
    }
    if (n == 0) {
      hs_failed(c, fmt::format("{} closed the connection during the handshake (it rejected us: "
                               "see its log; e.g. another job or wan.key_file, or a different "
                               "wan.auth or wan.rails)",
                               c->remote));
      return;
    }
    c->hs_have += static_cast<std::size_t>(n);
    if (c->hs_have < c->hs_need) continue;
    const auto in = std::span<const std::uint8_t>(c->hs_in.data(), c->hs_need);
    c->hs_have = 0;
    switch (c->st) {
      case ConnState::AwaitHello: {
        std::copy(in.begin(), in.end(), c->hello.begin());
        Hello h;
        std::string why = decode_hello(std::span<const std::uint8_t, kHelloBytes>(c->hello), h);
        const int idx = why.empty() ? peer_index(h.from_rank) : -1;
        // First of all: the MAC, under the secret of the rank the Hello names. Nothing else
        // about the connection is looked at, or answered, before it holds.
        if (why.empty() && idx < 0)
          why = fmt::format("rank {} is not a WAN peer of rank {}", h.from_rank, m_opts.my_rank);
        if (why.empty())
          why = check_hello(m_peers[static_cast<std::size_t>(idx)]->secret,
                            std::span<const std::uint8_t, kHelloBytes>(c->hello));
        if (why.empty()) {
          if (h.to_rank != m_opts.my_rank)
            why = fmt::format("hello is addressed to rank {}, but this is rank {}", h.to_rank,
                              m_opts.my_rank);
          else if (m_peers[static_cast<std::size_t>(idx)]->active)
            why = fmt::format("rank {} connected, but rank {} is the connecting side of this pair",
                              h.from_rank, m_opts.my_rank);
          else if (h.auth != m_opts.auth)
            why = fmt::format("rank {} uses wan.auth = {}, this rank {} (use one deck for every "
                              "rank)",
                              h.from_rank, auth_name(h.auth), auth_name(m_opts.auth));
          else if (h.rails != static_cast<std::uint32_t>(m_opts.rails))
            why = fmt::format("rank {} uses wan.rails = {}, this rank {}", h.from_rank, h.rails,
                              m_opts.rails);
          else if (h.rail >= h.rails)
            why = fmt::format("rail index {} out of range (wan.rails = {})", h.rail, h.rails);
          else if (h.chunk_bytes > m_opts.max_frame_bytes || h.chunk_bytes == 0)
            why = fmt::format("rank {} uses wan.chunk_bytes = {}, over this rank's "
                              "wan.max_frame_bytes = {}",
                              h.from_rank, h.chunk_bytes, m_opts.max_frame_bytes);
          else if (!m_peers[static_cast<std::size_t>(idx)]->failed.empty()) {
            close_conn(c);  // its error is already reported; the peer's reconnects are refused
            return;
          }
        }
        if (!why.empty()) {
          hs_failed(c, why);
          return;
        }
        // A valid MAC on a nonce seen before: someone on the path repeats a recorded Hello (it
        // could not finish the handshake, but it would hold a pending slot of the rail).
        if (!m_seen_hellos.insert(h.nonce).second) {
          hs_failed(c, fmt::format("a replayed hello of rank {} rail {} (its nonce was seen before "
                                   "by this rank): someone on the path repeats the peer's "
                                   "handshake",
                                   h.from_rank, h.rail));
          return;
        }
        m_seen_order.push_back(h.nonce);
        if (m_seen_order.size() > kSeenHellos) {
          m_seen_hellos.erase(m_seen_order.front());
          m_seen_order.pop_front();
        }
        c->peer = idx;
        c->rail = static_cast<int>(h.rail);
        c->proven = true;
        keep_proven(c);
        Nonce nonce{};
        random_bytes(nonce);
        c->challenge = encode_challenge(m_peers[static_cast<std::size_t>(idx)]->secret, c->hello, m_opts.chunk_bytes,
                                        m_opts.eager_credit_bytes, nonce);
        c->hs_out.assign(c->challenge.begin(), c->challenge.end());
        c->hs_out_off = 0;
        c->st = ConnState::AwaitResponse;
        c->hs_need = kResponseBytes;
        // Remember the offered parameters for make_ready (kept in the hello bytes).
        if (!write_hs(c) && c->dead) return;
        break;
      }
      case ConnState::AwaitResponse: {
        const std::string why = check_response(
            peer_of(c).secret, c->hello, c->challenge,
            std::span<const std::uint8_t, kResponseBytes>(in.data(), kResponseBytes));
        if (!why.empty()) {
          hs_failed(c, why);
          return;
        }
        Hello h;
        decode_hello(std::span<const std::uint8_t, kHelloBytes>(c->hello), h);
        make_ready(c, h.chunk_bytes, h.credit_bytes);
        return;
      }
      case ConnState::AwaitChallenge: {
        std::copy(in.begin(), in.end(), c->challenge.begin());
        Challenge ch;
        const std::string why = check_challenge(
            peer_of(c).secret, c->hello, std::span<const std::uint8_t, kChallengeBytes>(c->challenge), ch);
        if (!why.empty()) {
          hs_failed(c, fmt::format("handshake with {} failed: {}", c->remote, why));
          return;
        }
        if (ch.chunk_bytes == 0 || ch.chunk_bytes > m_opts.max_frame_bytes) {
          Peer& p = peer_of(c);
          const std::string msg = fmt::format(
              "WAN peer {} rail {}: the peer uses wan.chunk_bytes = {}, over this rank's "
              "wan.max_frame_bytes = {} (use one deck for every rank)",
              p.rank, c->rail, ch.chunk_bytes, m_opts.max_frame_bytes);
          fail_peer(p, msg);
          return;
        }
        const auto resp = encode_response(peer_of(c).secret, c->hello, c->challenge);
        c->hs_out.assign(resp.begin(), resp.end());
        c->hs_out_off = 0;
        make_ready(c, ch.chunk_bytes, ch.credit_bytes);
        if (!c->dead) write_hs(c);
        return;
      }
      default: return;
    }
  }
}

void Engine::hs_failed(Conn* c, const std::string& why) {
  if (c->dead) return;
  if (c->active && c->peer >= 0) {
    Peer& p = peer_of(c);
    RailSlot& s = p.rails[static_cast<std::size_t>(c->rail)];
    if (s.pending == c) s.pending = nullptr;
    s.last_error = why;
    s.next_attempt = m_now + std::min<Clock::duration>(20ms * (1 << std::min(s.attempts, 5)), 500ms);
  } else {
    m_warn_hs.warn(m_now, fmt::format("WAN: closed an incoming connection from {} that failed the "
                                      "handshake: {}",
                                      c->remote, why));
  }
  close_conn(c);
}

void Engine::make_ready(Conn* c, std::uint64_t chunk, std::uint64_t credit) {
  Peer& p = peer_of(c);
  RailSlot& s = p.rails[static_cast<std::size_t>(c->rail)];
  if (s.conn && s.conn != c) conn_failed(s.conn, "replaced by a new connection for the same rail");
  if (!p.failed.empty()) {
    close_conn(c);
    return;
  }
  if (s.pending == c) s.pending = nullptr;
  s.conn = c;
  const bool first = !s.ever_up;
  if (s.ever_up) {
    p.c_reconnects.fetch_add(1, std::memory_order_relaxed);
    rc(c).reconnects.fetch_add(1, std::memory_order_relaxed);
    log::warn("WAN rail {} to peer {} reconnected ({})", c->rail, p.rank, c->remote);
  }
  s.ever_up = true;
  s.dead = false;
  s.attempts = 0;
  s.deadline = Clock::time_point::max();
  c->st = ConnState::Ready;
  const FrameKeys keys = derive_frame_keys(p.secret, c->hello, c->challenge, m_opts.auth, c->active);
  c->sealer = std::make_unique<FrameSealer>(m_opts.auth, keys.send);
  c->opener = std::make_unique<FrameOpener>(m_opts.auth, keys.recv);
  c->in.resize(kStagingBytes);
  c->ack_clock = m_now;
  p.peer_chunk = chunk;
  p.peer_credit = credit;
  p.params_known = true;
  p.dirty = true;
  if (first) start_warmup(c);
  check_connected();
}

void Engine::start_warmup(Conn* c) {
  RailSlot& s = peer_of(c).rails[static_cast<std::size_t>(c->rail)];
  const std::uint64_t len = std::min(kPadMax, m_opts.chunk_bytes);  // the peer accepts our chunks
  const std::uint64_t n = std::min(kPadFramesMax, (m_opts.warmup_bytes + len - 1) / len);
  if (n == 0) {
    s.warm = true;
    return;
  }
  FrameHeader h;
  h.type = FrameType::Pad;
  h.length = static_cast<std::uint32_t>(len);
  if (m_opts.auth == FrameAuth::Crc) h.payload_crc = crc32c(kZeros, len);
  for (std::uint64_t k = 0; k < n; ++k) {
    OutFrame f;
    f.type = FrameType::Pad;
    f.reliable = true;
    f.len = static_cast<std::uint32_t>(len);
    f.payload = kZeros;
    encode_header(h, f.hdr);
    c->unwritten_bytes += f.size();
    c->queued_bytes += f.size();
    c->q.push_back(std::move(f));
  }
  c->pads_unacked = n;
}

void Engine::warmed(Conn* c) {
  RailSlot& s = peer_of(c).rails[static_cast<std::size_t>(c->rail)];
  if (s.conn == c) s.warm = true;
  check_connected();
}

void Engine::close_conn(Conn* c) {
  if (c->dead) return;
  c->dead = true;
  epoll_ctl(m_epoll.get(), EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->fd.reset();
  if (c->peer >= 0 && c->rail >= 0) {
    RailSlot& s = peer_of(c).rails[static_cast<std::size_t>(c->rail)];
    if (s.conn == c) s.conn = nullptr;
    if (s.pending == c) s.pending = nullptr;
  }
  auto it = m_conns.find(c->key);
  if (it != m_conns.end()) {
    m_graveyard.push_back(std::move(it->second));
    m_conns.erase(it);
  }
}

void Engine::conn_failed(Conn* c, const std::string& why) {
  if (c->dead) return;
  if (c->st != ConnState::Ready) {
    hs_failed(c, why);
    return;
  }
  Peer& p = peer_of(c);
  RailSlot& s = p.rails[static_cast<std::size_t>(c->rail)];
  const bool was_current = s.conn == c;
  if (was_current) s.warm = true;  // a rail lost while warming does not hold up the connect
  // Requeue everything not acknowledged: it is resent on the surviving rails (warm-up frames
  // are not).
  requeue_unacknowledged(p, c);
  // A chunk this connection was writing in place is free for another copy.
  if (c->in_payload && (c->dest_kind == Dest::Direct || c->dest_kind == Dest::Unexpected)) {
    auto it = p.in.find(c->cur.msg_id);
    if (it != p.in.end()) {
      auto w = it->second.writers.find(c->chunk_index);
      if (w != it->second.writers.end() && w->second == c) it->second.writers.erase(w);
    }
  }
  if (was_current && !m_stopping && p.failed.empty() && !p.gone) {
    s.last_error = why;
    s.deadline = m_now + to_duration(m_opts.connect_timeout_s);
    s.next_attempt = m_now;
    s.attempts = 0;
    log::warn("WAN rail {} to peer {} lost: {}; resending its unacknowledged chunks on the other "
              "rails{}",
              c->rail, p.rank, why, p.active ? " and reconnecting" : ", waiting for the peer to reconnect");
  }
  close_conn(c);
  p.dirty = true;
}

void Engine::requeue_unacknowledged(Peer& p, Conn* c) {
  for (OutFrame& f : c->q) {
    if (!f.reliable || f.type == FrameType::Pad) continue;
    if (f.type == FrameType::Data) p.resend.push_back(std::move(f.chunk));
    else if (f.type == FrameType::Credit) p.credit_dirty = true;
    else p.ctrl.push_back(f.ctrl);
  }
  c->q.clear();
  c->sealed = 0;
}

void Engine::on_bye(Conn* c) {
  Peer& p = peer_of(c);
  RailSlot& s = p.rails[static_cast<std::size_t>(c->rail)];
  if (s.conn == c) {
    s.closed_by_peer = true;
    s.warm = true;
  }
  requeue_unacknowledged(p, c);
  ::shutdown(c->fd.get(), SHUT_WR);
  close_conn(c);
  bool any = false;
  for (auto& r : p.rails)
    if (r.conn || (!r.closed_by_peer && !r.dead)) any = true;
  if (!any) peer_gone(p);
}

void Engine::peer_gone(Peer& p) {
  p.gone = true;
  // A message that arrived whole before the goodbye, whose irecv is not posted yet, is not
  // pending work: its sender saw it acknowledged and left; the irecv gets it later (start_recv).
  std::size_t pending = p.sends.size();
  for (const auto& [id, m] : p.in)
    if (m.op || !m.eager || m.chunks_done != m.n_chunks) ++pending;
  for (auto& [tag, ts] : p.tags) pending += ts.posted.size();
  if (pending == 0) return;
  fail_peer(p, fmt::format("WAN peer {} shut its transport down (said goodbye on every rail) while "
                           "{} operation(s) with it were pending",
                           p.rank, pending));
}

void Engine::fail_peer(Peer& p, const std::string& why) {
  if (!p.failed.empty()) return;
  p.failed = why;
  if (!m_stopping) log::error("{}", why);
  for (auto& s : p.rails) {
    if (s.conn) close_conn(s.conn);
    if (s.pending) close_conn(s.pending);
    s.conn = nullptr;
    s.pending = nullptr;
  }
  for (auto& [id, op] : p.sends) fail(op, why);
  for (auto& [tag, ts] : p.tags)
    for (auto& [seq, op] : ts.posted) fail(op, why);
  for (auto& [id, m] : p.in)
    if (m.op) fail(m.op, why);
  p.sends.clear();
  p.ready.clear();
  p.resend.clear();
  p.ctrl.clear();
  p.tags.clear();
  p.in.clear();
  p.eager_open = 0;
  p.rts_unbound = 0;
  check_connected();
}

}  // namespace atlas::wan::mr
