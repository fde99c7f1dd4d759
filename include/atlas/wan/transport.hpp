// SPDX-License-Identifier: MIT
// The WAN transport interface: MPI-like non-blocking point-to-point between world ranks in
// different DCs, used by the runtime for every stage boundary that crosses a DC. Two
// implementations: "multirail" (TCP rails, wan/multirail.hpp) and "mpi" (the baseline).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/wan/framing.hpp"

namespace atlas::wan {

namespace detail {
class Op;  // one pending operation; each transport derives its own
}  // namespace detail

/// An opaque, move-only request returned by isend/irecv. Empty once test() returned true or
/// wait() returned (or threw). Destroying a pending Handle is a bug (logged): for a receive the
/// transport may still write into the buffer.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::Op> op) noexcept : m_op(std::move(op)) {}
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  /// True when there is nothing to wait for.
  [[nodiscard]] bool empty() const noexcept { return m_op == nullptr; }
  /// The operation (for transports); null when empty.
  [[nodiscard]] detail::Op* op() const noexcept { return m_op.get(); }
  void reset() noexcept { m_op.reset(); }

 private:
  void warn_if_pending() const noexcept;
  std::shared_ptr<detail::Op> m_op;
};

/// Traffic on one rail (TCP connection index) of one peer. Payload bytes only.
struct RailStats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t frames_sent = 0;      ///< data frames
  std::uint64_t frames_received = 0;  ///< data frames
  std::uint64_t reconnects = 0;       ///< connections re-established after a loss
};

/// Traffic with one peer (world rank).
struct PeerStats {
  int peer = -1;                        ///< world rank
  std::uint64_t bytes_sent = 0;         ///< payload bytes of completed sends
  std::uint64_t bytes_received = 0;     ///< payload bytes of completed receives
  std::uint64_t messages_sent = 0;      ///< completed sends
  std::uint64_t messages_received = 0;  ///< completed receives
  std::uint64_t resent_chunks = 0;      ///< chunks sent again after a rail loss
  std::uint64_t resent_bytes = 0;
  std::uint64_t duplicates_dropped = 0; ///< chunks that arrived twice and were dropped
  std::uint64_t reconnects = 0;         ///< sum over rails
  std::vector<RailStats> rails;         ///< one per rail (empty for the mpi transport)
};

/// Counters since the transport was made; a snapshot.
struct TransportStats {
  std::vector<PeerStats> peers;  ///< in the order the peers were given to make_transport
  [[nodiscard]] std::uint64_t total_bytes_sent() const;
  [[nodiscard]] std::uint64_t total_bytes_received() const;
};

/// Point-to-point transport between world ranks in different DCs. Thread-compatible: one
/// application thread calls it; the multirail implementation runs its own progress thread.
class PeerTransport {
 public:
  virtual ~PeerTransport() = default;
  /// Non-blocking send of `bytes` bytes to world rank `peer`, matched by (peer, tag) in posting
  /// order (non-overtaking like MPI). `data` must stay valid until the handle completes.
  /// `tag` >= 0. Throws Error (Comm) at once for a peer not given to make_transport.
  virtual Handle isend(int peer, int tag, const void* data, std::size_t bytes) = 0;
  /// Non-blocking receive of exactly `bytes` bytes from world rank `peer` with `tag`; the matching
  /// send must have the same size (a mismatch fails the receive, naming both sizes).
  virtual Handle irecv(int peer, int tag, void* data, std::size_t bytes) = 0;
  /// True when complete (the handle is then empty); rethrows a transport error as Error (Comm).
  virtual bool test(Handle& h) = 0;
  /// Blocks until complete; throws Error (Comm) on failure or timeout (wan.recv_timeout_s).
  virtual void wait(Handle& h) = 0;
  /// Bytes/messages per peer and per rail, resends, reconnects.
  [[nodiscard]] virtual TransportStats stats() const = 0;
  /// "multirail" | "mpi"
  [[nodiscard]] virtual const char* name() const = 0;
};

/// Waits for every handle in order (convenience). Throws the first failure.
void wait_all(PeerTransport& t, std::vector<Handle>& handles);

/// Collective over `world` (every rank calls it, also ranks with no peers). No secret crosses the
/// network: every rank with peers makes an ephemeral X25519 key pair, the public keys are
/// allgathered over MPI, and each pair of peers derives its own secret (derive_pair_secret) from
/// their X25519 shared secret and, when wan.key_file is set, the key file's bytes (read_key_file;
/// a bad file is a ConfigError on every rank). Every rank with peers then listens on cluster.bind_hosts[my_dc] (port 0 = kernel-chosen), ports and addresses
/// are allgathered over MPI, then each pair of ranks in `peers` gets `wan.rails` TCP connections
/// (the lower world rank connects, the higher accepts). `peers`: world ranks (usually in other
/// DCs) this rank exchanges with; the relation must be symmetric (checked: every rank throws the
/// same Error otherwise). Returns when every rail to every peer is up; throws Error (Comm) naming
/// the peer and rail after wan.connect_timeout_s. `wan.transport = mpi` returns the MPI baseline
/// (MPI_Isend/Irecv over a dup of `world`), made collectively too. Under the WAN emulation the
/// environment variable ATLAS_WAN_BIND_HOST (set per DC by scripts/wan/run_emulated.sh) replaces
/// cluster.bind_hosts[my_dc].
/// Reads wan.key_file: a regular file of 32 bytes to 64 KiB, owned by this process's user and
/// readable by no one else (mode & 077 == 0). Throws ConfigError naming the file, what is wrong
/// and the fix (e.g. `chmod 600 FILE`). Not collective.
std::vector<std::uint8_t> read_key_file(const std::string& path);

/// The secret of the WAN pair (rank_a, rank_b): HKDF-SHA256 over their X25519 shared secret and
/// the key file's bytes (empty: none), bound to both ranks and both public keys. Symmetric in
/// (a, b). A passive observer of the MPI traffic sees only the public keys; without a key file an
/// active attacker on the MPI path could substitute them, with one it cannot.
Secret derive_pair_secret(std::span<const std::uint8_t, 32> x25519_shared,
                          std::span<const std::uint8_t> key_file, int rank_a,
                          std::span<const std::uint8_t, 32> pub_a, int rank_b,
                          std::span<const std::uint8_t, 32> pub_b);

struct MultirailOptions;  // atlas/wan/multirail.hpp

/// The multirail options a deck's wan.* keys give (frame protection, rails, chunk and frame
/// sizes, timeouts, eager credit, wan.tcp_congestion, wan.warmup_bytes); make_transport adds this
/// rank's identity, listen address and pair secrets. Not collective.
MultirailOptions rail_options(const WanCfg& wan);

/// Test hook: the strings this process sent over MPI in its last make_transport call, in order:
/// its peer list ("1 3 "), its X25519 public key (64 lowercase hex digits; "" without peers), its
/// listen address ("host port"). make_transport sends nothing else over MPI (an error line
/// instead of a key or an address, when it fails). wan.transport = mpi: the peer list only.
std::vector<std::string> debug_make_transport_mpi_strings();

/// Inside the WAN emulation (scripts/wan/run_emulated.sh starts each rank in its DC's network
/// namespace and names it in ATLAS_WAN_DC): whether that namespace is DC `dc`, the one the deck's
/// layout gives the rank. True outside the emulation (ATLAS_WAN_DC unset). make_transport refuses
/// a rank where it is false. Not collective.
[[nodiscard]] bool in_emulated_dc(int dc);

std::unique_ptr<PeerTransport> make_transport(const WanCfg& wan, const ClusterCfg& cluster,
                                              const mpi::Comm& world, int my_dc,
                                              const std::vector<int>& peers);

}  // namespace atlas::wan
