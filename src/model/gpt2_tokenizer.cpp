// SPDX-License-Identifier: MIT
// GPT-2 byte-level BPE (gpt2_tokenizer.hpp). Token strings are kept as ids throughout: a merge
// rule (left id, right id) -> (rank, merged id) lives in a hash map, and BPE of a word piece
// repeatedly merges every occurrence of its lowest-ranked adjacent pair, exactly as GPT-2's
// encoder.py does on strings. Pieces already seen are answered from a cache.
#include "atlas/model/gpt2_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas::model {

namespace {

// GPT-2's pre-tokenization pattern (encoder.py), unchanged.
constexpr std::string_view kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Bound on the cache of word pieces; cleared when exceeded (memory stays bounded on huge text).
constexpr std::size_t kMaxCache = 1U << 20;
// Longer word pieces are not cached (a cache of long runs would hold the text itself).
constexpr std::size_t kMaxCachedPieceBytes = 256;
// From this length on a piece's BPE uses the heap (bpe_heap), below it the rounds (bpe_rounds).
constexpr std::size_t kHeapBpeMinBytes = 48;

constexpr std::string_view kDirKey = "data.tokenizer_dir";

std::string hint() {
  return fmt::format("  hint: install the GPT-2 vocabulary and merges with scripts/get-data.sh (or `make "
                     "data`), or point {} at a directory holding encoder.json and vocab.bpe",
                     kDirKey);
}

[[noreturn]] void corrupt(const std::string& file, const std::string& what) {
  throw ConfigError(fmt::format("GPT-2 tokenizer file '{}' is corrupt: {}\n{}", file, what, hint()));
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw ConfigError(fmt::format("GPT-2 tokenizer file '{}' {}\n{}", path,
                                  std::filesystem::exists(path, ec) ? "is not a regular file"
                                                                    : "does not exist",
                                  hint()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read GPT-2 tokenizer file '{}'\n{}", path, hint()));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to 256 + n.
std::array<std::uint32_t, 256> byte_to_codepoint() {
  std::array<std::uint32_t, 256> map{};
  std::uint32_t n = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    map[b] = printable ? b : 256 + n++;
  }
  return map;
}

// A flat JSON object of string keys and non-negative integer values (encoder.json).
std::vector<std::pair<std::string, std::int64_t>> parse_encoder(const std::string& text,
                                                                const std::string& file) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  std::size_t i = 0;
  auto ws = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) ++i;
  };
  auto expect = [&](char ch) {
    ws();
    if (i >= text.size() || text[i] != ch)
      corrupt(file, fmt::format("expected '{}' at byte {}", ch, i));
    ++i;
  };
  auto hex4 = [&]() -> std::uint32_t {
    if (i + 4 > text.size()) corrupt(file, fmt::format("truncated \\u escape at byte {}", i));
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else corrupt(file, fmt::format("bad \\u escape at byte {}", i - 1));
    }
    return v;
  };
  expect('{');
  ws();
  if (i < text.size() && text[i] == '}') return out;
  while (true) {
    expect('"');
    std::string key;
    while (true) {
      if (i >= text.size()) corrupt(file, "unterminated string");
      const char c = text[i++];
      if (c == '"') break;
      if (c != '\\') { key += c; continue; }
      if (i >= text.size()) corrupt(file, "unterminated escape");
      const char e = text[i++];
      switch (e) {
        case '"': key += '"'; break;
        case '\\': key += '\\'; break;
        case '/': key += '/'; break;
        case 'b': key += '\b'; break;
        case 'f': key += '\f'; break;
        case 'n': key += '\n'; break;
        case 'r': key += '\r'; break;
        case 't': key += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i + 1 < text.size() && text[i] == '\\' && text[i + 1] == 'u') {
            i += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF)
              corrupt(file, fmt::format("bad escape at byte {}: \\u{:04X} after the high surrogate \\u{:04X} is no low "
                                        "surrogate (DC00-DFFF)", i - 6, lo, cp));
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(key, cp);
          break;
        }
        default: corrupt(file, fmt::format("bad escape '\\{}' at byte {}", e, i - 1));
      }
    }
    expect(':');
    ws();
    std::int64_t v = 0;
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - start < 12) v = v * 10 + (text[i++] - '0');
    if (i == start) corrupt(file, fmt::format("expected a token id at byte {}", i));
    out.emplace_back(std::move(key), v);
    ws();
    if (i < text.size() && text[i] == ',') { ++i; continue; }
    expect('}');
    break;
  }
  return out;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

struct Merge {
  std::int32_t rank;
  std::int32_t merged;
};

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::array<std::int32_t, 256> byte_id{};     // id of the single-byte token of each byte
  std::vector<std::string> bytes_of;           // id -> the bytes it stands for
  std::unordered_map<std::uint64_t, Merge> merges;
  std::unordered_map<std::string, std::vector<std::int32_t>> cache;
  pcre2_code* re = nullptr;
  pcre2_match_data* md = nullptr;

  ~Impl() {
    if (md != nullptr) pcre2_match_data_free(md);
    if (re != nullptr) pcre2_code_free(re);
  }

  std::size_t heap_min_bytes = kHeapBpeMinBytes;

  void bpe(std::string_view piece, std::vector<std::int32_t>& out) {
    const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
    if (cacheable)
      if (auto it = cache.find(std::string(piece)); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    std::vector<std::int32_t> word =
        piece.size() >= heap_min_bytes ? bpe_heap(piece) : bpe_rounds(piece);
    out.insert(out.end(), word.begin(), word.end());
    if (!cacheable) return;
    if (cache.size() >= kMaxCache) cache.clear();
    cache.emplace(std::string(piece), std::move(word));
  }

  /// BPE as encoder.py does it: each round finds the lowest-ranked adjacent pair and merges every
  /// occurrence, left to right. O(n^2) in the piece's length; the fastest for short pieces.
  std::vector<std::int32_t> bpe_rounds(std::string_view piece) {
    std::vector<std::int32_t> word(piece.size());
    for (std::size_t k = 0; k < piece.size(); ++k) word[k] = byte_id[static_cast<unsigned char>(piece[k])];
    while (word.size() > 1) {
      std::int32_t best_rank = std::numeric_limits<std::int32_t>::max();
      std::uint64_t best = 0;
      Merge best_merge{0, 0};
      for (std::size_t k = 0; k + 1 < word.size(); ++k) {
        const std::uint64_t key = pair_key(word[k], word[k + 1]);
        if (auto it = merges.find(key); it != merges.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          best = key;
          best_merge = it->second;
        }
      }
      if (best_rank == std::numeric_limits<std::int32_t>::max()) break;
      // Merge every occurrence of the pair, left to right (encoder.py's loop).
      std::size_t w = 0;
      for (std::size_t k = 0; k < word.size();) {
        if (k + 1 < word.size() && pair_key(word[k], word[k + 1]) == best) {
          word[w++] = best_merge.merged;
          k += 2;
        } else {
          word[w++] = word[k++];
        }
      }
      word.resize(w);
    }
    return word;
  }

  /// The same merges in O(n log n): the symbols in a linked list, every adjacent pair that has a
  /// merge in a min-heap by (rank, position). Popping in that order merges a rank's occurrences
  /// left to right, as a round does; an entry whose symbols changed since it was pushed is
  /// skipped (an overlapping occurrence, "aaa" -> "aa a"). A merge's new pairs rank after it (a
  /// token is used only by merges listed after the one that makes it), so no round is reordered.
  /// For long pieces (a run of letters or digits with no space: base64, hex dumps), where the
  /// rounds took seconds.
  std::vector<std::int32_t> bpe_heap(std::string_view piece) {
    if (piece.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      throw ConfigError(fmt::format("a word piece of {} bytes (no space or punctuation in 2 GiB of text): the GPT-2 "
                                    "tokenizer takes pieces below 2 GiB\n  hint: split the text",
                                    piece.size()));
    const auto n = static_cast<std::int32_t>(piece.size());
    std::vector<std::int32_t> id(piece.size()), prev(piece.size()), next(piece.size());
    for (std::int32_t k = 0; k < n; ++k) {
      id[static_cast<std::size_t>(k)] = byte_id[static_cast<unsigned char>(piece[static_cast<std::size_t>(k)])];
      prev[static_cast<std::size_t>(k)] = k - 1;
      next[static_cast<std::size_t>(k)] = k + 1;  // n: the end
    }
    struct Candidate {
      std::int32_t rank, pos, left, right, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](std::int32_t pos) {
      const std::int32_t nx = next[static_cast<std::size_t>(pos)];
      if (nx >= n) return;
      const std::int32_t l = id[static_cast<std::size_t>(pos)], r = id[static_cast<std::size_t>(nx)];
      if (auto it = merges.find(pair_key(l, r)); it != merges.end())
        heap.push({it->second.rank, pos, l, r, it->second.merged});
    };
    for (std::int32_t k = 0; k + 1 < n; ++k) push(k);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const auto pos = static_cast<std::size_t>(c.pos);
      const std::int32_t nx = next[pos];
      if (id[pos] != c.left || nx >= n || id[static_cast<std::size_t>(nx)] != c.right) continue;  // stale
      id[pos] = c.merged;
      id[static_cast<std::size_t>(nx)] = -1;
      next[pos] = next[static_cast<std::size_t>(nx)];
      if (next[pos] < n) prev[static_cast<std::size_t>(next[pos])] = c.pos;
      if (prev[pos] >= 0) push(prev[pos]);
      push(c.pos);
    }
    std::vector<std::int32_t> word;
    for (std::int32_t k = 0; k < n; k = next[static_cast<std::size_t>(k)]) word.push_back(id[static_cast<std::size_t>(k)]);
    return word;
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir, std::string_view dir_setting) try
    : m_impl(std::make_unique<Impl>()) {
  Impl& im = *m_impl;
  const std::string enc_file = (std::filesystem::path(dir) / "encoder.json").string();
  const std::string bpe_file = (std::filesystem::path(dir) / "vocab.bpe").string();

  // Token strings are in GPT-2's byte-to-unicode alphabet: map them back to bytes.
  const auto to_cp = byte_to_codepoint();
  std::unordered_map<std::string, int> char_to_byte;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, to_cp[static_cast<std::size_t>(b)]);
    char_to_byte.emplace(std::move(s), b);
  }
  auto token_bytes = [&](const std::string& tok, const std::string& file) {
    std::string bytes;
    for (std::size_t k = 0; k < tok.size();) {
      const auto lead = static_cast<unsigned char>(tok[k]);
      const std::size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      auto it = char_to_byte.find(tok.substr(k, len));
      if (it == char_to_byte.end()) corrupt(file, fmt::format("token '{}' has a character outside GPT-2's byte alphabet", tok));
      bytes += static_cast<char>(it->second);
      k += len;
    }
    return bytes;
  };

  // encoder.json: token string -> id, ids exactly 0 .. 50256.
  std::unordered_map<std::string, std::int32_t> id_of;  // token bytes -> id
  im.bytes_of.assign(kVocab, std::string());
  std::vector<bool> seen(kVocab, false);
  const auto entries = parse_encoder(read_file(enc_file), enc_file);
  if (entries.size() != static_cast<std::size_t>(kVocab))
    corrupt(enc_file, fmt::format("it holds {} tokens, GPT-2 has {}", entries.size(), kVocab));
  for (const auto& [tok, id] : entries) {
    if (id < 0 || id >= kVocab || seen[static_cast<std::size_t>(id)])
      corrupt(enc_file, fmt::format("token id {} is out of range or repeated", id));
    seen[static_cast<std::size_t>(id)] = true;
    if (tok == "<|endoftext|>") {
      im.bytes_of[static_cast<std::size_t>(id)] = tok;
      continue;
    }
    std::string bytes = token_bytes(tok, enc_file);
    id_of.emplace(bytes, static_cast<std::int32_t>(id));
    im.bytes_of[static_cast<std::size_t>(id)] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end()) corrupt(enc_file, fmt::format("byte {} has no token", b));
    im.byte_id[static_cast<std::size_t>(b)] = it->second;
  }

  // vocab.bpe: "#version" line, then one merge "left right" a line, in rank order.
  const std::string merges = read_file(bpe_file);
  std::istringstream lines(merges);
  std::string line;
  std::int32_t rank = 0;
  int line_no = 0;
  std::vector<bool> made(kVocab, false);  // a token some merge already makes
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size())
      corrupt(bpe_file, fmt::format("line {} is not a merge 'left right'", line_no));
    const std::string left = token_bytes(line.substr(0, sp), bpe_file);
    const std::string right = token_bytes(line.substr(sp + 1), bpe_file);
    auto l = id_of.find(left);
    auto r = id_of.find(right);
    auto m = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || m == id_of.end())
      corrupt(bpe_file, fmt::format("merge on line {} uses a token missing from encoder.json", line_no));
    if (made[static_cast<std::size_t>(m->second)])
      corrupt(bpe_file, fmt::format("the merge on line {} makes token {} a second time", line_no, m->second));
    // A merge uses bytes or tokens earlier merges made (the heap BPE relies on it: a merge's new
    // pairs rank after it).
    for (const auto& [bytes, it] : {std::pair{&left, l}, std::pair{&right, r}})
      if (bytes->size() > 1 && !made[static_cast<std::size_t>(it->second)])
        corrupt(bpe_file, fmt::format("the merge on line {} uses token {} before the merge that makes it", line_no,
                                      it->second));
    made[static_cast<std::size_t>(m->second)] = true;
    im.merges.emplace(pair_key(l->second, r->second), Merge{rank++, m->second});
  }
  // Every token but the 256 bytes and <|endoftext|> is made by exactly one merge: a file cut short
  // (at a line end, or mid-line into two known tokens) would pass every check above and change
  // how most words are split, without an error.
  if (rank != kVocab - 256 - 1)
    corrupt(bpe_file, fmt::format("it holds {} merges, GPT-2 has {} (a file cut short, or another model's merges)",
                                  rank, kVocab - 256 - 1));

  int err = 0;
  PCRE2_SIZE off = 0;
  im.re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern.data()), kPattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (im.re == nullptr) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    ATLAS_THROW(Internal, fmt::format("PCRE2 rejected GPT-2's pattern at {}: {}", off,
                                       reinterpret_cast<const char*>(msg.data())));
  }
  (void)pcre2_jit_compile(im.re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
  im.md = pcre2_match_data_create_from_pattern(im.re, nullptr);
} catch (const ConfigError& e) {
  // The hints name the deck key; a caller whose setting is another (atlas tokenize's option)
  // gets its own name there.
  if (dir_setting == kDirKey) throw;
  std::vector<std::string> problems = e.problems();
  for (std::string& p : problems)
    if (const auto at = p.find(kDirKey); at != std::string::npos) p.replace(at, kDirKey.size(), dir_setting);
  throw ConfigError(problems);
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) {
  Impl& im = *m_impl;
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 16);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(im.re, subject, text.size(), pos, 0, im.md, nullptr);
    PCRE2_SIZE start = text.size();
    PCRE2_SIZE end = text.size();
    if (rc > 0) {
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(im.md);
      start = ov[0];
      end = ov[1];
    } else if (rc != PCRE2_ERROR_NOMATCH) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      ATLAS_THROW(Internal, fmt::format("PCRE2 match failed at byte {}: {}", pos,
                                         reinterpret_cast<const char*>(msg.data())));
    }
    // Bytes no alternative matches (invalid UTF-8) are a piece of their own: lossless.
    if (start > pos) im.bpe(text.substr(pos, start - pos), out);
    if (end > start) im.bpe(text.substr(start, end - start), out);
    pos = end > pos ? end : pos + 1;
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocab) {
      throw ConfigError(fmt::format("token id {} at position {} is outside the GPT-2 vocabulary "
                                    "[0, {})\n  hint: the ids were not made by the gpt2 tokenizer",
                                    ids[i], i, kVocab));
    }
    text += m_impl->bytes_of[static_cast<std::size_t>(ids[i])];
  }
  return text;
}

std::size_t Gpt2Tokenizer::cache_size() const noexcept { return m_impl->cache.size(); }

void Gpt2Tokenizer::set_heap_bpe_min_bytes(std::size_t bytes) noexcept {
  m_impl->heap_min_bytes = bytes;
  m_impl->cache.clear();
}

namespace {

bool is_ascii_space(unsigned char b) { return b == ' ' || (b >= '\t' && b <= '\r'); }

/// Whether the character that ends just before `q` is a valid UTF-8 character that GPT-2's
/// pattern (PCRE2 with UCP) cannot take for whitespace. ASCII control characters, Unicode's space
/// separators and the format characters some engines class as spaces count as whitespace here.
bool ends_in_non_space(std::string_view t, std::size_t q) {
  const auto last = static_cast<unsigned char>(t[q - 1]);
  if (last < 0x80) return last > 0x20 && last < 0x7f;
  // The lead byte of the sequence that ends at q - 1 (at most 3 continuation bytes before it).
  std::size_t lead = q - 1;
  while (lead > 0 && q - lead < 4 && (static_cast<unsigned char>(t[lead]) & 0xC0) == 0x80) --lead;
  const auto b0 = static_cast<unsigned char>(t[lead]);
  std::size_t n = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return false;  // a stray continuation byte or an invalid lead byte
  }
  if (lead + n != q) return false;  // truncated or over-long sequence
  for (std::size_t i = lead + 1; i < q; ++i) cp = (cp << 6) | (static_cast<unsigned char>(t[i]) & 0x3F);
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;  // not valid UTF-8
  const bool space = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || cp == 0x180E || (cp >= 0x2000 && cp <= 0x200B) ||
                     cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
  return !space;
}

}  // namespace

std::size_t gpt2_last_cut(std::string_view text, std::size_t from) noexcept {
  for (std::size_t q = text.size(); q-- > std::max<std::size_t>(from, 1);)
    if (is_ascii_space(static_cast<unsigned char>(text[q])) && ends_in_non_space(text, q)) return q;
  return 0;
}

}  // namespace atlas::model
