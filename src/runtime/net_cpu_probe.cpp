// SPDX-License-Identifier: MIT
// Host CPU per WAN byte (see the header).
#include "atlas/runtime/net_cpu_probe.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/mpi/tags.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::runtime {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Waits for a WAN handle without holding a core (the probe measures the machine's CPU).
void sleepy_wait(wan::PeerTransport& t, wan::Handle& h, double timeout_s, const char* what) {
  const double start = now_s();
  while (!t.test(h)) {
    if (now_s() - start > timeout_s)
      ATLAS_THROW(Comm, "net cpu probe: the " << what << " did not complete in " << static_cast<int>(timeout_s)
                                               << " s (wan.recv_timeout_s)");
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

/// A barrier that sleeps (up to 1 ms at a time) while it waits.
void sleepy_barrier(const mpi::Comm& world) { world.ibarrier().wait_polling(1000); }

}  // namespace

double machine_busy_core_seconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  if (!in || !std::getline(in, line) || line.rfind("cpu ", 0) != 0) return -1.0;
  std::istringstream f(line.substr(4));
  // user nice system idle iowait irq softirq steal ...
  std::int64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (auto& x : v)
    if (!(f >> x)) return -1.0;
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6]) / (hz > 0 ? hz : 100.0);
}

NetCpuProbe probe_net_cpu(const mpi::Comm& world, const Config& cfg, int my_dc, int rounds, double seconds) {
  NetCpuProbe out;
  const std::vector<int> dcs = world.allgather(my_dc);
  const int sender = 0;
  int receiver = -1;
  for (int r = 1; r < world.size() && receiver < 0; ++r)
    if (dcs[static_cast<std::size_t>(r)] != dcs[0]) receiver = r;
  if (receiver < 0) return out;
  const int me = world.rank();
  std::vector<int> peers;
  if (me == sender) peers = {receiver};
  if (me == receiver) peers = {sender};
  const auto transport = wan::make_transport(cfg.wan, cfg.cluster, world, my_dc, peers);
  const double gbps = cfg.cluster.bandwidth(dcs[0], dcs[static_cast<std::size_t>(receiver)]);
  const std::int64_t msg = std::int64_t{1} << 20;
  const auto target = static_cast<std::int64_t>(gbps * 1e9 / 8.0 * seconds);
  const std::int64_t count = std::clamp<std::int64_t>(target / msg, 1, 96);
  out.bytes = count * msg;
  std::vector<char> buf(static_cast<std::size_t>(msg), 'a');
  struct Round {
    double ns_per_byte, busy, idle, mbit;
  };
  std::vector<Round> got;
  for (int r = 0; r < rounds; ++r) {
    // The burst, timed and CPU-counted by the sender (everyone shares this machine's /proc/stat).
    sleepy_barrier(world);
    const double c0 = machine_busy_core_seconds();
    const double t0 = now_s();
    if (me == sender || me == receiver) {
      std::vector<wan::Handle> hs;
      for (std::int64_t i = 0; i < count; ++i)
        hs.push_back(me == sender ? transport->isend(receiver, mpi::tags::net_cpu_probe(r), buf.data(), buf.size())
                                  : transport->irecv(sender, mpi::tags::net_cpu_probe(r), buf.data(), buf.size()));
      for (auto& h : hs) sleepy_wait(*transport, h, cfg.wan.recv_timeout_s, me == sender ? "send" : "receive");
    }
    sleepy_barrier(world);
    const double t1 = now_s();
    const double c1 = machine_busy_core_seconds();
    // The same time with nothing sent: the machine's background (and the waiters' polling).
    std::this_thread::sleep_for(std::chrono::duration<double>(t1 - t0));
    const double c2 = machine_busy_core_seconds();
    const double t2 = now_s();
    if (me == sender && c0 >= 0 && c2 >= 0 && t1 > t0 && t2 > t1) {
      const double busy = (c1 - c0) / (t1 - t0);
      const double idle = (c2 - c1) / (t2 - t1);
      got.push_back({std::max(0.0, busy - idle) * (t1 - t0) * 1e9 / static_cast<double>(out.bytes), busy, idle,
                     static_cast<double>(out.bytes) * 8.0 / 1e6 / (t1 - t0)});
    }
  }
  // Rank 0's median round, to everyone.
  std::vector<double> v(5, 0.0);
  if (me == sender && !got.empty()) {
    std::sort(got.begin(), got.end(), [](const Round& a, const Round& b) { return a.ns_per_byte < b.ns_per_byte; });
    const Round& m = got[got.size() / 2];
    v = {m.ns_per_byte, m.busy, m.idle, m.mbit, static_cast<double>(got.size())};
  }
  world.bcast(std::span<double>(v), sender);
  out.ns_per_byte = v[0];
  out.busy_cores = v[1];
  out.idle_cores = v[2];
  out.mbit_per_s = v[3];
  out.rounds = static_cast<int>(v[4]);
  return out;
}

}  // namespace atlas::runtime
