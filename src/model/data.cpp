// SPDX-License-Identifier: MIT
// Corpus loading, byte tokenizer, train/val split and the DP-partitioned DataLoader (data.hpp).
// The sample order is a stateless keyed permutation (a Feistel network with cycle walking), so
// any rank computes any sample's window directly: no shared state, nothing to replay on resume.
#include "atlas/model/data.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/crc32c.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/file.hpp"
#include "atlas/model/rng.hpp"
#include "atlas/model/shards.hpp"

namespace atlas::model {

namespace fs = std::filesystem;

// ---- tokenizer ----

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids(text.size());
  std::transform(text.begin(), text.end(), ids.begin(),
                 [](char ch) { return static_cast<std::int32_t>(static_cast<unsigned char>(ch)); });
  return ids;
}

std::string ByteTokenizer::decode(std::span<const std::int32_t> ids) {
  std::string text(ids.size(), '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocab) {
      ATLAS_THROW(Config, "token id " << ids[i] << " at position " << i
                                      << " is not a byte (byte tokenizer vocabulary is 256)");
    }
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

// ---- corpus ----

namespace {
std::string data_hint() {
  return "  hint: install the Brown corpus with scripts/get-data.sh (or `make data`), or point "
         "data.corpus_dir at a directory of .txt files";
}
}  // namespace

std::vector<std::string> Corpus::text_files(const std::string& dir, bool tokenize) {
  const std::string what = tokenize ? fmt::format("atlas tokenize: input directory '{}'", dir)
                                    : fmt::format("data.corpus_dir = '{}'", dir);
  const std::string hint = tokenize ? "  hint: name text files, or directories holding .txt files" : data_hint();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError(fmt::format("{} {}\n{}", what, fs::exists(dir, ec) ? "is not a directory" : "does not exist",
                                  hint));
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".txt") continue;
    std::error_code link_ec;
    if (entry.is_symlink(link_ec) && !fs::exists(entry.path(), link_ec)) {
      throw ConfigError(fmt::format("{}: {} is a broken symbolic link (to '{}')\n  hint: point it at the file again, "
                                    "or remove it",
                                    what, entry.path().string(), fs::read_symlink(entry.path(), link_ec).string()));
    }
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  if (ec) throw ConfigError(fmt::format("{}: {}", what, ec.message()));
  if (files.empty()) throw ConfigError(fmt::format("{} holds no .txt files\n{}", what, hint));
  std::sort(files.begin(), files.end());
  return files;
}

Corpus Corpus::load(const std::string& dir, const Encoder& encode) {
  const std::vector<std::string> files = text_files(dir);
  std::string text;
  for (const auto& path : files)
    read_file_blocks(path, "corpus file", "check the file (and its file system) and start the run again",
                     std::size_t{1} << 20, [&](std::string_view data, std::int64_t) { text.append(data); });
  Corpus c = from_text(text, dir, encode);
  c.m_files = static_cast<int>(files.size());
  return c;
}

Corpus Corpus::from_text(std::string_view text, std::string origin, const Encoder& encode) {
  Corpus c;
  c.m_tokens = std::make_shared<const std::vector<std::int32_t>>(
      encode ? encode(text) : ByteTokenizer::encode(text));
  c.m_origin = std::move(origin);
  c.m_files = 1;
  return c;
}

std::int64_t val_tokens_of(std::int64_t total, double val_fraction) {
  return static_cast<std::int64_t>(std::floor(val_fraction * static_cast<double>(total)));
}

std::span<const std::int32_t> Corpus::split(Split which, double val_fraction) const {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw ConfigError(fmt::format("data.val_fraction = {} must be in [0, 1)", val_fraction));
  }
  const auto total = static_cast<std::int64_t>(m_tokens->size());
  const std::int64_t val = val_tokens_of(total, val_fraction);
  const std::span<const std::int32_t> all(*m_tokens);
  const auto train_len = static_cast<std::size_t>(total - val);
  return which == Split::Train ? all.first(train_len) : all.subspan(train_len);
}

// ---- loader ----

namespace {

// A keyed bijection of [0, n): a balanced Feistel network over 2*half bits, cycle-walked into
// range. Four rounds of a strong mixer are plenty for shuffling samples.
std::int64_t permute(std::int64_t x, std::int64_t n, std::uint64_t key) {
  int bits = 2;
  while ((std::int64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;
  const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
  auto x_u = static_cast<std::uint64_t>(x);
  do {
    std::uint64_t left = x_u >> half;
    std::uint64_t right = x_u & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t next = left ^ (rng::bits(key + round, right) & mask);
      left = right;
      right = next;
    }
    x_u = (left << half) | right;
  } while (x_u >= static_cast<std::uint64_t>(n));
  return static_cast<std::int64_t>(x_u);
}

const char* split_name(Split s) { return s == Split::Train ? "train" : "validation"; }

}  // namespace

DataLoader::DataLoader(const Corpus& corpus, Split which, double val_fraction,
                       const LoaderShape& shape, std::uint64_t seed, bool shuffle)
    : m_keep(corpus.m_tokens),
      m_stream(corpus.split(which, val_fraction)),
      m_shape(shape),
      m_seed(seed),
      m_shuffle(shuffle) {
  check_shape(static_cast<std::int64_t>(m_stream.size()), which, corpus.origin());
}

DataLoader::DataLoader(const ShardSet& shards, Split which, const LoaderShape& shape,
                       std::uint64_t seed, bool shuffle)
    : m_shards(std::make_shared<const ShardSet>(shards)),
      m_shape(shape),
      m_seed(seed),
      m_shuffle(shuffle) {
  check_shape(shards.size(), which, shards.origin());
}

void DataLoader::check_shape(std::int64_t len, Split which, const std::string& origin) {
  m_split = which;
  m_origin = origin;
  const LoaderShape& shape = m_shape;
  ProblemList problems;
  if (shape.seq_len < 1)
    problems.add(fmt::format("model.seq_len = {} must be >= 1", shape.seq_len));
  if (shape.micro_batch_size < 1 || shape.micro_batches < 1 || shape.dp_size < 1) {
    problems.add(fmt::format("data loader shape B = {}, M = {}, dp = {} must all be >= 1",
                             shape.micro_batch_size, shape.micro_batches, shape.dp_size));
  }
  if (shape.dp_rank < 0 || shape.dp_rank >= std::max(1, shape.dp_size)) {
    problems.add(fmt::format("dp_rank {} is outside [0, {})", shape.dp_rank, shape.dp_size));
  }
  problems.throw_if_any();
  if (len < static_cast<std::int64_t>(shape.seq_len) + 1) {
    const char* more = m_shards ? (which == Split::Val ? " or add tokens to data.val_shards"
                                                       : " or add tokens to data.train_shards")
                                : (which == Split::Val ? " or raise data.val_fraction"
                                                       : " or use a larger corpus");
    throw ConfigError(fmt::format(
        "model.seq_len = {} needs at least {} tokens, but the {} split of {} has {} tokens\n"
        "  hint: lower model.seq_len{}",
        shape.seq_len, shape.seq_len + 1, split_name(which), origin, len, more));
  }
  m_windows = (len - 1) / shape.seq_len;
}

std::int64_t DataLoader::samples_per_step() const noexcept {
  return static_cast<std::int64_t>(m_shape.dp_size) * m_shape.micro_batches *
         m_shape.micro_batch_size;
}

std::string DataLoader::repeat_warning() const {
  const std::int64_t g = samples_per_step();
  if (m_windows >= g) return {};
  const bool train = m_split == Split::Train;
  return fmt::format(
      "the {} split of {} holds {} window(s) of model.seq_len + 1 = {} tokens, but {} takes {} samples "
      "(parallel.dp_size {} x {} {} x train.micro_batch_size {}): the same windows come several times in it, "
      "in several DP replicas\n  hint: {}",
      split_name(m_split), m_origin, m_windows, m_shape.seq_len + 1, train ? "a step" : "an evaluation", g,
      m_shape.dp_size, train ? "train.micro_batches" : "train.eval_batches", m_shape.micro_batches,
      m_shape.micro_batch_size,
      train ? "use more training data, or lower model.seq_len, train.micro_batches or train.micro_batch_size"
            : "lower train.eval_batches or model.seq_len, or give the validation split more tokens");
}

std::int64_t DataLoader::window_of(std::int64_t slot) const {
  const std::int64_t epoch = slot / m_windows;
  const std::int64_t within = slot % m_windows;
  if (!m_shuffle) return within;
  const std::uint64_t key =
      rng::mix64(rng::key(m_seed, "atlas.data.order") ^ static_cast<std::uint64_t>(epoch));
  return permute(within, m_windows, key);
}

std::int64_t DataLoader::sample_window(int micro, int b) const {
  ATLAS_ASSERT(micro >= 0 && micro < m_shape.micro_batches && b >= 0 &&
                   b < m_shape.micro_batch_size,
               "sample (micro " << micro << ", b " << b << ") outside the loader shape");
  const std::int64_t slot =
      m_consumed +
      (static_cast<std::int64_t>(m_shape.dp_rank) * m_shape.micro_batches + micro) *
          m_shape.micro_batch_size +
      b;
  return window_of(slot);
}

void DataLoader::fill(int micro, std::int32_t* tokens, std::int32_t* targets) const {
  const auto t = static_cast<std::size_t>(m_shape.seq_len);
  for (int b = 0; b < m_shape.micro_batch_size; ++b) {
    const auto start = static_cast<std::size_t>(sample_window(micro, b)) * t;
    const std::size_t out = static_cast<std::size_t>(b) * t;
    if (m_shards) {
      const auto s = static_cast<std::int64_t>(start);
      const auto n = static_cast<std::int64_t>(t);
      m_shards->copy(s, n, tokens + out);
      m_shards->copy(s + 1, n, targets + out);
      continue;
    }
    std::copy_n(m_stream.begin() + static_cast<std::ptrdiff_t>(start), t, tokens + out);
    std::copy_n(m_stream.begin() + static_cast<std::ptrdiff_t>(start) + 1, t, targets + out);
  }
}

DataPosition DataLoader::position() const { return DataPosition{m_seed, m_consumed, m_windows, stream_crc()}; }

std::uint32_t DataLoader::stream_crc() const {
  static_assert(std::endian::native == std::endian::little, "the CRC is defined over little-endian ids");
  if (m_stream_crc) return *m_stream_crc;
  // The shards hold uint16 ids, widened as ShardSet::open read them (one pass at start-up), so
  // shards and a text corpus of the same tokens give the same CRC.
  const std::uint32_t crc = m_shards ? m_shards->stream_crc() : crc32c(m_stream.data(), m_stream.size_bytes());
  m_stream_crc = crc;
  return crc;
}

void DataLoader::restore(const DataPosition& pos) {
  ProblemList problems;
  if (pos.seed != m_seed) {
    problems.add(fmt::format("the saved data position was drawn with run.seed = {}, this run "
                             "uses {}\n  hint: resume with the original run.seed",
                             pos.seed, m_seed));
  }
  if (pos.epoch_samples != m_windows) {
    problems.add(fmt::format("the saved data position has {} samples per epoch, this run {}\n"
                             "  hint: the corpus (or shards), data.val_fraction or model.seq_len changed "
                             "since the checkpoint",
                             pos.epoch_samples, m_windows));
  }
  if (pos.epoch_samples == m_windows && pos.stream_crc && *pos.stream_crc != stream_crc()) {
    problems.add(fmt::format("the saved data position was taken over other tokens: the {} split's token stream "
                             "had CRC32C {:#010x}, this run's ({}) has {:#010x}\n"
                             "  hint: the data files, their order or the tokenizer changed since the checkpoint; "
                             "resume with the same data (the deck's data.* keys and data.tokenizer)",
                             m_split == Split::Val ? "validation" : "training", *pos.stream_crc, m_origin,
                             stream_crc()));
  }
  if (pos.samples_consumed < 0) {
    problems.add(fmt::format("the saved data position is negative ({})", pos.samples_consumed));
  }
  problems.throw_if_any();
  m_consumed = pos.samples_consumed;
}

double unigram_entropy(std::span<const std::int32_t> tokens, int vocab) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(vocab), 0);
  for (const std::int32_t id : tokens) {
    ATLAS_ASSERT(id >= 0 && id < vocab, "token " << id << " outside [0, " << vocab << ")");
    ++counts[static_cast<std::size_t>(id)];
  }
  return entropy_of_counts(counts, static_cast<double>(tokens.size()));
}

double entropy_of_counts(std::span<const std::int64_t> counts, double n) {
  double h = 0.0;
  for (const std::int64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace atlas::model
