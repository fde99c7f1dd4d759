// SPDX-License-Identifier: MIT
// Token shards (shards.hpp): the llm.c header as written, a set read back across file ends, the
// DataLoader over shards serving exactly the text loader's batches (every replica, several
// epochs), tokenize_to_shards's piecewise encoding equal to one encode of the whole text, and
// every bad input a ConfigError naming the file and the fix: wrong magic, version, length, a
// token outside the vocabulary, a glob that matches nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <regex>

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "atlas/core/crc32c.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/shards.hpp"

namespace atlas::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() : m_path(fs::temp_directory_path() / ("atlas_test_shards_" + std::to_string(::getpid()))) {
    fs::remove_all(m_path);
    fs::create_directories(m_path);
  }
  ~TempDir() { fs::remove_all(m_path); }
  [[nodiscard]] std::string at(const std::string& name) const { return (m_path / name).string(); }

 private:
  fs::path m_path;
};

std::string synthetic_text(std::size_t n) {
  std::string s;
  const char* words[] = {"the ", "jury ", "said\n", "Friday ", "an ", "investigation ", "of "};
  for (std::size_t i = 0; s.size() < n; ++i) s += words[(i * 7 + i / 3) % 7];
  s.resize(n);
  return s;
}

/// A shard file with the given header fields and tokens (as another program would write it).
void write_raw(const std::string& path, std::int32_t magic, std::int32_t version, std::int32_t count,
               const std::vector<std::uint16_t>& tokens) {
  std::array<std::int32_t, 256> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return {};
}

// A file in both lists (the pattern DIR/*.bin for training), or named twice in one list (also
// through another path to it), is a config error naming the file; disjoint lists pass.
TEST(Shards, ListsThatOverlapAreRefused) {
  TempDir dir;
  std::vector<std::uint16_t> tokens(20, 7);
  write_shards(tokens, dir.at(""), "train", 10);
  write_shards(tokens, dir.at(""), "val", 20);
  const auto train = expand_shard_globs({dir.at("train_*.bin")}, "data.train_shards");
  const auto val = expand_shard_globs({dir.at("val_*.bin")}, "data.val_shards");
  EXPECT_NO_THROW(check_shard_lists(train, val));
  const auto all = expand_shard_globs({dir.at("*.bin")}, "data.train_shards");
  ASSERT_EQ(all.size(), 3u);
  const std::string both = config_error([&] { check_shard_lists(all, val); });
  EXPECT_THAT(both, HasSubstr("'" + dir.at("val_000000.bin") + "' is both a training shard (data.train_shards) and a "
                              "validation shard (data.val_shards)"));
  EXPECT_THAT(both, HasSubstr("hint: give the lists patterns that do not overlap"));
  const std::string twice = config_error(
      [&] { check_shard_lists({dir.at("train_000000.bin"), dir.at("./train_000000.bin")}, val); });
  EXPECT_THAT(twice, HasSubstr("data.train_shards names '" + dir.at("./train_000000.bin") + "' twice (also as '" +
                               dir.at("train_000000.bin") + "')"));
  // A hard link is the same file too (its device and inode), and the validation list alone is
  // checked for a file named twice (atlas eval opens no training list).
  fs::create_hard_link(dir.at("val_000000.bin"), dir.at("hard.bin"));
  EXPECT_THAT(config_error([&] { check_shard_lists({dir.at("hard.bin")}, val); }),
              HasSubstr("'" + val.front() + "' is both a training shard"));
  EXPECT_THAT(config_error([&] { check_shard_lists({}, {val.front(), dir.at("hard.bin")}); }),
              HasSubstr("data.val_shards names '" + dir.at("hard.bin") + "' twice"));
}

TEST(Shards, ABrokenLinkIsNamedAsOne) {
  TempDir dir;
  fs::create_symlink(dir.at("gone.bin"), dir.at("val_000000.bin"));
  const auto val = expand_shard_globs({dir.at("val_*.bin")}, "data.val_shards");
  ASSERT_EQ(val.size(), 1u);
  EXPECT_THAT(config_error([&] { (void)ShardSet::open(val, 256, "data.val_shards"); }),
              HasSubstr("shard '" + dir.at("val_000000.bin") + "' (data.val_shards) is a broken symbolic link (to '" +
                        dir.at("gone.bin") + "')"));
}

TEST(Shards, MoreThanSixDigitsOfShardsIsRefused) {
  TempDir dir;
  const std::vector<std::uint16_t> tokens(1'000'000, 7);
  EXPECT_THAT(config_error([&] { (void)write_shards(tokens, dir.at(""), "train", 1); }),
              HasSubstr("make 1000000 train shards, more than the 999,999 six-digit names hold"));
  EXPECT_FALSE(fs::exists(dir.at("train_000000.bin"))) << "nothing written";
}

TEST(Shards, WriteIsTheLlmcLayoutAndReadsBackAcrossFiles) {
  TempDir dir;
  std::vector<std::uint16_t> tokens(20);
  std::iota(tokens.begin(), tokens.end(), std::uint16_t{100});
  const auto paths = write_shards(tokens, dir.at(""), "train", 7);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0], dir.at("train_000000.bin"));
  EXPECT_EQ(fs::file_size(paths[0]), 1024u + 14u);
  EXPECT_EQ(fs::file_size(paths[2]), 1024u + 12u);
  std::ifstream in(paths[1], std::ios::binary);
  std::array<std::int32_t, 256> header{};
  in.read(reinterpret_cast<char*>(header.data()), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 7);
  EXPECT_EQ(header[3], 0);
  std::uint16_t first = 0;
  in.read(reinterpret_cast<char*>(&first), 2);
  EXPECT_EQ(first, 107);

  const ShardSet set = ShardSet::open(expand_shard_globs({dir.at("train_*.bin")}, "k"), 256, "k");
  EXPECT_EQ(set.size(), 20);
  EXPECT_EQ(set.file_count(), 3);
  std::vector<std::int32_t> got(12);
  set.copy(5, 12, got.data());  // crosses both file ends
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], 105 + i);
}

// A shard that shrinks under its mapping (truncated in place while a run reads it) raises SIGBUS
// on the next read: the process still dies of it, but first names the file and the fix. A SIGBUS
// sent by kill says nothing of a file. (Under ASan, its own handler ends the process: exit 1.)
bool died_of_sigbus(int status) {
  return WIFSIGNALED(status) ? WTERMSIG(status) == SIGBUS : WIFEXITED(status) && WEXITSTATUS(status) != 0;
}

TEST(ShardsDeathTest, AShardTruncatedWhileMappedNamesTheFileInItsSigbus) {
  TempDir dir;
  std::vector<std::uint16_t> tokens(100000, 7);
  const auto paths = write_shards(tokens, dir.at(""), "train", 100000);
  const ShardSet set = ShardSet::open(paths, 256, "data.train_shards");
  ASSERT_EQ(::truncate(paths[0].c_str(), 1024), 0);
  std::vector<std::int32_t> got(16);
  EXPECT_EXIT(set.copy(90000, 16, got.data()), died_of_sigbus,
              "ERROR: SIGBUS reading token shard '" + std::regex_replace(paths[0], std::regex(R"([.])"), R"(\.)") +
                  "' at byte [0-9]+: the file is shorter than when it was opened.*\n  hint: write a new data set "
                  "into another directory or by rename");
  // kill(SIGBUS) while the shard is mapped: the process dies of it without a word of the file.
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(out[1], STDERR_FILENO);
    ::kill(::getpid(), SIGBUS);
    ::_exit(0);
  }
  ::close(out[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(died_of_sigbus(status)) << status;
  EXPECT_THAT(said, ::testing::Not(HasSubstr("token shard")));
}

TEST(Shards, TheLoaderServesTheTextLoadersBatchesOnEveryReplica) {
  TempDir dir;
  const std::string text = synthetic_text(20000);
  std::ofstream(dir.at("in.txt"), std::ios::binary) << text;
  TokenizeJob job;
  job.inputs = {dir.at("in.txt")};
  job.out_dir = dir.at("out");
  job.val_fraction = 0.1;
  job.shard_tokens = 1111;
  const TokenizeResult r = tokenize_to_shards(job);
  EXPECT_EQ(r.train_tokens + r.val_tokens, 20000);
  EXPECT_EQ(r.val_tokens, 2000);
  EXPECT_EQ(r.train_shards.size(), 17u);
  const Corpus c = Corpus::from_text(text);
  const ShardSet train = ShardSet::open(expand_shard_globs({dir.at("out/train_*.bin")}, "t"), 256, "t");
  const ShardSet val = ShardSet::open(expand_shard_globs({dir.at("out/val_*.bin")}, "v"), 256, "v");
  EXPECT_EQ(val.unigram_entropy(256), unigram_entropy(c.split(Split::Val, 0.1), 256));
  for (int d = 0; d < 2; ++d) {
    const LoaderShape shape{.seq_len = 24, .micro_batch_size = 3, .micro_batches = 2, .dp_size = 2, .dp_rank = d};
    DataLoader a(c, Split::Train, 0.1, shape, 7, true);
    DataLoader b(train, Split::Train, shape, 7, true);
    DataLoader va(c, Split::Val, 0.1, shape, 7, false);
    DataLoader vb(val, Split::Val, shape, 7, false);
    ASSERT_EQ(a.epoch_samples(), b.epoch_samples());
    std::vector<std::int32_t> ta(72), ga(72), tb(72), gb(72);
    for (int step = 0; step < 130; ++step) {  // several epochs of 749 windows
      for (int m = 0; m < 2; ++m) {
        a.fill(m, ta.data(), ga.data());
        b.fill(m, tb.data(), gb.data());
        ASSERT_EQ(ta, tb) << "step " << step;
        ASSERT_EQ(ga, gb) << "step " << step;
        va.fill(m, ta.data(), ga.data());
        vb.fill(m, tb.data(), gb.data());
        ASSERT_EQ(ta, tb);
        ASSERT_EQ(ga, gb);
      }
      a.advance();
      b.advance();
    }
    const DataPosition pos = b.position();
    // The same tokens from a text corpus and from shards: the same stream CRC (resume across them).
    ASSERT_TRUE(pos.stream_crc.has_value());
    EXPECT_EQ(*pos.stream_crc, a.stream_crc());
    EXPECT_EQ(vb.stream_crc(), va.stream_crc());
    EXPECT_NE(vb.stream_crc(), b.stream_crc());
    DataLoader c2(train, Split::Train, shape, 7, true);
    c2.restore(pos);
    c2.fill(1, tb.data(), gb.data());
    a.fill(1, ta.data(), ga.data());
    EXPECT_EQ(ta, tb);
  }
}

TEST(Shards, TokenizeEncodesInPiecesLikeOneEncodeOfTheWholeText) {
  // More than the 4 MiB piece, with an encoder whose ids depend on the context (a stand-in for a
  // tokenizer that looks across piece ends): a cut anywhere but a safe newline changes the ids.
  TempDir dir;
  std::string text;
  while (text.size() < (9u << 20)) text += synthetic_text(997) + "  \n\n x\n";
  std::ofstream(dir.at("a.txt"), std::ios::binary) << text.substr(0, text.size() / 2);
  std::ofstream(dir.at("b.txt"), std::ios::binary) << text.substr(text.size() / 2);
  const auto encode = [](std::string_view t) {
    std::vector<std::int32_t> ids;
    std::size_t line = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      // id = byte + 256 * (position in its line is odd, a newline at 0): a cut anywhere but
      // before a newline shifts the parity
      if (t[i] == '\n') line = 0;
      ids.push_back(static_cast<unsigned char>(t[i]) + 256 * static_cast<int>(line % 2));
      ++line;
    }
    return ids;
  };
  TokenizeJob job;
  job.inputs = {dir.at("")};  // a directory: its .txt files in name order, as the text loader
  job.out_dir = dir.at("out");
  job.encode = encode;
  // The encoder's cut rule (TokenizeJob::cut): before a newline, scanning back from the end.
  std::size_t looked_at = 0;
  job.cut = [&looked_at](std::string_view t, std::size_t from) -> std::size_t {
    looked_at += t.size() - from;
    for (std::size_t q = t.size(); q-- > std::max<std::size_t>(from, 1);)
      if (t[q] == '\n') return q;
    return 0;
  };
  job.shard_tokens = 1 << 20;
  const TokenizeResult r = tokenize_to_shards(job);
  EXPECT_LE(looked_at, text.size());  // each byte is looked at once at most
  const Corpus c = Corpus::load(dir.at(""), encode);
  EXPECT_EQ(r.files, 2);
  const ShardSet train = ShardSet::open(r.train_shards, 512, "t");
  const ShardSet val = ShardSet::open(r.val_shards, 512, "v");
  std::vector<std::int32_t> got(static_cast<std::size_t>(train.size() + val.size()));
  train.copy(0, train.size(), got.data());
  val.copy(0, val.size(), got.data() + train.size());
  ASSERT_EQ(got.size(), c.tokens().size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), c.tokens().begin()));
  // The loader's stream CRC over several million tokens (read in pieces of 2^20 across the shards)
  // is the CRC32C of the same ids in one go.
  const DataLoader loader(train, Split::Train, LoaderShape{.seq_len = 64}, 1, false);
  EXPECT_EQ(loader.stream_crc(), crc32c(got.data(), static_cast<std::size_t>(train.size()) * sizeof(std::int32_t)));
}

/// A job of 30,000 synthetic tokens from DIR/a.txt into DIR/out in shards of 10,000 (3 train
/// shards, 1 val).
TokenizeJob three_shard_job(const TempDir& dir) {
  std::ofstream(dir.at("a.txt"), std::ios::binary) << synthetic_text(30000);
  TokenizeJob job;
  job.inputs = {dir.at("a.txt")};
  job.out_dir = dir.at("out");
  job.shard_tokens = 10000;
  return job;
}

TEST(Shards, AFailedTokenizeLeavesTheOldShardsAndASmallerSetReplacesALargerOne) {
  TempDir dir;
  TokenizeJob job = three_shard_job(dir);
  const TokenizeResult old = tokenize_to_shards(job);
  ASSERT_EQ(old.train_shards.size(), 3u);  // 28,500 train tokens, 1,500 val
  const auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(job.out_dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::vector<std::string> before = listing();
  const std::string first_before = bytes(old.train_shards[0]);
  // A new set (other text, other sizes) whose write fails after its first shard, as a full disk
  // would: the old set stays, byte for byte, and nothing of the new one is left.
  std::ofstream(dir.at("a.txt"), std::ios::binary) << synthetic_text(50000) + "more";
  job.shard_tokens = 7000;
  job.wrote = [](const std::string&) { ATLAS_THROW(Io, "No space left on device (injected)"); };
  EXPECT_THROW((void)tokenize_to_shards(job), Error);
  EXPECT_EQ(listing(), before);
  EXPECT_EQ(bytes(old.train_shards[0]), first_before);
  // The same job without the failure: one train shard now, the old set's extra files gone.
  job.wrote = nullptr;
  job.shard_tokens = 1'000'000;
  const TokenizeResult now = tokenize_to_shards(job);
  EXPECT_EQ(listing(), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  EXPECT_EQ(ShardSet::open(now.train_shards, 256, "t").size() + ShardSet::open(now.val_shards, 256, "v").size(), 50004);
}

// A tokenize killed while writing leaves its staging directory; the next tokenize into the same
// directory removes it (nobody holds its lock) and says so, and leaves a live job's (locked) and
// directories that are not its own.
TEST(Shards, ATokenizeRemovesTheStagingDirectoryOfAKilledOne) {
  TempDir dir;
  TokenizeJob job = three_shard_job(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // writes its first shard, then waits to be killed
    job.wrote = [](const std::string&) {
      for (;;) ::pause();
    };
    try {
      (void)tokenize_to_shards(job);
    } catch (...) {
    }
    ::_exit(3);
  }
  // The child's staging directory: .atlas-tokenize-PID-RANDOM (the random part keeps jobs with
  // the same PID, on other hosts or in other PID namespaces, apart).
  const std::regex child_staging("\\.atlas-tokenize-" + std::to_string(child) + "-[0-9a-f]{8}");
  fs::path killed;
  for (int i = 0; i < 2000 && !fs::exists(killed / "train_000000.bin"); ++i) {
    ::usleep(10000);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(job.out_dir, ec))
      if (std::regex_match(e.path().filename().string(), child_staging)) killed = e.path();
  }
  ASSERT_TRUE(fs::exists(killed / "train_000000.bin")) << "the child never wrote its first shard";
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  // A live job's staging directory (its lock held, here by this process), a directory without a
  // lock and a file under a staging name: not ours to remove.
  const fs::path live = fs::path(job.out_dir) / ".atlas-tokenize-1";
  fs::create_directories(live);
  const int held = ::open((live / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  const fs::path unlocked = fs::path(job.out_dir) / ".atlas-tokenize-2";
  fs::create_directories(unlocked);
  std::ofstream((fs::path(job.out_dir) / ".atlas-tokenize-3").string()) << "x";

  const TokenizeResult r = tokenize_to_shards(job);
  EXPECT_EQ(r.removed_staging, (std::vector<std::string>{killed.string()}));
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(live / ".lock"));
  EXPECT_TRUE(fs::exists(unlocked));
  EXPECT_TRUE(fs::is_regular_file(fs::path(job.out_dir) / ".atlas-tokenize-3"));
  EXPECT_EQ(r.train_shards.size(), 3u);
  // Its own staging directory is gone: only the live one and the unlocked one are left.
  std::vector<std::string> staging_left;
  for (const auto& e : fs::directory_iterator(job.out_dir))
    if (e.is_directory()) staging_left.push_back(e.path().filename().string());
  std::sort(staging_left.begin(), staging_left.end());
  EXPECT_EQ(staging_left, (std::vector<std::string>{".atlas-tokenize-1", ".atlas-tokenize-2"}));
  // The live job ends without cleaning up (its lock goes with it): the next run removes its directory.
  ::close(held);
  EXPECT_EQ(tokenize_to_shards(job).removed_staging, (std::vector<std::string>{live.string()}));
  // A job killed between making its staging directory (a .tmp name) and renaming it, after it
  // made its .lock: the next run removes that one too.
  const fs::path half = fs::path(job.out_dir) / ".atlas-tokenize-77-0000abcd.tmp";
  fs::create_directories(half);
  std::ofstream((half / ".lock").string()) << "";
  EXPECT_EQ(tokenize_to_shards(job).removed_staging, (std::vector<std::string>{half.string()}));
}

// A text with no place to cut it (TokenizeJob::cut finds none) is looked at once per byte, not
// once per read (the whole buffer again each time, quadratic in the text), and is refused, naming
// the file, once the text held back passes max_uncut_bytes: nothing is written.
TEST(Shards, TokenizeScansTextWithoutCutsOnceAndRefusesTooMuchOfIt) {
  TempDir dir;
  const std::string text(18u << 20, 'a');
  std::ofstream(dir.at("a.txt"), std::ios::binary) << text;
  TokenizeJob job;
  job.inputs = {dir.at("a.txt")};
  job.out_dir = dir.at("out");
  std::size_t looked_at = 0;
  int calls = 0;
  job.cut = [&](std::string_view t, std::size_t from) -> std::size_t {
    looked_at += t.size() - std::min(from, t.size());
    ++calls;
    return 0;
  };
  const TokenizeResult r = tokenize_to_shards(job);
  EXPECT_GE(calls, 4);                 // one look per 4 MiB read
  EXPECT_LE(looked_at, text.size());   // not 4 + 8 + 12 + 16 MiB
  EXPECT_EQ(r.train_tokens + r.val_tokens, static_cast<std::int64_t>(text.size()));

  job.max_uncut_bytes = 6u << 20;
  const std::string m = config_error([&] { (void)tokenize_to_shards(job); });
  EXPECT_THAT(m, HasSubstr("atlas tokenize: " + dir.at("a.txt") + ": 8388608 bytes of text (up to byte 8388608 of the "
                           "file) without a place to cut it"));
  EXPECT_THAT(m, HasSubstr("nothing was written"));
  EXPECT_THAT(m, HasSubstr("hint: is it a text file?"));
  // The shards of the first run are still there, whole.
  EXPECT_EQ(ShardSet::open(r.train_shards, 256, "t").size(), r.train_tokens);
}

// A read error (EIO: /proc/self/mem reads fail at address 0) is an error naming the file, not
// the end of its text: the rest would be dropped without a word.
TEST(Shards, AReadErrorIsAnErrorNotTheEndOfTheText) {
  TempDir dir;
  TokenizeJob job;
  job.inputs = {"/proc/self/mem"};
  job.out_dir = dir.at("out");
  try {
    (void)tokenize_to_shards(job);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("reading text file /proc/self/mem failed after 0 bytes: Input/output error"));
    EXPECT_THAT(e.what(), HasSubstr("nothing was written"));
  }
  EXPECT_FALSE(fs::exists(job.out_dir));
  // The text loader (data.corpus_dir) reads its files the same way.
  fs::create_directories(dir.at("corpus"));
  fs::create_symlink("/proc/self/mem", dir.at("corpus/a.txt"));
  try {
    (void)Corpus::load(dir.at("corpus"), nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("reading corpus file " + dir.at("corpus/a.txt") + " failed after 0 bytes: "
                                    "Input/output error"));
  }
}

// While a tokenize replaces the shards in its --out directory, the directory holds part of each
// set; the marker it keeps there for that time makes a run refuse the directory's shards, also
// when the tokenize was killed during the swap; the next tokenize into it replaces the set whole
// and removes the marker.
TEST(Shards, ADirectoryMarkedAsBeingSwappedIsRefusedUntilATokenizeEnds) {
  TempDir dir;
  TokenizeJob job = three_shard_job(dir);
  TokenizeResult r = tokenize_to_shards(job);
  const fs::path marker = fs::path(job.out_dir) / ShardFormat::kSwapMarker;
  EXPECT_FALSE(fs::exists(marker));
  std::ofstream(marker.string()) << "atlas tokenize (pid 1) is replacing the shards\n";  // a swap cut short
  const std::string m = config_error([&] { (void)ShardSet::open(r.train_shards, 256, "data.train_shards"); });
  EXPECT_THAT(m, HasSubstr("shard '" + r.train_shards[0] + "' (data.train_shards): its directory holds " +
                           marker.string() + ", so an atlas tokenize into it was interrupted"));
  EXPECT_THAT(m, HasSubstr("hint: run the atlas tokenize again"));
  r = tokenize_to_shards(job);
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(ShardSet::open(r.train_shards, 256, "t").size(), r.train_tokens);
}

TEST(Shards, TokenizeRefusesInputsThatCannotTrain) {
  TempDir dir;
  std::ofstream(dir.at("empty.txt"), std::ios::binary) << "";
  std::ofstream(dir.at("tiny.txt"), std::ios::binary) << "abc";
  std::ofstream(dir.at("text.txt"), std::ios::binary) << synthetic_text(5000);
  TokenizeJob job;
  job.out_dir = dir.at("out");
  job.inputs = {dir.at("empty.txt")};
  EXPECT_THAT(config_error([&] { (void)tokenize_to_shards(job); }),
              HasSubstr("no text in the inputs (1 file(s), 0 bytes); nothing written"));
  EXPECT_FALSE(fs::exists(job.out_dir));
  job.inputs = {dir.at("tiny.txt")};  // 3 tokens: 5% of them is none
  EXPECT_THAT(config_error([&] { (void)tokenize_to_shards(job); }),
              HasSubstr("the inputs make 3 tokens, too few for a val split of 0.05"));
  job.inputs = {dir.at("text.txt")};
  for (const double f : {0.0, 0.0005, 0.6, 1.0}) {
    job.val_fraction = f;
    EXPECT_THAT(config_error([&] { (void)tokenize_to_shards(job); }),
                HasSubstr("must be in [0.001, 0.5], the range of data.val_fraction"))
        << f;
  }
  job.val_fraction = 0.05;
  std::ofstream(dir.at("a_file"), std::ios::binary) << "x";
  job.out_dir = dir.at("a_file");
  EXPECT_THAT(config_error([&] { (void)tokenize_to_shards(job); }),
              HasSubstr("--out " + dir.at("a_file") + " exists and is not a directory"));
}

TEST(Shards, ShardsWrittenByAnotherProgramLoad) {
  // The writer's own layout, not write_shards: header fields set one by one, uint16 tokens.
  TempDir dir;
  std::vector<std::uint16_t> toks = {50256, 15496, 995, 0, 50256};
  write_raw(dir.at("x.bin"), 20240520, 1, 5, toks);
  const ShardSet set = ShardSet::open({dir.at("x.bin")}, 50257, "data.train_shards");
  std::vector<std::int32_t> got(5);
  set.copy(0, 5, got.data());
  EXPECT_EQ(got, (std::vector<std::int32_t>{50256, 15496, 995, 0, 50256}));
}

TEST(Shards, BadShardsAreConfigErrorsNamingTheFileAndTheFix) {
  TempDir dir;
  const std::vector<std::uint16_t> toks = {1, 2, 3, 4};
  write_raw(dir.at("magic.bin"), 20240521, 1, 4, toks);
  write_raw(dir.at("version.bin"), 20240520, 2, 4, toks);
  write_raw(dir.at("length.bin"), 20240520, 1, 5, toks);
  write_raw(dir.at("long.bin"), 20240520, 1, 3, toks);  // one token more than its header counts
  write_raw(dir.at("negative.bin"), 20240520, 1, -5, toks);
  write_raw(dir.at("vocab.bin"), 20240520, 1, 4, {1, 2, 300, 4});
  std::ofstream(dir.at("short.bin")) << "tiny";
  const auto open1 = [&](const std::string& name) {
    return [&dir, name] { (void)ShardSet::open({dir.at(name)}, 256, "data.train_shards"); };
  };
  std::string m = config_error(open1("magic.bin"));
  EXPECT_THAT(m, HasSubstr(dir.at("magic.bin")));
  EXPECT_THAT(m, HasSubstr("magic 20240521, not 20240520"));
  EXPECT_THAT(m, HasSubstr("hint: "));
  m = config_error(open1("version.bin"));
  EXPECT_THAT(m, HasSubstr(dir.at("version.bin")));
  EXPECT_THAT(m, HasSubstr("version 2; atlas reads version 1"));
  EXPECT_THAT(m, HasSubstr("hint: "));
  m = config_error(open1("length.bin"));
  EXPECT_THAT(m, HasSubstr(dir.at("length.bin")));
  EXPECT_THAT(m, HasSubstr("header says 5 tokens (1034 bytes with the header), but the file is 1032 bytes"));
  EXPECT_THAT(m, HasSubstr("hint: the file is truncated"));
  m = config_error(open1("long.bin"));
  EXPECT_THAT(m, HasSubstr("header says 3 tokens (1030 bytes with the header), but the file is 1032 bytes"));
  EXPECT_THAT(m, HasSubstr("hint: the file holds more than its header counts"));
  m = config_error(open1("negative.bin"));
  EXPECT_THAT(m, HasSubstr(dir.at("negative.bin")));
  EXPECT_THAT(m, HasSubstr("its header's token count is -5, negative: the header is corrupt"));
  EXPECT_THAT(m, HasSubstr("hint: "));
  m = config_error(open1("short.bin"));
  EXPECT_THAT(m, HasSubstr("shorter than the 1024-byte header"));
  m = config_error(open1("vocab.bin"));
  EXPECT_THAT(m, HasSubstr(dir.at("vocab.bin")));
  EXPECT_THAT(m, HasSubstr("holds token 300 at token offset 2 (byte offset 1028), outside model.vocab = 256"));
  EXPECT_THAT(m, HasSubstr("hint: "));
  m = config_error([&] { (void)expand_shard_globs({dir.at("nothing_*.bin")}, "data.val_shards"); });
  EXPECT_THAT(m, HasSubstr("data.val_shards = '" + dir.at("nothing_*.bin") + "' matches no file"));
  EXPECT_THAT(m, HasSubstr("atlas tokenize"));
  m = config_error([&] { (void)expand_shard_globs({}, "data.val_shards"); });
  EXPECT_THAT(m, HasSubstr("data.val_shards is empty"));
  m = config_error([&] { (void)ShardSet::open({dir.at("missing.bin")}, 256, "data.train_shards"); });
  EXPECT_THAT(m, HasSubstr("cannot open shard '" + dir.at("missing.bin") + "'"));
  // A FIFO the glob matched: refused at once (its open blocked until a writer came)
  ASSERT_EQ(::mkfifo(dir.at("fifo.bin").c_str(), 0600), 0);
  m = config_error(open1("fifo.bin"));
  EXPECT_THAT(m, HasSubstr("shard '" + dir.at("fifo.bin") + "' (data.train_shards) is not a regular file"));
}

TEST(Shards, ASplitShorterThanASampleNamesTheShardKey) {
  TempDir dir;
  write_raw(dir.at("v.bin"), 20240520, 1, 4, {1, 2, 3, 4});
  const ShardSet set = ShardSet::open({dir.at("v.bin")}, 256, "data.val_shards");
  const std::string m = config_error([&] {
    DataLoader dl(set, Split::Val, LoaderShape{.seq_len = 8}, 1, false);
  });
  EXPECT_THAT(m, HasSubstr("add tokens to data.val_shards"));
}

}  // namespace
}  // namespace atlas::model
