// SPDX-License-Identifier: MIT
// The multirail TCP transport: per peer, `rails` TCP connections; each message is cut into chunks
// striped over the least-loaded rails and reassembled in place; an epoll progress thread does
// all socket work. make_transport() builds one from the deck; tests build one directly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "atlas/wan/framing.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::wan {

/// Everything a MultirailTransport needs (make_transport fills it from WanCfg/ClusterCfg).
struct MultirailOptions {
  int my_rank = 0;                            ///< this process's world rank
  int rails = 4;                              ///< TCP connections per peer (wan.rails)
  std::uint64_t chunk_bytes = 256 * 1024;     ///< striping unit (wan.chunk_bytes), < 4 GiB
  std::uint64_t max_frame_bytes = 64u << 20;  ///< longer frames are rejected (wan.max_frame_bytes)
  double recv_timeout_s = 60.0;               ///< stalled receive / unacknowledged rail limit
  double connect_timeout_s = 20.0;            ///< all rails up (and each reconnect) within this
  /// Eager credit per peer: bytes a peer may send before the matching irecv is posted. This is
  /// the bound on memory buffered for early arrivals; larger messages wait for a clear-to-send.
  std::uint64_t eager_credit_bytes = 64u << 20;
  /// Messages a peer may have announced by request-to-send that wait for a receive on this rank
  /// (each holds a few hundred bytes; its chunk bitmap is made when a receive takes it). A
  /// pipeline announces at most a step's worth ahead (up to 65,536 micro-batches); one more than
  /// this is a runaway or corrupt sender and fails the peer.
  std::uint64_t max_unbound_rts = std::uint64_t{1} << 20;
  /// Warm-up per new rail and direction: right after its handshake each side sends this many
  /// bytes of Pad frames (zeros, dropped by the peer), and wait_connected() returns only once the
  /// peer acknowledged them. A fresh TCP connection may have only 10 segments (about 14 KiB) in
  /// flight, so without it the first messages take 2-4 RTTs; slow start grows the window by about
  /// the bytes acknowledged, and it stays grown (in the emulation net.ipv4.tcp_slow_start_after_idle
  /// = 0; elsewhere for idle gaps shorter than the RTO). At most 64 frames of min(64 KiB,
  /// chunk_bytes) each; 0 = none. Reconnected rails are not warmed (data is waiting on them).
  std::uint64_t warmup_bytes = 1024 * 1024;
  /// SO_SNDBUF/SO_RCVBUF per rail; 0 = kernel autotuning (the default; it honours the emulated
  /// per-flow window of scripts/wan, which an explicit size would bypass).
  int socket_buffer_bytes = 0;
  /// TCP congestion control of every rail: "auto" (the system's unless it is bbr, which paces
  /// bursty rails at about burst/RTT; then cubic or reno), "system", or an algorithm's name
  /// (see choose_congestion_control in fd.hpp). make_transport takes it from the deck key
  /// wan.tcp_congestion.
  std::string tcp_congestion = "auto";
  std::string bind_host = "127.0.0.1";        ///< listen address (cluster.bind_hosts[my_dc])
  int bind_port = 0;                          ///< 0 = kernel-chosen
  /// Secret of the pair (this rank, peer), by the peer's world rank; a peer not listed uses
  /// `secret`. make_transport fills it (X25519 + wan.key_file); the handshake proves it (the
  /// connector's Hello already does) and the frame keys are derived from it.
  std::map<int, Secret> pair_secrets;
  /// Secret of peers not in pair_secrets (tests, bench). All zero (the default) with such a
  /// peer: Error (Comm) at construction, naming the peer.
  Secret secret{};
  /// Protection of every frame (wan.auth): Mac (default), Encrypt, or Crc (accidents only).
  FrameAuth auth = FrameAuth::Mac;
  /// Incoming connections that have not yet sent a Hello with a valid MAC, at most this many at
  /// once (0 = from RLIMIT_NOFILE: a limit / 8, within 4..64); the oldest is closed for a new one.
  /// Connections whose Hello proved the pair secret are not counted and never closed for these;
  /// of them at most 2 per (peer, rail) wait for their handshake to finish, the newest.
  int max_pending_handshakes = 0;
  /// Of those, at most this many from one source address (0 = a quarter of the above, >= 2).
  int max_pending_per_source = 0;

  MultirailOptions() = default;
  MultirailOptions(const MultirailOptions&) = default;
  MultirailOptions(MultirailOptions&&) = default;
  // No assignment: the old secrets' map nodes would be freed or reused unwiped.
  MultirailOptions& operator=(const MultirailOptions&) = delete;
  MultirailOptions& operator=(MultirailOptions&&) = delete;
  ~MultirailOptions() { wipe_secrets(); }
  /// Overwrites `secret` and every value of `pair_secrets` with zeros (wipe_secret).
  void wipe_secrets() noexcept;
};

/// Where a peer listens.
struct PeerAddress {
  int rank = -1;  ///< world rank
  std::string host;
  int port = 0;
};

namespace mr {
class Engine;  // the progress engine (src/wan/multirail_engine.hpp)
}

/// See file comment. Not collective by itself: make_transport wraps it with the MPI bootstrap.
/// Lifecycle: construct (binds and listens, starts the progress thread) -> connect(addresses)
/// -> wait_connected() -> isend/irecv/test/wait -> destroy (says goodbye on every rail, joins
/// the thread; bounded, no hang when the peer is gone).
class MultirailTransport final : public PeerTransport {
 public:
  /// `peers`: world ranks this rank exchanges with. Throws Error (Comm) when it cannot listen.
  MultirailTransport(const MultirailOptions& opts, const std::vector<int>& peers);
  ~MultirailTransport() override;
  MultirailTransport(const MultirailTransport&) = delete;
  MultirailTransport& operator=(const MultirailTransport&) = delete;

  /// One line saying which TCP congestion control the rails use and why.
  [[nodiscard]] std::string congestion_control_note() const;
  /// The port this rank listens on.
  [[nodiscard]] int listen_port() const;
  /// Starts connecting: this rank opens the rails to every peer with a higher world rank (it
  /// needs only those peers' addresses) and accepts rails from lower ones. Starts the
  /// wan.connect_timeout_s clock.
  void connect(const std::vector<PeerAddress>& addresses);
  /// Blocks until every rail of every peer completed its handshake and its warm-up (see
  /// MultirailOptions::warmup_bytes). Throws Error (Comm) naming each peer and rail that did not,
  /// with the last reason, after connect_timeout_s.
  void wait_connected();

  Handle isend(int peer, int tag, const void* data, std::size_t bytes) override;
  Handle irecv(int peer, int tag, void* data, std::size_t bytes) override;
  bool test(Handle& h) override;
  void wait(Handle& h) override;
  [[nodiscard]] TransportStats stats() const override;
  [[nodiscard]] const char* name() const override { return "multirail"; }

  /// Test hook: abruptly shuts down the connection of `rail` to `peer` (as a network fault
  /// would), from the progress thread. `after_frames` = 0: now; N > 0: right after that rail has
  /// sent or received N more data frames (so chunks are certainly in flight). Returns at once.
  void debug_kill_rail(int peer, int rail, int after_frames = 0);
  /// Test hook: the next data frame sent to `peer` carries a wrong payload CRC (wan.auth = crc)
  /// or a wrong payload tag (mac, encrypt).
  void debug_corrupt_next_frame(int peer);
  /// Test hook: the secret this rank shares with `peer` (what the handshake proves and the frame
  /// keys come from). Throws Error (Comm) for a rank that is not a peer.
  [[nodiscard]] Secret debug_pair_secret(int peer) const;

 private:
  void finish(Handle& h);
  std::unique_ptr<mr::Engine> m_engine;
  bool m_connect_called = false;
};

}  // namespace atlas::wan
