// SPDX-License-Identifier: MIT
// The WAN benchmark: one sender and one receiver stream fixed-size messages with a window of
// them in flight, over each transport in turn; the receiver times what arrives after a warm-up.
// iperf3 runs between the same two ranks (spawned as child processes) as the kernel's reference.
#include "atlas/wan/bench.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/wan/fd.hpp"
#include "atlas/wan/multirail.hpp"
#include "atlas/wan/transport.hpp"
#include "bench_common.hpp"

extern char** environ;

namespace atlas::wan {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kDefaultDeck =
    "cluster.dcs = dc0 dc1\n"
    "cluster.gpus_per_dc = 1 1\n"
    "parallel.stages_per_dc = 1 1\n";

struct Opts {
  std::string deck;
  std::vector<std::string> overrides;
  std::vector<int> rails = {1, 2, 4, 8, 16};
  std::vector<WanAuth> auths = {WanAuth::Mac, WanAuth::Encrypt, WanAuth::Crc};  // side by side
  double seconds = 3.0;
  double warmup = 1.0;
  double loopback_seconds = 0.5;
  int loopback_rounds = 5;
  std::uint64_t msg_bytes = units::kMiB;
  int window = 8;
  bool iperf = true;
  bool mpi = true;
  bool loopback = true;
};

Opts opts_of(const atlas::bench::Args& a) {
  Opts o;
  o.deck = a.deck();
  o.overrides = a.overrides;
  if (a.positional.size() > 1) a.fail("unknown argument '" + a.positional[1] + "' (one DECK at most)");
  if (a.given("rails")) {
    o.rails.clear();
    for (const std::string& v : a.list("rails")) {
      const auto n = units::parse_int(v);
      if (!n || *n < 1 || *n > deck::limits::kMaxRails)
        a.fail(fmt::format("--rails needs a list like 1,2,4,8,16 (1..{})", deck::limits::kMaxRails));
      o.rails.push_back(static_cast<int>(*n));
    }
    if (o.rails.empty())
      a.fail(fmt::format("--rails needs a list like 1,2,4,8,16 (1..{})", deck::limits::kMaxRails));
  }
  if (a.given("auth")) {
    o.auths.clear();
    for (const std::string& m : a.list("auth")) {
      if (m == "mac") o.auths.push_back(WanAuth::Mac);
      else if (m == "encrypt") o.auths.push_back(WanAuth::Encrypt);
      else if (m == "crc") o.auths.push_back(WanAuth::Crc);
      else a.fail("--auth needs a list of mac, encrypt, crc (e.g. mac,crc), got '" + a.text("auth") + "'");
    }
    if (o.auths.empty()) a.fail("--auth needs a list of mac, encrypt, crc (e.g. mac,crc), got ''");
  }
  auto positive = [&](const char* name) {
    const std::string v = a.text(name);
    const auto d = units::parse_double(v);
    if (!d || *d <= 0) a.fail(fmt::format("--{} needs a positive number, got '{}'", name, v));
    return *d;
  };
  o.seconds = positive("seconds");
  o.warmup = positive("warmup");
  o.loopback_seconds = positive("loopback-seconds");
  o.loopback_rounds = a.integer("loopback-rounds", 1, 100);
  o.msg_bytes = a.bytes("msg-bytes", 8, 16 * units::kGiB);
  o.window = a.integer("window", 1, 64);
  o.iperf = !a.flag("no-iperf");
  o.mpi = !a.flag("no-mpi");
  o.loopback = !a.flag("no-loopback");
  return o;
}

}  // namespace

const atlas::bench::Spec& wan_bench_spec() {
  static const atlas::bench::Spec spec{
      "wan",
      "multi-rail TCP vs one rail vs Open MPI vs iperf3 on the (emulated) WAN link (--latency: atlas bench latency)",
      "[DECK] [key=value ...]",
      {{"rails", "LIST", "1,2,4,8,16", "rail counts measured side by side"},
       {"auth", "LIST", "mac,encrypt,crc", "frame protections measured side by side"},
       {"seconds", "S", "3", "measured time per transport"},
       {"warmup", "S", "1", "time streamed before measuring"},
       {"msg-bytes", "BYTES", "1M", "message size"},
       {"window", "N", "8", "messages in flight"},
       {"loopback-seconds", "S", "0.5", "in-process loopback check: time per round"},
       {"loopback-rounds", "N", "5", "in-process loopback check: rounds"},
       {"no-iperf", "", "", "leave out iperf3"},
       {"no-mpi", "", "", "leave out the Open MPI baseline"},
       {"no-loopback", "", "", "leave out the in-process loopback check"}}};
  return spec;
}

namespace {

// ---- one measurement: a stream of messages, `window` in flight ----
// Byte 0 of each message: 1 = data, 0 = last data, 2 = drain (matches the receiver's extra
// posted irecvs so nothing is left pending). The receiver decides when it has measured enough
// (at least `seconds` after the warm-up and at least kMinWindows windows of messages, so bursty
// completions cannot skew the rate) and tells the sender to stop through a StopChannel.

constexpr int kMinWindows = 5;

/// The receiver's "enough" signal to the sender: sent exactly once per measurement.
class StopChannel {
 public:
  virtual ~StopChannel() = default;
  virtual bool requested() = 0;  // sender: has the receiver said stop?
  virtual void request() = 0;    // receiver
  virtual void finish() = 0;     // sender, after the stream: consume the signal if not seen yet
};

/// Between two ranks over MPI (not over the transport being measured).
class MpiStop final : public StopChannel {
 public:
  MpiStop(const mpi::Comm& world, int other) : m_world(world), m_other(other) {}
  bool requested() override {
    if (m_seen) return true;
    int flag = 0;
    ATLAS_MPI_CHECK(MPI_Iprobe(m_other, kTag, m_world.get(), &flag, MPI_STATUS_IGNORE));
    if (flag) consume();
    return m_seen;
  }
  void request() override {
    if (m_sent) return;
    m_sent = true;
    int one = 1;
    ATLAS_MPI_CHECK(MPI_Send(&one, 1, MPI_INT, m_other, kTag, m_world.get()));
  }
  void finish() override {
    if (!m_seen) consume();
  }

 private:
  void consume() {
    int v = 0;
    ATLAS_MPI_CHECK(MPI_Recv(&v, 1, MPI_INT, m_other, kTag, m_world.get(), MPI_STATUS_IGNORE));
    m_seen = true;
  }
  static constexpr int kTag = 9901;
  const mpi::Comm& m_world;
  int m_other;
  bool m_seen = false;
  bool m_sent = false;
};

/// Between two threads of one process (the loopback check).
class FlagStop final : public StopChannel {
 public:
  bool requested() override { return m_flag.load(); }
  void request() override { m_flag.store(true); }
  void finish() override {}

 private:
  std::atomic<bool> m_flag{false};
};

/// Returns true when it stopped at the hard time cap rather than on the receiver's signal.
bool send_stream(PeerTransport& t, int peer, const Opts& o, double cap_s, StopChannel& stop) {
  const std::size_t w = static_cast<std::size_t>(o.window);
  std::vector<std::vector<std::uint8_t>> bufs(w, std::vector<std::uint8_t>(o.msg_bytes, 0x5A));
  std::deque<std::pair<std::size_t, Handle>> inflight;
  auto post = [&](std::size_t slot, std::uint8_t flag) {
    bufs[slot][0] = flag;
    inflight.emplace_back(slot, t.isend(peer, 1, bufs[slot].data(), o.msg_bytes));
  };
  const auto cap = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cap_s));
  bool capped = false;
  for (std::size_t s = 0; s < w; ++s) post(s, 1);
  std::size_t free_slot = 0;
  for (;;) {
    auto [slot, h] = std::move(inflight.front());
    inflight.pop_front();
    t.wait(h);
    capped = Clock::now() > cap;
    if (!stop.requested() && !capped) {
      post(slot, 1);
      continue;
    }
    free_slot = slot;
    break;
  }
  for (auto& [slot, h] : inflight) t.wait(h);
  inflight.clear();
  post(free_slot, 0);
  t.wait(inflight.front().second);
  inflight.clear();
  for (std::size_t s = 1; s < w; ++s) post(s, 2);
  for (auto& [slot, h] : inflight) t.wait(h);
  stop.finish();
  return capped;
}

/// Bytes per second that arrived after the warm-up.
double recv_stream(PeerTransport& t, int peer, const Opts& o, double warmup, double seconds,
                   StopChannel& stop) {
  const std::size_t w = static_cast<std::size_t>(o.window);
  std::vector<std::vector<std::uint8_t>> bufs(w, std::vector<std::uint8_t>(o.msg_bytes));
  std::deque<std::pair<std::size_t, Handle>> posted;
  const auto t0 = Clock::now();
  for (std::size_t s = 0; s < w; ++s) posted.emplace_back(s, t.irecv(peer, 1, bufs[s].data(), o.msg_bytes));
  Clock::time_point warm{}, last{};
  bool warmed = false, stopped = false;
  std::uint64_t bytes_warm = 0, bytes = 0, since_warm = 0;
  while (!posted.empty()) {
    auto [slot, h] = std::move(posted.front());
    posted.pop_front();
    t.wait(h);
    const std::uint8_t flag = bufs[slot][0];
    if (flag != 1) {
      if (flag == 0) {
        stopped = true;
        stop.request();  // no-op if already sent
      }
      continue;
    }
    if (stopped) ATLAS_THROW(Internal, "bench: data message after the last one");
    const auto now = Clock::now();
    bytes += o.msg_bytes;
    if (!warmed && std::chrono::duration<double>(now - t0).count() >= warmup) {
      warmed = true;
      warm = now;
      bytes_warm = bytes;
    } else if (warmed) {
      ++since_warm;
      last = now;
      if (std::chrono::duration<double>(now - warm).count() >= seconds &&
          since_warm >= static_cast<std::uint64_t>(kMinWindows) * w)
        stop.request();
    }
    posted.emplace_back(slot, t.irecv(peer, 1, bufs[slot].data(), o.msg_bytes));
  }
  if (!warmed || since_warm == 0 || last <= warm) return 0.0;
  return static_cast<double>(bytes - bytes_warm) / std::chrono::duration<double>(last - warm).count();
}

// ---- iperf3 ----

bool on_path(const char* prog) {
  const std::optional<std::string> path = env::get("PATH");
  if (!path) return false;
  const std::string& p = *path;
  std::size_t pos = 0;
  while (pos <= p.size()) {
    const std::size_t c = std::min(p.find(':', pos), p.size());
    const std::string f = p.substr(pos, c - pos) + "/" + prog;
    if (access(f.c_str(), X_OK) == 0) return true;
    pos = c + 1;
  }
  return false;
}

pid_t spawn(const std::vector<std::string>& argv, int stdout_fd) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdout_fd >= 0) posix_spawn_file_actions_adddup2(&fa, stdout_fd, STDOUT_FILENO);
  else posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

/// Runs the iperf3 client; returns received bits/s from its JSON report (0 on failure). Bounded:
/// a client still running kIperfMarginS after its test should have ended (a link that drops every
/// packet, a server that never answers) is killed and counts as a failure.
constexpr double kIperfMarginS = 15.0;
double iperf_client(const std::string& host, int port, int flows, double seconds, double warmup) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return 0;
  const int t = std::max(1, static_cast<int>(seconds + 0.5)), o = std::max(0, static_cast<int>(warmup + 0.5));
  const pid_t pid = spawn({"iperf3", "-c", host, "-p", std::to_string(port), "-P", std::to_string(flows), "-t",
                           std::to_string(t), "-O", std::to_string(o), "-J"},
                          pipefd[1]);
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(t + o + kIperfMarginS);
  bool late = false;
  while (true) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      late = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close(pipefd[0]);
  if (late && pid > 0) {
    kill(pid, SIGKILL);
    log::warn("bench wan: iperf3 -c {} did not finish within {:.0f} s of its {} s test: killed, counted as failed",
              host, kIperfMarginS, t + o);
  }
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  if (late) return 0;
  const auto at = out.find("\"sum_received\"");
  if (at == std::string::npos) return 0;
  const auto b = out.find("\"bits_per_second\":", at);
  if (b == std::string::npos) return 0;
  return std::strtod(out.c_str() + b + 18, nullptr);
}

const char* auth_str(WanAuth a) {
  return a == WanAuth::Mac ? "mac" : a == WanAuth::Encrypt ? "encrypt" : "crc";
}

FrameAuth frame_auth(WanAuth a) {
  return a == WanAuth::Mac ? FrameAuth::Mac : a == WanAuth::Encrypt ? FrameAuth::Encrypt : FrameAuth::Crc;
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/// Frame protection alone on one core: bytes per second to seal, and to open, frames of `len`
/// bytes for about `seconds` each.
std::pair<double, double> crypto_rate(FrameAuth auth, std::size_t len, double seconds) {
  Secret secret{};
  random_bytes(secret);
  FrameKey key{};
  hkdf_sha256(secret, {}, {}, key);
  FrameSealer tx(auth, key);
  FrameOpener rx(auth, key);
  std::vector<std::uint8_t> payload(len, 0x5A), wire(len);
  std::vector<std::array<std::uint8_t, kHeaderBytes>> hdrs;
  FrameHeader h;
  h.length = static_cast<std::uint32_t>(len);
  std::array<std::uint8_t, kHeaderBytes> proto{};
  encode_header(h, proto);
  const auto t0 = Clock::now();
  double el = 0;
  while (el < seconds && hdrs.size() < (1u << 20)) {  // bounded memory for tiny frames
    auto hdr = proto;
    tx.seal(hdr, payload, wire.data());
    hdrs.push_back(hdr);
    el = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double seal = static_cast<double>(hdrs.size() * len) / el;
  const auto t1 = Clock::now();
  for (const auto& hdr : hdrs) {
    if (!rx.open_header(hdr).empty())
      ATLAS_THROW(Internal, "bench: a sealed frame failed its header tag");
    (void)rx.open_payload(wire.data(), len);  // one ciphertext for all: only the time counts
  }
  const double open = static_cast<double>(hdrs.size() * len) /
                      std::chrono::duration<double>(Clock::now() - t1).count();
  return {seal, open};
}

int free_port(const std::string& host) {
  int port = 0;
  Fd probe = listen_tcp(host, 0, port);
  return port;
}

// ---- printing ----

struct Row {
  std::string what;
  WanAuth auth = WanAuth::Mac;  // multirail rows
  int flows = 1;
  double bytes_per_s = 0;
  std::string note;
};

}  // namespace

int run_wan_bench(mpi::Environment& env, const std::vector<std::string>& args) {
  std::vector<std::string> words = args;
  const auto latency = std::find(words.begin(), words.end(), "--latency");
  const bool lat = latency != words.end();
  if (lat) words.erase(latency);
  const atlas::bench::Args parsed = atlas::bench::parse(lat ? wan_latency_bench_spec() : wan_bench_spec(), words);
  if (env.world_rank() == 0) {
    fmt::print("{}", atlas::bench::header(parsed));
    std::fflush(stdout);
  }
  return lat ? run_wan_latency_bench(env, parsed) : run_wan_bench(env, parsed);
}

int run_wan_bench(mpi::Environment& env, const atlas::bench::Args& args) {
  const Opts o = opts_of(args);
  const mpi::Comm world = mpi::Comm::world();
  const int me = world.rank();
  (void)env;
  using bench::idle_barrier;
  using bench::idle_bcast;

  const bench::Link link = bench::setup_link(world, o.deck, o.overrides);
  const Config& cfg = link.cfg;
  const ClusterCfg& cl = cfg.cluster;
  const int my_dc = link.my_dc;
  const int receiver = link.receiver;
  const int dc_s = link.dc_s;
  const int dc_r = link.dc_r;
  const bool emulated = link.emulated;
  const double link_bps = link.link_bps;
  const double rtt_ms = link.rtt_ms;
  const std::string& host_r = link.host_r;

  auto out = [&](const std::string& line) {
    if (me == 0) {
      std::fputs((line + "\n").c_str(), stdout);
      std::fflush(stdout);
    }
  };
  auto mbit = [](double bytes_per_s) { return bytes_per_s * 8 / 1e6; };
  auto fraction = [&](double bytes_per_s) {
    return emulated && link_bps > 0 ? fmt::format("{:.2f}", bytes_per_s * 8 / link_bps) : std::string("n/a");
  };

  // ---- header ----
  out("# atlas bench wan: multirail vs MPI vs iperf3 between the same two ranks, same link");
  if (receiver >= 0) {
    out(fmt::format("# link: rank 0 (dc '{}') -> rank {} (dc '{}', {}): {:.0f} Mbit/s, RTT {:.1f} ms "
                    "(deck); emulated: {}",
                    cl.dcs[static_cast<std::size_t>(dc_s)], receiver, cl.dcs[static_cast<std::size_t>(dc_r)],
                    host_r, link_bps / 1e6, rtt_ms,
                    emulated ? "yes (network namespaces, scripts/wan)" : "no (plain TCP, fractions n/a)"));
    if (cfg.wan.flow_window_bytes > 0)
      out(fmt::format("# per-flow limit: every TCP flow's window capped at {} by the namespaces' "
                      "net.ipv4.tcp_rmem/tcp_wmem (wan.flow_window_bytes): about {:.0f} Mbit/s per "
                      "flow at this RTT",
                      units::format_bytes_human(static_cast<double>(cfg.wan.flow_window_bytes)),
                      rtt_ms > 0 ? static_cast<double>(cfg.wan.flow_window_bytes) * 8 / (rtt_ms / 1e3) / 1e6 : 0.0));
    else
      out("# per-flow limit: none (wan.flow_window_bytes = 0): one TCP flow may fill the link");
    out(fmt::format("# streamed messages of {}, {} in flight, wan.chunk_bytes {}; per row {:.1f} s "
                    "warm-up, then at least {:.1f} s and {} messages timed at the receiver",
                    units::format_bytes_human(static_cast<double>(o.msg_bytes)), o.window,
                    units::format_bytes_human(static_cast<double>(cfg.wan.chunk_bytes)), o.warmup,
                    o.seconds, kMinWindows * o.window));
  } else {
    out("# one DC only (or np = 1): no cross-DC pair to measure; loopback check only");
  }

  using bench::loadavg;
  out(fmt::format("# machine load (1-min average) at start: {} on {} CPUs", loadavg(),
                  std::thread::hardware_concurrency()));

  std::vector<Row> rows;
  const double cap_s = std::max(60.0, 4 * (o.warmup + o.seconds));
  auto pair_run = [&](PeerTransport* t) -> double {
    double rate = 0;
    int capped = 0;
    if (me == 0) {
      MpiStop stop(world, receiver);
      capped = send_stream(*t, receiver, o, cap_s, stop) ? 1 : 0;
    }
    if (me == receiver) {
      MpiStop stop(world, 0);
      rate = recv_stream(*t, 0, o, o.warmup, o.seconds, stop);
    }
    idle_bcast(world, rate, receiver);
    if (capped) out(fmt::format("  (this row stopped at the {:.0f} s cap before {} windows were measured)", cap_s, kMinWindows));
    return rate;
  };

  if (receiver >= 0) {
    out(fmt::format("# {:<28} {:>6} {:>10} {:>9}  {}", "what", "flows", "Mbit/s", "fraction", "notes"));
    std::vector<int> peers;
    if (me == 0) peers = {receiver};
    if (me == receiver) peers = {0};
    // ---- multirail at each frame protection and rail count ----
    for (WanAuth auth : o.auths)
    for (int rails : o.rails) {
      WanCfg w = cfg.wan;
      w.transport = WanTransport::Multirail;
      w.auth = auth;
      w.rails = rails;
      auto t = make_transport(w, cl, world, my_dc, peers);
      world.barrier();
      const double rate = pair_run(t.get());
      std::string note;
      if (me == 0) {
        const PeerStats s = t->stats().peers.at(0);
        std::uint64_t lo = UINT64_MAX, hi = 0;
        for (const auto& r : s.rails) {
          lo = std::min(lo, r.bytes_sent);
          hi = std::max(hi, r.bytes_sent);
        }
        note = fmt::format("rail bytes min/max {:.2f}; resent {} chunks", hi ? static_cast<double>(lo) / static_cast<double>(hi) : 1.0,
                           s.resent_chunks);
      }
      world.barrier();
      t.reset();
      rows.push_back({fmt::format("multirail {} rails={}", auth_str(auth), rails), auth, rails, rate, note});
      out(fmt::format("  {:<28} {:>6} {:>10.1f} {:>9}  {}", rows.back().what, rails, mbit(rate), fraction(rate), note));
    }
    // ---- MPI ----
    if (o.mpi) {
      WanCfg w = cfg.wan;
      w.transport = WanTransport::Mpi;
      auto t = make_transport(w, cl, world, my_dc, peers);
      world.barrier();
      const double rate = pair_run(t.get());
      world.barrier();
      t.reset();
      rows.push_back({"mpi (Open MPI, one TCP conn)", WanAuth::Crc, 1, rate, ""});
      out(fmt::format("  {:<28} {:>6} {:>10.1f} {:>9}", rows.back().what, 1, mbit(rate), fraction(rate)));
    }
    // ---- iperf3 ----
    int have_iperf = (me == 0 || me == receiver) ? (on_path("iperf3") ? 1 : 0) : 1;
    have_iperf = world.allreduce(have_iperf, MPI_MIN);
    if (o.iperf && !have_iperf) out("  iperf3: not found on PATH on both ranks (Debian: iperf3): skipped");
    if (o.iperf && have_iperf) {
      for (int flows : o.rails) {
        int port = 0;
        pid_t server = -1;
        if (me == receiver) {
          port = free_port(host_r);
          server = spawn({"iperf3", "-s", "-1", "-B", host_r, "-p", std::to_string(port)}, -1);
          std::this_thread::sleep_for(std::chrono::milliseconds(400));
        }
        world.bcast(std::span<int>(&port, 1), receiver);
        double bps = 0;
        if (me == 0) bps = iperf_client(host_r, port, flows, o.seconds, o.warmup);
        idle_bcast(world, bps, 0);
        if (me == receiver && server > 0) {
          int status = 0;
          const auto deadline = Clock::now() + std::chrono::seconds(5);
          while (waitpid(server, &status, WNOHANG) == 0) {
            if (Clock::now() > deadline) {  // TERM, then KILL: never an unbounded wait on it
              kill(server, SIGTERM);
              const auto hard = Clock::now() + std::chrono::seconds(2);
              bool reaped = false;
              while (!(reaped = waitpid(server, &status, WNOHANG) != 0) && Clock::now() < hard)
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
              if (!reaped) {  // only a child not reaped yet: a reaped pid may be another process's now
                kill(server, SIGKILL);
                waitpid(server, &status, 0);
              }
              break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }
        world.barrier();
        rows.push_back({fmt::format("iperf3 -P {}", flows), WanAuth::Crc, flows, bps / 8, bps > 0 ? "" : "failed"});
        out(fmt::format("  {:<28} {:>6} {:>10.1f} {:>9}  {}", rows.back().what, flows, bps / 1e6,
                        fraction(bps / 8), rows.back().note));
      }
    }
  }

  // ---- loopback overhead check: one process, two transports on 127.0.0.1 ----
  std::string loop_line;
  if (o.loopback && emulated && env::get("ATLAS_WAN_EMULATED")) {
    // Inside a DC namespace the emulation's per-flow window (tcp_rmem/tcp_wmem) caps loopback
    // sockets too, so this would not be the plain-loopback overhead check.
    out("# loopback overhead check: skipped inside the emulation (its per-flow window caps "
        "loopback sockets too); scripts/wan/bench_wan.sh runs it outside the namespaces");
  } else if (o.loopback) {
    out(fmt::format("# loopback overhead check (rank 0 alone: two multirail transports in one process "
                    "on 127.0.0.1, no emulation; best of {} interleaved rounds of {:.1f} s): more "
                    "rails must not be slower than one",
                    o.loopback_rounds, o.loopback_seconds));
    if (me == 0) {
      // Interleaved rounds, best of each: the machine may be shared, and a transient burst of
      // other work must not pass for transport overhead.
      Opts lo = o;
      constexpr double kWarm = 0.1;
      struct LoopPair {
        std::unique_ptr<MultirailTransport> a, b;
        int rails = 1;
        WanAuth auth = WanAuth::Mac;
      };
      std::vector<LoopPair> pairs;
      for (WanAuth auth : o.auths)
      for (int rails : o.rails) {
        MultirailOptions mo = rail_options(cfg.wan);  // the deck's switches, as make_transport
        mo.auth = frame_auth(auth);                   // the variants measured side by side
        mo.rails = rails;
        random_bytes(mo.secret);
        MultirailOptions ma = mo, mb = mo;
        ma.my_rank = 0;
        mb.my_rank = 1;
        LoopPair lp{std::make_unique<MultirailTransport>(ma, std::vector<int>{1}),
                    std::make_unique<MultirailTransport>(mb, std::vector<int>{0}), rails, auth};
        lp.a->connect({{1, "127.0.0.1", lp.b->listen_port()}});
        lp.b->connect({{0, "127.0.0.1", lp.a->listen_port()}});
        lp.a->wait_connected();
        lp.b->wait_connected();
        pairs.push_back(std::move(lp));
      }
      std::vector<double> rates(pairs.size(), 0.0);
      std::vector<double> per_core(pairs.size(), 0.0);  // of the best round
      for (int round = 0; round < o.loopback_rounds; ++round)
        for (std::size_t i = 0; i < pairs.size(); ++i) {
          double rate = 0;
          FlagStop stop;
          const double cpu0 = cpu_seconds();
          const auto w0 = Clock::now();
          std::thread rx([&] { rate = recv_stream(*pairs[i].b, 0, lo, kWarm, o.loopback_seconds, stop); });
          send_stream(*pairs[i].a, 1, lo, cap_s, stop);
          rx.join();
          // Cores busy on average in the round (both transports and both application threads).
          const double cores = (cpu_seconds() - cpu0) / std::chrono::duration<double>(Clock::now() - w0).count();
          if (rate > rates[i]) {
            rates[i] = rate;
            per_core[i] = cores > 0 ? rate / cores : 0.0;
          }
        }
      for (std::size_t i = 0; i < rates.size(); ++i) {
        // How the sender spread its bytes: rails that carried at least 1% of them.
        const TransportStats st = pairs[i].a->stats();
        std::uint64_t total = 0;
        int busy = 0;
        for (const auto& r : st.peers.at(0).rails) total += r.bytes_sent;
        for (const auto& r : st.peers.at(0).rails) busy += total > 0 && r.bytes_sent * 100 >= total;
        out(fmt::format("  {:<28} {:>6} {:>10.1f}   ({} of {} rails carried >= 1% of the bytes; "
                        "{:.2f} GB/s per busy core)",
                        fmt::format("loopback {} rails={}", auth_str(pairs[i].auth), pairs[i].rails),
                        pairs[i].rails, mbit(rates[i]), busy, pairs[i].rails, per_core[i] / 1e9));
      }
      // Frame protection side by side: each mode against crc at the same rail count.
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (pairs[i].auth == WanAuth::Crc) continue;
        for (std::size_t j = 0; j < pairs.size(); ++j)
          if (pairs[j].auth == WanAuth::Crc && pairs[j].rails == pairs[i].rails && rates[j] > 0)
            out(fmt::format("  loopback {} / crc at rails={}: {:.2f} x", auth_str(pairs[i].auth),
                            pairs[i].rails, rates[i] / rates[j]));
      }
      for (WanAuth a : o.auths) {
        if (a == WanAuth::Crc) continue;
        const auto [seal, open] = crypto_rate(frame_auth(a), cfg.wan.chunk_bytes, 0.2);
        out(fmt::format("  frame protection alone, one core, {} frames: {} seal {:.2f} GB/s, open "
                          "{:.2f} GB/s",
                          units::format_bytes_human(static_cast<double>(cfg.wan.chunk_bytes)),
                          auth_str(a), seal / 1e9, open / 1e9));
      }
      // The rail-count check, on the first protection mode listed.
      double worst = 1e300;
      int worst_rails = 0;
      double r1 = 0;
      for (std::size_t i = 0; i < rates.size(); ++i) {
        if (pairs[i].auth != o.auths.front()) continue;
        if (pairs[i].rails == 1) r1 = rates[i];
        if (pairs[i].rails != 1 && rates[i] < worst) {
          worst = rates[i];
          worst_rails = pairs[i].rails;
        }
      }
      const auto one = std::find(o.rails.begin(), o.rails.end(), 1);
      if (one != o.rails.end() && worst_rails > 0) {
        loop_line = fmt::format("loopback: slowest rails={} is {:.2f} x rails=1 ({:.0f} vs {:.0f} Mbit/s): {}",
                                worst_rails, worst / r1, mbit(worst), mbit(r1),
                                worst >= 0.9 * r1 ? "OK (not slower, 10% noise allowed)" : "SLOWER than rails=1");
      } else {
        loop_line = "loopback: needs rails=1 and another rail count in --rails to compare";
      }
      out(loop_line);
    }
    idle_barrier(world);
  }

  out(fmt::format("# machine load (1-min average) at end: {}", loadavg()));
  // ---- the verdict line (last) ----
  if (receiver >= 0 && me == 0) {
    const Row* best = nullptr;
    const Row* one = nullptr;
    const Row* mpi_row = nullptr;
    for (const Row& r : rows) {
      if (r.what.rfind("multirail", 0) == 0 && r.auth == o.auths.front()) {
        if (!best || r.bytes_per_s > best->bytes_per_s) best = &r;
        if (r.flows == 1) one = &r;
      }
      if (r.what.rfind("mpi", 0) == 0) mpi_row = &r;
    }
    if (best) {
      auto ratio = [&](const Row* base) {
        return base && base->bytes_per_s > 0 ? fmt::format("{:.2f}", best->bytes_per_s / base->bytes_per_s)
                                             : std::string("n/a");
      };
      // Each protection mode against crc at the same rail count (the goal: >= 0.95).
      for (const Row& r : rows)
        if (r.what.rfind("multirail", 0) == 0 && r.auth != WanAuth::Crc)
          for (const Row& c : rows)
            if (c.what.rfind("multirail", 0) == 0 && c.auth == WanAuth::Crc && c.flows == r.flows &&
                c.bytes_per_s > 0)
              out(fmt::format("auth {} / crc at rails={}: {:.2f} x", auth_str(r.auth), r.flows,
                              r.bytes_per_s / c.bytes_per_s));
      out(fmt::format("best: auth={} rails={} fraction={} vs rails=1: {} x vs mpi: {} x",
                      auth_str(best->auth), best->flows, fraction(best->bytes_per_s), ratio(one),
                      ratio(mpi_row)));
    }
  }
  return 0;
}

// ---- shared by the WAN benchmarks (bench_common.hpp) ----

namespace bench {

Link setup_link(const mpi::Comm& world, const std::string& deck_path,
                const std::vector<std::string>& overrides) {
  const int me = world.rank();
  const int np = world.size();
  // The deck is read on rank 0 and broadcast; only its cluster.* and wan.* keys matter here, so it
  // is parsed (every rank alike) but not validated against a training layout.
  std::string text = kDefaultDeck;
  if (!deck_path.empty()) {
    if (me == 0) {
      try {
        text = deck::read_text_file(deck_path);
      } catch (const ConfigError& e) {
        text = std::string("\x01") + e.what();
      }
    }
    world.bcast_string(text, 0);
    if (!text.empty() && text[0] == '\x01') throw ConfigError(text.substr(1));
  }
  Link link;
  link.cfg = deck::parse(deck_path.empty() ? "(built-in bench deck)" : deck_path, text, overrides);
  const Config& cfg = link.cfg;
  const ClusterCfg& cl = cfg.cluster;
  const int ndc = cl.dc_count();

  // ---- which DC each rank is in ----
  int my_dc = 0;
  if (const std::optional<std::string> e = env::get("ATLAS_WAN_DC")) {
    const auto v = units::parse_int(*e);
    if (!v || *v < 0 || *v >= ndc)
      ATLAS_THROW(Usage, fmt::format("ATLAS_WAN_DC='{}' is not a DC index of the deck (0..{})", *e, ndc - 1));
    my_dc = static_cast<int>(*v);
  } else if (cfg.parallel.world_size() == np &&
             cfg.parallel.stages_per_dc.size() == static_cast<std::size_t>(ndc)) {
    int first = 0;
    for (int d = 0; d < ndc; ++d) {
      const int n = cfg.parallel.stages_per_dc[static_cast<std::size_t>(d)] * cfg.parallel.dp_size *
                    cfg.parallel.tp_size;
      if (me >= first && me < first + n) my_dc = d;
      first += n;
    }
  } else {
    my_dc = me * ndc / np;
  }
  link.my_dc = my_dc;
  const std::vector<int> dcs = world.allgather(my_dc);
  for (int r = 1; r < np && link.receiver < 0; ++r)
    if (dcs[static_cast<std::size_t>(r)] != dcs[0]) link.receiver = r;
  const int receiver = link.receiver;
  link.dc_s = dcs[0];
  link.dc_r = receiver >= 0 ? dcs[static_cast<std::size_t>(receiver)] : link.dc_s;
  link.emulated = env::get("ATLAS_WAN_EMULATED") == "1" ||
                  cfg.wan.emulate == WanEmulation::Netns;
  if (receiver >= 0) {
    link.link_bps = cl.bandwidth(link.dc_s, link.dc_r) * 1e9;
    link.one_way_ms = cl.latency(link.dc_s, link.dc_r);
    link.rtt_ms = link.one_way_ms + cl.latency(link.dc_r, link.dc_s);
  }
  link.host_r = cl.bind_hosts.empty() ? "127.0.0.1"
                : cl.bind_hosts[cl.bind_hosts.size() == 1 ? 0 : static_cast<std::size_t>(link.dc_r)];
  if (const auto e = env::get("ATLAS_WAN_BIND_HOST"); e && me == receiver) link.host_r = *e;
  if (receiver >= 0) world.bcast_string(link.host_r, receiver);
  return link;
}

// Open MPI busy-polls inside blocking collectives. A rank that waits through someone else's long
// phase (the loopback check, an iperf3 run) would burn a core the measured processes need, so
// long waits use the non-blocking collective and sleep between tests.

void idle_wait(MPI_Request& req) {
  for (;;) {
    int done = 0;
    ATLAS_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void idle_barrier(const mpi::Comm& world) {
  MPI_Request req = MPI_REQUEST_NULL;
  ATLAS_MPI_CHECK(MPI_Ibarrier(world.get(), &req));
  idle_wait(req);
}

void idle_bcast(const mpi::Comm& world, double& value, int root) {
  MPI_Request req = MPI_REQUEST_NULL;
  ATLAS_MPI_CHECK(MPI_Ibcast(&value, 1, MPI_DOUBLE, root, world.get(), &req));
  idle_wait(req);
}

std::string loadavg() {
  std::string s = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) s = std::string(buf).substr(0, std::string(buf).find(' '));
    std::fclose(f);
  }
  return s;
}

std::string tcp_congestion_control() {
  std::string s = "?";
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) {
      s = buf;
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    }
    std::fclose(f);
  }
  return s;
}

}  // namespace bench

}  // namespace atlas::wan
