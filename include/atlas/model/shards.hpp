// SPDX-License-Identifier: MIT
// Token-shard datasets in llm.c's binary format (docs/formats.md): reading (memory-mapped,
// checked against the model's vocabulary) and writing (atlas tokenize). Not the sample order:
// the DataLoader (data.hpp) serves a shard set exactly as it serves a text corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/model/data.hpp"

namespace atlas::model {

/// llm.c's token shard: a header of 256 little-endian int32 (magic, version, token count, the
/// rest zero), then `count` tokens as little-endian uint16.
struct ShardFormat {
  static constexpr std::int32_t kMagic = 20240520;
  static constexpr std::int32_t kVersion = 1;
  static constexpr int kHeaderInts = 256;
  static constexpr std::int64_t kHeaderBytes = kHeaderInts * 4;
  /// The file atlas tokenize keeps in its --out directory while it replaces the shards there
  /// (a directory holding it holds part of two sets: ShardSet::open refuses its shards).
  static constexpr const char* kSwapMarker = ".atlas-tokenize-swapping";
};

/// Expands the glob patterns of deck key `key` (glob(3)); each pattern's matches in name order,
/// the patterns in list order. Throws atlas::ConfigError naming the pattern and the fix when a
/// pattern matches no file, or when the list is empty.
[[nodiscard]] std::vector<std::string> expand_shard_globs(const std::vector<std::string>& patterns,
                                                          std::string_view key);

/// Throws atlas::ConfigError naming every file that data.train_shards and data.val_shards both
/// list, or that one list names twice (the same file through any path): a validation loss on
/// training tokens, or a file trained twice as often, is a pattern's mistake (`dir/*.bin`).
void check_shard_lists(const std::vector<std::string>& train, const std::vector<std::string>& val);

/// A key equal for every path of one file (symbolic or hard links): its device and inode, or its
/// canonical path when it cannot be stat'ed.
[[nodiscard]] std::string file_identity(const std::string& path);

/// Token shards seen as one read-only stream: the files' tokens in list order. The files are
/// memory-mapped (read-only, unmapped when the last copy goes); cheap to copy.
class ShardSet {
 public:
  ShardSet() = default;
  /// Maps `files` and checks each: the magic, the version, the header's token count against the
  /// file size, and every token < `vocab`. Throws atlas::ConfigError naming the file (`key` is
  /// the deck key the list came from, for the hint) and the fix.
  [[nodiscard]] static ShardSet open(const std::vector<std::string>& files, int vocab,
                                     std::string_view key);

  /// Tokens in the stream.
  [[nodiscard]] std::int64_t size() const noexcept { return m_total; }
  [[nodiscard]] int file_count() const noexcept;
  /// "N shards from FIRST" (messages).
  [[nodiscard]] std::string origin() const;
  /// Copies tokens [start, start + n) of the stream (across file ends) into `out`.
  void copy(std::int64_t start, std::int64_t n, std::int32_t* out) const;
  /// Unigram entropy of the stream in nats per token (as unigram_entropy of data.hpp).
  [[nodiscard]] double unigram_entropy(int vocab) const;
  /// CRC32C of the stream's ids as little-endian int32 (DataLoader::stream_crc's definition),
  /// computed by open() in its one pass over the tokens.
  [[nodiscard]] std::uint32_t stream_crc() const noexcept { return m_crc; }

 private:
  struct Mapping;
  std::vector<std::shared_ptr<const Mapping>> m_files;
  std::vector<std::int64_t> m_starts;  ///< stream offset of each file's first token
  std::int64_t m_total = 0;
  std::uint32_t m_crc = 0;  ///< stream_crc()
};

/// Writes `tokens` as shards `dir`/`prefix`_000000.bin, _000001.bin, ... of at most
/// `shard_tokens` tokens each (one empty shard if `tokens` is empty). Returns the paths.
/// Throws atlas::Error (Io) when a file cannot be written.
std::vector<std::string> write_shards(std::span<const std::uint16_t> tokens, const std::string& dir,
                                      const std::string& prefix, std::int64_t shard_tokens);

/// What atlas tokenize does, as a library call.
struct TokenizeJob {
  std::vector<std::string> inputs;  ///< text files, or directories (their *.txt files in name order)
  std::string out_dir;
  Corpus::Encoder encode;           ///< empty = ByteTokenizer::encode
  /// Where `encode` may cut text into pieces (the text is read and encoded piecewise): the last
  /// position q in [from, text.size()) with encode(text) == encode(text[0, q)) + encode(text[q,
  /// end)) whatever follows, 0 for none (gpt2_last_cut for the GPT-2 tokenizer). Empty = anywhere
  /// (an encoder without context across bytes, as ByteTokenizer).
  std::function<std::size_t(std::string_view text, std::size_t from)> cut;
  /// Text held back waiting for a cut before the job gives up (a ConfigError naming the file):
  /// GPT-2's cuts need whitespace, and a file without any is not text.
  std::size_t max_uncut_bytes = std::size_t{256} << 20;
  double val_fraction = 0.05;       ///< the tail held out, as data.val_fraction
  std::int64_t shard_tokens = 100'000'000;
  /// Called about once a second while encoding: (bytes read, bytes in all, tokens so far).
  std::function<void(std::int64_t, std::int64_t, std::int64_t)> progress;
  /// Called after each new shard is written (to the staging directory, before the swap) with its
  /// path; may be empty. What it throws aborts the job as a failed write would (tests use it).
  std::function<void(const std::string&)> wrote;
};

struct TokenizeResult {
  int files = 0;
  std::int64_t bytes = 0;
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  /// Staging directories of earlier tokenize jobs into the same directory that were killed
  /// (nobody holds their lock), removed before this one wrote.
  std::vector<std::string> removed_staging;
};

/// Encodes the inputs' text, concatenated in order, into the train shards (`out_dir`/train_*.bin)
/// and the val shards (`out_dir`/val_*.bin, the tail, split as Corpus::split). The text is encoded
/// in pieces cut only where GPT-2's pre-tokenization must cut too (just before whitespace that
/// follows a character that is not whitespace; model::gpt2_last_cut), so the tokens equal
/// Corpus::load's on the same text.
/// The new shards are written to a staging directory inside `out_dir` and then swapped in (each
/// renamed over its namesake, the old set's extra files removed), so a failed write leaves the old
/// set as it was. Throws atlas::ConfigError on a missing input, an `out_dir` that is not a
/// directory, a fraction outside data.val_fraction's range, a bad shard size, inputs with no text
/// or too few tokens for a val split, a token that does not fit uint16; atlas::Error (Io) when a
/// write fails.
TokenizeResult tokenize_to_shards(const TokenizeJob& job);

}  // namespace atlas::model
