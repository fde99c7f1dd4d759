// SPDX-License-Identifier: MIT
// DirLock: flock(2) on DIR/.lock taken by rank 0, its verdict broadcast (see dir_lock.hpp).
#include "atlas/io/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/log.hpp"
#include "ckpt_internal.hpp"

namespace fs = std::filesystem;

namespace atlas::io {

namespace {

/// The lock file's text (who holds it), without trailing white space; "" if unreadable.
std::string holder_of(int fd) {
  std::string text(512, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) {
    text.pop_back();
  }
  return text;
}

std::string me_as_holder() {
  const std::string host = env::host_name();
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return fmt::format("pid {} on host {}, since {}", ::getpid(), host, when);
}

}  // namespace

DirLock DirLock::acquire(const mpi::Comm& comm, const std::string& dir, const std::string& role,
                         const std::string& hint) {
  int fd = -1;
  (void)internal::run_on_root(comm, [&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) ATLAS_THROW(Io, "cannot create " << role << " '" << dir << "': " << ec.message());
    const std::string path = (fs::path(dir) / kDirLockFile).string();
    // O_NOFOLLOW: a planted .lock symlink must not make us create, truncate and overwrite the
    // file it points to (ELOOP, also for a dangling one). Only a plain file is written to.
    const int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f < 0) {
      const int err = errno;
      if (err == ELOOP) {
        ATLAS_THROW(Io, "the lock file '" << path << "' of " << role << " '" << dir
                                          << "' is a symbolic link; atlas does not follow it "
                                             "(it would overwrite the file it points to)\n"
                                             "  hint: remove the link; atlas creates the lock "
                                             "file itself");
      }
      ATLAS_THROW(Io, "cannot open the lock file '" << path << "' of " << role << " '" << dir
                                                    << "': " << std::strerror(err));
    }
    struct stat st {};
    if (::fstat(f, &st) != 0) {
      const int err = errno;
      ::close(f);
      ATLAS_THROW(Io, "cannot stat the lock file '" << path << "' of " << role << " '" << dir
                                                    << "': " << std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {  // a FIFO or device planted there: never truncate or write it
      ::close(f);
      ATLAS_THROW(Io, "the lock file '" << path << "' of " << role << " '" << dir
                                        << "' is not a regular file\n"
                                           "  hint: remove it; atlas creates the lock file itself");
    }
    if (::flock(f, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = holder_of(f);
      ::close(f);
      if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP) {
        // A file system without locks: refusing to run there would stop all work on it, so go
        // on unprotected, and say so.
        log::warn("{} '{}' cannot be locked on this file system ({}): a second job started in "
                  "it would not be stopped",
                  role, dir, std::strerror(err));
        return std::string();
      }
      if (err != EWOULDBLOCK) {
        ATLAS_THROW(Io, "cannot lock '" << path << "' (" << role << " '" << dir
                                        << "'): " << std::strerror(err));
      }
      throw ConfigError(fmt::format(
          "{} '{}' is in use by another atlas job ({}; lock file {}): a second job would mix its "
          "metrics and checkpoints with that job's\n  hint: {}",
          role, dir, holder.empty() ? "its holder has not written its pid yet" : holder, path,
          hint));
    }
    // Ours. Record who holds it, for the message a second job prints (best effort: the lock
    // itself is the flock, not this text).
    const std::string text = me_as_holder() + "\n";
    if (::ftruncate(f, 0) != 0 ||
        ::pwrite(f, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      log::warn("could not record this job in the lock file '{}': {}", path, std::strerror(errno));
    }
    fd = f;
    return std::string();
  });
  return DirLock(fd);
}

void DirLock::release() noexcept {
  if (m_fd < 0) return;
  (void)::ftruncate(m_fd, 0);  // no holder any more; a failure only leaves a stale text
  ::close(m_fd);
  m_fd = -1;
}

DirLock::~DirLock() { release(); }

DirLock::DirLock(DirLock&& other) noexcept : m_fd(std::exchange(other.m_fd, -1)) {}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    m_fd = std::exchange(other.m_fd, -1);
  }
  return *this;
}

}  // namespace atlas::io
