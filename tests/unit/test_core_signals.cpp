// SPDX-License-Identifier: MIT
// core/signals: SIGUSR1 is recorded as a stop request while a StopRequests scope lives (and the
// previous handler comes back after it); a SIGTERM/SIGINT/SIGHUP under InterruptNotes writes the
// note (log line, run.json) and the process still dies of the signal; a signal the process
// ignores (nohup's SIGHUP) stays ignored. The dying cases run in a forked child.
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "atlas/core/signals.hpp"
#include "support/temp_dir.hpp"

namespace atlas {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using test::slurp;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("atlas-signals") {}
};

volatile std::sig_atomic_t g_previous_ran = 0;
extern "C" void previous_handler(int) { g_previous_ran = 1; }

TEST(StopRequests, SigusrOneIsRecordedAndThePreviousHandlerComesBack) {
  struct sigaction mine {};
  mine.sa_handler = previous_handler;
  sigemptyset(&mine.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGUSR1, &mine, &saved), 0);
  {
    const signals::StopRequests scope;
    EXPECT_EQ(signals::stop_requested(), 0);
    ASSERT_EQ(::raise(SIGUSR1), 0);
    EXPECT_EQ(signals::stop_requested(), SIGUSR1);
    EXPECT_EQ(g_previous_ran, 0);
    signals::clear_stop_request();
    EXPECT_EQ(signals::stop_requested(), 0);
  }
  ASSERT_EQ(::raise(SIGUSR1), 0);
  EXPECT_EQ(g_previous_ran, 1) << "the handler installed before the scope is back";
  EXPECT_EQ(signals::stop_requested(), 0);
  ::sigaction(SIGUSR1, &saved, nullptr);
}

TEST(StopRequests, ALateRequestIsIgnoredWhereTheDefaultWouldKill) {
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGUSR1, nullptr, &saved), 0);
  ::signal(SIGUSR1, SIG_DFL);
  { const signals::StopRequests scope; }
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGUSR1, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN) << "a SIGUSR1 after the job must not kill the rank";
  ASSERT_EQ(::raise(SIGUSR1), 0);  // survives
  EXPECT_EQ(signals::stop_requested(), 0);
  ::sigaction(SIGUSR1, &saved, nullptr);
}

/// Forks a child that arms the note (after `step`, `checkpoint`) and raises `sig`; returns the
/// child's wait status.
int child_raises(const TempDir& t, int sig, int step, int checkpoint, bool ignore_first = false,
                 bool broken_stderr = false) {
  int pipe_fds[2] = {-1, -1};
  if (broken_stderr) {
    if (::pipe(pipe_fds) != 0) return -1;
    ::close(pipe_fds[0]);  // before the fork: no process holds a read end
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (broken_stderr) {  // stderr a pipe nobody reads any more (`atlas train | tee`, tee gone)
      ::dup2(pipe_fds[1], STDERR_FILENO);
      ::close(pipe_fds[1]);
    }
    if (ignore_first) ::signal(sig, SIG_IGN);
    {
      std::ofstream(t.path / "log.txt") << "# earlier lines\n";
      const signals::InterruptNotes notes(
          {(t.path / "log.txt").string(), (t.path / "run.json").string(), "job \\\"q\\\"", 12});
      signals::set_progress(step, checkpoint);
      ::raise(sig);
      // Only reached when the signal is ignored.
      std::ofstream(t.path / "survived") << "yes\n";
    }
    ::_exit(0);
  }
  if (broken_stderr) ::close(pipe_fds[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(InterruptNotes, SigtermWritesTheNoteAndStillKills) {
  TempDir t;
  const int status = child_raises(t, SIGTERM, 7, 4);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the process dies of the signal, as without the note";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  const std::string log = slurp(t.path / "log.txt");
  EXPECT_THAT(log, HasSubstr("# earlier lines\n")) << "appended, nothing lost";
  EXPECT_THAT(log, HasSubstr("ERROR: rank 0 received SIGTERM during step 7 of run.steps = 12 (scancel, a time "
                             "limit, Ctrl-C, or the launcher ending the job after another rank failed); the "
                             "newest checkpoint is at step 4 (resume with run.resume=latest)\n"));
  EXPECT_THAT(log, HasSubstr("hint: to stop with a checkpoint instead, send SIGUSR1"));
  EXPECT_EQ(slurp(t.path / "run.json"),
            "{\"run\":\"job \\\"q\\\"\",\"status\":\"interrupted\",\"signal\":\"SIGTERM\",\"step\":7,\"steps\":12,"
            "\"checkpoint_step\":4}\n");
  EXPECT_FALSE(fs::exists(t.path / "run.json.signal.tmp"));
}

TEST(InterruptNotes, ABrokenStderrDoesNotLoseTheNote) {
  // The note went to stderr first: SIGPIPE from a reader that had gone killed the process before
  // log.txt and run.json had it. The child's stderr is a pipe without a reader: the files must
  // have the note, and the process die of SIGTERM, not SIGPIPE.
  TempDir t;
  const int status = child_raises(t, SIGTERM, 5, 2, false, /*broken_stderr=*/true);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM) << "died of signal " << WTERMSIG(status);
  EXPECT_THAT(slurp(t.path / "log.txt"), HasSubstr("received SIGTERM during step 5 of run.steps = 12"));
  EXPECT_THAT(slurp(t.path / "run.json"), HasSubstr("\"status\":\"interrupted\",\"signal\":\"SIGTERM\",\"step\":5"));
}

TEST(InterruptNotes, SigintWithoutACheckpointSaysSo) {
  TempDir t;
  const int status = child_raises(t, SIGINT, 0, -1);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_THAT(slurp(t.path / "log.txt"), HasSubstr("received SIGINT during step 0 of run.steps = 12 ("));
  EXPECT_THAT(slurp(t.path / "log.txt"), HasSubstr("); no checkpoint of this run was written yet\n"));
  EXPECT_THAT(slurp(t.path / "run.json"), HasSubstr("\"signal\":\"SIGINT\",\"step\":0,\"steps\":12,\"checkpoint_step\":null}"));
}

TEST(InterruptNotes, AnIgnoredSignalStaysIgnored) {
  TempDir t;
  const int status = child_raises(t, SIGHUP, 3, -1, /*ignore_first=*/true);
  ASSERT_TRUE(WIFEXITED(status)) << "nohup's SIGHUP must not start killing the job";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::exists(t.path / "survived"));
  EXPECT_FALSE(fs::exists(t.path / "run.json"));
}

// A second fatal signal on another thread while the first one's handler is writing the note (here
// held in its open() of log.txt, a FIFO nobody reads yet) waits for the note instead of killing the
// process with it half written: the note arrives once a reader opens the FIFO, and the process
// dies of the first signal. Before, the second handler re-raised at once: nothing was written.
TEST(InterruptNotes, ASecondSignalOnAnotherThreadWaitsForTheNote) {
  TempDir t;
  const fs::path fifo = t.path / "log.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const signals::InterruptNotes notes({fifo.string(), (t.path / "run.json").string(), "two", 12});
    signals::set_progress(3, -1);
    std::thread first([] { ::pthread_kill(::pthread_self(), SIGTERM); });  // blocks in open(fifo)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::raise(SIGINT);  // the second signal, on this thread
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  std::string note;
  char buf[4096];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until && note.find('\n') == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) note.append(buf, static_cast<std::size_t>(n));
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(fd);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_THAT(note, HasSubstr("ERROR: rank 0 received SIGTERM during step 3 of run.steps = 12"))
      << "the second signal killed the process before the note was written";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM) << "died of signal " << WTERMSIG(status);
}

}  // namespace
}  // namespace atlas
