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
#include "atlas/wan/multirail.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/wan/fd.hpp"
#include "op.hpp"

namespace atlas::wan {

namespace {

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
alignas(64) const std::uint8_t kZeros[kPadMax] = {};  // every warm-up payload

constexpr auto kListenBackoff = 100ms;             // listener not polled after EMFILE/ENFILE
constexpr auto kWarnEvery = 10s;                   // one line per kind of listener warning
constexpr int kAcceptBatch = 64;                   // accepts per readiness event
constexpr int kMaxProvenPerRail = 2;  // pending incoming connections with a valid Hello, per rail
constexpr std::size_t kSeenHellos = 4096;  // Hello nonces remembered to refuse replays
/// A message is cut into at most this many chunks (its receive bitmap: 1 byte per chunk).
constexpr std::uint64_t kMaxMessageChunks = std::uint64_t{1} << 24;

constexpr std::uint64_t kWakeKey = 1;
constexpr std::uint64_t kListenKey = 2;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
Clock::duration to_duration(double s) {
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
std::uint64_t chunks_of(std::uint64_t total, std::uint64_t chunk) {
  return std::max<std::uint64_t>(1, total / chunk + (total % chunk != 0));
}

std::string rail_list(const std::vector<int>& rails) {
  std::string s;
  for (int r : rails) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s.empty() ? "none" : s;
}

}  // namespace

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

namespace {

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

}  // namespace

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
    if (idx < 0) throw Error(ExitCode::Comm, fmt::format("WAN: rank {} is not a peer of this transport", rank));
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

Engine::Engine(const MultirailOptions& opts, const std::vector<int>& peers, const PeerTransport* owner)
    : m_opts(opts), m_owner(owner) {
  if (m_opts.rails < 1 || m_opts.rails > deck::limits::kMaxRails)
    throw Error(ExitCode::Comm, fmt::format("multirail: rails = {} (need 1..{}, the range of wan.rails)", m_opts.rails,
                                            deck::limits::kMaxRails));
  if (m_opts.chunk_bytes < 1 || m_opts.chunk_bytes > 0xFFFFFFFFull)
    throw Error(ExitCode::Comm, fmt::format("multirail: wan.chunk_bytes = {} (need 1 .. 4G-1)",
                                            m_opts.chunk_bytes));
  if (m_opts.chunk_bytes > m_opts.max_frame_bytes)
    throw Error(ExitCode::Comm,
                fmt::format("multirail: wan.chunk_bytes = {} exceeds wan.max_frame_bytes = {}",
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
      throw Error(ExitCode::Comm, fmt::format("multirail: rank {} lists itself as a WAN peer", rank));
    if (m_peer_index.count(rank))
      throw Error(ExitCode::Comm, fmt::format("multirail: peer {} listed twice", rank));
    auto p = std::make_unique<Peer>();
    p->rank = rank;
    p->active = m_opts.my_rank < rank;
    auto sec = m_opts.pair_secrets.find(rank);
    p->secret = sec != m_opts.pair_secrets.end() ? sec->second : m_opts.secret;
    if (sec == m_opts.pair_secrets.end() && m_opts.secret == Secret{})
      throw Error(ExitCode::Comm,
                  fmt::format("multirail: rank {} has no secret for its WAN peer {} (not in "
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
    throw Error(ExitCode::Comm, fmt::format("multirail: epoll/eventfd: {}", std::strerror(errno)));
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
    throw Error(ExitCode::Comm, msg);
  }
  if (m_dead && !m_connected)
    throw Error(ExitCode::Comm, "WAN progress thread stopped before connecting: " + m_dead_reason);
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
    throw Error(ExitCode::Comm, fmt::format("epoll_wait: {}", std::strerror(errno)));
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
    throw Error(ExitCode::Comm, fmt::format("epoll_ctl(ADD): {}", std::strerror(errno)));
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
  for (OutFrame& f : c->q) {
    if (!f.reliable || f.type == FrameType::Pad) continue;
    if (f.type == FrameType::Data) p.resend.push_back(std::move(f.chunk));
    else if (f.type == FrameType::Credit) p.credit_dirty = true;
    else p.ctrl.push_back(f.ctrl);
  }
  c->q.clear();
  c->sealed = 0;
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

void Engine::on_bye(Conn* c) {
  Peer& p = peer_of(c);
  RailSlot& s = p.rails[static_cast<std::size_t>(c->rail)];
  if (s.conn == c) {
    s.closed_by_peer = true;
    s.warm = true;
  }
  for (OutFrame& f : c->q) {
    if (!f.reliable || f.type == FrameType::Pad) continue;
    if (f.type == FrameType::Data) p.resend.push_back(std::move(f.chunk));
    else if (f.type == FrameType::Credit) p.credit_dirty = true;
    else p.ctrl.push_back(f.ctrl);
  }
  c->q.clear();
  c->sealed = 0;
  ::shutdown(c->fd.get(), SHUT_WR);
  close_conn(c);
  bool any = false;
  for (auto& r : p.rails)
    if (r.conn || (!r.closed_by_peer && !r.dead)) any = true;
  if (!any) peer_gone(p);
}

void Engine::peer_gone(Peer& p) {
  p.gone = true;
  std::size_t pending = p.sends.size() + p.in.size();
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
  check_connected();
}

// ---- operations ----

void Engine::start_send(std::shared_ptr<SendOp> op) {
  Peer& p = *m_peers[static_cast<std::size_t>(peer_index(op->peer()))];
  if (!p.failed.empty()) return fail(op, p.failed);
  if (p.gone)
    return fail(op, fmt::format("WAN peer {} has shut its transport down; cannot send to it", p.rank));
  op->m_msg_id = p.next_msg_id++;
  op->m_tag_seq = p.send_seq[op->tag()]++;
  op->m_chunks = std::max<std::uint64_t>(1, (op->m_total + m_opts.chunk_bytes - 1) / m_opts.chunk_bytes);
  if (!p.sends.empty() && op->m_msg_id - p.sends.begin()->first >= kMsgWindow)
    return fail(op, fmt::format("WAN send to peer {}: more than {} sends outstanding", p.rank, kMsgWindow));
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
  if (p.gone)
    return fail(op, fmt::format("WAN peer {} has shut its transport down; nothing more will come "
                                "from it",
                                p.rank));
  TagState& ts = p.tags[op->tag()];
  op->m_tag_seq = ts.next_post++;
  op->m_posted = m_now;
  auto a = ts.arrived.find(op->m_tag_seq);
  if (a == ts.arrived.end()) {
    ts.posted[op->m_tag_seq] = std::move(op);
    return;
  }
  const std::uint64_t id = a->second;
  ts.arrived.erase(a);
  bind(p, p.in.at(id), std::move(op));
}

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
  InMsg& m = p.in[h.msg_id];
  m.id = h.msg_id;
  m.tag = h.tag;
  m.tag_seq = h.tag_seq;
  m.total = h.total;
  m.eager = eager;
  m.chunk = p.peer_chunk;
  m.n_chunks = chunks_of(h.total, m.chunk);
  m.done.assign(m.n_chunks, 0);
  auto po = ts.posted.find(h.tag_seq);
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
  if (c->want_out) {
    c->want_out = false;
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

// ---- input ----

void Engine::on_readable(Conn* c) {
  std::size_t budget = kReadBudget;
  while (budget > 0 && !c->dead) {
    if (!c->in_payload) {
      if (c->in_end - c->in_begin >= kHeaderBytes) {
        parse_header(c);
        continue;
      }
      if (!fill(c, budget)) break;
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

// ---- MultirailTransport ----

MultirailTransport::MultirailTransport(const MultirailOptions& opts, const std::vector<int>& peers)
    : m_engine(std::make_unique<Engine>(opts, peers, this)) {}

MultirailTransport::~MultirailTransport() = default;

int MultirailTransport::listen_port() const { return m_engine->port(); }

std::string MultirailTransport::congestion_control_note() const { return m_engine->cc_note(); }

void MultirailTransport::connect(const std::vector<PeerAddress>& addresses) {
  m_connect_called = true;
  m_engine->post(Command{CmdKind::Connect, {}, {}, -1, -1, 0, addresses});
}

void MultirailTransport::wait_connected() {
  if (!m_connect_called)
    throw Error(ExitCode::Internal, "MultirailTransport::wait_connected before connect(): nothing would ever connect");
  m_engine->wait_connected();
}

Handle MultirailTransport::isend(int peer, int tag, const void* data, std::size_t bytes) {
  if (m_engine->peer_index(peer) < 0)
    throw Error(ExitCode::Comm, fmt::format("WAN isend to rank {}: not a peer of this transport "
                                            "(give it to make_transport)",
                                            peer));
  if (tag < 0) throw Error(ExitCode::Comm, fmt::format("WAN isend: tag {} is negative", tag));
  if (!data && bytes > 0) throw Error(ExitCode::Comm, "WAN isend: null buffer");
  if (chunks_of(bytes, m_engine->opts().chunk_bytes) > kMaxMessageChunks)
    throw Error(ExitCode::Comm,
                fmt::format("WAN isend of {} bytes to rank {}: more than {} chunks of wan.chunk_bytes "
                            "= {}; raise wan.chunk_bytes or send it in parts",
                            bytes, peer, kMaxMessageChunks, m_engine->opts().chunk_bytes));
  auto op = std::make_shared<SendOp>(this, peer, tag, static_cast<const std::uint8_t*>(data), bytes);
  Handle h(op);
  m_engine->post(Command{CmdKind::Send, std::move(op), {}, peer, -1, 0, {}});
  return h;
}

Handle MultirailTransport::irecv(int peer, int tag, void* data, std::size_t bytes) {
  if (m_engine->peer_index(peer) < 0)
    throw Error(ExitCode::Comm, fmt::format("WAN irecv from rank {}: not a peer of this transport "
                                            "(give it to make_transport)",
                                            peer));
  if (tag < 0) throw Error(ExitCode::Comm, fmt::format("WAN irecv: tag {} is negative", tag));
  if (!data && bytes > 0) throw Error(ExitCode::Comm, "WAN irecv: null buffer");
  auto op = std::make_shared<RecvOp>(this, peer, tag, static_cast<std::uint8_t*>(data), bytes);
  Handle h(op);
  m_engine->post(Command{CmdKind::Recv, {}, std::move(op), peer, -1, 0, {}});
  return h;
}

void MultirailTransport::finish(Handle& h) {
  const detail::Op* op = h.op();
  if (op->state() == detail::OpState::Failed) {
    std::string why = op->error();
    h.reset();
    throw Error(ExitCode::Comm, why);
  }
  h.reset();
}

bool MultirailTransport::test(Handle& h) {
  const detail::Op* op = h.op();
  if (!op) return true;
  if (op->owner() != this) throw Error(ExitCode::Comm, "WAN test: the handle belongs to another transport");
  if (op->state() == detail::OpState::Pending) return false;
  finish(h);
  return true;
}

void MultirailTransport::wait(Handle& h) {
  const detail::Op* op = h.op();
  if (!op) return;
  if (op->owner() != this) throw Error(ExitCode::Comm, "WAN wait: the handle belongs to another transport");
  m_engine->wait_op(op);
  finish(h);
}

TransportStats MultirailTransport::stats() const { return m_engine->stats(); }

void MultirailTransport::debug_kill_rail(int peer, int rail, int after_frames) {
  m_engine->post(Command{CmdKind::KillRail, {}, {}, peer, rail, after_frames, {}});
}

void MultirailTransport::debug_corrupt_next_frame(int peer) {
  m_engine->post(Command{CmdKind::Corrupt, {}, {}, peer, -1, 0, {}});
}

Secret MultirailTransport::debug_pair_secret(int peer) const { return m_engine->pair_secret(peer); }

}  // namespace atlas::wan
