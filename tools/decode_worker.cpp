// SPDX-License-Identifier: MIT
// atlas-decode-worker: BubbleTea's decode worker process (one per DC, started by the DC's first
// inference rank; never by hand in normal use). Listens on --host, reports its port on
// --ready-fd, then runs bubbletea::DecodeServer until the DC's ranks finish. No MPI.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

/// Every thread of this process at `nice_level`, and SCHED_IDLE at 19. Linux keeps the nice
/// value and the policy per thread, and OpenBLAS starts its pool when the library loads, before
/// main: lowering only the main thread left that pool, which runs the decode GEMMs, at nice 0,
/// where it took the cores from training ranks for tens of ms (`perf sched timehist`). Threads
/// started later inherit the main thread's setting. Returns how many settings were refused.
int lower_every_thread(int nice_level) {
  int refused = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const auto tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice_level) != 0) ++refused;
    if (nice_level >= 19) {
      // A training rank that wakes preempts an idle-policy thread at once (nice 19 still gets a
      // time slice first).
      sched_param param{};
      if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0) ++refused;
    }
  }
  return refused;
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
  // A stop request (SIGUSR1) is for the training ranks: the launcher signals the rank's whole
  // process group, this worker included, and the ranks stop it themselves when they end.
  std::signal(SIGUSR1, SIG_IGN);
  // Decoding runs on machines outside the training pipeline; on a shared host it must only use
  // spare CPU, so every thread of the worker runs at the lowest priority (SCHED_IDLE at 19).
  if (nice_level != 0) {
    if (const int refused = lower_every_thread(nice_level); refused > 0)
      std::fprintf(stderr, "atlas-decode-worker: could not lower %d thread setting(s) to nice %d%s (%s)\n", refused,
                   nice_level, nice_level >= 19 ? " / SCHED_IDLE" : "", std::strerror(errno));
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
