// SPDX-License-Identifier: MIT
// One job per directory: an advisory flock(2) on DIR/.lock, held by world rank 0 for the whole
// job, so a second job started with the same run.name (or ckpt.dir) stops at once with a clear
// error instead of mixing its metrics and checkpoints with the first one's. Not a mutex between
// ranks of one job, and not a guard against tools that ignore it.
#pragma once

#include <string>

#include "atlas/mpi/comm.hpp"

namespace atlas::io {

/// Name of the lock file inside a locked directory.
inline constexpr const char* kDirLockFile = ".lock";

/// An exclusive flock(2) on DIR/.lock, held through an open descriptor (close-on-exec) on world
/// rank 0 of the job for this object's lifetime; the other ranks hold nothing. The kernel drops
/// the lock when the holder exits in any way (crash, SIGKILL), so a dead job never blocks the
/// next one: a lock file nobody holds is simply taken over. The file stays (atlas never deletes
/// it: unlinking a lock file races with a job that has just opened it); while held it names the
/// holder ("pid P on host H, since UTC"), and it is emptied on release. On NFS, flock is emulated
/// with POSIX locks (Linux >= 2.6.12), which works across clients when the server supports locks.
/// Move-only.
class DirLock {
 public:
  DirLock() = default;
  /// Collective over `comm`: rank 0 creates `dir` if needed, opens DIR/.lock and tries
  /// flock(LOCK_EX | LOCK_NB); it never waits. The verdict is broadcast, so when another process
  /// holds the lock every rank throws the same ConfigError (exit code 2), naming `role` ("run
  /// directory"), the directory, the holder as the lock file records it, and `hint` (the fix).
  /// A directory or lock file that cannot be created is atlas::Error (Io) on every rank, and so
  /// is a DIR/.lock that is a symbolic link (never followed: O_NOFOLLOW) or not a regular file,
  /// which is left as it is. On a file system without lock support (ENOLCK, ENOSYS, EOPNOTSUPP)
  /// rank 0 warns and the job runs unprotected (held() is false everywhere).
  [[nodiscard]] static DirLock acquire(const mpi::Comm& comm, const std::string& dir,
                                       const std::string& role, const std::string& hint);
  ~DirLock();
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  /// True on the rank that holds the lock (world rank 0 of the job that acquired it).
  [[nodiscard]] bool held() const noexcept { return m_fd >= 0; }
  /// Empties the lock file and closes it (which releases the lock). Idempotent.
  void release() noexcept;

 private:
  explicit DirLock(int fd) : m_fd(fd) {}
  int m_fd = -1;
};

}  // namespace atlas::io
