// SPDX-License-Identifier: MIT
// The one table that declares every deck key: type, default or required, range or allowed
// values, one-line help, and how it binds to a Config field. It also generates inputs/README.md
// and the --help-deck text. Adding a key = one entry in src/deck/schema.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::deck {

/// Upper bounds of the keys that size memory, loops or time: far above any real job, low enough
/// that atlas schedule / simulate / plan stay within memory and seconds (no silent clamping: a
/// value above one is a config error naming the key).
namespace limits {
inline constexpr double kMaxDcs = 64;                  ///< entries of cluster.dcs
inline constexpr double kMaxGpusPerDc = 1'000'000;     ///< cluster.gpus_per_dc, ranks_per_host
inline constexpr double kMaxStages = 4096;             ///< parallel.stages_per_dc entries
inline constexpr double kMaxDp = 100'000;              ///< parallel.dp_size
inline constexpr int kMaxRails = 64;                   ///< wan.rails (and every other user of the transport)
/// wan.chunk_bytes (and every other user of the multirail transport; its frames count 32 bits)
inline constexpr double kMaxChunkBytes = 1024.0 * 1024 * 1024;
inline constexpr double kMaxRanks = 16'777'216;         ///< stages x dp_size x tp_size (the job's ranks)
inline constexpr double kMaxLayers = 4096;             ///< model.layers, bubbletea.layers
inline constexpr double kMaxHidden = 1'048'576;        ///< model.hidden, heads (and bubbletea's)
inline constexpr double kMaxTokens = 16'777'216;       ///< seq_len, vocab, context, prompt lengths
/// train.micro_batches, eval_batches. The pipeline's MPI tags (mpi/tags.hpp) take 2 per
/// micro-batch and 1 per eval batch; a job checks them against its MPI's MPI_TAG_UB.
inline constexpr double kMaxMicroBatches = 65'536;
inline constexpr double kMaxSeconds = 1e6;             ///< every *_s duration (std::chrono safe)
/// Slots of one schedule table, estimated as micro_batches x stages x dp x 6 (forward,
/// backward and their sends and receives): bounds the memory and time of atlas schedule,
/// simulate and train: measured 0.4 KB and 30 us a slot (atlas schedule of inputs/default.deck with
/// 10,000 micro-batches: 480,000 slots, 200 MB, 15 s).
inline constexpr double kMaxScheduleSlots = 2'000'000;
/// Sequences per step (dp x micro_batches x micro_batch_size).
inline constexpr double kMaxGlobalBatch = 16'777'216;
/// BubbleTea's requests: bubbletea.requests, and the requests a trace may hold.
inline constexpr double kMaxRequests = 1'000'000;
/// The prompt tokens all requests may hold (every rank holds every prompt, 4 bytes a token):
/// 2^28, 1 GiB. The generator's with the deck, a trace's while it is read.
inline constexpr double kMaxPromptTokens = 268'435'456;
/// One micro-batch's boundary activations (seq_len x micro_batch_size x hidden x 4 bytes): 1 TiB.
inline constexpr double kMaxBoundaryBytes = 1099511627776.0;
/// data.val_fraction (and atlas tokenize --val-fraction): the held-out share of the tokens.
inline constexpr double kMinValFraction = 0.001;
inline constexpr double kMaxValFraction = 0.5;
}  // namespace limits

enum class ValueType { Int, Float, Bool, String, Bytes, Enum, IntList, FloatList, StringList };

/// A value converted from deck text according to its KeySpec.
struct Value {
  std::int64_t i = 0;
  std::uint64_t bytes = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<std::int64_t> il;
  std::vector<double> fl;
  std::vector<std::string> sl;
};

struct KeySpec {
  std::string key;                    ///< "section.name"
  ValueType type = ValueType::String;
  bool required = false;
  std::string default_text;           ///< deck text of the default (when not required)
  std::optional<double> min;          ///< inclusive bound for numbers and list elements
  std::optional<double> max;
  /// Integer keys: the limits of the Config field's type (int, int64), checked exactly so that a
  /// value is never narrowed into another one ("4294967300" is not 4).
  std::optional<std::int64_t> type_min;
  std::optional<std::int64_t> type_max;
  std::vector<std::string> choices;   ///< Enum values
  std::string help;
  std::function<void(Config&, const Value&)> set;
  std::function<std::string(const Config&)> get;  ///< deck text of the current value

  [[nodiscard]] std::string section() const { return key.substr(0, key.find('.')); }
  /// "an integer in [1, 64]", "one of: gpipe 1f1b atlas", ...
  [[nodiscard]] std::string expectation() const;
  /// Converts text; on failure returns nullopt and sets `why` to the expectation.
  [[nodiscard]] std::optional<Value> convert(std::string_view text, std::string& why) const;
};

class Schema {
 public:
  /// The table of every key atlas knows (built once, immutable).
  static const Schema& instance();

  [[nodiscard]] const KeySpec* find(std::string_view key) const;
  [[nodiscard]] const std::vector<KeySpec>& keys() const { return m_keys; }
  /// Up to three known keys close to `key` (edit distance), best first.
  [[nodiscard]] std::vector<std::string> suggestions(std::string_view key) const;
  /// Markdown reference of every key (inputs/README.md).
  [[nodiscard]] std::string markdown() const;
  /// Plain-text reference (atlas <cmd> --help-deck).
  [[nodiscard]] std::string help_text() const;

  KeySpec& add(KeySpec spec);

 private:
  std::vector<KeySpec> m_keys;
};

/// True if `text` is wrapped in double quotes.
bool is_quoted(std::string_view text);
/// Removes surrounding double quotes, if any.
std::string unquote(std::string_view text);
/// Splits on whitespace, keeping "quoted strings" whole.
std::vector<std::string> split_list(std::string_view text);

}  // namespace atlas::deck
