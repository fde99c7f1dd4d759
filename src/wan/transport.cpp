// SPDX-License-Identifier: MIT
// Handle, stats helpers, and make_transport: the MPI bootstrap (pair secrets, addresses) of a
// transport. No secret crosses the network: only X25519 public keys are exchanged over MPI.
#include "atlas/wan/transport.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/mpi/agree.hpp"
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

std::mutex g_sent_mu;
std::vector<std::string> g_sent;  // debug_make_transport_mpi_strings

/// Every string make_transport sends over MPI goes through here (and is kept for the test hook).
std::vector<std::string> gather(const mpi::Comm& world, const std::string& mine) {
  {
    std::lock_guard lk(g_sent_mu);
    g_sent.push_back(mine);
  }
  return world.allgather_strings(mine);
}

/// Every rank's peer list, gathered; throws the same Error on every rank when the relation is
/// not symmetric (a one-sided peer would wait for its rails until the connect timeout).
void check_symmetric(const mpi::Comm& world, const std::vector<int>& peers) {
  std::string mine;
  for (int p : peers) mine += std::to_string(p) + " ";
  const auto all = gather(world, mine);
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
        ATLAS_THROW(Comm, fmt::format("make_transport: rank {} lists WAN peer {}, which is "
                                      "not another world rank (0..{})",
                                      r, p, lists.size() - 1));
      if (!lists[static_cast<std::size_t>(p)].count(static_cast<int>(r)))
        ATLAS_THROW(Comm, fmt::format("make_transport: rank {} lists WAN peer {} but rank "
                                      "{} does not list {} (peers must be symmetric)",
                                      r, p, p, r));
    }
}

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;

[[noreturn]] void x25519_failed(const char* what) {
  ATLAS_THROW(Comm, fmt::format("WAN key exchange: X25519 {} failed inside OpenSSL", what));
}

/// An ephemeral X25519 key pair; its public key as 32 raw bytes.
Pkey x25519_keypair(std::array<std::uint8_t, 32>& pub) {
  PkeyCtx c(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* k = nullptr;
  if (!c || EVP_PKEY_keygen_init(c.get()) <= 0 || EVP_PKEY_keygen(c.get(), &k) <= 0) x25519_failed("key generation");
  Pkey key(k);
  std::size_t len = pub.size();
  if (EVP_PKEY_get_raw_public_key(key.get(), pub.data(), &len) <= 0 || len != pub.size())
    x25519_failed("public key export");
  return key;
}

/// The X25519 shared secret of `mine` and the peer's raw public key.
std::array<std::uint8_t, 32> x25519_shared(EVP_PKEY* mine, const std::array<std::uint8_t, 32>& peer_pub) {
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_pub.data(), peer_pub.size()));
  if (!peer) x25519_failed("peer public key import");
  PkeyCtx c(EVP_PKEY_CTX_new(mine, nullptr));
  std::array<std::uint8_t, 32> out{};
  std::size_t len = out.size();
  if (!c || EVP_PKEY_derive_init(c.get()) <= 0 || EVP_PKEY_derive_set_peer(c.get(), peer.get()) <= 0 ||
      EVP_PKEY_derive(c.get(), out.data(), &len) <= 0 || len != out.size())
    x25519_failed("key agreement (a malformed or low-order public key from the peer?)");
  if (std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == 0; }))
    x25519_failed("key agreement (all-zero shared secret: a low-order public key)");
  return out;
}

std::string to_hex(std::span<const std::uint8_t> b) {
  std::string s;
  for (std::uint8_t x : b) s += fmt::format("{:02x}", x);
  return s;
}

bool from_hex(const std::string& s, std::array<std::uint8_t, 32>& out) {
  if (s.size() != 64) return false;
  for (std::size_t i = 0; i < 32; ++i) {
    unsigned v = 0;
    for (std::size_t j = 0; j < 2; ++j) {
      const char ch = s[2 * i + j];
      const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + static_cast<unsigned>(d);
    }
    out[i] = static_cast<std::uint8_t>(v);
  }
  return true;
}

}  // namespace

std::vector<std::uint8_t> read_key_file(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return ConfigError(fmt::format("wan.key_file = '{}': {}", path, why));
  };
  // O_NONBLOCK: a FIFO must not block the open; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    throw bad(fmt::format("cannot open it: {} (make one readable only by you: (umask 077; head -c "
                          "32 /dev/urandom > FILE))",
                          std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw bad(fmt::format("fstat failed: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw bad("not a regular file (a FIFO, device or directory); give a file of random bytes");
  if ((st.st_mode & 077) != 0)
    throw bad(fmt::format("its mode {:04o} lets other users read or change it; run `chmod 600 {}`",
                          st.st_mode & 07777, path));
  if (st.st_uid != ::geteuid())
    throw bad(fmt::format("it belongs to uid {}, not to this job's user (uid {}); make the key file "
                          "as the user who runs the job",
                          st.st_uid, ::geteuid()));
  constexpr off_t kMax = 64 * 1024;
  if (st.st_size < 32 || st.st_size > kMax)
    throw bad(fmt::format("{} bytes; it needs 32 to {} random bytes (e.g. head -c 32 /dev/urandom)",
                          st.st_size, kMax));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw bad(fmt::format("read failed: {}", n < 0 ? std::strerror(errno) : "file shrank"));
    got += static_cast<std::size_t>(n);
  }
  return bytes;
}

Secret derive_pair_secret(std::span<const std::uint8_t, 32> x25519_shared,
                          std::span<const std::uint8_t> key_file, int rank_a,
                          std::span<const std::uint8_t, 32> pub_a, int rank_b,
                          std::span<const std::uint8_t, 32> pub_b) {
  if (rank_a > rank_b) {
    std::swap(rank_a, rank_b);
    std::swap(pub_a, pub_b);
  }
  std::vector<std::uint8_t> ikm(x25519_shared.begin(), x25519_shared.end());
  ikm.insert(ikm.end(), key_file.begin(), key_file.end());
  const std::string salt = "atlas-wan/pair-secret/v1";
  const std::string info = fmt::format("ranks {} {} keys {} {} key_file {}", rank_a, rank_b, to_hex(pub_a),
                                       to_hex(pub_b), key_file.empty() ? "no" : "yes");
  Secret out{};
  hkdf_sha256(ikm, std::span(reinterpret_cast<const std::uint8_t*>(salt.data()), salt.size()),
              std::span(reinterpret_cast<const std::uint8_t*>(info.data()), info.size()), out);
  OPENSSL_cleanse(ikm.data(), ikm.size());  // the shared secret and the key file's bytes
  return out;
}

std::vector<std::string> debug_make_transport_mpi_strings() {
  std::lock_guard lk(g_sent_mu);
  return g_sent;
}

MultirailOptions rail_options(const WanCfg& wan) {
  MultirailOptions o;
  o.auth = wan.auth == WanAuth::Crc       ? FrameAuth::Crc
           : wan.auth == WanAuth::Encrypt ? FrameAuth::Encrypt
                                          : FrameAuth::Mac;
  o.rails = wan.rails;
  o.chunk_bytes = wan.chunk_bytes;
  o.max_frame_bytes = wan.max_frame_bytes;
  o.recv_timeout_s = wan.recv_timeout_s;
  o.connect_timeout_s = wan.connect_timeout_s;
  o.eager_credit_bytes = std::max<std::uint64_t>(64 * units::kMiB, 4 * wan.chunk_bytes);
  o.tcp_congestion = wan.tcp_congestion;
  o.warmup_bytes = wan.warmup_bytes;
  return o;
}

bool in_emulated_dc(int dc) {
  const std::optional<std::string> env_dc = env::get("ATLAS_WAN_DC");
  if (!env_dc) return true;
  const auto v = units::parse_int(*env_dc);
  return v && *v == dc;
}

std::unique_ptr<PeerTransport> make_transport(const WanCfg& wan, const ClusterCfg& cluster,
                                              const mpi::Comm& world, int my_dc,
                                              const std::vector<int>& peers) {
  {
    std::lock_guard lk(g_sent_mu);
    g_sent.clear();
  }
  check_symmetric(world, peers);
  // The WAN emulation (scripts/wan/run_emulated.sh) starts each rank inside its DC's network
  // namespace and says which in ATLAS_WAN_DC. A layout that puts the rank in another DC (the
  // launcher and atlas given different decks or overrides) would send intra-DC traffic over the
  // emulated WAN and WAN traffic inside a namespace: measured, but not what the deck describes.
  mpi::agree(world, "checking the emulated DC (ATLAS_WAN_DC)", [&] {
    if (!in_emulated_dc(my_dc))
      throw ConfigError(fmt::format(
          "rank {}: ATLAS_WAN_DC = '{}' (the emulated DC this process was started in, by scripts/wan/run_emulated.sh) "
          "but the deck's layout puts this rank in DC {}: the launcher and atlas laid out different decks\n"
          "  hint: give run_emulated.sh the same deck and key=value overrides as the atlas command after '--'",
          world.rank(), env::get("ATLAS_WAN_DC").value_or(""), my_dc));
  });
  if (wan.transport == WanTransport::Mpi)
    return std::make_unique<MpiTransport>(world, wan.recv_timeout_s, peers);

  // No secret travels: every rank makes an ephemeral X25519 key pair and only the public keys
  // are exchanged (with the addresses, below); each pair of peers derives its own secret from
  // their shared X25519 secret and, when wan.key_file is set, the key file's bytes (which bind
  // it to the job: without them an active attacker on the MPI path could stand in the middle).
  MultirailOptions o = rail_options(wan);
  o.my_rank = world.rank();
  // Errors below are collective-safe: every rank's outcome goes through mpi::agree before any
  // rank throws (a deck or key-file problem: ConfigError, exit 2; a transport that cannot start:
  // CollectiveError, Comm), each message naming the rank it happened on.
  const auto on_this_rank = [&](const std::string& step, const std::string& what, const std::function<void()>& fn) {
    mpi::agree(world, step, [&] {
      try {
        fn();
      } catch (const ConfigError& e) {
        std::vector<std::string> problems;
        for (const auto& p : e.problems()) problems.push_back(fmt::format("rank {}: {}", world.rank(), p));
        throw ConfigError(problems);
      } catch (const Error& e) {
        throw CollectiveError(ExitCode::Comm, {fmt::format("make_transport: rank {} could not {}: {}", world.rank(),
                                                           what, e.what())});
      }
    });
  };

  // ---- the pair secrets: X25519 public keys (and nothing secret) exchanged over MPI ----
  std::vector<std::uint8_t> key_file;
  Pkey my_key;
  std::array<std::uint8_t, 32> my_pub{};
  on_this_rank("making the WAN keys", "make its WAN key", [&] {
    if (cluster.bind_hosts.empty()) throw ConfigError("make_transport: cluster.bind_hosts is empty");
    const std::size_t dc = cluster.bind_hosts.size() == 1 ? 0 : static_cast<std::size_t>(my_dc);
    if (my_dc < 0 || dc >= cluster.bind_hosts.size())
      throw ConfigError(fmt::format("make_transport: DC index {} has no entry in cluster.bind_hosts ({} entries)",
                                    my_dc, cluster.bind_hosts.size()));
    o.bind_host = cluster.bind_hosts[dc];
    // The WAN emulation (scripts/wan/run_emulated.sh) runs each DC in a network namespace of its
    // own and names the DC's address there; it replaces the deck's (loopback) listen address.
    if (const std::optional<std::string> env = env::get("ATLAS_WAN_BIND_HOST")) {
      static bool told = false;  // once per process
      if (world.rank() == 0 && !told)
        log::info("# WAN: listen addresses from ATLAS_WAN_BIND_HOST (emulated WAN), not cluster.bind_hosts");
      told = true;
      o.bind_host = *env;
    }
    if (o.bind_host == "0.0.0.0" || o.bind_host == "::")
      throw ConfigError(fmt::format("cluster.bind_hosts entry '{}' is a wildcard: peers need a routable address "
                                    "of DC {}",
                                    o.bind_host, my_dc));
    if (!peers.empty()) {
      if (!wan.key_file.empty()) key_file = read_key_file(wan.key_file);
      my_key = x25519_keypair(my_pub);
    }
  });
  {
    const auto keys = gather(world, peers.empty() ? std::string() : to_hex(my_pub));
    on_this_rank("deriving the WAN pair secrets", "derive its pair secrets", [&] {
      for (int p : peers) {
        std::array<std::uint8_t, 32> pub{};
        if (!from_hex(keys[static_cast<std::size_t>(p)], pub))
          ATLAS_THROW(Internal, "make_transport: rank " << p << " sent a malformed public key '"
                                                        << keys[static_cast<std::size_t>(p)] << "'");
        auto shared = x25519_shared(my_key.get(), pub);
        Secret pair = derive_pair_secret(shared, key_file, world.rank(), my_pub, p, pub);
        o.pair_secrets[p] = pair;
        wipe_secret(pair);
        OPENSSL_cleanse(shared.data(), shared.size());
      }
    });
    OPENSSL_cleanse(key_file.data(), key_file.size());  // only the derived pair secrets are kept
  }

  // Every rank with peers listens before the addresses are exchanged, so a connect never races
  // a listener that does not exist yet.
  std::unique_ptr<MultirailTransport> t;
  on_this_rank("starting the WAN transport", "start its transport", [&] {
    t = std::make_unique<MultirailTransport>(o, peers);
  });
  const std::string mine = peers.empty() ? std::string() : fmt::format("{} {}", o.bind_host, t->listen_port());
  const auto all = gather(world, mine);
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
