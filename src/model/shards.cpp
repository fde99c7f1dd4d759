// SPDX-License-Identifier: MIT
// Token shards in llm.c's format (shards.hpp): glob expansion, the read-only memory maps and
// their checks, the writer, and atlas tokenize's streaming encoder. The sample order is the
// DataLoader's (data.cpp), the same for text and shards.
#include "atlas/model/shards.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/crc32c.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/signals.hpp"
#include "atlas/deck/schema.hpp"

namespace atlas::model {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "the shard format is little-endian; this reader maps the tokens as they are");

namespace {

std::string write_hint() {
  return "  hint: write shards with `atlas tokenize TEXT... --out DIR` (docs/formats.md, token "
         "shards), or fix the pattern";
}

}  // namespace

// ---- globs ----

std::vector<std::string> expand_shard_globs(const std::vector<std::string>& patterns,
                                            std::string_view key) {
  if (patterns.empty()) {
    throw ConfigError(fmt::format("{} is empty, but data.format = shards needs it\n{}", key,
                                  write_hint()));
  }
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    // No GLOB_ERR: a directory that does not exist is "matches no file", the clearer message.
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> found;
    if (rc == 0) {
      for (std::size_t i = 0; i < g.gl_pathc; ++i) found.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && found.empty())) {
      throw ConfigError(fmt::format("{} = '{}' matches no file\n{}", key, pattern, write_hint()));
    }
    if (rc != 0) {
      throw ConfigError(fmt::format("{} = '{}': cannot read the directories of the pattern ({})\n{}",
                                    key, pattern, rc == GLOB_ABORTED ? "read error" : "out of memory",
                                    write_hint()));
    }
    std::sort(found.begin(), found.end());  // glob sorts by the locale; name order is bytes
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return fmt::format("dev {} ino {}", st.st_dev, st.st_ino);
  std::error_code ec;
  const std::filesystem::path c = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : c.string();
}

void check_shard_lists(const std::vector<std::string>& train, const std::vector<std::string>& val) {
  // The same file through any path, symbolic or hard link: its device and inode (the files exist:
  // the globs found them), else its canonical path.
  auto key_of = [](const std::string& path) { return file_identity(path); };
  std::vector<std::string> problems;
  std::map<std::string, std::string> in_train;  // canonical -> as listed
  for (const std::string& f : train) {
    const auto [it, fresh] = in_train.emplace(key_of(f), f);
    if (!fresh)
      problems.push_back(fmt::format("data.train_shards names '{}' twice{}: it would be trained on twice as often\n"
                                     "  hint: make the patterns match each file once",
                                     f, it->second == f ? "" : fmt::format(" (also as '{}')", it->second)));
  }
  std::map<std::string, std::string> in_val;
  for (const std::string& f : val) {
    const std::string k = key_of(f);
    if (const auto t = in_train.find(k); t != in_train.end()) {
      problems.push_back(fmt::format("'{}' is both a training shard (data.train_shards) and a validation shard "
                                     "(data.val_shards): the validation loss would be measured on training tokens\n"
                                     "  hint: give the lists patterns that do not overlap, e.g. DIR/train_*.bin and "
                                     "DIR/val_*.bin (atlas tokenize's names)",
                                     f));
      continue;
    }
    if (!in_val.emplace(k, f).second)
      problems.push_back(fmt::format("data.val_shards names '{}' twice\n  hint: make the patterns match each file once", f));
  }
  if (!problems.empty()) throw ConfigError(problems);
}

// ---- the memory maps ----

/// One shard file mapped read-only; unmapped by the destructor.
struct ShardSet::Mapping {
  std::string path;
  const void* base = nullptr;
  std::size_t bytes = 0;
  std::span<const std::uint16_t> tokens;
  /// Names the file in the SIGBUS a read raises if it shrinks under the mapping.
  std::unique_ptr<signals::MappedFileWatch> watch;

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    watch.reset();
    if (base != nullptr) ::munmap(const_cast<void*>(base), bytes);
  }
};

namespace {

std::string fix_hint(std::string_view key) {
  return fmt::format("  hint: write the shards again with `atlas tokenize TEXT... --out DIR`, or "
                     "remove the file from {} (docs/formats.md, token shards)",
                     key);
}

}  // namespace

ShardSet ShardSet::open(const std::vector<std::string>& files, int vocab, std::string_view key) {
  ShardSet set;
  std::set<std::string> dirs_checked;
  for (const std::string& path : files) {
    if (const fs::path dir = fs::path(path).parent_path(); dirs_checked.insert(dir.string()).second) {
      const fs::path marker = (dir.empty() ? fs::path(".") : dir) / ShardFormat::kSwapMarker;
      std::error_code ec;
      if (fs::exists(marker, ec))
        throw ConfigError(fmt::format("shard '{}' ({}): its directory holds {}, so an atlas tokenize into it was "
                                      "interrupted while it replaced the shards there (or is running now): the "
                                      "directory may hold part of the old set and part of the new one\n  hint: run "
                                      "the atlas tokenize again (it replaces the whole set)",
                                      path, key, marker.string()));
    }
    auto m = std::make_shared<Mapping>();
    m->path = path;
    // O_NONBLOCK: a FIFO the glob matched must not block the open (it is refused below).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      std::error_code ec;
      if (err == ENOENT && std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
        const std::string target = std::filesystem::read_symlink(path, ec).string();
        throw ConfigError(fmt::format("shard '{}' ({}) is a broken symbolic link (to '{}')\n  hint: point it at the "
                                      "shard again, or remove it",
                                      path, key, target));
      }
      throw ConfigError(fmt::format("cannot open shard '{}' ({}): {}\n{}", path, key, std::strerror(err),
                                    fix_hint(key)));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError(fmt::format("cannot stat shard '{}' ({}): {}\n{}", path, key, std::strerror(err),
                                    fix_hint(key)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw ConfigError(fmt::format("shard '{}' ({}) is not a regular file\n{}", path, key,
                                    fix_hint(key)));
    }
    const auto size = static_cast<std::int64_t>(st.st_size);
    if (size < ShardFormat::kHeaderBytes) {
      ::close(fd);
      throw ConfigError(fmt::format(
          "shard '{}' ({}) is {} bytes, shorter than the {}-byte header of an llm.c token shard\n{}",
          path, key, size, ShardFormat::kHeaderBytes, fix_hint(key)));
    }
    void* base = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (base == MAP_FAILED) {
      throw ConfigError(fmt::format("cannot map shard '{}' ({}): {}\n  hint: check the memory limits "
                                    "(ulimit -v) and that the file system supports mmap",
                                    path, key, std::strerror(map_errno)));
    }
    m->base = base;
    m->bytes = static_cast<std::size_t>(size);
    m->watch = std::make_unique<signals::MappedFileWatch>(base, m->bytes, path, "token shard");
    std::array<std::int32_t, 3> head{};
    std::memcpy(head.data(), base, sizeof(head));
    if (head[0] != ShardFormat::kMagic) {
      throw ConfigError(fmt::format(
          "shard '{}' ({}) starts with magic {}, not {} (llm.c's token shard format)\n"
          "  hint: it is not a token shard (nanoGPT's headerless .bin files need the 1024-byte "
          "header); write shards with `atlas tokenize TEXT... --out DIR`",
          path, key, head[0], ShardFormat::kMagic));
    }
    if (head[1] != ShardFormat::kVersion) {
      throw ConfigError(fmt::format(
          "shard '{}' ({}) has format version {}; atlas reads version {} (uint16 tokens)\n"
          "  hint: llm.c's version 2 holds uint32 tokens (Llama 3); write the shards with "
          "`atlas tokenize` or a GPT-2 (uint16) writer",
          path, key, head[1], ShardFormat::kVersion));
    }
    const std::int64_t count = head[2];
    if (count < 0) {
      throw ConfigError(fmt::format(
          "shard '{}' ({}): its header's token count is {}, negative: the header is corrupt\n  hint: it was not "
          "written by an llm.c-format (uint16) writer; write it again with `atlas tokenize`",
          path, key, count));
    }
    const std::int64_t expect = ShardFormat::kHeaderBytes + 2 * count;
    if (expect != size) {
      throw ConfigError(fmt::format(
          "shard '{}' ({}): its header says {} tokens ({} bytes with the header), but the file is "
          "{} bytes\n  hint: {}; write it again with `atlas tokenize`",
          path, key, count, expect, size,
          size > expect ? "the file holds more than its header counts (another writer's header, or "
                                        "bytes appended)"
                                      : "the file is truncated or was not written completely"));
    }
    m->tokens = std::span<const std::uint16_t>(
        reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(base) +
                                               ShardFormat::kHeaderBytes),
        static_cast<std::size_t>(count));
    // Every token inside the vocabulary: a branch-free max first (vectorised), then the first
    // offender only if there is one. The same pass, piece by piece while the piece is in cache,
    // extends the stream's CRC32C (the ids widened to little-endian int32, as DataLoader's
    // stream_crc defines it): the first checkpoint then reads no shard again.
    std::uint16_t top = 0;
    {
      constexpr std::size_t kPiece = std::size_t{1} << 16;
      std::vector<std::int32_t> wide(std::min(kPiece, m->tokens.size()));
      for (std::size_t at = 0; at < m->tokens.size(); at += kPiece) {
        const std::size_t n = std::min(kPiece, m->tokens.size() - at);
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint16_t t = m->tokens[at + i];
          top = std::max(top, t);
          wide[i] = t;
        }
        set.m_crc = crc32c_extend(set.m_crc, wide.data(), n * sizeof(std::int32_t));
      }
    }
    if (static_cast<int>(top) >= vocab) {
      const auto it = std::find_if(m->tokens.begin(), m->tokens.end(),
                                   [vocab](std::uint16_t t) { return static_cast<int>(t) >= vocab; });
      const auto at = static_cast<std::int64_t>(it - m->tokens.begin());
      throw ConfigError(fmt::format(
          "shard '{}' ({}) holds token {} at token offset {} (byte offset {}), outside model.vocab "
          "= {}\n  hint: the shard was written by a tokenizer with a larger vocabulary: set "
          "data.tokenizer and model.vocab to the one that wrote it (gpt2: 50257), or write the "
          "shards again with `atlas tokenize --tokenizer ...`",
          path, key, *it, at, ShardFormat::kHeaderBytes + 2 * at, vocab));
    }
    set.m_starts.push_back(set.m_total);
    set.m_total += count;
    set.m_files.push_back(std::move(m));
  }
  return set;
}

int ShardSet::file_count() const noexcept { return static_cast<int>(m_files.size()); }

std::string ShardSet::origin() const {
  if (m_files.empty()) return "no shards";
  if (m_files.size() == 1) return "shard " + m_files.front()->path;
  return fmt::format("{} shards from {}", m_files.size(), m_files.front()->path);
}

void ShardSet::copy(std::int64_t start, std::int64_t n, std::int32_t* out) const {
  ATLAS_ASSERT(start >= 0 && n >= 0 && start + n <= m_total,
               "shard range [" << start << ", " << start + n << ") outside the stream of "
                               << m_total << " tokens");
  auto file = static_cast<std::size_t>(
      std::upper_bound(m_starts.begin(), m_starts.end(), start) - m_starts.begin() - 1);
  while (n > 0) {
    const auto& toks = m_files[file]->tokens;
    const std::int64_t within = start - m_starts[file];
    const std::int64_t take = std::min<std::int64_t>(n, static_cast<std::int64_t>(toks.size()) - within);
    for (std::int64_t i = 0; i < take; ++i) out[i] = toks[static_cast<std::size_t>(within + i)];
    out += take;
    start += take;
    n -= take;
    ++file;
  }
}

double ShardSet::unigram_entropy(int vocab) const {
  // The same sums in the same order as unigram_entropy (data.cpp): equal to the last bit.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(vocab), 0);
  for (const auto& f : m_files)
    for (const std::uint16_t id : f->tokens) ++counts[id];
  return entropy_of_counts(counts, static_cast<double>(m_total));
}

// ---- writing ----

std::vector<std::string> write_shards(std::span<const std::uint16_t> tokens, const std::string& dir,
                                      const std::string& prefix, std::int64_t shard_tokens) {
  ATLAS_ASSERT(shard_tokens >= 1 && shard_tokens <= INT32_MAX, "shard_tokens " << shard_tokens);
  std::vector<std::string> paths;
  std::size_t at = 0;
  int index = 0;
  // Six-digit names (llm.c's), which sort in stream order: at most 999,999 shards a split.
  if (const std::size_t shards = (tokens.size() + static_cast<std::size_t>(shard_tokens) - 1) /
                                 static_cast<std::size_t>(shard_tokens);
      shards > 999'999)
    throw ConfigError(fmt::format("atlas tokenize: {} tokens in shards of --shard-tokens {} make {} {} shards, more "
                                  "than the 999,999 six-digit names hold (and a run maps each file)\n  hint: raise "
                                  "--shard-tokens to at least {}",
                                  tokens.size(), shard_tokens, shards, prefix,
                                  (tokens.size() + 999'998) / 999'999));
  do {
    const std::size_t n = std::min(tokens.size() - at, static_cast<std::size_t>(shard_tokens));
    const std::string path = (fs::path(dir) / fmt::format("{}_{:06d}.bin", prefix, index)).string();
    const std::string tmp = path + ".tmp";
    std::array<std::int32_t, ShardFormat::kHeaderInts> header{};
    header[0] = ShardFormat::kMagic;
    header[1] = ShardFormat::kVersion;
    header[2] = static_cast<std::int32_t>(n);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
      out.write(reinterpret_cast<const char*>(tokens.data() + at),
                static_cast<std::streamsize>(n * sizeof(std::uint16_t)));
      out.close();
      if (!out) ATLAS_THROW(Io, "cannot write shard " << tmp << ": " << std::strerror(errno));
    }
    fsync_path(tmp, false);  // on disk before it takes the name: a crash leaves no empty shard
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) ATLAS_THROW(Io, "cannot rename " << tmp << " to " << path << ": " << ec.message());
    paths.push_back(path);
    at += n;
    ++index;
  } while (at < tokens.size());
  return paths;
}

// ---- atlas tokenize ----

namespace {

constexpr std::size_t kChunkBytes = std::size_t{4} << 20;

constexpr const char* kStagingPrefix = ".atlas-tokenize-";

/// A tokenize's staging directory, DIR/.atlas-tokenize-PID-RANDOM, with an exclusive flock on its .lock
/// file for as long as the job runs: a staging directory whose lock nobody holds was left by a
/// tokenize that was killed (the kernel drops a dead process's locks). Made under a ".tmp" name
/// and renamed once locked, so a directory under the final name is locked while its job lives.
/// The lock and the directory (what a failed write left in it, or the .lock after the swap) go
/// with this object, on every way out of the job.
struct StagingDir {
  fs::path path;
  int fd = -1;
  // PID and a random number: jobs on other hosts (a shared file system) or in other PID
  // namespaces may have the same PID, and one must never take the other's directory.
  explicit StagingDir(const std::string& out_dir)
      : path(fs::path(out_dir) / fmt::format("{}{}-{:08x}", kStagingPrefix, ::getpid(), std::random_device{}())) {
    const fs::path tmp = fs::path(path.string() + ".tmp");
    std::error_code ec;
    if (!fs::create_directory(tmp, ec) || ec)
      ATLAS_THROW(Io, "cannot create " << tmp.string() << ": " << (ec ? ec.message() : std::string("it exists")));
    // A file system without flock (ENOLCK, ENOSYS): no .lock, so no later job takes this
    // directory for a dead one's; a kill then leaves it, as before the lock.
    fd = ::open((tmp / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      fd = -1;
      fs::remove(tmp / ".lock", ec);
    }
    fs::rename(tmp, path, ec);
    if (ec) {
      const std::string why = ec.message();
      if (fd >= 0) ::close(fd);
      fs::remove_all(tmp, ec);
      ATLAS_THROW(Io, "cannot rename " << tmp.string() << " to " << path.string() << ": " << why);
    }
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (fd >= 0) ::close(fd);
  }
};

/// Removes the staging directories in out_dir that killed tokenize jobs left (their .lock held
/// by nobody: flock succeeds) and returns their paths; a live job's (locked) stays, and so does
/// one without a .lock (an older atlas's: docs/formats.md).
std::vector<std::string> remove_dead_staging(const std::string& out_dir) {
  std::vector<std::string> removed;
  // (.tmp: a job killed between making its directory and renaming it; its .lock, if it made one,
  // is free then too)
  const std::regex staging_name(std::string("\\") + kStagingPrefix + "[0-9]+(-[0-9a-f]{8})?(\\.tmp)?");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code kind;
    if (entry.is_symlink(kind) || !entry.is_directory(kind) || !std::regex_match(name, staging_name)) continue;
    const int fd = ::open((entry.path() / ".lock").c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
      if (!rm) removed.push_back(entry.path().string());
    }
    ::close(fd);
  }
  return removed;
}

}  // namespace

TokenizeResult tokenize_to_shards(const TokenizeJob& job) {
  // The range data.val_fraction takes: the shards' val split is what a text run would hold out.
  if (!(job.val_fraction >= deck::limits::kMinValFraction && job.val_fraction <= deck::limits::kMaxValFraction))
    throw ConfigError(fmt::format("--val-fraction {} must be in [{}, {}], the range of data.val_fraction (a run "
                                  "needs val shards to evaluate on)",
                                  job.val_fraction, deck::limits::kMinValFraction, deck::limits::kMaxValFraction));
  if (job.shard_tokens < 1 || job.shard_tokens > INT32_MAX)
    throw ConfigError(fmt::format("--shard-tokens {} must be in [1, {}] (the header's count is an "
                                  "int32)", job.shard_tokens, INT32_MAX));
  if (job.inputs.empty()) throw ConfigError("atlas tokenize needs at least one text file or directory");
  // The files, in the order the text loader reads them.
  std::vector<std::string> files;
  for (const std::string& in : job.inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      for (auto& f : Corpus::text_files(in, true)) files.push_back(std::move(f));
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      throw ConfigError(fmt::format("atlas tokenize: input '{}' {}\n  hint: name text files, or "
                                    "directories of .txt files", in,
                                    fs::exists(in, ec) ? "is not a file or directory" : "does not exist"));
    }
  }
  // One file named twice (two spellings, a link): its tokens would be in the stream twice, and
  // the validation tail could repeat training text.
  {
    std::map<std::string, std::string> seen;
    for (const std::string& f : files)
      if (const auto [it, fresh] = seen.emplace(file_identity(f), f); !fresh)
        throw ConfigError(fmt::format("atlas tokenize: '{}' is '{}' again{}: its text would be tokenized twice\n  "
                                      "hint: name each file once",
                                      f, it->second, it->second == f ? "" : " (the same file by another path)"));
  }
  check_output_dir("atlas tokenize", job.out_dir);
  // --out is created before the work, so a place it cannot go fails at once, not after the
  // tokenizing; what this created is removed again if the job fails before writing shards.
  std::vector<fs::path> missing;  // deepest first
  for (fs::path p = fs::absolute(job.out_dir); !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p, ec)) break;
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  {
    std::error_code ec;
    fs::create_directories(job.out_dir, ec);
    if (ec)
      throw ConfigError(fmt::format("atlas tokenize: cannot create --out {}: {}\n  hint: name a directory in a "
                                    "writable place",
                                    job.out_dir, ec.message()));
  }
  struct RemoveCreated {  // only the (still empty) directories this job made: another job may share a parent
    std::vector<fs::path> dirs;
    ~RemoveCreated() {
      for (const fs::path& d : dirs) {
        std::error_code ec;
        if (!fs::remove(d, ec)) break;  // not empty (or gone): leave it and its parents
      }
    }
  } created{missing};
  TokenizeResult r;
  r.files = static_cast<int>(files.size());
  std::int64_t all_bytes = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const std::uintmax_t bytes = fs::file_size(f, ec);
    if (!ec) all_bytes += static_cast<std::int64_t>(bytes);
  }

  std::vector<std::uint16_t> tokens;
  // The byte tokenizer makes one token a byte: reserved at once, no reallocation's copy.
  if (!job.encode) tokens.reserve(static_cast<std::size_t>(all_bytes));
  const auto encode_into = [&](std::string_view text) {
    const std::vector<std::int32_t> ids = job.encode ? job.encode(text) : ByteTokenizer::encode(text);
    for (const std::int32_t id : ids) {
      if (id < 0 || id > 0xFFFF) {
        throw ConfigError(fmt::format("token id {} does not fit the shard format's uint16 tokens",
                                      id));
      }
      tokens.push_back(static_cast<std::uint16_t>(id));
    }
  };
  std::string buf;
  std::size_t scanned = 0;  // buf[0, scanned) holds no cut (TokenizeJob::cut) after position 0
  auto last = std::chrono::steady_clock::now();
  for (const std::string& path : files) {
    read_file_blocks(path, "text file", "nothing was written; check the file and run atlas tokenize again", kChunkBytes,
                     [&](std::string_view data, std::int64_t offset) {
      buf.append(data);
      r.bytes += static_cast<std::int64_t>(data.size());
      const std::int64_t file_bytes = offset + static_cast<std::int64_t>(data.size());
      if (buf.size() < kChunkBytes) return;
      // Only what is new since the last look is scanned: a text without cuts costs one pass.
      const std::size_t q = job.cut ? job.cut(buf, scanned) : buf.size();
      if (q > 0) {
        encode_into(std::string_view(buf).substr(0, q));
        buf.erase(0, q);
      }
      scanned = buf.size();
      if (buf.size() > job.max_uncut_bytes)
        throw ConfigError(fmt::format("atlas tokenize: {}: {} bytes of text (up to byte {} of the file) without a place "
                                      "to cut it: the tokenizer cuts only before whitespace (a space, tab or line "
                                      "end) that follows a character; nothing was written\n  hint: is it a text "
                                      "file? Break very long lines, or use --tokenizer byte",
                                      path, buf.size(), file_bytes));
      const auto now = std::chrono::steady_clock::now();
      if (job.progress && now - last >= std::chrono::seconds(1)) {
        job.progress(r.bytes - static_cast<std::int64_t>(buf.size()), all_bytes,
                     static_cast<std::int64_t>(tokens.size()));
        last = now;
      }
    });
  }
  encode_into(buf);
  if (job.progress) job.progress(r.bytes, all_bytes, static_cast<std::int64_t>(tokens.size()));

  // The split (Corpus::split's rule): both sides must hold tokens, or the shards cannot train.
  const auto total = static_cast<std::int64_t>(tokens.size());
  if (total == 0)
    throw ConfigError(fmt::format("atlas tokenize: no text in the inputs ({} file(s), {} bytes); nothing written\n"
                                  "  hint: name text files that are not empty",
                                  r.files, r.bytes));
  r.val_tokens = val_tokens_of(total, job.val_fraction);
  r.train_tokens = total - r.val_tokens;
  if (r.val_tokens == 0)
    throw ConfigError(fmt::format("atlas tokenize: the inputs make {} tokens, too few for a val split of {} (it "
                                  "would hold none); nothing written\n  hint: more text, or a larger --val-fraction",
                                  total, job.val_fraction));

  // Write the new set beside the old one, then swap: a failure while writing (a full disk, a
  // kill) leaves the old shards as they were and removes the partial new ones.
  created.dirs.clear();  // from here on the directory holds (or will hold) the shards
  std::error_code ec;
  r.removed_staging = remove_dead_staging(job.out_dir);
  const StagingDir stage(job.out_dir);
  const fs::path& staging = stage.path;
  const std::span<const std::uint16_t> all(tokens);
  r.train_shards = write_shards(all.first(static_cast<std::size_t>(r.train_tokens)), staging.string(), "train",
                                job.shard_tokens);
  if (job.wrote)
    for (const auto& path : r.train_shards) job.wrote(path);
  r.val_shards = write_shards(all.subspan(static_cast<std::size_t>(r.train_tokens)), staging.string(), "val",
                              job.shard_tokens);
  if (job.wrote)
    for (const auto& path : r.val_shards) job.wrote(path);
  // The swap. Between the first change to the old set and the last rename, the directory holds
  // a mix of both sets; the marker says so to every reader (ShardSet::open refuses the
  // directory) until the swap is whole, also when a kill or crash cuts it short.
  const fs::path marker = fs::path(job.out_dir) / ShardFormat::kSwapMarker;
  write_file_whole(marker.string(), fmt::format("atlas tokenize (pid {}) is replacing the shards in this directory; "
                                                "if it is not running, it was interrupted: run it again\n",
                                                ::getpid()),
                   true);
  std::set<std::string> names;
  for (auto* list : {&r.train_shards, &r.val_shards})
    for (const std::string& path : *list) names.insert(fs::path(path).filename().string());
  // The old set's files that the new one does not replace go first (with more files they would
  // join this run's under a glob); a failure to remove one fails the job, the marker staying.
  const std::regex ours(R"((train|val)_[0-9]{6}\.bin)");
  std::vector<fs::path> extra;
  for (auto it = fs::directory_iterator(job.out_dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code kind;
    if (it->is_regular_file(kind) && std::regex_match(name, ours) && names.count(name) == 0) extra.push_back(it->path());
  }
  if (ec) ATLAS_THROW(Io, "cannot list " << job.out_dir << " to replace its shards: " << ec.message());
  for (const fs::path& old : extra) {
    fs::remove(old, ec);
    if (ec)
      ATLAS_THROW(Io, "cannot remove the old shard " << old.string() << ": " << ec.message()
                                                     << "\n  hint: the directory holds part of the old set and is marked "
                                                        "unusable ("
                                                     << marker.string() << "); fix its permissions and run atlas "
                                                                           "tokenize again");
  }
  for (auto* list : {&r.train_shards, &r.val_shards})
    for (std::string& path : *list) {
      const fs::path to = fs::path(job.out_dir) / fs::path(path).filename();
      fs::rename(path, to, ec);
      if (ec)
        ATLAS_THROW(Io, "cannot move shard " << path << " to " << to.string() << ": " << ec.message()
                                             << "\n  hint: the directory holds part of each set and is marked unusable ("
                                             << marker.string() << "); run atlas tokenize again");
      path = to.string();
    }
  fsync_path(job.out_dir, true);  // the renames reach the disk before the marker goes
  fs::remove(marker, ec);
  if (ec) ATLAS_THROW(Io, "cannot remove " << marker.string() << " after the shards were replaced: " << ec.message());
  fsync_path(job.out_dir, true);
  return r;
}

}  // namespace atlas::model
