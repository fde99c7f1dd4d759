// SPDX-License-Identifier: MIT
// RAII file descriptor and the few TCP socket helpers the WAN transport needs (resolve, listen,
// non-blocking connect, options). Every failure throws atlas::Error (Comm) naming host and port.
#pragma once

#include <sys/socket.h>

#include <functional>
#include <string>
#include <utility>

namespace atlas::wan {

/// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : m_fd(fd) {}
  Fd(Fd&& o) noexcept : m_fd(std::exchange(o.m_fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      m_fd = std::exchange(o.m_fd, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return m_fd; }
  [[nodiscard]] bool valid() const noexcept { return m_fd >= 0; }
  /// Closes the descriptor now (no-op when empty).
  void reset() noexcept;

 private:
  int m_fd = -1;
};

/// A resolved socket address plus its printable "host:port" form.
struct SockAddr {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string text;
};

/// Resolves `host` (IPv4/IPv6 literal or name) and `port`. Throws Error naming both on failure.
SockAddr resolve(const std::string& host, int port);

/// A non-blocking TCP listener bound to `host:port` (port 0 = kernel-chosen); `bound_port` gets
/// the actual port. Throws Error naming the address on failure.
Fd listen_tcp(const std::string& host, int port, int& bound_port);

/// Starts a non-blocking connect to `to`. Returns the socket; `in_progress` is true when the
/// connect has not finished yet (wait for writability, then check connect_error()).
/// Throws Error only when no socket can be made; a refused connect returns an invalid Fd and sets
/// `error` to the reason.
/// `prepare`, when given, is called with the new socket before connect() (socket options that
/// must be in place before the handshake, e.g. the congestion control: see tune_socket).
Fd connect_tcp(const SockAddr& to, bool& in_progress, std::string& error,
               const std::function<void(int)>& prepare = {});

/// The pending error of a non-blocking connect (SO_ERROR): "" when connected.
std::string connect_error(int fd);

/// TCP_NODELAY; and, when `buffer_bytes` > 0, SO_SNDBUF/SO_RCVBUF (0 keeps kernel autotuning,
/// which respects the namespace's net.ipv4.tcp_rmem/tcp_wmem caps of the WAN emulation).
void tune_socket(int fd, int buffer_bytes);

/// The TCP congestion control algorithm of socket `fd` (TCP_CONGESTION), "" when unknown.
std::string congestion_control(int fd);

/// Sets socket `fd`'s TCP congestion control to `name`. Returns "" on success, else the reason
/// (e.g. not available in this kernel, or restricted: see net.ipv4.tcp_allowed_congestion_control).
/// Set it before the connection is established (a listener's accepted sockets inherit its
/// algorithm): a socket that was established under bbr keeps bbr's pacing after a switch.
std::string set_congestion_control(int fd, const std::string& name);

/// What the WAN rails use, resolved once per process from a request:
/// - "system": whatever new sockets get (net.ipv4.tcp_congestion_control of this namespace);
/// - "auto": the system's, unless it paces (bbr), then "cubic", else "reno" (whichever this
///   process may set first). BBR paces each flow at its measured delivery rate, and a rail that
///   carries one burst per compute slot measures about burst/RTT, so every later burst is spread
///   over about an RTT: a 128 KiB message after an idle gap took 2.2 x its ideal time.
/// - any other name: that algorithm; an Error (ExitCode::Comm) when it cannot be set.
struct CongestionChoice {
  std::string name;    ///< algorithm to set on every rail; "" = leave sockets as they are
  std::string system;  ///< the namespace's default
  std::string note;    ///< one line for logs and benchmark headers
};
CongestionChoice choose_congestion_control(const std::string& request);

/// "host:port" of the remote end, or "?" when unknown.
std::string peer_name(int fd);

}  // namespace atlas::wan
