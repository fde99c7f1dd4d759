// SPDX-License-Identifier: MIT
// write_file_whole: a failed write is an Io error naming the file and the reason, and never
// truncates the file it would have replaced.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "atlas/core/error.hpp"
#include "atlas/core/file.hpp"
#include "support/temp_dir.hpp"

namespace atlas {
namespace {

namespace fs = std::filesystem;

using test::slurp;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("atlas-file") {}
};

/// A full disk for this process's file writes: files may grow to `bytes` only (RLIMIT_FSIZE; its
/// SIGXFSZ ignored, so a write past it fails with EFBIG). Restored when it goes.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit r = saved;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  rlimit saved{};
  void (*old_handler)(int) = nullptr;
};

TEST(WriteFileWhole, WritesAndReplaces) {
  TempDir t;
  const std::string p = (t.path / "run.json").string();
  write_file_whole(p, "first\n");
  write_file_whole(p, "second\n");
  EXPECT_EQ(slurp(p), "second\n");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(WriteFileWhole, AFullDiskIsAnIoErrorAndKeepsTheOldFile) {
  TempDir t;
  const std::string p = (t.path / "metrics.csv").string();
  write_file_whole(p, "kept\n");
  {
    const FileSizeLimit full(1000);  // the new file does not fit
    try {
      write_file_whole(p, std::string(1 << 16, 'x'));
      FAIL() << "expected an Io error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Io);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("writing " + p + ".tmp failed: File too large"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(p + " was left as it was"));
    }
  }
  EXPECT_EQ(slurp(p), "kept\n");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// A symbolic link at the temporary name (planted in a shared directory, or left over) is refused,
// never written through: its target is not truncated.
TEST(WriteFileWhole, ALinkAtTheTemporaryNameIsRefusedNotFollowed) {
  TempDir t;
  const std::string p = (t.path / "run.json").string();
  const std::string victim = (t.path / "victim").string();
  write_file_whole(victim, "precious\n");
  fs::create_symlink(victim, p + ".tmp");
  try {
    write_file_whole(p, "x");
    FAIL() << "expected an Io error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot create " + p + ".tmp"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("it is a symbolic link"));
  }
  EXPECT_EQ(slurp(victim), "precious\n");
  EXPECT_FALSE(fs::exists(p));
}

TEST(WriteFileWhole, AMissingDirectoryIsAnIoErrorNamingTheFile) {
  TempDir t;
  const std::string p = (t.path / "no" / "such" / "run.json").string();
  try {
    write_file_whole(p, "x");
    FAIL() << "expected an Io error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot create " + p + ".tmp: No such file or directory"));
  }
}

// A path that is a directory cannot be replaced: an Io error with the fix, and the temporary
// file is removed (it was left beside the path).
TEST(WriteFileWhole, ADirectoryInTheWayIsAnIoErrorAndLeavesNoTmp) {
  TempDir t;
  const fs::path p = t.path / "logits";
  fs::create_directories(p / "inside");
  try {
    write_file_whole(p.string(), "x");
    FAIL() << "expected an Io error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot rename " + p.string() + ".tmp to " + p.string()));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("hint: " + p.string() + " must be a file name (not a directory)"));
  }
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  EXPECT_TRUE(fs::is_directory(p / "inside"));
}

// Files that belong together (exported weights and their config): when the second cannot be
// written, the first is not replaced either, and no .tmp is left; durable writes replace both.
TEST(WriteFilesWhole, AFailedWriteOfOneLeavesEveryFileAsItWas) {
  TempDir t;
  const std::string a = (t.path / "model.safetensors").string();
  const std::string b = (t.path / "config.json").string();
  write_file_whole(a, "old weights");
  write_file_whole(b, "old config");
  {
    const FileSizeLimit full(1000);  // the first fits, the second does not
    try {
      write_files_whole({{a, "new weights"}, {b, std::string(1 << 16, 'x')}}, true);
      FAIL() << "expected an Io error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Io);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("writing " + b + ".tmp failed: File too large"));
    }
  }
  EXPECT_EQ(slurp(a), "old weights");
  EXPECT_EQ(slurp(b), "old config");
  EXPECT_FALSE(fs::exists(a + ".tmp"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(b + ".tmp")));
  write_files_whole({{a, "new weights"}, {b, "new config"}}, true);
  EXPECT_EQ(slurp(a), "new weights");
  EXPECT_EQ(slurp(b), "new config");
  EXPECT_FALSE(fs::exists(a + ".tmp"));
  EXPECT_FALSE(fs::exists(b + ".tmp"));
}

// A rename that fails (the second target is a directory now): the first file stays replaced (a
// rename cannot be taken back: the documented outcome), the rest as they were, no .tmp left.
TEST(WriteFilesWhole, AFailedRenameLeavesNoTemporaryFiles) {
  TempDir t;
  const std::string a = (t.path / "a.json").string();
  const std::string b = (t.path / "b").string();
  const std::string c = (t.path / "c.json").string();
  write_file_whole(a, "old a");
  fs::create_directory(b);
  std::ofstream(b + "/inside") << "x";
  write_file_whole(c, "old c");
  EXPECT_THROW(write_files_whole({{a, "new a"}, {b, "new b"}, {c, "new c"}}), Error);
  EXPECT_EQ(slurp(a), "new a");
  EXPECT_TRUE(fs::is_directory(b));
  EXPECT_EQ(slurp(c), "old c");
  for (const std::string& p : {a, b, c}) EXPECT_FALSE(fs::exists(fs::symlink_status(p + ".tmp"))) << p;
}

// A FIFO (what a shell's `--json >(jq .)` or `/dev/stdout` piped to a command is) cannot be
// replaced by a rename, and a temporary file beside /dev/stdout cannot be created: it is written
// in place, through a link too, and stays a FIFO.
TEST(WriteFileWhole, AFifoIsWrittenInPlaceThroughALink) {
  TempDir t;
  const std::string fifo = (t.path / "pipe").string();
  const std::string link = (t.path / "stdout").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, link);
  std::string got;
  std::thread reader([&] { got = slurp(fifo); });  // opens (blocking) before or after the writer
  // The reader's open may come after the writer's: retry an unread FIFO for up to 5 s.
  bool written = false;
  for (int i = 0; i < 500 && !written; ++i) {
    try {
      write_file_whole(link, "{\"rows\": 3}\n", true);
      written = true;
    } catch (const Error& e) {
      if (std::string(e.what()).find("no process reads") == std::string::npos) {
        ADD_FAILURE() << e.what();  // not ASSERT: the reader thread must be joined below
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Code that replaced the link instead never opens the FIFO: release the reader (it reads
  // nothing), so such a failure fails the test instead of hanging it.
  if (const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) ::close(fd);
  reader.join();
  ASSERT_TRUE(written);
  EXPECT_EQ(got, "{\"rows\": 3}\n");
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(fs::symlink_status(link + ".tmp")));
}

// /dev/stdout when the shell sent stdout to a file: written through stdout itself, after what
// was printed (still buffered) before it; the /dev/stdout link is never replaced.
TEST(WriteFileWhole, StdoutRedirectedToAFileGetsTheTextAfterWhatWasPrinted) {
  TempDir t;
  const std::string out = (t.path / "out.txt").string();
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ::dup2(fd, STDOUT_FILENO);
  ::close(fd);
  std::printf("# the tables\n");  // buffered: stdout is a file now
  std::string error;
  try {
    write_file_whole("/dev/stdout", "[1, 2]\n");
  } catch (const Error& e) {
    error = e.what();
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  EXPECT_EQ(error, "");
  EXPECT_EQ(slurp(out), "# the tables\n[1, 2]\n");
  EXPECT_TRUE(fs::is_symlink("/dev/stdout"));
  if (!fs::is_symlink("/dev/stdout") && ::getuid() == 0) {  // a regression replaced it: put it back
    std::error_code ec;
    fs::remove("/dev/stdout", ec);
    fs::create_symlink("/proc/self/fd/1", "/dev/stdout", ec);
  }
}

// A FIFO that no process reads is an Io error at once with the fix, never a wait without end.
TEST(WriteFileWhole, AFifoNobodyReadsIsAnErrorNotAHang) {
  TempDir t;
  const std::string fifo = (t.path / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    write_file_whole(fifo, "x");
    FAIL() << "expected an Io error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot open " + fifo + " to write"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("hint: it is a pipe (FIFO) that no process reads"));
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
}

// A character device (/dev/null here, /dev/stdout on a terminal) is written in place, through a
// link, the link kept; the same in a group of files (write_files_whole).
TEST(WriteFileWhole, ACharacterDeviceIsWrittenInPlaceAndTheLinkKept) {
  TempDir t;
  const std::string link = (t.path / "trace.json").string();
  fs::create_symlink("/dev/null", link);
  write_file_whole(link, "discarded\n", true);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), "/dev/null");
  const std::string other = (t.path / "config.json").string();
  write_files_whole({{link, "weights"}, {other, "config"}}, true);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(other), "config");
  EXPECT_FALSE(fs::exists(fs::symlink_status(link + ".tmp")));
}

// A link to a regular file is still replaced whole (the link itself: a planted link in a shared
// directory never makes atlas truncate its target).
TEST(WriteFileWhole, ALinkToARegularFileIsReplacedNotWrittenThrough) {
  TempDir t;
  const std::string victim = (t.path / "victim").string();
  const std::string p = (t.path / "run.json").string();
  write_file_whole(victim, "precious\n");
  fs::create_symlink(victim, p);
  write_file_whole(p, "new\n");
  EXPECT_FALSE(fs::is_symlink(p));
  EXPECT_EQ(slurp(p), "new\n");
  EXPECT_EQ(slurp(victim), "precious\n");
}

// A block device (a link to one, planted or mistyped) is refused: never written. The node made
// here names no device (major 240, for local use), so even a wrong write could not reach a disk.
TEST(WriteFileWhole, ABlockDeviceIsRefused) {
  TempDir t;
  const std::string dev = (t.path / "disk").string();
  if (::mknod(dev.c_str(), S_IFBLK | 0600, ::makedev(240, 0)) != 0)
    GTEST_SKIP() << "cannot make a block device node here (not root): " << std::strerror(errno);
  const std::string link = (t.path / "run.json").string();
  fs::create_symlink(dev, link);
  for (const std::string& p : {dev, link}) {
    try {
      write_file_whole(p, "x");
      FAIL() << "a block device was written through " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Io);
      EXPECT_THAT(e.what(), ::testing::HasSubstr("refusing to write " + p + ": it is a block device"));
    }
  }
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(fs::symlink_status(link + ".tmp")));
}

TEST(ReadFileBlocks, GivesEveryByteInBlocksWithTheirOffsets) {
  TempDir t;
  const std::string p = (t.path / "ten.txt").string();
  write_file_whole(p, "0123456789");
  std::string got;
  std::vector<std::int64_t> offsets;
  read_file_blocks(p, "text file", "-", 3, [&](std::string_view d, std::int64_t off) {
    got.append(d);
    offsets.push_back(off);
  });
  EXPECT_EQ(got, "0123456789");
  EXPECT_EQ(offsets, (std::vector<std::int64_t>{0, 3, 6, 9}));
  int calls = 0;
  write_file_whole(p, "");
  read_file_blocks(p, "text file", "-", 3, [&](std::string_view, std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);  // an empty file: no block
}

TEST(ReadFileBlocks, AMissingFileOrAFailedReadIsAnIoErrorNamingItAndTheHint) {
  TempDir t;
  const std::string p = (t.path / "missing.txt").string();
  try {
    read_file_blocks(p, "corpus file", "check the path", 16, [](std::string_view, std::int64_t) {});
    FAIL() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot read corpus file " + p + ": No such file or directory\n"
                                               "  hint: check the path"));
  }
  // /proc/self/mem opens, and its first read (address 0, unmapped) fails with EIO.
  try {
    read_file_blocks("/proc/self/mem", "text file", "try again", 16, [](std::string_view, std::int64_t) {});
    FAIL() << "a failed read was taken for the end of the file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Io);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("reading text file /proc/self/mem failed after 0 bytes: "
                                               "Input/output error\n  hint: try again"));
  }
}

}  // namespace
}  // namespace atlas
