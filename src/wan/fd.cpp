// SPDX-License-Identifier: MIT
// Socket helpers for the WAN transport.
#include "atlas/wan/fd.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas::wan {

namespace {

std::string addr_text(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

[[noreturn]] void sys_fail(const std::string& what, int err) {
  ATLAS_THROW(Comm, fmt::format("{}: {}", what, std::strerror(err)));
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) sys_fail("fcntl(O_NONBLOCK)", errno);
}

}  // namespace

void Fd::reset() noexcept {
  if (m_fd >= 0) ::close(m_fd);
  m_fd = -1;
}

SockAddr resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0 || !res)
    ATLAS_THROW(Comm, fmt::format("cannot resolve WAN address '{}' (port {}): {}", host,
                                  port, gai_strerror(rc)));
  SockAddr out;
  std::memcpy(&out.addr, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  out.text = addr_text(res->ai_addr);
  freeaddrinfo(res);
  return out;
}

Fd listen_tcp(const std::string& host, int port, int& bound_port) {
  const SockAddr sa = resolve(host, port);
  Fd fd(::socket(sa.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) sys_fail("socket() for the WAN listener", errno);
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa.addr), sa.len) < 0) {
    const int err = errno;
    if (err == EADDRNOTAVAIL)  // the deck's address, not the network: a configuration error
      throw ConfigError(fmt::format("cannot bind the WAN listener to {} (cluster.bind_hosts): {}: {} is not an "
                                    "address of this host\n  hint: give cluster.bind_hosts an address of each "
                                    "DC's hosts (`ip -brief address` lists this one's)",
                                    sa.text, std::strerror(err), host));
    sys_fail(fmt::format("cannot bind the WAN listener to {} (cluster.bind_hosts)", sa.text), err);
  }
  if (::listen(fd.get(), 256) < 0) sys_fail(fmt::format("listen() on {}", sa.text), errno);
  set_nonblocking(fd.get());
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &len) < 0)
    sys_fail("getsockname() on the WAN listener", errno);
  bound_port = got.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  return fd;
}

Fd connect_tcp(const SockAddr& to, bool& in_progress, std::string& error,
               const std::function<void(int)>& prepare) {
  in_progress = false;
  error.clear();
  Fd fd(::socket(to.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    // Out of descriptors (EMFILE) or buffers: the caller's error, which a rail's reconnect
    // retries with its back-off, not an exception that would end the WAN progress thread.
    error = fmt::format("socket() for a connection to {}: {}", to.text, std::strerror(errno));
    return Fd();
  }
  if (prepare) prepare(fd.get());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.addr), to.len) == 0) return fd;
  if (errno == EINPROGRESS) {
    in_progress = true;
    return fd;
  }
  error = fmt::format("connect to {}: {}", to.text, std::strerror(errno));
  return Fd();
}

std::string connect_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
  return err == 0 ? std::string() : std::string(std::strerror(err));
}

void tune_socket(int fd, int buffer_bytes) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
    sys_fail("setsockopt(TCP_NODELAY)", errno);
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

std::string congestion_control(int fd) {
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) < 0) return "";
  return std::string(name, strnlen(name, len));
}

std::string set_congestion_control(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0)
    return "";
  const int err = errno;
  if (err == ENOENT) return fmt::format("TCP congestion control '{}' is not available in this kernel", name);
  if (err == EPERM)
    return fmt::format("TCP congestion control '{}' is restricted here (not in "
                       "net.ipv4.tcp_allowed_congestion_control, and no CAP_NET_ADMIN)",
                       name);
  return fmt::format("setsockopt(TCP_CONGESTION, {}): {}", name, std::strerror(err));
}

CongestionChoice choose_congestion_control(const std::string& request) {
  Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) sys_fail("socket (congestion control probe)", errno);
  CongestionChoice c;
  c.system = congestion_control(probe.get());
  if (request == "system" || request.empty()) {
    c.note = fmt::format("TCP congestion control: the system's ({})", c.system);
    return c;
  }
  if (request != "auto") {
    if (const std::string why = set_congestion_control(probe.get(), request); !why.empty())
      ATLAS_THROW(Comm, fmt::format("WAN rails: {} (asked for '{}'; 'auto' or 'system' "
                                    "always work)",
                                    why, request));
    c.name = request;
    c.note = fmt::format("TCP congestion control: {} (asked for; the system's is {})", request, c.system);
    return c;
  }
  if (c.system.rfind("bbr", 0) != 0) {
    c.note = fmt::format("TCP congestion control: the system's ({})", c.system);
    return c;
  }
  std::string why;
  for (const char* alt : {"cubic", "reno"}) {
    const std::string e = set_congestion_control(probe.get(), alt);
    if (e.empty()) {
      c.name = alt;
      c.note = fmt::format("TCP congestion control: {} instead of the system's {} (bbr paces bursty "
                           "rails at about burst/RTT)",
                           alt, c.system);
      return c;
    }
    why += (why.empty() ? "" : "; ") + e;
  }
  c.note = fmt::format("TCP congestion control: the system's ({}); no alternative could be set: {}",
                       c.system, why);
  return c;
}

std::string peer_name(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) < 0) return "?";
  return addr_text(reinterpret_cast<const sockaddr*>(&sa));
}

}  // namespace atlas::wan
