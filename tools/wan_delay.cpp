// SPDX-License-Identifier: MIT
// atlas-wan-delay: the WAN emulation's one-way delay. Reads one netfilter queue (NFQUEUE, fed by
// an iptables rule on the receiving DC namespace's INPUT hook) and accepts each packet after a
// fixed delay, in arrival order (FIFO). No --queue-bypass: if this program dies, packets drop
// and the link visibly breaks instead of silently losing its delay. Not a rate limiter (tc does
// that). Packets due within min(50 us, 1% of the delay) of each other leave together (one
// wake-up, one batch verdict). Usage: atlas-wan-delay --queue N --delay-ms D [--max-packets P]
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

#include "atlas/core/units.hpp"

#if ATLAS_HAVE_NFQ
extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
}
#endif

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int usage(const char* why) {
  std::fprintf(stderr,
               "atlas-wan-delay: %s\n"
               "usage: atlas-wan-delay --queue N --delay-ms D [--max-packets P]\n"
               "  Delays every packet of netfilter queue N by D ms (FIFO). Run it inside the\n"
               "  receiving namespace, then add: iptables -A INPUT ... -j NFQUEUE --queue-num N\n",
               why);
  return 1;
}

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

#if ATLAS_HAVE_NFQ
struct Held {
  std::uint32_t id;
  std::int64_t release_ns;
};

struct State {
  std::deque<Held> held;
  std::int64_t delay_ns = 0;
  std::uint64_t packets = 0;
  std::size_t max_depth = 0;
};

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* st = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (!ph) return 0;
  st->held.push_back({ntohl(ph->packet_id), now_ns() + st->delay_ns});
  ++st->packets;
  if (st->held.size() > st->max_depth) st->max_depth = st->held.size();
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  long queue = -1;
  double delay_ms = -1;
  long max_packets = 200000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--queue") {
      const auto n = atlas::units::parse_int(v);
      if (!n || *n < 0 || *n > 65535) return usage("--queue needs 0..65535");
      queue = static_cast<long>(*n);
    } else if (a == "--delay-ms") {
      const auto d = atlas::units::parse_double(v);
      if (!d || *d < 0 || *d > 60000) return usage("--delay-ms needs 0..60000");
      delay_ms = *d;
    } else if (a == "--max-packets") {
      const auto n = atlas::units::parse_int(v);
      if (!n || *n < 1024) return usage("--max-packets needs >= 1024");
      max_packets = static_cast<long>(*n);
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  if (queue < 0 || delay_ms < 0) return usage("--queue and --delay-ms are required");
#if !ATLAS_HAVE_NFQ
  (void)max_packets;
  std::fprintf(stderr, "atlas-wan-delay: built without libnetfilter-queue (Debian: "
                       "libnetfilter-queue-dev); WAN delay emulation is unavailable\n");
  return 3;
#else
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  State st;
  st.delay_ns = static_cast<std::int64_t>(delay_ms * 1e6);
  // Early release allowed to batch packets: 50 us, at most 1% of the delay.
  const std::int64_t slack_ns = std::min<std::int64_t>(50000, st.delay_ns / 100);
  nfq_handle* h = nfq_open();
  if (!h) {
    std::fprintf(stderr, "atlas-wan-delay: nfq_open failed: %s (root and a network namespace "
                         "with netfilter needed)\n", std::strerror(errno));
    return 2;
  }
  nfq_bind_pf(h, AF_INET);  // a no-op on current kernels; harmless
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<std::uint16_t>(queue), &on_packet, &st);
  if (!qh) {
    std::fprintf(stderr, "atlas-wan-delay: cannot bind netfilter queue %ld: %s (another delayer "
                         "on it?)\n", queue, std::strerror(errno));
    nfq_close(h);
    return 2;
  }
  // Metadata only (the verdict needs just the id); GSO packets unsplit; a deep queue.
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) nfq_set_mode(qh, NFQNL_COPY_PACKET, 64);
  nfq_set_queue_maxlen(qh, static_cast<std::uint32_t>(max_packets));
  nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 64u << 20);
  const int fd = nfq_fd(h);
  std::printf("ready queue=%ld delay_ms=%.3f\n", queue, delay_ms);
  std::fflush(stdout);

  alignas(8) static char buf[1 << 17];
  std::uint64_t overruns = 0;
  while (!g_stop) {
    // Release what is due (and what falls due within `slack`: one wake-up and one batch verdict
    // for a train of packets instead of one each), then sleep until the next release or a new
    // packet. Packet ids of a queue increase, and FIFO keeps them in order, so a batch verdict
    // for the last id accepts exactly the packets popped here.
    std::int64_t t = now_ns();
    bool any = false;
    std::uint32_t last = 0;
    while (!st.held.empty() && st.held.front().release_ns <= t + slack_ns) {
      last = st.held.front().id;
      any = true;
      st.held.pop_front();
    }
    if (any) nfq_set_verdict_batch(qh, last, NF_ACCEPT);
    timespec wait{0, 100 * 1000 * 1000};
    if (!st.held.empty()) {
      const std::int64_t dt = st.held.front().release_ns - t;
      wait.tv_sec = dt / 1000000000;
      wait.tv_nsec = dt % 1000000000;
    }
    pollfd pf{fd, POLLIN, 0};
    const int n = ppoll(&pf, 1, &wait, nullptr);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (;;) {
      const ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r > 0) {
        nfq_handle_packet(h, buf, static_cast<int>(r));
        continue;
      }
      if (r < 0 && errno == ENOBUFS) {
        ++overruns;  // the kernel dropped queue messages: packets were lost (TCP resends)
        continue;
      }
      break;
    }
  }
  // Let what is still held through, so the namespace's flows end cleanly.
  for (const Held& p : st.held) nfq_set_verdict(qh, p.id, NF_ACCEPT, 0, nullptr);
  std::fprintf(stderr, "atlas-wan-delay: queue %ld: %llu packets delayed %.3f ms, deepest queue %zu, "
               "%llu receive overruns\n", queue, static_cast<unsigned long long>(st.packets), delay_ms,
               st.max_depth, static_cast<unsigned long long>(overruns));
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
#endif
}
