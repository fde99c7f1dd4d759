// SPDX-License-Identifier: MIT
// Internal to src/wan/multirail*.cpp: the multirail engine's state (operations, connections, rails,
// peers, commands) and the Engine class whose members those files define, one section each:
// multirail.cpp (construction, progress loop, timers, shutdown, MultirailTransport),
// multirail_connect.cpp (listener, accept caps, handshake, rail health), multirail_send.cpp
// (posting operations, output path), multirail_recv.cpp (receive bookkeeping, input path).
// Not a public header: see atlas/wan/multirail.hpp for the transport's contract.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/log.hpp"
#include "atlas/wan/fd.hpp"
#include "atlas/wan/framing.hpp"
#include "atlas/wan/multirail.hpp"
#include "op.hpp"


namespace atlas::wan::mr {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Message ids further than this past the oldest incomplete one are "unknown" (corrupt or rogue).
constexpr std::uint64_t kMsgWindow = std::uint64_t{1} << 24;
constexpr std::size_t kStagingBytes = 256 * 1024;  // per-connection receive staging buffer
constexpr std::uint64_t kDirectRecvMin = 16 * 1024;  // payload reads this big skip the staging
constexpr std::size_t kReadBudget = 8u << 20;      // bytes per readiness event per connection
constexpr int kMaxIov = 64;
constexpr std::size_t kWriteBatch = 4u << 20;      // bytes per sendmsg
constexpr std::uint64_t kSpareSlack = 64u << 10;   // a spare early buffer may exceed the message by 2x + this
constexpr std::size_t kEagerFlush = 64u << 10;     // user-space bytes a rail gathers before it is written through
constexpr auto kTick = 20ms;                       // timer resolution of the progress loop
constexpr auto kLinger = 2s;                       // longest goodbye at destruction
constexpr std::uint64_t kPadMax = 64 * 1024;       // warm-up frame payload, at most
constexpr std::uint64_t kPadFramesMax = 64;        // warm-up frames per rail, at most
alignas(64) inline constexpr std::uint8_t kZeros[kPadMax] = {};  // every warm-up payload

constexpr auto kListenBackoff = 100ms;             // listener not polled after EMFILE/ENFILE
constexpr auto kWarnEvery = 10s;                   // one line per kind of listener warning
constexpr int kAcceptBatch = 64;                   // accepts per readiness event
constexpr int kMaxProvenPerRail = 2;  // pending incoming connections with a valid Hello, per rail
constexpr std::size_t kSeenHellos = 4096;  // Hello nonces remembered to refuse replays
/// A message is cut into at most this many chunks (its receive bitmap: 1 byte per chunk).
constexpr std::uint64_t kMaxMessageChunks = std::uint64_t{1} << 24;

constexpr std::uint64_t kWakeKey = 1;
constexpr std::uint64_t kListenKey = 2;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

/// Repeated warnings of one kind: the first line at once, then at most one per kWarnEvery, which
/// says how many were folded into it.
struct WarnLimiter {
  Clock::time_point next{};
  std::uint64_t folded = 0;
  void warn(Clock::time_point now, const std::string& msg) {
    if (now < next) {
      ++folded;
      return;
    }
    if (folded > 0)
      log::warn("{} (and {} more like it since the last such line)", msg, folded);
    else
      log::warn("{}", msg);
    folded = 0;
    next = now + kWarnEvery;
  }
};

/// Chunks a message of `total` bytes is cut into (1 for an empty one); no overflow.
inline std::uint64_t chunks_of(std::uint64_t total, std::uint64_t chunk) {
  return std::max<std::uint64_t>(1, total / chunk + (total % chunk != 0));
}

inline std::string rail_list(const std::vector<int>& rails) {
  std::string s;
  for (int r : rails) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s.empty() ? "none" : s;
}

// ---- operations ----

class SendOp final : public detail::Op {
 public:
  SendOp(const PeerTransport* owner, int peer, int tag, const std::uint8_t* data, std::uint64_t bytes)
      : Op(owner, true, peer, tag), m_data(data), m_total(bytes) {}
  const std::uint8_t* m_data;
  std::uint64_t m_total;
  std::uint64_t m_msg_id = 0;
  std::uint64_t m_tag_seq = 0;
  std::uint64_t m_chunks = 1;   // frames the message is cut into (1 for an empty message)
  std::uint64_t m_handed = 0;   // chunks handed to rails for the first time
  std::uint64_t m_acked = 0;    // chunks acknowledged
  bool m_eager = false;
  bool m_cleared = false;       // eager, or CTS received
  Clock::time_point m_posted{};  // start_send: a send not cleared within wan.recv_timeout_s fails
};

class RecvOp final : public detail::Op {
 public:
  RecvOp(const PeerTransport* owner, int peer, int tag, std::uint8_t* data, std::uint64_t bytes)
      : Op(owner, false, peer, tag), m_data(data), m_bytes(bytes) {}
  std::uint8_t* m_data;
  std::uint64_t m_bytes;
  std::uint64_t m_tag_seq = 0;
  Clock::time_point m_posted{};
};

// ---- engine state ----

struct Chunk {
  std::shared_ptr<SendOp> op;
  std::uint64_t offset = 0;
  std::uint32_t len = 0;
};

struct Ctrl {
  FrameType type = FrameType::Cts;
  std::uint64_t msg_id = 0;
  std::uint64_t total = 0;
  std::int32_t tag = 0;
  std::uint64_t tag_seq = 0;
};

struct OutFrame {
  std::array<std::uint8_t, kHeaderBytes> hdr{};
  const std::uint8_t* payload = nullptr;  // the user's bytes; after sealing (encrypt) `cipher`
  std::unique_ptr<std::uint8_t[]> cipher;  // encrypt: the payload's ciphertext, until written
  bool sealed = false;      // tags computed (when its writing started)
  bool corrupt = false;     // test hook: a wrong payload tag
  std::uint32_t len = 0;
  std::size_t written = 0;  // of kHeaderBytes + len
  bool reliable = false;    // counted by acks and resent after a loss (all but Ack and Bye)
  std::uint64_t seq = 0;    // per-connection reliable frame number, set when writing starts
  FrameType type = FrameType::Data;
  Chunk chunk;  // Data
  Ctrl ctrl;    // Rts, Cts
  [[nodiscard]] std::size_t size() const { return kHeaderBytes + len; }
};

enum class ConnState { Connecting, AwaitChallenge, AwaitHello, AwaitResponse, Ready, Closing };
enum class Dest { None, Direct, Unexpected, Temp, Discard };

struct Conn {
  std::uint64_t key = 0;
  Fd fd;
  bool active = false;  // we connected (we reconnect it after a loss)
  int peer = -1;        // peer index; -1 until an accepted connection's Hello names it
  int rail = -1;
  std::string source;   // accepted: the remote address without its port
  bool proven = false;  // accepted: its Hello's MAC proved the pair secret (see make_room)
  ConnState st = ConnState::AwaitHello;
  std::string remote;
  Clock::time_point hs_deadline{};
  bool dead = false;
  std::uint32_t events = 0;  // registered epoll events
  bool want_out = false;
  // handshake
  std::array<std::uint8_t, kHelloBytes> hello{};
  std::array<std::uint8_t, kChallengeBytes> challenge{};
  std::vector<std::uint8_t> hs_out;
  std::size_t hs_out_off = 0;
  std::array<std::uint8_t, 128> hs_in{};
  std::size_t hs_have = 0;
  std::size_t hs_need = 0;
  // output
  std::deque<OutFrame> q;
  std::size_t unwritten = 0;  // frames [0, unwritten) are fully written, awaiting acks
  std::size_t sealed = 0;     // frames [0, sealed) are sealed (their frame numbers are fixed)
  std::unique_ptr<FrameSealer> sealer;  // from make_ready on
  std::unique_ptr<FrameOpener> opener;
  std::uint64_t unwritten_bytes = 0;
  std::uint64_t queued_bytes = 0;  // every frame in q: unwritten + written and unacknowledged
  std::uint64_t sent_seq = 0;
  std::uint64_t unacked = 0;  // reliable frames written and not yet acknowledged
  std::uint64_t pads_unacked = 0;  // warm-up frames not yet acknowledged
  Clock::time_point ack_clock{};
  bool ack_dirty = false;
  // input
  std::vector<std::uint8_t> in;
  std::size_t in_begin = 0;
  std::size_t in_end = 0;
  bool in_payload = false;
  FrameHeader cur;
  Dest dest_kind = Dest::None;
  std::uint8_t* dest = nullptr;  // payload start for Direct/Unexpected/Temp
  std::uint64_t got = 0;         // payload bytes of `cur` received
  std::uint64_t chunk_index = 0;
  std::vector<std::uint8_t> temp;
  std::uint64_t recv_seq = 0;    // reliable frames fully received
};

struct RailSlot {
  Conn* conn = nullptr;     // the Ready connection
  Conn* pending = nullptr;  // active side: the attempt in progress
  bool ever_up = false;
  bool warm = false;        // the first connection's warm-up is acknowledged (or given up)
  bool closed_by_peer = false;
  bool dead = false;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point next_attempt{};
  int attempts = 0;
  std::string last_error;
  int kill_after = 0;  // test hook: data frames until a forced shutdown (0 = not armed)
};

struct TagState {
  std::uint64_t next_post = 0;                                // tag_seq of the next irecv
  std::map<std::uint64_t, std::shared_ptr<RecvOp>> posted;    // unmatched irecvs by tag_seq
  std::map<std::uint64_t, std::uint64_t> arrived;             // unmatched messages: tag_seq -> id
};

struct InMsg {
  std::uint64_t id = 0;
  std::int32_t tag = 0;
  std::uint64_t tag_seq = 0;
  std::uint64_t total = 0;
  bool eager = false;
  std::uint64_t chunk = 1;
  std::uint64_t n_chunks = 1;
  std::vector<std::uint8_t> done;
  std::uint64_t chunks_done = 0;
  std::uint64_t bytes_done = 0;
  std::shared_ptr<RecvOp> op;
  std::unique_ptr<std::uint8_t[]> unexpected;  // early eager data, until the irecv is posted
  std::uint64_t unexpected_cap = 0;            // its size (a recycled buffer may be larger than total)
  std::unordered_map<std::uint64_t, Conn*> writers;  // chunk -> connection writing it in place
  int last_rail = -1;
};

struct RailCounters {
  std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, frames_sent{0}, frames_received{0},
      reconnects{0};
};

struct Peer {
  Peer() = default;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() { wipe_secret(secret); }
  int rank = -1;
  bool active = false;  // this rank connects (lower world rank)
  SockAddr addr;
  bool have_addr = false;
  std::vector<RailSlot> rails;
  std::string failed;  // fatal error; every operation with this peer fails with it
  bool gone = false;   // said goodbye on every rail
  std::uint64_t peer_chunk = 1;
  std::uint64_t peer_credit = 0;
  bool params_known = false;
  bool dirty = false;  // has output work
  bool corrupt_next = false;
  Secret secret{};     // of this pair: proves the handshake, keys the frames
  // send side
  std::uint64_t next_msg_id = 0;
  std::unordered_map<int, std::uint64_t> send_seq;
  std::map<std::uint64_t, std::shared_ptr<SendOp>> sends;  // incomplete sends by message id
  std::map<std::uint64_t, SendOp*> ready;  // cleared sends with chunks never handed out yet
  std::deque<Chunk> resend;
  std::deque<Ctrl> ctrl;
  std::uint64_t credit_used = 0;
  std::uint64_t credit_back = 0;
  // receive side
  std::unordered_map<int, TagState> tags;
  std::unordered_map<std::uint64_t, InMsg> in;
  std::uint64_t done_below = 0;
  std::set<std::uint64_t> done_above;
  std::uint64_t credit_returned = 0;
  // Bytes of eager messages received (opened) and not yet delivered: an honest sender keeps
  // them within the credit this rank granted, since credit comes back only on delivery.
  std::uint64_t eager_open = 0;
  // Messages announced by request-to-send that no receive has bound yet (max_unbound_rts).
  std::uint64_t rts_unbound = 0;
  bool credit_dirty = false;
  Clock::time_point last_data{};
  // counters (read by stats() from the application thread)
  std::atomic<std::uint64_t> c_bytes_sent{0}, c_bytes_received{0}, c_messages_sent{0},
      c_messages_received{0}, c_resent_chunks{0}, c_resent_bytes{0}, c_duplicates{0},
      c_reconnects{0};
  std::unique_ptr<RailCounters[]> rail_counters;
};

enum class CmdKind { Send, Recv, Connect, KillRail, Corrupt, Stop };

struct Command {
  CmdKind kind = CmdKind::Stop;
  std::shared_ptr<SendOp> send;
  std::shared_ptr<RecvOp> recv;
  int peer = -1;
  int rail = -1;
  int count = 0;
  std::vector<PeerAddress> addresses;
};

// ---- the engine ----

class Engine {
 public:
  Engine(const MultirailOptions& opts, const std::vector<int>& peers, const PeerTransport* owner);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  [[nodiscard]] int port() const { return m_port; }
  [[nodiscard]] const PeerTransport* owner() const { return m_owner; }
  [[nodiscard]] int peer_index(int rank) const {
    auto it = m_peer_index.find(rank);
    return it == m_peer_index.end() ? -1 : it->second;
  }
  [[nodiscard]] const MultirailOptions& opts() const { return m_opts; }
  [[nodiscard]] const std::string& cc_note() const { return m_cc.note; }
  [[nodiscard]] Secret pair_secret(int rank) const {  // immutable after construction
    const int idx = peer_index(rank);
    if (idx < 0) ATLAS_THROW(Comm, fmt::format("WAN: rank {} is not a peer of this transport", rank));
    return m_peers[static_cast<std::size_t>(idx)]->secret;
  }

  void post(Command cmd);
  void wait_connected();
  void wait_op(const detail::Op* op);
  [[nodiscard]] TransportStats stats() const;

 private:
  // progress thread
  void run();
  void loop_once(int timeout_ms);
  void drain_commands();
  void handle(Command& cmd);
  void on_event(std::uint64_t key, std::uint32_t ev);
  void accept_all();
  void make_room(const std::string& source);
  void keep_proven(Conn* c);
  void out_of_descriptors(int err);
  void pause_listener();
  void timers();
  void output();
  void publish();
  void shutdown_linger();

  // connections
  Conn* add_conn(Fd fd, bool active, int peer, int rail, ConnState st);
  void set_events(Conn* c);
  void start_attempt(Peer& p, int rail);
  void send_hello(Conn* c);
  bool write_hs(Conn* c);
  void read_hs(Conn* c);
  void hs_failed(Conn* c, const std::string& why);
  void make_ready(Conn* c, std::uint64_t chunk, std::uint64_t credit);
  void start_warmup(Conn* c);
  void warmed(Conn* c);
  void conn_failed(Conn* c, const std::string& why);
  void close_conn(Conn* c);
  void on_bye(Conn* c);
  /// Everything reliable still queued on `c` goes back to its peer: data chunks to resend on
  /// the other rails, a credit update marked due again, control frames requeued (pads and
  /// warm-up frames are dropped); `c`'s queue is emptied.
  void requeue_unacknowledged(Peer& p, Conn* c);

  // output
  Conn* least_loaded(Peer& p, bool for_data);
  std::uint8_t* early_buffer(InMsg& m);
  void recycle(InMsg& m);
  Conn* first_open(Peer& p);
  bool next_chunk(Peer& p, Chunk& ch);
  void push_data(Peer& p, Conn* c, Chunk ch, bool resend);
  void push_ctrl(Conn* c, const Ctrl& ctrl);
  void push_credit(Peer& p, Conn* c);
  static std::size_t boundary(const Conn* c);
  void service(Peer& p);
  bool flush(Conn* c);
  void advance(Conn* c, std::size_t w);
  void on_ack(Conn* c, std::uint64_t count);
  void count_frame(Conn* c);
  void seal(Conn* c, OutFrame& f);
  std::unique_ptr<std::uint8_t[]> take_cipher();
  void give_cipher(std::unique_ptr<std::uint8_t[]> buf);

  // input
  void on_readable(Conn* c);
  bool fill(Conn* c, std::size_t& budget);
  void parse_header(Conn* c);
  void begin_data(Conn* c, const FrameHeader& h);
  void begin_pad(Conn* c, const FrameHeader& h);
  void finish_payload(Conn* c);
  void on_rts(Peer& p, Conn* c, const FrameHeader& h);
  void on_cts(Peer& p, Conn* c, const FrameHeader& h);
  InMsg* new_msg(Peer& p, Conn* c, const FrameHeader& h, bool eager);
  void bind(Peer& p, InMsg& m, std::shared_ptr<RecvOp> op);
  void complete_recv(Peer& p, InMsg& m);
  void mark_done(Peer& p, std::uint64_t id);

  // operations
  void start_send(std::shared_ptr<SendOp> op);
  void start_recv(std::shared_ptr<RecvOp> op);
  void complete(const std::shared_ptr<detail::Op>& op);
  void fail(const std::shared_ptr<detail::Op>& op, const std::string& why);
  void fail_peer(Peer& p, const std::string& why);
  void peer_gone(Peer& p);
  void check_connected();

  [[nodiscard]] std::string where(const Conn* c) const {
    return fmt::format("peer {} rail {}", c->peer >= 0 ? m_peers[static_cast<std::size_t>(c->peer)]->rank : -1,
                       c->rail);
  }
  Peer& peer_of(const Conn* c) { return *m_peers[static_cast<std::size_t>(c->peer)]; }
  RailCounters& rc(const Conn* c) {
    return peer_of(c).rail_counters[static_cast<std::size_t>(c->rail)];
  }

  void tune(int fd);

  MultirailOptions m_opts;
  CongestionChoice m_cc;
  const PeerTransport* m_owner;
  std::vector<std::unique_ptr<Peer>> m_peers;
  std::unordered_map<int, int> m_peer_index;  // world rank -> index (immutable)
  int m_port = 0;
  Fd m_listen;
  Fd m_reserve;  // /dev/null: given up to accept-and-close a connection when out of descriptors
  int m_pending_cap = 64;
  int m_pending_per_source = 16;
  bool m_listen_paused = false;
  Clock::time_point m_listen_resume{};
  WarnLimiter m_warn_fds, m_warn_evict, m_warn_accept, m_warn_hs;
  // Nonces of the last kSeenHellos Hellos whose MAC held: the same nonce again is a replay.
  std::set<Nonce> m_seen_hellos;
  std::deque<Nonce> m_seen_order;
  Fd m_epoll;
  Fd m_wake;
  std::uint64_t m_high_water;

  // application <-> progress
  std::mutex m_cmd_mu;
  std::vector<Command> m_cmds;
  // Set (under m_cmd_mu) when the progress thread has taken its last commands: a command posted
  // after that fails at once with this reason instead of waiting in a queue nobody reads.
  std::string m_cmds_closed;
  mutable std::mutex m_done_mu;
  std::condition_variable m_done_cv;
  bool m_connected = false;                  // guarded by m_done_mu
  std::vector<std::string> m_connect_errors; // guarded by m_done_mu
  bool m_dead = false;                       // progress thread ended; guarded by m_done_mu
  std::string m_dead_reason;                 // guarded by m_done_mu

  // progress thread only
  // Buffers of delivered early messages, kept for the next ones: a fresh allocation of a large
  // buffer is page-faulted in on every message (about as costly as the copy itself).
  struct Spare {
    std::unique_ptr<std::uint8_t[]> buf;
    std::uint64_t cap = 0;
  };
  std::vector<Spare> m_spares;
  std::uint64_t m_spare_bytes = 0;
  std::vector<std::unique_ptr<std::uint8_t[]>> m_ciphers;  // encrypt: free buffers of chunk_bytes
  std::unordered_map<std::uint64_t, std::unique_ptr<Conn>> m_conns;
  std::vector<std::unique_ptr<Conn>> m_graveyard;
  std::uint64_t m_next_key = 16;
  std::vector<std::shared_ptr<detail::Op>> m_completed;
  std::vector<std::pair<std::shared_ptr<detail::Op>, std::string>> m_failed;
  bool m_stopping = false;
  bool m_connect_started = false;
  bool m_connected_reported = false;
  Clock::time_point m_now{};
  Clock::time_point m_last_timers{};
  std::thread m_thread;
};

}  // namespace atlas::wan::mr
