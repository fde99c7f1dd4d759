// SPDX-License-Identifier: MIT
// The multirail progress engine: one epoll thread per transport owns every socket and all
// protocol state; the application thread only posts commands and waits on operation states.
// Protocol: per connection a handshake (framing.hpp), then frames. Data frames of a message are
// striped over the least-loaded rails and acknowledged per connection (a cumulative count of
// reliable frames); a lost connection's unacknowledged frames are resent on the other rails, and
// the receiver drops duplicates (per-chunk bitmap, completed-message set). Messages within the
// receiver's credit go eagerly; larger ones send an RTS and wait for the CTS of the posted irecv.
// A new rail first carries warm-up (Pad) frames, so its TCP window has grown before any message.
// Every frame is sealed (wan.auth: AES-256-GCM tags, per-connection keys, a frame counter per
// direction; framing.hpp) when its writing starts, so the counter follows the wire order. A frame
// that fails its tag is a rail error: the connection is reset and its unacknowledged frames are
// resent; the frame's data is never delivered.
// Anyone who can reach the listener can open connections: those not yet authenticated are capped
// (per listener and per source address; the oldest gives way), and when the process runs out of
// descriptors the listener backs off instead of spinning, so rails and checkpoints keep theirs.
#include "multirail_engine.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "atlas/deck/schema.hpp"

namespace atlas::wan::mr {

Engine::Engine(const MultirailOptions& opts, const std::vector<int>& peers, const PeerTransport* owner)
    : m_opts(opts), m_owner(owner) {
  if (m_opts.rails < 1 || m_opts.rails > deck::limits::kMaxRails)
    ATLAS_THROW(Comm, fmt::format("multirail: rails = {} (need 1..{}, the range of wan.rails)", m_opts.rails,
                                  deck::limits::kMaxRails));
  if (m_opts.chunk_bytes < 1 || static_cast<double>(m_opts.chunk_bytes) > deck::limits::kMaxChunkBytes)
    ATLAS_THROW(Comm, fmt::format("multirail: wan.chunk_bytes = {} (need 1..{}, the range of wan.chunk_bytes)",
                                  m_opts.chunk_bytes, static_cast<std::uint64_t>(deck::limits::kMaxChunkBytes)));
  if (m_opts.chunk_bytes > m_opts.max_frame_bytes)
    ATLAS_THROW(Comm, fmt::format("multirail: wan.chunk_bytes = {} exceeds wan.max_frame_bytes = {}",
                                  m_opts.chunk_bytes, m_opts.max_frame_bytes));
  m_high_water = std::max<std::uint64_t>(m_opts.chunk_bytes + kHeaderBytes, 1u << 20);
  // Handshakes in progress hold descriptors: at most an eighth of the limit (4..64), and never
  // fewer than the rails of every peer that connects here plus some room.
  {
    rlimit rl{};
    const std::uint64_t lim =
        getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 65536;
    int incoming = 0;
    for (int rank : peers) incoming += rank < m_opts.my_rank ? m_opts.rails : 0;
    const int per_source = std::max(16, 2 * m_opts.rails);
    m_pending_cap = m_opts.max_pending_handshakes > 0
                        ? m_opts.max_pending_handshakes
                        : std::max({static_cast<int>(std::clamp<std::uint64_t>(lim / 8, 4, 64)),
                                    incoming + 8, per_source});
    m_pending_per_source = m_opts.max_pending_per_source > 0
                               ? std::min(m_opts.max_pending_per_source, m_pending_cap)
                               : std::min(per_source, m_pending_cap);
  }
  m_cc = choose_congestion_control(m_opts.tcp_congestion);
  for (int rank : peers) {
    if (rank == m_opts.my_rank)
      ATLAS_THROW(Comm, fmt::format("multirail: rank {} lists itself as a WAN peer", rank));
    if (m_peer_index.count(rank))
      ATLAS_THROW(Comm, fmt::format("multirail: peer {} listed twice", rank));
    auto p = std::make_unique<Peer>();
    p->rank = rank;
    p->active = m_opts.my_rank < rank;
    auto sec = m_opts.pair_secrets.find(rank);
    p->secret = sec != m_opts.pair_secrets.end() ? sec->second : m_opts.secret;
    if (sec == m_opts.pair_secrets.end() && m_opts.secret == Secret{})
      ATLAS_THROW(Comm, fmt::format("multirail: rank {} has no secret for its WAN peer {} (not in "
                                    "MultirailOptions::pair_secrets, and MultirailOptions::secret is all "
                                    "zero, which anyone could use): build the transport with "
                                    "make_transport, which derives one per pair, or pass one",
                                    m_opts.my_rank, rank));
    p->rails.resize(static_cast<std::size_t>(m_opts.rails));
    p->rail_counters = std::make_unique<RailCounters[]>(static_cast<std::size_t>(m_opts.rails));
    m_peer_index[rank] = static_cast<int>(m_peers.size());
    m_peers.push_back(std::move(p));
  }
  m_epoll = Fd(epoll_create1(EPOLL_CLOEXEC));
  m_wake = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!m_epoll.valid() || !m_wake.valid())
    ATLAS_THROW(Comm, fmt::format("multirail: epoll/eventfd: {}", std::strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  epoll_ctl(m_epoll.get(), EPOLL_CTL_ADD, m_wake.get(), &ev);
  if (!m_peers.empty()) {
    m_reserve = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    m_listen = listen_tcp(m_opts.bind_host, m_opts.bind_port, m_port);
    // Accepted rails inherit the listener's congestion control from their first packet on.
    if (!m_cc.name.empty())
      if (const std::string why = set_congestion_control(m_listen.get(), m_cc.name); !why.empty())
        log::warn("WAN listener: {}", why);
    ev.events = EPOLLIN;
    ev.data.u64 = kListenKey;
    epoll_ctl(m_epoll.get(), EPOLL_CTL_ADD, m_listen.get(), &ev);
  }
  m_thread = std::thread([this] { run(); });
}

Engine::~Engine() {
  post(Command{CmdKind::Stop, {}, {}, -1, -1, 0, {}});
  if (m_thread.joinable()) m_thread.join();
}

// ---- application side ----

void Engine::post(Command cmd) {
  {
    std::lock_guard lk(m_done_mu);
    if (m_dead && cmd.kind != CmdKind::Stop) {
      const std::string why = "WAN progress thread has stopped: " + m_dead_reason;
      if (cmd.send) cmd.send->set_failed(why);
      if (cmd.recv) cmd.recv->set_failed(why);
      return;
    }
  }
  {
    std::lock_guard lk(m_cmd_mu);
    // The progress thread may have taken its last commands between the check above and here.
    if (!m_cmds_closed.empty() && cmd.kind != CmdKind::Stop) {
      const std::string why = "WAN progress thread has stopped: " + m_cmds_closed;
      if (cmd.send) cmd.send->set_failed(why);
      if (cmd.recv) cmd.recv->set_failed(why);
      return;
    }
    m_cmds.push_back(std::move(cmd));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(m_wake.get(), &one, sizeof one);
}

void Engine::wait_connected() {
  std::unique_lock lk(m_done_mu);
  m_done_cv.wait(lk, [&] { return m_connected || !m_connect_errors.empty() || m_dead; });
  if (!m_connect_errors.empty()) {
    std::string msg;
    for (const auto& e : m_connect_errors) msg += (msg.empty() ? "" : "\n") + e;
    ATLAS_THROW(Comm, msg);
  }
  if (m_dead && !m_connected)
    ATLAS_THROW(Comm, "WAN progress thread stopped before connecting: " + m_dead_reason);
}

void Engine::wait_op(const detail::Op* op) {
  std::unique_lock lk(m_done_mu);
  m_done_cv.wait(lk, [&] { return op->state() != detail::OpState::Pending; });
}

TransportStats Engine::stats() const {
  TransportStats s;
  for (const auto& p : m_peers) {
    PeerStats ps;
    ps.peer = p->rank;
    ps.bytes_sent = p->c_bytes_sent.load(std::memory_order_relaxed);
    ps.bytes_received = p->c_bytes_received.load(std::memory_order_relaxed);
    ps.messages_sent = p->c_messages_sent.load(std::memory_order_relaxed);
    ps.messages_received = p->c_messages_received.load(std::memory_order_relaxed);
    ps.resent_chunks = p->c_resent_chunks.load(std::memory_order_relaxed);
    ps.resent_bytes = p->c_resent_bytes.load(std::memory_order_relaxed);
    ps.duplicates_dropped = p->c_duplicates.load(std::memory_order_relaxed);
    ps.reconnects = p->c_reconnects.load(std::memory_order_relaxed);
    for (int r = 0; r < m_opts.rails; ++r) {
      const RailCounters& c = p->rail_counters[static_cast<std::size_t>(r)];
      ps.rails.push_back({c.bytes_sent.load(std::memory_order_relaxed),
                          c.bytes_received.load(std::memory_order_relaxed),
                          c.frames_sent.load(std::memory_order_relaxed),
                          c.frames_received.load(std::memory_order_relaxed),
                          c.reconnects.load(std::memory_order_relaxed)});
    }
    s.peers.push_back(std::move(ps));
  }
  return s;
}

// ---- progress loop ----

void Engine::run() {
  std::string reason;
  try {
    m_now = Clock::now();
    while (!m_stopping) {
      bool busy = false;
      for (auto& p : m_peers) busy |= p->dirty;
      loop_once(busy ? 0
                     : static_cast<int>(
                           std::chrono::duration_cast<std::chrono::milliseconds>(kTick).count()));
    }
    shutdown_linger();
  } catch (const std::exception& e) {
    reason = std::string("internal error in the WAN progress thread: ") + e.what();
  } catch (...) {
    reason = "internal error in the WAN progress thread (unknown exception)";
  }
  // Fail whatever is left (destroyed transport, or a broken progress thread).
  const std::string why = reason.empty() ? "the WAN transport was destroyed while this operation was pending" : reason;
  if (!reason.empty()) log::error("{}", reason);
  try {
    for (auto& p : m_peers) {
      for (auto& [id, op] : p->sends) fail(op, why);
      for (auto& [tag, ts] : p->tags)
        for (auto& [seq, op] : ts.posted) fail(op, why);
      for (auto& [id, m] : p->in)
        if (m.op) fail(m.op, why);
      p->sends.clear();
      p->tags.clear();
      p->in.clear();
    }
    {
      std::lock_guard lk(m_cmd_mu);
      m_cmds_closed = reason.empty() ? "the transport was destroyed" : reason;
      for (auto& cmd : m_cmds) {
        if (cmd.send) fail(cmd.send, why);
        if (cmd.recv) fail(cmd.recv, why);
      }
      m_cmds.clear();
    }
  } catch (...) {
  }
  {
    std::lock_guard lk(m_done_mu);
    for (auto& op : m_completed) op->set_done();
    for (auto& [op, msg] : m_failed) op->set_failed(msg);
    m_completed.clear();
    m_failed.clear();
    m_dead = true;
    m_dead_reason = reason.empty() ? "the transport was destroyed" : reason;
  }
  m_done_cv.notify_all();
  m_conns.clear();
  m_graveyard.clear();
}

void Engine::loop_once(int timeout_ms) {
  epoll_event events[64];
  const int n = epoll_wait(m_epoll.get(), events, 64, timeout_ms);
  if (n < 0 && errno != EINTR)
    ATLAS_THROW(Comm, fmt::format("epoll_wait: {}", std::strerror(errno)));
  m_now = Clock::now();
  // The listener last: Hellos that arrived are checked before new connections can make room.
  int listen_at = -1;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kListenKey) listen_at = i;
    else on_event(events[i].data.u64, events[i].events);
  }
  if (listen_at >= 0) on_event(kListenKey, events[listen_at].events);
  if (m_now - m_last_timers >= kTick) {
    m_last_timers = m_now;
    timers();
  }
  output();
  publish();
  m_graveyard.clear();
}

void Engine::on_event(std::uint64_t key, std::uint32_t ev) {
  if (key == kWakeKey) {
    std::uint64_t v = 0;
    [[maybe_unused]] const ssize_t r = ::read(m_wake.get(), &v, sizeof v);
    drain_commands();
    return;
  }
  if (key == kListenKey) {
    accept_all();
    return;
  }
  auto it = m_conns.find(key);
  if (it == m_conns.end()) return;  // closed earlier in this batch
  Conn* c = it->second.get();
  if (c->dead) return;
  if (c->st == ConnState::Connecting) {
    if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
      const std::string err = connect_error(c->fd.get());
      if (!err.empty()) {
        hs_failed(c, fmt::format("connect to {}: {}", c->remote, err));
        return;
      }
      send_hello(c);
    }
    return;
  }
  if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
    if (c->st == ConnState::Ready) on_readable(c);
    else read_hs(c);
  }
  if (c->dead) return;
  if (ev & EPOLLOUT) {
    if (c->st == ConnState::Ready) {
      flush(c);
      if (!c->dead) peer_of(c).dirty = true;
    } else {
      write_hs(c);
    }
  }
}

void Engine::drain_commands() {
  std::vector<Command> cmds;
  {
    std::lock_guard lk(m_cmd_mu);
    cmds.swap(m_cmds);
  }
  for (auto& cmd : cmds) handle(cmd);
}

void Engine::handle(Command& cmd) {
  switch (cmd.kind) {
    case CmdKind::Send: start_send(std::move(cmd.send)); break;
    case CmdKind::Recv: start_recv(std::move(cmd.recv)); break;
    case CmdKind::Connect: {
      m_connect_started = true;
      const auto deadline = m_now + to_duration(m_opts.connect_timeout_s);
      for (const auto& a : cmd.addresses) {
        const int idx = peer_index(a.rank);
        if (idx < 0) continue;
        Peer& p = *m_peers[static_cast<std::size_t>(idx)];
        if (p.active) {
          try {
            p.addr = resolve(a.host, a.port);
            p.have_addr = true;
          } catch (const Error& e) {
            fail_peer(p, fmt::format("WAN peer {}: {}", p.rank, e.what()));
          }
        }
      }
      for (auto& p : m_peers) {
        if (!p->failed.empty()) continue;
        if (p->active && !p->have_addr) {
          fail_peer(*p, fmt::format("WAN peer {}: no listen address was given for it", p->rank));
          continue;
        }
        for (auto& s : p->rails) {
          if (!s.ever_up) s.deadline = deadline;
          s.next_attempt = m_now;
        }
      }
      timers();
      check_connected();
      break;
    }
    case CmdKind::KillRail: {
      const int idx = peer_index(cmd.peer);
      if (idx < 0 || cmd.rail < 0 || cmd.rail >= m_opts.rails) break;
      RailSlot& s = m_peers[static_cast<std::size_t>(idx)]->rails[static_cast<std::size_t>(cmd.rail)];
      if (cmd.count > 0) s.kill_after = cmd.count;
      else if (s.conn) ::shutdown(s.conn->fd.get(), SHUT_RDWR);
      break;
    }
    case CmdKind::Corrupt: {
      const int idx = peer_index(cmd.peer);
      if (idx >= 0) m_peers[static_cast<std::size_t>(idx)]->corrupt_next = true;
      break;
    }
    case CmdKind::Stop: m_stopping = true; break;
  }
}

void Engine::publish() {
  if (m_completed.empty() && m_failed.empty()) return;
  {
    std::lock_guard lk(m_done_mu);
    for (auto& op : m_completed) op->set_done();
    for (auto& [op, msg] : m_failed) op->set_failed(msg);
  }
  m_completed.clear();
  m_failed.clear();
  m_done_cv.notify_all();
}

void Engine::complete(const std::shared_ptr<detail::Op>& op) { m_completed.push_back(op); }

void Engine::fail(const std::shared_ptr<detail::Op>& op, const std::string& why) {
  m_failed.emplace_back(op, why);
}

// ---- timers: handshakes, reconnects, deadlines, stalls ----

void Engine::timers() {
  if (m_listen_paused && m_now >= m_listen_resume && m_listen.valid()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenKey;
    epoll_ctl(m_epoll.get(), EPOLL_CTL_MOD, m_listen.get(), &ev);
    m_listen_paused = false;
  }
  // Handshakes that take too long.
  std::vector<Conn*> slow;
  for (auto& [key, c] : m_conns)
    if (!c->dead && c->st != ConnState::Ready && m_now > c->hs_deadline) slow.push_back(c.get());
  for (Conn* c : slow)
    hs_failed(c, c->st == ConnState::Connecting
                     ? fmt::format("connect to {} did not finish in time", c->remote)
                     : fmt::format("no handshake reply from {} in time", c->remote));

  for (auto& pp : m_peers) {
    Peer& p = *pp;
    if (!p.failed.empty() || p.gone) continue;
    int up = 0;
    int trying = 0;
    std::vector<int> missing;
    std::string first_error;
    bool initial_failure = false;
    for (int r = 0; r < m_opts.rails; ++r) {
      RailSlot& s = p.rails[static_cast<std::size_t>(r)];
      if (s.conn) {
        Conn* c = s.conn;
        ++up;
        if (c->unacked > 0 && m_now - c->ack_clock > to_duration(m_opts.recv_timeout_s)) {
          conn_failed(c, fmt::format("no acknowledgement for {:.1f} s (wan.recv_timeout_s) with {} "
                                     "frames outstanding",
                                     seconds(m_now - c->ack_clock), c->unacked));
          --up;
        } else {
          continue;
        }
      }
      if (s.dead || s.closed_by_peer) continue;
      if (m_now > s.deadline) {
        missing.push_back(r);
        if (first_error.empty()) first_error = s.last_error;
        if (!s.ever_up) initial_failure = true;
        if (s.pending) close_conn(s.pending);
        s.pending = nullptr;
        s.dead = true;
        continue;
      }
      ++trying;
      if (p.active && p.have_addr && m_connect_started && !s.pending && m_now >= s.next_attempt &&
          !m_stopping)
        start_attempt(p, r);
    }
    if (!missing.empty()) {
      const std::string why = fmt::format(
          "WAN peer {}{}: rail(s) {} not {}connected within {:.1f} s (wan.connect_timeout_s); "
          "last error on rail {}: {}",
          p.rank, p.have_addr ? " at " + p.addr.text : "", rail_list(missing),
          initial_failure ? "" : "re", m_opts.connect_timeout_s, missing.front(),
          first_error.empty() ? (p.active ? "none recorded" : "the peer never connected")
                              : first_error);
      if (initial_failure || (up == 0 && trying == 0)) {
        fail_peer(p, why);
        continue;
      }
      log::warn("{} (continuing on the other rails)", why);
    }
    // Receives that stall.
    const auto limit = to_duration(m_opts.recv_timeout_s);
    auto stalled = [&](const RecvOp& op) {
      const auto since = std::max(op.m_posted, p.last_data);
      return m_now - since > limit ? seconds(m_now - since) : 0.0;
    };
    std::vector<int> up_rails;
    for (int r = 0; r < m_opts.rails; ++r)
      if (p.rails[static_cast<std::size_t>(r)].conn) up_rails.push_back(r);
    std::string stall;
    for (auto& [id, m] : p.in) {
      if (!m.op) continue;
      if (const double s = stalled(*m.op); s > 0) {
        stall = fmt::format(
            "WAN receive from peer {} stalled: no data for {:.1f} s (wan.recv_timeout_s) on message "
            "id {} (tag {}): {} of {} bytes received, last data on rail {}; rails up: {}",
            p.rank, s, id, m.tag, m.bytes_done, m.total,
            m.last_rail >= 0 ? std::to_string(m.last_rail) : std::string("none"), rail_list(up_rails));
        break;
      }
    }
    if (stall.empty())
      for (auto& [tag, ts] : p.tags)
        for (auto& [seq, op] : ts.posted)
          if (const double s = stalled(*op); s > 0 && stall.empty())
            stall = fmt::format(
                "WAN receive from peer {} stalled: no data for {:.1f} s (wan.recv_timeout_s); the "
                "message (tag {}, #{} with that tag, message id not yet known) has not started: 0 "
                "of {} bytes received, on no rail; rails up: {}",
                p.rank, s, tag, seq, op->m_bytes, rail_list(up_rails));
    // Sends that wait for the peer's clear-to-send (it comes once the matching irecv is posted):
    // a peer that never posts it would hold the sender's wait forever.
    if (stall.empty())
      for (const auto& [id, op] : p.sends)
        if (!op->m_cleared && m_now - op->m_posted > limit) {
          stall = fmt::format(
              "WAN send to peer {} not cleared for {:.1f} s (wan.recv_timeout_s): message id {} (tag {}, {} bytes) "
              "waits for the peer's clear-to-send, which it gives once its matching irecv is posted; rails up: {}",
              p.rank, seconds(m_now - op->m_posted), id, op->tag(), op->m_total, rail_list(up_rails));
          break;
        }
    if (!stall.empty()) fail_peer(p, stall);
  }
  check_connected();
}

void Engine::check_connected() {
  if (m_connected_reported) return;
  std::vector<std::string> errors;
  bool all_up = true;
  for (auto& p : m_peers) {
    if (!p->failed.empty()) errors.push_back(p->failed);
    for (auto& s : p->rails)
      if (!s.ever_up || !s.warm) all_up = false;
  }
  if (!errors.empty() || all_up) {
    m_connected_reported = true;
    {
      std::lock_guard lk(m_done_mu);
      m_connected = errors.empty();
      m_connect_errors = std::move(errors);
    }
    m_done_cv.notify_all();
  }
}

// ---- shutdown ----

void Engine::shutdown_linger() {
  // Say goodbye on every ready rail (after what is queued, so pending acks still go out), then
  // wait, bounded, for the peer to close its side. No waiting on a peer that is gone.
  m_listen.reset();
  std::vector<Conn*> ready;
  std::vector<Conn*> others;
  for (auto& [key, c] : m_conns) (c->st == ConnState::Ready ? ready : others).push_back(c.get());
  for (Conn* c : others) close_conn(c);
  for (Conn* c : ready) {
    // Unsent frames are dropped (their operations fail as "destroyed while pending"); a frame
    // half written stays, so the stream remains parseable up to the goodbye.
    c->q.erase(c->q.begin() + static_cast<std::ptrdiff_t>(boundary(c)), c->q.end());
    c->unwritten_bytes = 0;
    for (std::size_t i = c->unwritten; i < c->q.size(); ++i)
      c->unwritten_bytes += c->q[i].size() - c->q[i].written;
    OutFrame f;
    f.type = FrameType::Bye;
    FrameHeader h;
    h.type = FrameType::Bye;
    encode_header(h, f.hdr);
    c->unwritten_bytes += f.size();
    c->q.push_back(std::move(f));
    flush(c);  // pending acks go out first (flush puts them before the goodbye)
  }
  const auto deadline = Clock::now() + std::min<Clock::duration>(kLinger, to_duration(m_opts.connect_timeout_s));
  std::vector<std::uint8_t> sink(64 * 1024);
  std::set<Conn*> write_shut;
  for (;;) {
    bool open = false;
    for (auto& [key, c] : m_conns) {
      if (c->dead) continue;
      open = true;
      if (c->unwritten == c->q.size() && !write_shut.count(c.get())) {
        ::shutdown(c->fd.get(), SHUT_WR);
        write_shut.insert(c.get());
      }
    }
    m_graveyard.clear();
    if (!open || Clock::now() > deadline) break;
    epoll_event events[64];
    const int n = epoll_wait(m_epoll.get(), events, 64, 20);
    for (int i = 0; i < n; ++i) {
      auto it = m_conns.find(events[i].data.u64);
      if (it == m_conns.end()) continue;
      Conn* c = it->second.get();
      if (c->dead) continue;
      if (events[i].events & EPOLLOUT) flush(c);
      if (c->dead) continue;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
        // Drain (and drop) whatever the peer still sends until it closes its side.
        for (;;) {
          const ssize_t r = ::recv(c->fd.get(), sink.data(), sink.size(), 0);
          if (r > 0) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (r < 0 && errno == EINTR) continue;
          close_conn(c);
          break;
        }
      }
    }
  }
  std::vector<Conn*> left;
  for (auto& [key, c] : m_conns) left.push_back(c.get());
  for (Conn* c : left) close_conn(c);
  m_graveyard.clear();
}

}  // namespace atlas::wan::mr

namespace atlas::wan {

// ---- MultirailTransport ----

MultirailTransport::MultirailTransport(const MultirailOptions& opts, const std::vector<int>& peers)
    : m_engine(std::make_unique<mr::Engine>(opts, peers, this)) {}

void MultirailOptions::wipe_secrets() noexcept {
  wipe_secret(secret);
  for (auto& [peer, pair] : pair_secrets) wipe_secret(pair);
}

MultirailTransport::~MultirailTransport() = default;

int MultirailTransport::listen_port() const { return m_engine->port(); }

std::string MultirailTransport::congestion_control_note() const { return m_engine->cc_note(); }

void MultirailTransport::connect(const std::vector<PeerAddress>& addresses) {
  m_connect_called = true;
  m_engine->post(mr::Command{mr::CmdKind::Connect, {}, {}, -1, -1, 0, addresses});
}

void MultirailTransport::wait_connected() {
  if (!m_connect_called)
    ATLAS_THROW(Internal, "MultirailTransport::wait_connected before connect(): nothing would ever connect");
  m_engine->wait_connected();
}

Handle MultirailTransport::isend(int peer, int tag, const void* data, std::size_t bytes) {
  if (m_engine->peer_index(peer) < 0)
    ATLAS_THROW(Comm, fmt::format("WAN isend to rank {}: not a peer of this transport "
                                  "(give it to make_transport)",
                                  peer));
  if (tag < 0) ATLAS_THROW(Comm, fmt::format("WAN isend: tag {} is negative", tag));
  if (!data && bytes > 0) ATLAS_THROW(Comm, "WAN isend: null buffer");
  if (mr::chunks_of(bytes, m_engine->opts().chunk_bytes) > mr::kMaxMessageChunks)
    ATLAS_THROW(Comm, fmt::format("WAN isend of {} bytes to rank {}: more than {} chunks of wan.chunk_bytes "
                                  "= {}; raise wan.chunk_bytes or send it in parts",
                                  bytes, peer, mr::kMaxMessageChunks, m_engine->opts().chunk_bytes));
  auto op = std::make_shared<mr::SendOp>(this, peer, tag, static_cast<const std::uint8_t*>(data), bytes);
  Handle h(op);
  m_engine->post(mr::Command{mr::CmdKind::Send, std::move(op), {}, peer, -1, 0, {}});
  return h;
}

Handle MultirailTransport::irecv(int peer, int tag, void* data, std::size_t bytes) {
  if (m_engine->peer_index(peer) < 0)
    ATLAS_THROW(Comm, fmt::format("WAN irecv from rank {}: not a peer of this transport "
                                  "(give it to make_transport)",
                                  peer));
  if (tag < 0) ATLAS_THROW(Comm, fmt::format("WAN irecv: tag {} is negative", tag));
  if (!data && bytes > 0) ATLAS_THROW(Comm, "WAN irecv: null buffer");
  auto op = std::make_shared<mr::RecvOp>(this, peer, tag, static_cast<std::uint8_t*>(data), bytes);
  Handle h(op);
  m_engine->post(mr::Command{mr::CmdKind::Recv, {}, std::move(op), peer, -1, 0, {}});
  return h;
}

void MultirailTransport::finish(Handle& h) {
  const detail::Op* op = h.op();
  if (op->state() == detail::OpState::Failed) {
    std::string why = op->error();
    h.reset();
    ATLAS_THROW(Comm, why);
  }
  h.reset();
}

bool MultirailTransport::test(Handle& h) {
  const detail::Op* op = h.op();
  if (!op) return true;
  if (op->owner() != this) ATLAS_THROW(Comm, "WAN test: the handle belongs to another transport");
  if (op->state() == detail::OpState::Pending) return false;
  finish(h);
  return true;
}

void MultirailTransport::wait(Handle& h) {
  const detail::Op* op = h.op();
  if (!op) return;
  if (op->owner() != this) ATLAS_THROW(Comm, "WAN wait: the handle belongs to another transport");
  m_engine->wait_op(op);
  finish(h);
}

TransportStats MultirailTransport::stats() const { return m_engine->stats(); }

void MultirailTransport::debug_kill_rail(int peer, int rail, int after_frames) {
  m_engine->post(mr::Command{mr::CmdKind::KillRail, {}, {}, peer, rail, after_frames, {}});
}

void MultirailTransport::debug_corrupt_next_frame(int peer) {
  m_engine->post(mr::Command{mr::CmdKind::Corrupt, {}, {}, peer, -1, 0, {}});
}

Secret MultirailTransport::debug_pair_secret(int peer) const { return m_engine->pair_secret(peer); }

}  // namespace atlas::wan
