// SPDX-License-Identifier: MIT
// atlas-decode-worker: BubbleTea's decode worker process (one per DC, started by the DC's first
// inference rank; never by hand in normal use). Listens on --host, reports its port on
// --ready-fd, then runs bubbletea::DecodeServer until the DC's ranks finish. No MPI.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "atlas/bubbletea/decode.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: atlas-decode-worker --host HOST --ready-fd FD [--threads N] [--nice N] [--timeout-s S]\n"
               "  started by atlas train when bubbletea.enabled = true; listens on HOST (port chosen by the\n"
               "  kernel), writes 'PORT <n>' to FD, then decodes the DC's finished prefills.\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host;
  int ready_fd = -1;
  int threads = 1;
  int nice_level = 19;
  double timeout_s = 60.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    const auto as_int = atlas::units::parse_int(v);
    if (a == "--host") host = v;
    else if (a == "--ready-fd" && as_int) ready_fd = static_cast<int>(*as_int);
    else if (a == "--threads" && as_int && *as_int >= 1) threads = static_cast<int>(*as_int);
    else if (a == "--nice" && as_int) nice_level = static_cast<int>(*as_int);
    else if (a == "--timeout-s" && atlas::units::parse_double(v)) timeout_s = *atlas::units::parse_double(v);
    else return usage();
  }
  if (host.empty() || ready_fd < 0) return usage();
  // Decoding runs on machines outside the training pipeline; on a shared host it must only use
  // spare CPU, so the worker runs at the lowest priority.
  if (nice_level != 0) (void)setpriority(PRIO_PROCESS, 0, nice_level);
  // At the lowest level, SCHED_IDLE as well: a training rank that wakes from a wait preempts
  // the worker at once instead of after the worker's time slice (nice 19 still gets one).
  if (nice_level >= 19) {
    sched_param param{};
    if (sched_setscheduler(0, SCHED_IDLE, &param) != 0)
      std::fprintf(stderr, "atlas-decode-worker: SCHED_IDLE refused (%s); staying at nice %d\n", std::strerror(errno),
                   nice_level);
  }
  try {
    int port = 0;
    atlas::wan::Fd listener = atlas::wan::listen_tcp(host, 0, port);
    const std::string line = fmt::format("PORT {}\n", port);
    if (::write(ready_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      std::fprintf(stderr, "atlas-decode-worker: cannot report the port: %s\n", std::strerror(errno));
      return 3;
    }
    ::close(ready_fd);
    atlas::bubbletea::DecodeServerOptions opt;
    opt.threads = threads;
    opt.timeout_s = timeout_s;
    atlas::bubbletea::DecodeServer server(std::move(listener), opt);
    (void)server.run();
    return 0;
  } catch (const atlas::Error& e) {
    std::fprintf(stderr, "atlas-decode-worker: ERROR: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas-decode-worker: ERROR: %s\n", e.what());
    return 6;
  }
}
