// SPDX-License-Identifier: MIT
// DirLock (one job per run directory): a second job finds the directory taken and every rank
// throws the same ConfigError at once, naming the directory, the holder and the fix; a lock file
// nobody holds (left by a job that died) does not block; the lock ends with its holder; a lock
// file that is a symbolic link is refused, never followed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/io/dir_lock.hpp"
#include "test_io_model.hpp"

namespace atlas::io {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

mpi::Comm& world() {
  static mpi::Comm c = mpi::Comm::world();
  return c;
}

std::string text_of(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

DirLock lock_run(const std::string& dir) {
  return DirLock::acquire(world(), dir, "run directory", "give this job its own run.name");
}

TEST(DirLock, ASecondJobIsAConfigErrorOnEveryRankNamingTheDirectoryHolderAndFix) {
  testing::SharedTempDir tmp(world());
  const std::string dir = tmp.path() + "/runs/x";
  const DirLock first = lock_run(dir);  // creates the directory
  EXPECT_EQ(first.held(), world().rank() == 0);
  const std::string holder = fmt::format("pid {} on host ", ::getpid());
  if (world().rank() == 0) {
    EXPECT_THAT(text_of(dir + "/.lock"), HasSubstr(holder));
  }
  // Another job: its rank 0 opens the file anew (flock locks belong to the open file, so this
  // process's second open conflicts exactly as another process's would).
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg = "<no ConfigError>";
  try {
    (void)lock_run(dir);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 2.0) << "the second job must not wait for the lock";
  std::string rank0_pid = std::to_string(::getpid());
  world().bcast_string(rank0_pid, 0);
  EXPECT_THAT(msg, HasSubstr("run directory '" + dir + "' is in use by another atlas job (pid " +
                             rank0_pid + " on host "));
  EXPECT_THAT(msg, HasSubstr("lock file " + dir + "/.lock"));
  EXPECT_THAT(msg, HasSubstr("would mix its metrics and checkpoints"));
  EXPECT_THAT(msg, HasSubstr("hint: give this job its own run.name"));
}

TEST(DirLock, ALockFileNobodyHoldsDoesNotBlockAndTheLockEndsWithItsHolder) {
  testing::SharedTempDir tmp(world());
  const std::string dir = tmp.path() + "/runs/y";
  if (world().rank() == 0) {  // left behind by a job that was killed
    fs::create_directories(dir);
    std::ofstream(dir + "/.lock") << "pid 999999 on host gone, since 2020-01-01T00:00:00Z\n";
  }
  world().barrier();
  {
    DirLock lock = lock_run(dir);
    EXPECT_EQ(lock.held(), world().rank() == 0);
    if (world().rank() == 0) {
      const std::string text = text_of(dir + "/.lock");
      EXPECT_THAT(text, HasSubstr(fmt::format("pid {} on host ", ::getpid())));
      EXPECT_THAT(text, ::testing::Not(HasSubstr("999999")));
    }
    DirLock moved = std::move(lock);
    EXPECT_FALSE(lock.held());
    EXPECT_EQ(moved.held(), world().rank() == 0);
  }  // released: the file stays, empty
  if (world().rank() == 0) {
    EXPECT_TRUE(fs::exists(dir + "/.lock"));
    EXPECT_EQ(text_of(dir + "/.lock"), "");
  }
  EXPECT_NO_THROW((void)lock_run(dir));
}

TEST(DirLock, ALockHeldByAnotherProcessBlocksUntilThatProcessDies) {
  testing::SharedTempDir tmp(world());
  const std::string dir = tmp.path() + "/runs/z";
  int pipe_fds[2] = {-1, -1};
  pid_t child = -1;
  if (world().rank() == 0) {
    fs::create_directories(dir);
    ASSERT_EQ(::pipe(pipe_fds), 0);
    child = ::fork();  // a plain process holding the lock; it only sleeps, then is killed
    if (child == 0) {
      const int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
      const int ok = fd >= 0 && ::flock(fd, LOCK_EX) == 0 ? 1 : 0;
      (void)!::write(pipe_fds[1], &ok, sizeof ok);
      for (;;) ::pause();
    }
    int ok = 0;
    ASSERT_EQ(::read(pipe_fds[0], &ok, sizeof ok), static_cast<ssize_t>(sizeof ok));
    ASSERT_EQ(ok, 1);
  }
  world().barrier();
  EXPECT_THROW((void)lock_run(dir), ConfigError);
  if (world().rank() == 0) {  // the holder dies without any cleanup: the kernel drops its lock
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
  }
  world().barrier();
  EXPECT_NO_THROW((void)lock_run(dir));
}

TEST(DirLock, ALockFileThatIsASymlinkIsRefusedAndItsTargetLeftAlone) {
  testing::SharedTempDir tmp(world());
  const std::string dir = tmp.path() + "/runs/s";
  const std::string target = tmp.path() + "/precious.txt";
  const std::string lock = dir + "/.lock";
  if (world().rank() == 0) {  // planted: .lock -> a file someone else cares about
    fs::create_directories(dir);
    std::ofstream(target) << "precious data\n";
    fs::create_symlink(target, lock);
  }
  world().barrier();
  try {
    (void)lock_run(dir);
    ADD_FAILURE() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), HasSubstr("the lock file '" + lock + "' of run directory '" + dir +
                                    "' is a symbolic link"));
  }
  if (world().rank() == 0) {
    EXPECT_EQ(text_of(target), "precious data\n");
    // A dangling one is refused too (O_CREAT would otherwise create its target).
    fs::remove(lock);
    fs::create_symlink(tmp.path() + "/elsewhere", lock);
  }
  world().barrier();
  EXPECT_THROW((void)lock_run(dir), Error);
  if (world().rank() == 0) {
    EXPECT_FALSE(fs::exists(tmp.path() + "/elsewhere"));
  }
}

TEST(DirLock, ADirectoryThatCannotBeCreatedIsAnIoErrorOnEveryRank) {
  testing::SharedTempDir tmp(world());
  if (world().rank() == 0) std::ofstream(tmp.path() + "/runs") << "a file, not a directory";
  world().barrier();
  const std::string dir = tmp.path() + "/runs/x";
  try {
    (void)lock_run(dir);
    ADD_FAILURE() << "expected atlas::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), HasSubstr("cannot create run directory '" + dir + "'"));
  }
}

}  // namespace
}  // namespace atlas::io
