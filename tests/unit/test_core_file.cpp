// SPDX-License-Identifier: MIT
// write_file_whole: a failed write is an Io error naming the file and the reason, and never
// truncates the file it would have replaced.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

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
