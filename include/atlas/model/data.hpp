// SPDX-License-Identifier: MIT
// Training data: the Brown corpus (plain text installed by scripts/get-data.sh), a byte-level
// tokenizer, the train/validation split and a DataLoader that hands every DP replica its own
// disjoint samples, deterministically from the seed and resumable from a few integers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace atlas::model {

/// Byte-level tokenizer: token id = byte value, vocabulary 256. Lossless for any bytes.
class ByteTokenizer {
 public:
  static constexpr int kVocab = 256;
  [[nodiscard]] static std::vector<std::int32_t> encode(std::string_view text);
  /// Throws atlas::Error (Config) on an id outside [0, 256).
  [[nodiscard]] static std::string decode(std::span<const std::int32_t> ids);
};

enum class Split { Train, Val };

class ShardSet;  // shards.hpp

/// Tokens of a stream of `total` held out for validation (the tail): floor(val_fraction * total).
[[nodiscard]] std::int64_t val_tokens_of(std::int64_t total, double val_fraction);

/// A corpus as one token stream: every *.txt file of a directory, in file-name order,
/// concatenated. Cheap to copy (the tokens are shared, immutable).
class Corpus {
 public:
  /// Text to token ids (a tokenizer's encode). Empty = ByteTokenizer::encode.
  using Encoder = std::function<std::vector<std::int32_t>(std::string_view)>;

  /// Loads every *.txt file under `dir` (not recursive), concatenated, tokenized by `encode`.
  /// Throws atlas::ConfigError when the directory is missing or holds no text (hint:
  /// scripts/get-data.sh / make data).
  [[nodiscard]] static Corpus load(const std::string& dir, const Encoder& encode = {});
  /// The files load() reads: every *.txt file under `dir`, in name order. Throws
  /// atlas::ConfigError as load() does, and for a *.txt that is a broken symbolic link (skipping
  /// it would change the data silently). `tokenize`: the messages speak of atlas tokenize's input
  /// directory instead of data.corpus_dir.
  [[nodiscard]] static std::vector<std::string> text_files(const std::string& dir, bool tokenize = false);
  /// A corpus from in-memory text (tests, tools), tokenized by `encode`.
  [[nodiscard]] static Corpus from_text(std::string_view text, std::string origin = "<memory>",
                                        const Encoder& encode = {});

  [[nodiscard]] std::span<const std::int32_t> tokens() const noexcept { return *m_tokens; }
  /// The train split = the first (1 - val_fraction) of the stream, val = the rest (the tail).
  /// val_fraction in [0, 1).
  [[nodiscard]] std::span<const std::int32_t> split(Split which, double val_fraction) const;
  [[nodiscard]] const std::string& origin() const noexcept { return m_origin; }
  [[nodiscard]] int file_count() const noexcept { return m_files; }

 private:
  friend class DataLoader;
  std::shared_ptr<const std::vector<std::int32_t>> m_tokens;
  std::string m_origin;
  int m_files = 0;
};

/// Which samples one loader serves.
struct LoaderShape {
  int seq_len = 0;           ///< T: tokens per sample (targets are the next T tokens)
  int micro_batch_size = 1;  ///< B: samples per micro-batch
  int micro_batches = 1;     ///< M: micro-batches per pipeline per step
  int dp_size = 1;           ///< DP replicas (pipelines)
  int dp_rank = 0;           ///< this replica
};

/// Where a loader stands: enough to resume exactly (store it in checkpoints).
struct DataPosition {
  std::uint64_t seed = 0;             ///< seed the sample order was drawn from
  std::int64_t samples_consumed = 0;  ///< global samples served before the current step
  std::int64_t epoch_samples = 0;     ///< windows per epoch (guards against a changed corpus)
  /// CRC32C of the split's token stream (the ids as little-endian int32, in stream order): the
  /// same data. Empty in a position read from a checkpoint written before it was kept.
  std::optional<std::uint32_t> stream_crc;
};

/// Serves micro-batches of one split.
///
/// Samples are the non-overlapping windows w = 0 .. W-1 of the split, W = (len - 1) / T:
/// tokens = split[w*T, w*T + T), targets = split[w*T + 1, w*T + T + 1). Each epoch e visits
/// them in the order perm_e (a seeded bijection of [0, W); identity when shuffle is false).
/// A step consumes G = dp_size * M * B global sample slots. Sample b of micro-batch m on
/// replica d, at the current step, takes global slot
///     q = samples_consumed + (d * M + m) * B + b,  window = perm_{q / W}(q % W),
/// so replica d's micro-batch m is exactly micro-batch d*M + m of a dp_size = 1 run with
/// dp_size * M micro-batches, and the replicas' samples are disjoint within an epoch (a step
/// that crosses an epoch's end, or takes more than W samples, repeats windows: repeat_warning).
class DataLoader {
 public:
  /// Keeps the corpus tokens alive. Throws atlas::ConfigError if the split is shorter than
  /// seq_len + 1 tokens, or on a bad shape.
  DataLoader(const Corpus& corpus, Split which, double val_fraction, const LoaderShape& shape,
             std::uint64_t seed, bool shuffle);
  /// The same over a shard set (data.format = shards): the set is the split's whole stream.
  /// Keeps the mapped shards alive.
  DataLoader(const ShardSet& shards, Split which, const LoaderShape& shape, std::uint64_t seed,
             bool shuffle);

  /// Fills `tokens` and `targets` (host arrays of B*T ids) with micro-batch `micro` of the
  /// current step for this replica.
  void fill(int micro, std::int32_t* tokens, std::int32_t* targets) const;
  /// Window index of sample `b` of micro-batch `micro` of this replica at the current step.
  [[nodiscard]] std::int64_t sample_window(int micro, int b) const;
  /// Moves to the next step (samples_consumed += G).
  void advance() noexcept { m_consumed += samples_per_step(); }
  /// Back to the start (evaluation loaders).
  void rewind() noexcept { m_consumed = 0; }

  [[nodiscard]] std::int64_t samples_per_step() const noexcept;
  /// Non-empty when a step (of this shape: an evaluation pass for the validation loader) takes
  /// more samples than the split holds windows: the same windows then come several times in one
  /// step, in several replicas. The run's warning, naming the split, the counts and the fixes.
  [[nodiscard]] std::string repeat_warning() const;
  [[nodiscard]] std::int64_t epoch_samples() const noexcept { return m_windows; }
  [[nodiscard]] const LoaderShape& shape() const noexcept { return m_shape; }
  /// Where the loader stands. The first call reads the split's whole token stream once (its
  /// CRC32C, DataPosition::stream_crc); later calls reuse it.
  [[nodiscard]] DataPosition position() const;
  /// Resumes at `pos`. Throws atlas::ConfigError if it was taken with another seed or other data
  /// (window count, or the stream's CRC32C where `pos` has one).
  void restore(const DataPosition& pos);
  /// CRC32C of the split's token stream as little-endian int32 ids (computed once, then kept):
  /// the same for a text corpus and for shards of the same tokens.
  [[nodiscard]] std::uint32_t stream_crc() const;

 private:
  [[nodiscard]] std::int64_t window_of(std::int64_t slot) const;
  void check_shape(std::int64_t len, Split which, const std::string& origin);

  std::shared_ptr<const std::vector<std::int32_t>> m_keep;
  std::span<const std::int32_t> m_stream;
  std::shared_ptr<const ShardSet> m_shards;  ///< set: the stream is these shards, not m_stream
  LoaderShape m_shape;
  std::uint64_t m_seed;
  bool m_shuffle;
  std::int64_t m_windows = 0;
  std::int64_t m_consumed = 0;
  mutable std::optional<std::uint32_t> m_stream_crc;  ///< stream_crc(), once computed
  Split m_split = Split::Train;
  std::string m_origin;
};

/// Unigram (order-0) entropy of a token stream in nats per token: the loss floor of a model that
/// ignores context.
[[nodiscard]] double unigram_entropy(std::span<const std::int32_t> tokens, int vocab);
/// -sum p log p over token counts (`n` = their total), in nats: the one sum (and order) behind
/// unigram_entropy and ShardSet::unigram_entropy, so both give the same bits.
[[nodiscard]] double entropy_of_counts(std::span<const std::int64_t> counts, double n);

}  // namespace atlas::model
