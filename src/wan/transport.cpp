// SPDX-License-Identifier: MIT
// Handle, stats helpers, and make_transport: the MPI bootstrap (secret, addresses) of a transport.
#include "atlas/wan/transport.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <set>

#include <fmt/format.h>

#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/wan/mpi_transport.hpp"
#include "atlas/wan/multirail.hpp"
#include "op.hpp"

namespace atlas::wan {

// ---- Handle ----

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    warn_if_pending();
    m_op = std::move(o.m_op);
  }
  return *this;
}

Handle::~Handle() { warn_if_pending(); }

void Handle::warn_if_pending() const noexcept {
  // While an error unwinds the job, pending operations are expected (the error says why).
  if (m_op && m_op->state() == detail::OpState::Pending && std::uncaught_exceptions() == 0) {
    try {
      log::error("wan::Handle ({} peer {}, tag {}) destroyed while pending: a missing wait (a bug); "
                 "the transport may still use its buffer",
                 m_op->is_send() ? "send to" : "receive from", m_op->peer(), m_op->tag());
    } catch (...) {
    }
  }
}

// ---- stats ----

std::uint64_t TransportStats::total_bytes_sent() const {
  std::uint64_t s = 0;
  for (const auto& p : peers) s += p.bytes_sent;
  return s;
}

std::uint64_t TransportStats::total_bytes_received() const {
  std::uint64_t s = 0;
  for (const auto& p : peers) s += p.bytes_received;
  return s;
}

void wait_all(PeerTransport& t, std::vector<Handle>& handles) {
  for (auto& h : handles) t.wait(h);
}

// ---- make_transport ----

namespace {

/// Every rank's peer list, gathered; throws the same Error on every rank when the relation is
/// not symmetric (a one-sided peer would wait for its rails until the connect timeout).
void check_symmetric(const mpi::Comm& world, const std::vector<int>& peers) {
  std::string mine;
  for (int p : peers) mine += std::to_string(p) + " ";
  const auto all = world.allgather_strings(mine);
  std::vector<std::set<int>> lists(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::size_t pos = 0;
    const std::string& s = all[r];
    while (pos < s.size()) {
      const std::size_t sp = s.find(' ', pos);
      lists[r].insert(std::stoi(s.substr(pos, sp - pos)));
      pos = sp + 1;
    }
  }
  for (std::size_t r = 0; r < lists.size(); ++r)
    for (int p : lists[r]) {
      if (p < 0 || p >= static_cast<int>(lists.size()) || p == static_cast<int>(r))
        throw Error(ExitCode::Comm, fmt::format("make_transport: rank {} lists WAN peer {}, which is "
                                                "not another world rank (0..{})",
                                                r, p, lists.size() - 1));
      if (!lists[static_cast<std::size_t>(p)].count(static_cast<int>(r)))
        throw Error(ExitCode::Comm, fmt::format("make_transport: rank {} lists WAN peer {} but rank "
                                                "{} does not list {} (peers must be symmetric)",
                                                r, p, p, r));
    }
}

}  // namespace

std::unique_ptr<PeerTransport> make_transport(const WanCfg& wan, const ClusterCfg& cluster,
                                              const mpi::Comm& world, int my_dc,
                                              const std::vector<int>& peers) {
  check_symmetric(world, peers);
  if (wan.transport == WanTransport::Mpi)
    return std::make_unique<MpiTransport>(world, wan.recv_timeout_s, peers);

  // The per-job secret: made on rank 0, broadcast over MPI (never over the WAN).
  MultirailOptions o;
  if (world.rank() == 0) random_bytes(o.secret);
  world.bcast(std::span<std::uint8_t>(o.secret.data(), o.secret.size()), 0);

  o.my_rank = world.rank();
  o.auth = wan.auth == WanAuth::Crc       ? FrameAuth::Crc
           : wan.auth == WanAuth::Encrypt ? FrameAuth::Encrypt
                                          : FrameAuth::Mac;
  o.rails = wan.rails;
  o.chunk_bytes = wan.chunk_bytes;
  o.max_frame_bytes = wan.max_frame_bytes;
  o.recv_timeout_s = wan.recv_timeout_s;
  o.connect_timeout_s = wan.connect_timeout_s;
  o.eager_credit_bytes = std::max<std::uint64_t>(64 * units::kMiB, 4 * wan.chunk_bytes);
  if (const char* env = std::getenv("ATLAS_WAN_TCP_CONGESTION"); env && *env) o.tcp_congestion = env;
  if (cluster.bind_hosts.empty())
    throw Error(ExitCode::Comm, "make_transport: cluster.bind_hosts is empty");
  const std::size_t dc = cluster.bind_hosts.size() == 1 ? 0 : static_cast<std::size_t>(my_dc);
  if (my_dc < 0 || dc >= cluster.bind_hosts.size())
    throw Error(ExitCode::Comm, fmt::format("make_transport: DC index {} has no entry in "
                                            "cluster.bind_hosts ({} entries)",
                                            my_dc, cluster.bind_hosts.size()));
  o.bind_host = cluster.bind_hosts[dc];
  // The WAN emulation (scripts/wan/run_emulated.sh) runs each DC in a network namespace of its
  // own and names the DC's address there; it replaces the deck's (loopback) listen address.
  if (const char* env = std::getenv("ATLAS_WAN_BIND_HOST"); env && *env) {
    static bool told = false;  // once per process
    if (world.rank() == 0 && !told)
      log::info("# WAN: listen addresses from ATLAS_WAN_BIND_HOST (emulated WAN), not cluster.bind_hosts");
    told = true;
    o.bind_host = env;
  }
  if (o.bind_host == "0.0.0.0" || o.bind_host == "::")
    throw Error(ExitCode::Comm, fmt::format("cluster.bind_hosts entry '{}' is a wildcard: peers "
                                            "need a routable address of DC {}",
                                            o.bind_host, my_dc));

  // Every rank with peers listens before the addresses are exchanged, so a connect never races
  // a listener that does not exist yet. Errors here are collective-safe: all ranks gather first.
  std::unique_ptr<MultirailTransport> t;
  std::string error;
  try {
    // Environment overrides (diagnostics and A/B runs; see docs/wan.md): checked here, so a bad
    // value fails every rank together instead of leaving the others in the allgather.
    if (const char* env = std::getenv("ATLAS_WAN_WARMUP_BYTES"); env && *env) {
      const auto b = units::parse_bytes(env);
      if (!b)
        throw Error(ExitCode::Comm, fmt::format("ATLAS_WAN_WARMUP_BYTES='{}' is not a byte count (e.g. "
                                                "0, 256K, 1M)",
                                                env));
      o.warmup_bytes = *b;
    }
    t = std::make_unique<MultirailTransport>(o, peers);
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string mine = !error.empty() ? "!" + error
                           : peers.empty() ? std::string()
                                           : fmt::format("{} {}", o.bind_host, t->listen_port());
  const auto all = world.allgather_strings(mine);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty() && all[r][0] == '!')
      throw Error(ExitCode::Comm, fmt::format("make_transport: rank {} could not start its transport: {}", r,
                                              all[r].substr(1)));
  std::vector<PeerAddress> addresses;
  for (int p : peers) {
    const std::string& s = all[static_cast<std::size_t>(p)];
    const std::size_t sp = s.rfind(' ');
    addresses.push_back({p, s.substr(0, sp), std::stoi(s.substr(sp + 1))});
  }
  // Every rank chose the same way (same host setup), so rank 0 reports, with or without peers.
  const bool any_peers = std::any_of(all.begin(), all.end(), [](const std::string& a) { return !a.empty(); });
  if (world.rank() == 0 && any_peers) {
    static std::string told;  // once per process and choice
    if (told != t->congestion_control_note()) log::info("# WAN: {}", t->congestion_control_note());
    told = t->congestion_control_note();
  }
  t->connect(addresses);
  t->wait_connected();
  return t;
}

}  // namespace atlas::wan
