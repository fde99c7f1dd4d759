// SPDX-License-Identifier: MIT
// atlas-wan-probe: measures the round-trip time of an (emulated) WAN path by timing TCP
// connects (SYN -> SYN-ACK is one RTT even when the delay is applied on the receiving side,
// where ping would show only half). Server: --listen HOST:PORT (accepts until killed or --count
// connections). Client: --connect HOST:PORT [--count N]: prints "rtt_ms median=.. min=.. max=..".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "atlas/core/units.hpp"
#include "atlas/wan/fd.hpp"

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "atlas-wan-probe: %s\n"
               "usage: atlas-wan-probe --listen HOST:PORT [--count N]\n"
               "       atlas-wan-probe --connect HOST:PORT [--count N] [--timeout-ms T]\n",
               why);
  return 1;
}

bool split(const std::string& hp, std::string& host, int& port) {
  const auto c = hp.rfind(':');
  if (c == std::string::npos) return false;
  host = hp.substr(0, c);
  const auto p = atlas::units::parse_int(hp.substr(c + 1));
  if (!p || *p < 0 || *p > 65535) return false;
  port = static_cast<int>(*p);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, target;
  long count = 5;
  long timeout_ms = 5000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--listen" || a == "--connect") {
      mode = a;
      target = v;
    } else if (a == "--count" || a == "--timeout-ms") {
      const auto n = atlas::units::parse_int(v);
      if (!n || *n < 1) return usage(("bad value for " + a).c_str());
      (a == "--count" ? count : timeout_ms) = static_cast<long>(*n);
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  std::string host;
  int port = 0;
  if (mode.empty() || !split(target, host, port)) return usage("need --listen or --connect HOST:PORT");
  try {
    if (mode == "--listen") {
      int bound = 0;
      atlas::wan::Fd l = atlas::wan::listen_tcp(host, port, bound);
      std::printf("listening %s:%d\n", host.c_str(), bound);
      std::fflush(stdout);
      for (long n = 0; n < count;) {
        pollfd pf{l.get(), POLLIN, 0};
        if (poll(&pf, 1, 1000) <= 0) continue;
        const int c = accept(l.get(), nullptr, nullptr);
        if (c >= 0) {
          close(c);
          ++n;
        }
      }
      return 0;
    }
    const atlas::wan::SockAddr sa = atlas::wan::resolve(host, port);
    std::vector<double> ms;
    for (long i = 0; i < count; ++i) {
      bool in_progress = false;
      std::string err;
      const auto t0 = std::chrono::steady_clock::now();
      atlas::wan::Fd fd = atlas::wan::connect_tcp(sa, in_progress, err);
      if (!fd.valid()) {
        std::fprintf(stderr, "atlas-wan-probe: %s\n", err.c_str());
        return 2;
      }
      if (in_progress) {
        pollfd pf{fd.get(), POLLOUT, 0};
        if (poll(&pf, 1, static_cast<int>(timeout_ms)) != 1) {
          std::fprintf(stderr, "atlas-wan-probe: connect to %s timed out after %ld ms (is the "
                               "delayer running?)\n", sa.text.c_str(), timeout_ms);
          return 2;
        }
        if (const std::string e = atlas::wan::connect_error(fd.get()); !e.empty()) {
          std::fprintf(stderr, "atlas-wan-probe: connect to %s: %s\n", sa.text.c_str(), e.c_str());
          return 2;
        }
      }
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("rtt_ms median=%.2f min=%.2f max=%.2f n=%zu\n", ms[ms.size() / 2], ms.front(),
                ms.back(), ms.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas-wan-probe: %s\n", e.what());
    return 2;
  }
}
