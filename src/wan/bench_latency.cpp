// SPDX-License-Identifier: MIT
// `atlas bench wan --latency`: the time of one message after an idle gap (a pipeline boundary
// tensor between compute slots), over multirail at several rail counts and chunk sizes, the MPI
// baseline and one plain TCP socket, on the same link. Reports the one-way time (isend to the
// receiver's completion) and the acknowledged send time (isend to the sender's completion).
// Not a throughput benchmark (bench.cpp streams for that).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/wan/bench.hpp"
#include "atlas/wan/fd.hpp"
#include "atlas/wan/multirail.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/wan/transport.hpp"
#include "bench_common.hpp"

namespace atlas::wan {

namespace {

enum class Kind { Multirail, Mpi, Tcp };

struct Variant {
  Kind kind = Kind::Multirail;
  int rails = 1;
  std::uint64_t chunk = 0;
  std::string cc;  // congestion-control request ("" = the deck's wan.tcp_congestion)
  [[nodiscard]] std::string name() const {
    switch (kind) {
      case Kind::Multirail: {
        std::string c = units::format_bytes_human(static_cast<double>(chunk));
        if (const auto sp = c.find(".0 "); sp != std::string::npos) c.erase(sp, 2);
        return fmt::format("multirail {} x {}", rails, c);
      }
      case Kind::Mpi: return "mpi (Open MPI TCP)";
      case Kind::Tcp: return "tcp (one plain socket)";
    }
    return "?";
  }
  /// The congestion control this variant asks for: its own, else the deck's.
  [[nodiscard]] std::string request(const WanCfg& deck) const { return cc.empty() ? deck.tcp_congestion : cc; }
};

struct LatOpts {
  std::string deck;
  std::vector<std::string> overrides;
  std::vector<Variant> variants;
  std::uint64_t msg_bytes = 128 * units::kKiB;
  int count = 40;
  int warmup = 2;
  double gap_ms = 30;
  bool both_ways = false;
  int load = 0;  // spinning threads per measured rank (CPU contention, as in a training job)
  double max_ratio = 0;  // > 0: fail (exit 1) beyond this many times the ideal (see --max-ratio)
};

const atlas::bench::Args* g_args = nullptr;  // for usage_error, set while parsing

[[noreturn]] void usage_error(const std::string& why) {
  ATLAS_ASSERT(g_args != nullptr, "usage_error outside the option parsing");
  g_args->fail(why + "\n  CC: a TCP congestion control for that variant: auto, system, cubic, reno, bbr "
                     "(default: the deck's wan.tcp_congestion)");
}

std::vector<Variant> parse_variants(const std::string& v) {
  std::vector<Variant> out;
  std::size_t pos = 0;
  while (pos <= v.size()) {
    const std::size_t c = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, c - pos);
    pos = c + 1;
    Variant x;
    if (item == "mpi") {
      x.kind = Kind::Mpi;
    } else if (item == "tcp" || item.rfind("tcp:", 0) == 0) {
      x.kind = Kind::Tcp;
      if (item.size() > 4) x.cc = item.substr(4);
    } else if (item.rfind("multirail:", 0) == 0) {
      std::string rest = item.substr(10);
      const std::size_t k = rest.find(':');
      if (k == std::string::npos) usage_error("bad variant '" + item + "' (multirail:RAILS:CHUNK, e.g. multirail:4:32K)");
      if (const std::size_t k2 = rest.find(':', k + 1); k2 != std::string::npos) {
        x.cc = rest.substr(k2 + 1);
        rest.resize(k2);
      }
      const auto r = units::parse_int(rest.substr(0, k));
      const auto b = units::parse_bytes(rest.substr(k + 1));
      if (!r || *r < 1 || *r > deck::limits::kMaxRails || !b || *b < 1 || *b > deck::limits::kMaxChunkBytes)
        usage_error("bad variant '" + item + "' (multirail:RAILS:CHUNK, e.g. multirail:4:32K)");
      x.rails = static_cast<int>(*r);
      x.chunk = b.value();
    } else {
      usage_error("unknown variant '" + item + "' (multirail:RAILS:CHUNK[:CC], mpi, tcp[:CC])");
    }
    out.push_back(x);
  }
  return out;
}

LatOpts opts_of(const atlas::bench::Args& a) {
  g_args = &a;
  LatOpts o;
  o.deck = a.deck();
  o.overrides = a.overrides;
  if (a.positional.size() > 1) usage_error("unknown argument '" + a.positional[1] + "' (one DECK at most)");
  o.variants = parse_variants(a.text("variants"));
  o.msg_bytes = a.bytes("msg-bytes", 16, 16 * units::kGiB);
  o.count = a.integer("count", 1, 100000);
  o.warmup = a.integer("warmup", 0, 1000);
  o.gap_ms = a.number("gap-ms", 0, 10000);
  o.both_ways = a.flag("both-ways");
  o.load = a.integer("load", 0, 64);
  if (a.given("max-ratio")) o.max_ratio = a.number("max-ratio", 1, 1e9);
  g_args = nullptr;
  return o;
}

}  // namespace

const atlas::bench::Spec& wan_latency_bench_spec() {
  static const atlas::bench::Spec spec{
      "latency",
      "one WAN message at a time after idle gaps: multirail variants vs Open MPI vs one TCP socket (also: atlas "
      "bench wan --latency)",
      "[DECK] [key=value ...]",
      {{"variants", "LIST",
        "multirail:1:32K,multirail:4:32K,multirail:1:256K,multirail:4:256K,multirail:4:32K:system,mpi,tcp,tcp:system",
        "what is measured side by side: multirail:RAILS:CHUNK[:CC], mpi, tcp[:CC]"},
       {"msg-bytes", "BYTES", "128K", "message size"},
       {"count", "N", "40", "messages per variant"},
       {"warmup", "N", "2", "messages left out of the percentiles"},
       {"gap-ms", "MS", "30", "idle gap before each message"},
       {"both-ways", "", "", "also time the reverse direction"},
       {"load", "N", "0", "spinning threads per measured rank (CPU contention, as in training)"},
       {"max-ratio", "R", "", "exit 1 when a multirail p50 exceeds R x ideal (first message: 2R x)"}}};
  return spec;
}

namespace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- one message at a time over a channel ----

/// What a variant needs: a posted receive that completes when the whole message is there, and a
/// send that completes when the peer has acknowledged it (as the multirail transport's does).
class Channel {
 public:
  virtual ~Channel() = default;
  virtual void post_recv(std::uint8_t* buf, std::size_t n) = 0;
  virtual bool recv_done() = 0;  // non-blocking
  virtual void wait_recv() = 0;
  virtual void start_send(const std::uint8_t* buf, std::size_t n) = 0;
  virtual bool send_done() = 0;  // non-blocking
  virtual void wait_send() = 0;
  [[nodiscard]] virtual std::string note() const { return {}; }
};

class TransportChannel final : public Channel {
 public:
  TransportChannel(std::unique_ptr<PeerTransport> t, int peer) : m_t(std::move(t)), m_peer(peer) {}
  void post_recv(std::uint8_t* buf, std::size_t n) override { m_rh = m_t->irecv(m_peer, 3, buf, n); }
  bool recv_done() override { return m_t->test(m_rh); }
  void wait_recv() override { m_t->wait(m_rh); }
  void start_send(const std::uint8_t* buf, std::size_t n) override { m_sh = m_t->isend(m_peer, 3, buf, n); }
  bool send_done() override { return m_t->test(m_sh); }
  void wait_send() override { m_t->wait(m_sh); }
  [[nodiscard]] std::string note() const override {
    const TransportStats s = m_t->stats();
    if (s.peers.empty() || std::string(m_t->name()) != "multirail") return {};
    return fmt::format("resent {} chunks", s.peers.front().resent_chunks);
  }

 private:
  std::unique_ptr<PeerTransport> m_t;
  int m_peer;
  Handle m_rh, m_sh;
};

/// One blocking TCP socket (TCP_NODELAY): the receiver reads the whole message, then writes a
/// one-byte acknowledgement, which completes the sender's send. Used one way at a time only.
class TcpChannel final : public Channel {
 public:
  explicit TcpChannel(Fd fd) : m_fd(std::move(fd)) {}
  void post_recv(std::uint8_t* buf, std::size_t n) override {
    m_buf = buf;
    m_n = n;
  }
  bool recv_done() override {
    wait_recv();
    return true;
  }
  void wait_recv() override {
    for (std::size_t got = 0; got < m_n;) {
      const ssize_t r = ::recv(m_fd.get(), m_buf + got, m_n - got, 0);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        ATLAS_THROW(Comm, fmt::format("bench tcp: receive failed: {}", r == 0 ? "peer closed" : std::strerror(errno)));
      }
      got += static_cast<std::size_t>(r);
    }
    const std::uint8_t ack = 1;
    if (::send(m_fd.get(), &ack, 1, MSG_NOSIGNAL) != 1)
      ATLAS_THROW(Comm, fmt::format("bench tcp: ack send failed: {}", std::strerror(errno)));
  }
  void start_send(const std::uint8_t* buf, std::size_t n) override {
    for (std::size_t put = 0; put < n;) {
      const ssize_t w = ::send(m_fd.get(), buf + put, n - put, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        ATLAS_THROW(Comm, fmt::format("bench tcp: send failed: {}", std::strerror(errno)));
      }
      put += static_cast<std::size_t>(w);
    }
  }
  bool send_done() override {
    wait_send();
    return true;
  }
  [[nodiscard]] std::string note() const override {
    tcp_info ti{};
    socklen_t len = sizeof ti;
    if (getsockopt(m_fd.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) return {};
    return fmt::format("sender cwnd {} x {} B, ssthresh {}, srtt {:.1f} ms, retrans {}", ti.tcpi_snd_cwnd,
                       ti.tcpi_snd_mss, ti.tcpi_snd_ssthresh, ti.tcpi_rtt / 1e3, ti.tcpi_total_retrans);
  }
  void wait_send() override {
    std::uint8_t ack = 0;
    for (;;) {
      const ssize_t r = ::recv(m_fd.get(), &ack, 1, 0);
      if (r == 1) return;
      if (r < 0 && errno == EINTR) continue;
      ATLAS_THROW(Comm, fmt::format("bench tcp: ack receive failed: {}", r == 0 ? "peer closed" : std::strerror(errno)));
    }
  }

 private:
  Fd m_fd;
  std::uint8_t* m_buf = nullptr;
  std::size_t m_n = 0;
};

void set_blocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
    ATLAS_THROW(Comm, fmt::format("bench tcp: fcntl: {}", std::strerror(errno)));
}

/// Collective over `world`: the receiver listens, the sender connects. Other ranks get null.
std::unique_ptr<Channel> make_tcp(const mpi::Comm& world, const bench::Link& link, const std::string& cc) {
  const int me = world.rank();
  int port = 0;
  Fd listener;
  if (me == link.receiver) {
    listener = listen_tcp(link.host_r, 0, port);
    if (!cc.empty())
      if (const std::string why = set_congestion_control(listener.get(), cc); !why.empty())
        ATLAS_THROW(Comm, "bench tcp: " + why);
  }
  world.bcast(std::span<int>(&port, 1), link.receiver);
  Fd fd;
  if (me == 0) {
    bool in_progress = false;
    std::string err;
    fd = connect_tcp(resolve(link.host_r, port), in_progress, err, [&](int f) {
      if (!cc.empty())
        if (const std::string why = set_congestion_control(f, cc); !why.empty())
          ATLAS_THROW(Comm, "bench tcp: " + why);
    });
    if (!fd.valid()) ATLAS_THROW(Comm, "bench tcp: connect: " + err);
    pollfd pf{fd.get(), POLLOUT, 0};
    if (in_progress && poll(&pf, 1, 10000) != 1)
      ATLAS_THROW(Comm, "bench tcp: connect timed out");
    if (const std::string e = connect_error(fd.get()); !e.empty())
      ATLAS_THROW(Comm, "bench tcp: connect: " + e);
  } else if (me == link.receiver) {
    pollfd pf{listener.get(), POLLIN, 0};
    if (poll(&pf, 1, 10000) != 1) ATLAS_THROW(Comm, "bench tcp: nobody connected");
    fd = Fd(::accept(listener.get(), nullptr, nullptr));
    if (!fd.valid()) ATLAS_THROW(Comm, fmt::format("bench tcp: accept: {}", std::strerror(errno)));
  }
  if (!fd.valid()) return nullptr;
  set_blocking(fd.get());
  tune_socket(fd.get(), 0);
  return std::make_unique<TcpChannel>(std::move(fd));
}

/// Collective over `world`.
std::unique_ptr<Channel> make_channel(const mpi::Comm& world, const bench::Link& link, const Variant& v) {
  const int me = world.rank();
  if (v.kind == Kind::Tcp) return make_tcp(world, link, choose_congestion_control(v.request(link.cfg.wan)).name);
  std::vector<int> peers;
  if (me == 0) peers = {link.receiver};
  if (me == link.receiver) peers = {0};
  WanCfg w = link.cfg.wan;
  w.transport = v.kind == Kind::Mpi ? WanTransport::Mpi : WanTransport::Multirail;
  if (v.kind == Kind::Multirail) {
    w.rails = v.rails;
    w.chunk_bytes = v.chunk;
    w.max_frame_bytes = std::max(w.max_frame_bytes, v.chunk);
  }
  w.tcp_congestion = v.request(link.cfg.wan);
  std::unique_ptr<PeerTransport> t = make_transport(w, link.cfg.cluster, world, link.my_dc, peers);
  if (peers.empty()) return nullptr;
  return std::make_unique<TransportChannel>(std::move(t), peers.front());
}

// Message layout: bytes 0-7 the sender's CLOCK_MONOTONIC at isend (ns), 8-15 the message index,
// the rest a pattern of (index, offset) that the receiver checks.
void fill(std::vector<std::uint8_t>& b, std::uint64_t index) {
  std::memcpy(b.data() + 8, &index, 8);
  for (std::size_t k = 16; k < b.size(); ++k) b[k] = static_cast<std::uint8_t>(index * 131 + k * 7);
}

void check(const std::vector<std::uint8_t>& b, std::uint64_t index, const std::string& what) {
  std::uint64_t got = 0;
  std::memcpy(&got, b.data() + 8, 8);
  if (got != index)
    ATLAS_THROW(Internal, fmt::format("bench {}: message #{} arrived where #{} was expected", what, got, index));
  for (std::size_t k = 16; k < b.size(); ++k)
    if (b[k] != static_cast<std::uint8_t>(index * 131 + k * 7))
      ATLAS_THROW(Internal, fmt::format("bench {}: message #{} corrupt at byte {}", what, index, k));
}

/// `n` threads that spin on arithmetic until destroyed: the CPU contention of computing ranks.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i)
      m_threads.emplace_back([this, i] {
        volatile double x = 1.0 + i;
        while (!m_stop.load(std::memory_order_relaxed))
          for (int k = 0; k < 10000; ++k) x = x * 1.0000001 + 1e-9;
      });
  }
  ~Spinners() {
    m_stop = true;
    for (auto& t : m_threads) t.join();
  }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;

 private:
  std::atomic<bool> m_stop{false};
  std::vector<std::thread> m_threads;
};

struct Series {
  std::vector<double> one_way_ms;  // per message, receiver side (index order)
  std::vector<double> send_ms;     // per message, sender side
};

/// 1 + warmup + count messages: this rank sends when `i_send` (each after gap_ms idle) and/or
/// receives when `i_recv` (both at once with --both-ways). Records into `fwd` the one-way time of
/// each message it received and the acknowledged-send time of each it sent.
void run_series(Channel& ch, bool i_send, bool i_recv, const LatOpts& o, std::int64_t offset_ns,
                const std::string& what, Series& fwd) {
  const int total = 1 + o.warmup + o.count;
  std::vector<std::uint8_t> sbuf(o.msg_bytes), rbuf(o.msg_bytes);
  const auto gap = std::chrono::duration<double, std::milli>(o.gap_ms);
  for (int i = 0; i < total; ++i) {
    if (i_recv) ch.post_recv(rbuf.data(), rbuf.size());
    std::int64_t t_send = 0;
    if (i_send) {
      if (i > 0) std::this_thread::sleep_for(gap);
      fill(sbuf, static_cast<std::uint64_t>(i));
      t_send = now_ns();
      std::memcpy(sbuf.data(), &t_send, 8);
      ch.start_send(sbuf.data(), sbuf.size());
    }
    // Both ways: poll both (a short sleep keeps the core free); one way: block.
    bool rdone = !i_recv, sdone = !i_send;
    std::int64_t t_recv = 0, t_sent = 0;
    if (i_send && !i_recv) {
      ch.wait_send();
      t_sent = now_ns();
      sdone = true;
    } else if (i_recv && !i_send) {
      ch.wait_recv();
      t_recv = now_ns();
      rdone = true;
    }
    while (!rdone || !sdone) {
      if (!rdone && ch.recv_done()) {
        t_recv = now_ns();
        rdone = true;
      }
      if (!sdone && ch.send_done()) {
        t_sent = now_ns();
        sdone = true;
      }
      if (!rdone || !sdone) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (i_recv) {
      std::int64_t stamp = 0;
      std::memcpy(&stamp, rbuf.data(), 8);
      check(rbuf, static_cast<std::uint64_t>(i), what);
      fwd.one_way_ms.push_back(static_cast<double>(t_recv - stamp - offset_ns) / 1e6);
    }
    if (i_send) fwd.send_ms.push_back(static_cast<double>(t_sent - t_send) / 1e6);
  }
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

/// Rank `from` sends a vector of doubles to rank 0 (over MPI, not over the measured link's
/// transport).
std::vector<double> to_root(const mpi::Comm& world, int from, const std::vector<double>& v) {
  const int me = world.rank();
  if (from == 0) return v;
  int n = static_cast<int>(v.size());
  if (me == from) world.send(std::span<const int>(&n, 1), 0, 9911);
  if (me == 0) world.recv(std::span<int>(&n, 1), from, 9911);
  std::vector<double> out(static_cast<std::size_t>(n));
  if (me == from) world.send(std::span<const double>(v.data(), v.size()), 0, 9912);
  if (me == 0) world.recv(std::span<double>(out.data(), out.size()), from, 9912);
  return out;
}

}  // namespace

int run_wan_latency_bench(mpi::Environment& env, const atlas::bench::Args& args) {
  (void)env;
  const LatOpts o = opts_of(args);
  const mpi::Comm world = mpi::Comm::world();
  const int me = world.rank();
  const bench::Link link = bench::setup_link(world, o.deck, o.overrides);
  auto out = [&](const std::string& line) {
    if (me == 0) {
      std::fputs((line + "\n").c_str(), stdout);
      std::fflush(stdout);
    }
  };
  if (link.receiver < 0) {
    out("# atlas bench wan --latency: one DC only (or np = 1): no cross-DC pair to measure");
    return 0;
  }
  const int rx = link.receiver;
  const bool i_send = me == 0, i_recv = me == rx;

  // ---- a common clock: the same kernel's CLOCK_MONOTONIC, else an NTP-style offset over MPI ----
  const bool same = world.on_one_kernel();
  std::int64_t offset_ns = 0;  // receiver clock - sender clock
  std::string clock_note = "one kernel's CLOCK_MONOTONIC on both ranks (same boot id): exact";
  if (!same) {
    std::int64_t best_rtt = INT64_MAX;
    for (int k = 0; k < 16; ++k) {
      std::int64_t t[3] = {0, 0, 0};
      if (i_send) {
        t[0] = now_ns();
        world.send(std::span<const std::int64_t>(t, 1), rx, 9921);
        world.recv(std::span<std::int64_t>(t + 1, 1), rx, 9922);
        t[2] = now_ns();
        if (t[2] - t[0] < best_rtt) {
          best_rtt = t[2] - t[0];
          offset_ns = t[1] - (t[0] + t[2]) / 2;
        }
      } else if (i_recv) {
        world.recv(std::span<std::int64_t>(t, 1), 0, 9921);
        t[1] = now_ns();
        world.send(std::span<const std::int64_t>(t + 1, 1), 0, 9922);
      }
    }
    world.bcast(std::span<std::int64_t>(&offset_ns, 1), 0);
    world.bcast(std::span<std::int64_t>(&best_rtt, 1), 0);
    clock_note = fmt::format("different hosts: NTP-style offset over MPI, +/- {:.2f} ms", static_cast<double>(best_rtt) / 2e6);
  }

  const double ser_ms = link.link_bps > 0 ? static_cast<double>(o.msg_bytes) * 8 / link.link_bps * 1e3 : 0;
  const double ideal_one = link.one_way_ms + ser_ms;
  const double ideal_ack = link.rtt_ms + ser_ms;
  out("# atlas bench wan --latency: one message at a time after an idle gap, over each transport "
      "between the same two ranks on the same link");
  out(fmt::format("# link: rank 0 (dc '{}') -> rank {} (dc '{}', {}): {:.0f} Mbit/s, one-way {:.1f} ms, "
                  "RTT {:.1f} ms (deck); emulated: {}",
                  link.cfg.cluster.dcs[static_cast<std::size_t>(link.dc_s)], rx,
                  link.cfg.cluster.dcs[static_cast<std::size_t>(link.dc_r)], link.host_r,
                  link.link_bps / 1e6, link.one_way_ms, link.rtt_ms, link.emulated ? "yes" : "no"));
  out(fmt::format("# messages of {}, {} ms idle before each (after the previous send completed); "
                  "the first (fresh connections) is shown apart, then {} warm-up, then {} timed{}",
                  units::format_bytes_human(static_cast<double>(o.msg_bytes)), o.gap_ms, o.warmup,
                  o.count, o.both_ways ? "; both ranks send at once (both directions)" : ""));
  if (o.load > 0)
    out(fmt::format("# CPU contention: {} spinning thread(s) in each of the two measured ranks while they "
                    "measure (as computing pipeline stages would)", o.load));
  out(fmt::format("# ideal: one-way = latency + bytes/rate = {:.2f} ms; acknowledged send = RTT + "
                  "bytes/rate = {:.2f} ms", ideal_one, ideal_ack));
  out(fmt::format("# clock: {}; tcp congestion control: {}; per-flow window: {}; load (1-min) {} on {} CPUs",
                  clock_note, bench::tcp_congestion_control(),
                  link.cfg.wan.flow_window_bytes ? units::format_bytes_human(static_cast<double>(link.cfg.wan.flow_window_bytes)) : std::string("none"),
                  bench::loadavg(), std::thread::hardware_concurrency()));
  out(fmt::format("# {:<22} {:<6} {:>7} | {:>7} {:>7} {:>7} {:>7} | {:>7} {:>7} | {:>6} {:>6}  {}", "what (times in ms)",
                  "tcp cc", "first", "1w p50", "1w p90", "1w p99", "1w max", "ack p50", "ack p99", "1w/id", "ack/id", "notes"));

  int worst_ok = 1;
  std::vector<std::string> over;  // --max-ratio violations
  for (const Variant& v : o.variants) {
    if (v.kind == Kind::Tcp && o.both_ways) {
      out(fmt::format("  {:<29} skipped with --both-ways (one blocking socket)", v.name()));
      continue;
    }
    auto ch = make_channel(world, link, v);
    world.barrier();
    Series mine;
    std::unique_ptr<Spinners> spin;
    if ((i_send || i_recv) && o.load > 0) spin = std::make_unique<Spinners>(o.load);
    if (i_send || i_recv)
      run_series(*ch, i_send || o.both_ways, i_recv || o.both_ways, o,
                 i_recv ? offset_ns : -offset_ns, v.name(), mine);
    spin.reset();
    std::string note = ch && i_send ? ch->note() : std::string();
    world.barrier();
    ch.reset();
    // Forward direction: the receiver's one-way times and the sender's send times. With
    // --both-ways the reverse direction's are pooled in (same link, other way).
    std::vector<double> one = to_root(world, rx, i_recv ? mine.one_way_ms : std::vector<double>{});
    std::vector<double> ack = i_send ? mine.send_ms : std::vector<double>{};
    if (o.both_ways) {
      const std::vector<double> back_one = i_send ? mine.one_way_ms : std::vector<double>{};
      const std::vector<double> back_ack = to_root(world, rx, i_recv ? mine.send_ms : std::vector<double>{});
      if (me == 0) {
        // interleave per index so "first" stays the first of each direction
        std::vector<double> o2, a2;
        for (std::size_t k = 0; k < one.size(); ++k) {
          o2.push_back(one[k]);
          if (k < back_one.size()) o2.push_back(back_one[k]);
        }
        for (std::size_t k = 0; k < ack.size(); ++k) {
          a2.push_back(ack[k]);
          if (k < back_ack.size()) a2.push_back(back_ack[k]);
        }
        one.swap(o2);
        ack.swap(a2);
      }
    }
    if (me == 0) {
      const std::size_t skip = static_cast<std::size_t>(1 + o.warmup) * (o.both_ways ? 2 : 1);
      const double first = one.empty() ? 0 : one.front();
      std::vector<double> t1(one.begin() + static_cast<std::ptrdiff_t>(std::min(skip, one.size())), one.end());
      std::vector<double> ta(ack.begin() + static_cast<std::ptrdiff_t>(std::min(skip, ack.size())), ack.end());
      const double p50 = pct(t1, 0.5), a50 = pct(ta, 0.5);
      if (v.kind == Kind::Multirail && v.cc.empty()) {
        if (p50 > 1.3 * ideal_one || a50 > 1.3 * ideal_ack) worst_ok = 0;
        const double r = o.max_ratio;
        if (r > 0 && p50 > r * ideal_one)
          over.push_back(fmt::format("{}: one-way p50 {:.2f} ms > {:.1f} x {:.2f}", v.name(), p50, r, ideal_one));
        if (r > 0 && a50 > r * ideal_ack)
          over.push_back(fmt::format("{}: acknowledged send p50 {:.2f} ms > {:.1f} x {:.2f}", v.name(), a50, r, ideal_ack));
        if (r > 0 && first > 2 * r * ideal_one)
          over.push_back(fmt::format("{}: first message (fresh rails) {:.2f} ms > {:.1f} x {:.2f}", v.name(), first,
                                     2 * r, ideal_one));
      }
      const CongestionChoice cc = choose_congestion_control(v.kind == Kind::Mpi ? "system" : v.request(link.cfg.wan));
      out(fmt::format("  {:<22} {:<6} {:>7.2f} | {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} | {:>7.2f} {:>7.2f} | {:>6.2f} {:>6.2f}  {}",
                      v.name(), cc.name.empty() ? cc.system : cc.name, first, p50, pct(t1, 0.9), pct(t1, 0.99), pct(t1, 1.0), a50, pct(ta, 0.99),
                      ideal_one > 0 ? p50 / ideal_one : 0.0, ideal_ack > 0 ? a50 / ideal_ack : 0.0, note));
    }
  }
  out(fmt::format("# load (1-min) at end: {}", bench::loadavg()));
  if (me == 0)
    out(fmt::format("latency: multirail (default congestion control) p50 one-way and acknowledged send {} 1.3 x ideal ({:.2f} / {:.2f} ms)",
                    worst_ok ? "within" : "NOT within", ideal_one, ideal_ack));
  int failed = over.empty() ? 0 : 1;
  if (o.max_ratio > 0) {
    for (const std::string& line : over) out("FAIL: " + line);
    if (over.empty())
      out(fmt::format("OK: multirail p50 one-way and acknowledged send within {:.1f} x ideal, first "
                      "message within {:.1f} x",
                      o.max_ratio, 2 * o.max_ratio));
  }
  world.bcast(std::span<int>(&failed, 1), 0);
  return failed;
}

}  // namespace atlas::wan
