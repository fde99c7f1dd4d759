// SPDX-License-Identifier: MIT
// Starting and stopping the decode worker process (see decode.hpp). posix_spawn (no fork of the
// MPI process's address space); the worker reports its listening port through a pipe.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "atlas/bubbletea/decode.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/error.hpp"

extern char** environ;

namespace atlas::bubbletea {

namespace fs = std::filesystem;

std::string default_worker_program() {
  if (const std::optional<std::string> env = env::get("ATLAS_DECODE_WORKER")) {
    if (!fs::exists(*env))
      throw ConfigError(fmt::format("ATLAS_DECODE_WORKER = '{}' does not exist", *env));
    return *env;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path candidate = ec ? fs::path("atlas-decode-worker") : self.parent_path() / "atlas-decode-worker";
  if (!fs::exists(candidate))
    throw ConfigError(fmt::format("bubbletea.enabled = true needs the decode worker program, but '{}' does not exist"
                                  "\n  hint: build the atlas-decode-worker target (it is placed next to atlas) or set "
                                  "ATLAS_DECODE_WORKER",
                                  candidate.string()));
  return candidate.string();
}

WorkerProcess WorkerProcess::spawn(const std::string& program, const std::string& host, int threads, int nice,
                                   double timeout_s) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) < 0)
    ATLAS_THROW(Comm, "cannot create the decode worker's pipe: " << std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 3);  // dup2 clears FD_CLOEXEC on fd 3
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // The worker must not keep the MPI library's sockets and pipes open (mpirun waits for them).
  posix_spawn_file_actions_addclosefrom_np(&fa, 4);
#endif
  std::vector<std::string> words{program,          "--host",  host, "--ready-fd", "3", "--threads",
                                 std::to_string(threads), "--nice", std::to_string(nice), "--timeout-s",
                                 fmt::format("{:.0f}", timeout_s)};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(pipefd[1]);
  if (rc != 0) {
    ::close(pipefd[0]);
    ATLAS_THROW(Comm, "cannot start the decode worker '" << program << "': " << std::strerror(rc));
  }
  WorkerProcess w;
  w.m_pid = pid;
  // Read "PORT <n>\n" (the child writes it once it listens).
  std::string line;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration<double, std::milli>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      ::close(pipefd[0]);
      ATLAS_THROW(Comm, "the decode worker '" << program << "' did not report its port within " << timeout_s << " s");
    }
    pollfd p{pipefd[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left) + 1) <= 0) continue;
    char buf[64];
    const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n <= 0) {
      ::close(pipefd[0]);
      ATLAS_THROW(Comm, "the decode worker '" << program << "' exited before listening (see its message above)");
    }
    line.append(buf, static_cast<std::size_t>(n));
  }
  ::close(pipefd[0]);
  int port = 0;
  if (std::sscanf(line.c_str(), "PORT %d", &port) != 1 || port <= 0 || port > 65535)
    ATLAS_THROW(Comm, "the decode worker reported '" << line << "' instead of its port");
  w.m_port = port;
  return w;
}

WorkerProcess::WorkerProcess(WorkerProcess&& o) noexcept
    : m_pid(std::exchange(o.m_pid, -1)), m_port(std::exchange(o.m_port, 0)) {}

WorkerProcess& WorkerProcess::operator=(WorkerProcess&& o) noexcept {
  if (this != &o) {
    if (m_pid > 0) (void)wait(0.0);
    m_pid = std::exchange(o.m_pid, -1);
    m_port = std::exchange(o.m_port, 0);
  }
  return *this;
}

WorkerProcess::~WorkerProcess() {
  if (m_pid > 0) (void)wait(0.0);
}

int WorkerProcess::wait(double timeout_s) {
  if (m_pid <= 0) return 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(m_pid, &status, WNOHANG);
    if (r == m_pid) break;
    if (r < 0 && errno != EINTR) {
      m_pid = -1;
      return 0;
    }
    if (std::chrono::steady_clock::now() >= until) {
      ::kill(m_pid, SIGKILL);
      ::waitpid(m_pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  m_pid = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 0;
}

}  // namespace atlas::bubbletea
