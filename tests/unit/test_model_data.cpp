// SPDX-License-Identifier: MIT
// Tokenizer round trip, corpus loading and its errors, the train/val split, and the DataLoader's
// contracts: DP partition (replica d's micro m == micro d*M+m of the dp=1 run), every window once
// per epoch, seeded order, resume determinism.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include "atlas/core/crc32c.hpp"
#include "atlas/core/error.hpp"
#include "atlas/model/data.hpp"

namespace atlas::model {
namespace {

namespace fs = std::filesystem;

std::string synthetic_text(std::size_t n) {
  std::string s;
  const char* words[] = {"the ", "jury ", "said ", "Friday ", "an ", "investigation ", "of "};
  for (std::size_t i = 0; s.size() < n; ++i) s += words[(i * 7 + i / 3) % 7];
  s.resize(n);
  return s;
}

class TempDir {
 public:
  TempDir()
      : m_path(fs::temp_directory_path() / ("atlas_test_data_" + std::to_string(::getpid()))) {
    fs::remove_all(m_path);
    fs::create_directories(m_path);
  }
  ~TempDir() { fs::remove_all(m_path); }
  [[nodiscard]] const fs::path& path() const { return m_path; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(m_path / name, std::ios::binary) << text;
  }

 private:
  fs::path m_path;
};

TEST(ByteTokenizer, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  all += "caf\xc3\xa9 -- plain English";
  const auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), all.size());
  EXPECT_EQ(ids[255], 255);
  EXPECT_EQ(ids[256], 'c');
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
  const std::vector<std::int32_t> bad = {65, 300};
  try {
    (void)ByteTokenizer::decode(bad);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("token id 300 at position 1"));
  }
}

TEST(Corpus, LoadsTxtFilesInNameOrderAndSplitsOffTheTail) {
  TempDir dir;
  dir.write("b.txt", "world\n");
  dir.write("a.txt", "hello ");
  dir.write("notes.md", "ignored");
  const Corpus c = Corpus::load(dir.path().string());
  EXPECT_EQ(c.file_count(), 2);
  EXPECT_EQ(ByteTokenizer::decode(c.tokens()), "hello world\n");
  const auto train = c.split(Split::Train, 0.25);
  const auto val = c.split(Split::Val, 0.25);
  EXPECT_EQ(train.size() + val.size(), c.tokens().size());
  EXPECT_EQ(val.size(), 3U);  // floor(0.25 * 12)
  EXPECT_EQ(ByteTokenizer::decode(val), "ld\n");
  EXPECT_THROW((void)c.split(Split::Val, 1.0), ConfigError);
}

TEST(Corpus, MissingOrEmptyDirectoryNamesTheFix) {
  try {
    (void)Corpus::load("/nonexistent/brown");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("data.corpus_dir = '/nonexistent/brown' does not exist"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("scripts/get-data.sh"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("make data"));
  }
  TempDir empty;
  try {
    (void)Corpus::load(empty.path().string());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("holds no .txt files"));
  }
}

// A *.txt that is a broken symbolic link is an error naming it (it was skipped: the corpus shrank
// without a word); atlas tokenize's input directories speak of themselves, not data.corpus_dir.
TEST(Corpus, ABrokenLinkIsNamedNotSkipped) {
  TempDir dir;
  {
    std::ofstream(dir.path() / "a.txt") << "some text";
  }
  std::filesystem::create_symlink(dir.path() / "gone.txt", dir.path() / "b.txt");
  const std::string d = dir.path().string();
  try {
    (void)Corpus::text_files(d);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("data.corpus_dir = '" + d + "': " + d + "/b.txt is a broken symbolic link"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("hint: point it at the file again, or remove it"));
  }
  std::filesystem::remove(dir.path() / "b.txt");
  EXPECT_EQ(Corpus::text_files(d, true), std::vector<std::string>{d + "/a.txt"});
  std::filesystem::remove(dir.path() / "a.txt");
  try {
    (void)Corpus::text_files(d, true);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("atlas tokenize: input directory '" + d + "' holds no .txt files"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("hint: name text files, or directories holding .txt files"));
  }
}

TEST(DataLoader, SeqLenLongerThanTheSplitIsAConfigError) {
  const Corpus c = Corpus::from_text(synthetic_text(1000), "tiny");
  LoaderShape shape{.seq_len = 64};
  try {
    DataLoader val(c, Split::Val, 0.05, shape, 1, false);  // 50 tokens
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("model.seq_len = 64 needs at least 65 tokens, but "
                                               "the validation split of tiny has 50 tokens"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("data.val_fraction"));
  }
  EXPECT_NO_THROW(DataLoader(c, Split::Train, 0.05, shape, 1, false));
}

// A split with fewer windows than a step takes repeats them within the step, across replicas:
// said (it was silent), naming the split, the counts and the fixes; none when the split is large.
TEST(DataLoader, ASplitSmallerThanAStepIsWarnedAbout) {
  const Corpus c = Corpus::from_text(synthetic_text(200), "tiny");
  const LoaderShape shape{.seq_len = 16, .micro_batch_size = 2, .micro_batches = 4, .dp_size = 2};
  const DataLoader train(c, Split::Train, 0.1, shape, 1, true);
  ASSERT_LT(train.epoch_samples(), train.samples_per_step());
  EXPECT_THAT(train.repeat_warning(),
              ::testing::HasSubstr("the train split of tiny holds " + std::to_string(train.epoch_samples()) +
                                   " window(s) of model.seq_len + 1 = 17 tokens, but a step takes 16 samples "
                                   "(parallel.dp_size 2 x train.micro_batches 4 x train.micro_batch_size 2)"));
  LoaderShape eval = shape;
  eval.micro_batches = 2;
  const DataLoader val(c, Split::Val, 0.5, eval, 1, false);
  ASSERT_LT(val.epoch_samples(), 8);
  EXPECT_THAT(val.repeat_warning(), ::testing::HasSubstr("but an evaluation takes 8 samples (parallel.dp_size 2 x "
                                                         "train.eval_batches 2 x train.micro_batch_size 2)"));
  const Corpus big = Corpus::from_text(synthetic_text(5000));
  EXPECT_EQ(DataLoader(big, Split::Train, 0.1, shape, 1, true).repeat_warning(), "");
}

TEST(DataLoader, TargetsAreTheTokensShiftedByOne) {
  const Corpus c = Corpus::from_text(synthetic_text(5000));
  const auto stream = c.split(Split::Train, 0.1);
  DataLoader dl(c, Split::Train, 0.1, LoaderShape{.seq_len = 16, .micro_batch_size = 3}, 9, true);
  std::vector<std::int32_t> tok(48), tgt(48);
  dl.fill(0, tok.data(), tgt.data());
  for (int b = 0; b < 3; ++b) {
    const auto w = static_cast<std::size_t>(dl.sample_window(0, b));
    for (std::size_t t = 0; t < 16; ++t) {
      EXPECT_EQ(tok[b * 16 + t], stream[w * 16 + t]);
      EXPECT_EQ(tgt[b * 16 + t], stream[w * 16 + t + 1]);
    }
  }
}

TEST(DataLoader, ReplicasPartitionTheSingleReplicaBatch) {
  const Corpus c = Corpus::from_text(synthetic_text(5000));
  const int dp = 3, micros = 2, batch = 2;
  DataLoader single(c, Split::Train, 0.0,
                    LoaderShape{.seq_len = 8, .micro_batch_size = batch,
                                .micro_batches = dp * micros},
                    42, true);
  std::vector<DataLoader> replicas;
  for (int d = 0; d < dp; ++d) {
    replicas.emplace_back(c, Split::Train, 0.0,
                          LoaderShape{.seq_len = 8, .micro_batch_size = batch,
                                      .micro_batches = micros, .dp_size = dp, .dp_rank = d},
                          42, true);
  }
  const std::int64_t windows = single.epoch_samples();
  ASSERT_EQ(windows, 4999 / 8);
  // 60 steps of 12 samples cross the epoch boundary (624 windows) once.
  for (int step = 0; step < 60; ++step) {
    std::multiset<std::int64_t> want, got;
    for (int m = 0; m < dp * micros; ++m) {
      for (int b = 0; b < batch; ++b) want.insert(single.sample_window(m, b));
    }
    for (int d = 0; d < dp; ++d) {
      for (int m = 0; m < micros; ++m) {
        for (int b = 0; b < batch; ++b) {
          const std::int64_t w = replicas[static_cast<std::size_t>(d)].sample_window(m, b);
          got.insert(w);
          EXPECT_EQ(w, single.sample_window(d * micros + m, b)) << "step " << step;
        }
      }
    }
    EXPECT_EQ(got, want) << "step " << step;
    EXPECT_EQ(std::set<std::int64_t>(got.begin(), got.end()).size(), got.size()) << "disjoint";
    single.advance();
    for (auto& r : replicas) r.advance();
  }
}

TEST(DataLoader, EachEpochVisitsEveryWindowOnceInASeededOrder) {
  const Corpus c = Corpus::from_text(synthetic_text(3001));
  auto epoch_order = [&](std::uint64_t seed, int epoch, bool shuffle) {
    DataLoader dl(c, Split::Train, 0.0, LoaderShape{.seq_len = 10}, seed, shuffle);
    std::vector<std::int64_t> order;
    for (std::int64_t s = 0; s < static_cast<std::int64_t>(epoch + 1) * dl.epoch_samples(); ++s) {
      if (s >= epoch * dl.epoch_samples()) order.push_back(dl.sample_window(0, 0));
      dl.advance();
    }
    return order;
  };
  const auto e0 = epoch_order(7, 0, true);
  ASSERT_EQ(e0.size(), 300U);
  std::vector<std::int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    ASSERT_EQ(sorted[i], static_cast<std::int64_t>(i));
  EXPECT_NE(e0, sorted) << "shuffled";
  EXPECT_NE(e0, epoch_order(7, 1, true)) << "a new order every epoch";
  EXPECT_NE(e0, epoch_order(8, 0, true)) << "the order depends on the seed";
  EXPECT_EQ(e0, epoch_order(7, 0, true)) << "and only on the seed";
  EXPECT_EQ(epoch_order(7, 0, false), sorted) << "no shuffle: stream order";
}

TEST(DataLoader, ResumesExactlyFromASavedPosition) {
  const Corpus c = Corpus::from_text(synthetic_text(4000));
  const LoaderShape shape{.seq_len = 12, .micro_batch_size = 2, .micro_batches = 3,
                          .dp_size = 2, .dp_rank = 1};
  DataLoader a(c, Split::Train, 0.1, shape, 5, true);
  for (int i = 0; i < 7; ++i) a.advance();
  const DataPosition pos = a.position();
  EXPECT_EQ(pos.samples_consumed, 7 * 12);
  EXPECT_EQ(pos.seed, 5U);
  DataLoader b(c, Split::Train, 0.1, shape, 5, true);
  b.restore(pos);
  for (int step = 0; step < 5; ++step) {
    for (int m = 0; m < 3; ++m) {
      std::vector<std::int32_t> ta(24), ga(24), tb(24), gb(24);
      a.fill(m, ta.data(), ga.data());
      b.fill(m, tb.data(), gb.data());
      ASSERT_EQ(ta, tb);
      ASSERT_EQ(ga, gb);
    }
    a.advance();
    b.advance();
  }
  DataLoader other_seed(c, Split::Train, 0.1, shape, 6, true);
  try {
    other_seed.restore(pos);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("run.seed = 5"));
  }
  DataLoader other_len(c, Split::Train, 0.1, LoaderShape{.seq_len = 13}, 5, true);
  EXPECT_THROW(other_len.restore(pos), ConfigError);
}

TEST(DataLoader, RefusesAPositionTakenOverOtherTokensOfTheSameLength) {
  // Another corpus with as many windows (one byte changed): the window count cannot tell, the
  // stream's CRC32C does.
  std::string text = synthetic_text(4000);
  const Corpus c = Corpus::from_text(text, "original");
  text[100] = text[100] == 'x' ? 'y' : 'x';
  const Corpus changed = Corpus::from_text(text, "changed");
  const LoaderShape shape{.seq_len = 12, .micro_batch_size = 2, .micro_batches = 3, .dp_size = 1, .dp_rank = 0};
  DataLoader a(c, Split::Train, 0.1, shape, 5, true);
  a.advance();
  const DataPosition pos = a.position();
  ASSERT_TRUE(pos.stream_crc.has_value());
  EXPECT_EQ(*pos.stream_crc, crc32c(c.split(Split::Train, 0.1).data(), c.split(Split::Train, 0.1).size_bytes()));
  DataLoader b(changed, Split::Train, 0.1, shape, 5, true);
  ASSERT_EQ(b.epoch_samples(), a.epoch_samples());
  try {
    b.restore(pos);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("taken over other tokens"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("changed"));  // this run's data, named
    EXPECT_THAT(e.what(), ::testing::HasSubstr("resume with the same data (the deck's data.* keys and data.tokenizer)"));
  }
  // A position of a checkpoint from before the CRC was kept: its data is not checked.
  DataPosition old = pos;
  old.stream_crc.reset();
  b.restore(old);
  EXPECT_EQ(b.position().samples_consumed, pos.samples_consumed);
  // The same data resumes.
  DataLoader same(c, Split::Train, 0.1, shape, 5, true);
  EXPECT_NO_THROW(same.restore(pos));
}

TEST(UnigramEntropy, MatchesClosedForms) {
  EXPECT_NEAR(unigram_entropy(std::vector<std::int32_t>{1, 1, 1, 1}, 4), 0.0, 1e-12);
  EXPECT_NEAR(unigram_entropy(std::vector<std::int32_t>{0, 1, 2, 3}, 4), std::log(4.0), 1e-12);
  EXPECT_NEAR(unigram_entropy(std::vector<std::int32_t>{0, 0, 0, 1}, 2),
              -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
}

}  // namespace
}  // namespace atlas::model
