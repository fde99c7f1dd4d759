// SPDX-License-Identifier: MIT
// A deck's data.* opened as loaders (see dataset.hpp).
#include "atlas/model/dataset.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"

namespace atlas::model {

double DataSplits::val_unigram_entropy(int vocab, double val_fraction) const {
  if (!val) return 0.0;  // no data on this rank
  if (val_shards) return val_shards->unigram_entropy(vocab);
  return unigram_entropy(corpus.split(Split::Val, val_fraction), vocab);
}

void check_vocab_fits_tokenizer(const Config& cfg) {
  const bool gpt2 = cfg.data.tokenizer == TokenizerKind::Gpt2;
  if (gpt2 && cfg.model.vocab != Gpt2Tokenizer::kVocab)
    throw ConfigError("model.vocab = " + std::to_string(cfg.model.vocab) +
                      " does not match data.tokenizer = gpt2's 50257 tokens\n  hint: set model.vocab = 50257");
  if (!gpt2 && cfg.model.vocab < ByteTokenizer::kVocab)
    throw ConfigError("model.vocab = " + std::to_string(cfg.model.vocab) +
                      " is smaller than the byte tokenizer's 256 symbols\n  hint: set model.vocab = 256");
}

DataSplits open_data(const Config& cfg, const std::optional<LoaderShape>& train, const LoaderShape& val) {
  check_vocab_fits_tokenizer(cfg);
  const bool gpt2 = cfg.data.tokenizer == TokenizerKind::Gpt2;
  DataSplits d;
  const auto seed = static_cast<std::uint64_t>(cfg.run.seed);
  if (cfg.data.format == DataFormat::Shards) {
    // Token shards (atlas tokenize or llm.c): memory-mapped, checked against model.vocab.
    // (Without a train shape, as atlas eval's, the training shards are not looked at.)
    const std::vector<std::string> val_files = expand_shard_globs(cfg.data.val_shards, "data.val_shards");
    const std::vector<std::string> train_files =
        train ? expand_shard_globs(cfg.data.train_shards, "data.train_shards") : std::vector<std::string>{};
    check_shard_lists(train_files, val_files);
    if (train) {
      const ShardSet set = ShardSet::open(train_files, cfg.model.vocab, "data.train_shards");
      d.train = std::make_unique<DataLoader>(set, Split::Train, *train, seed, true);
    }
    d.val_shards = std::make_shared<const ShardSet>(ShardSet::open(val_files, cfg.model.vocab, "data.val_shards"));
    d.val = std::make_unique<DataLoader>(*d.val_shards, Split::Val, val, seed, false);
    return d;
  }
  Corpus::Encoder encode;
  if (gpt2) {
    auto bpe = std::make_shared<Gpt2Tokenizer>(cfg.data.tokenizer_dir);
    encode = [bpe](std::string_view text) { return bpe->encode(text); };
  }
  d.corpus = Corpus::load(cfg.data.corpus_dir, encode);
  if (train) d.train = std::make_unique<DataLoader>(d.corpus, Split::Train, cfg.data.val_fraction, *train, seed, true);
  d.val = std::make_unique<DataLoader>(d.corpus, Split::Val, cfg.data.val_fraction, val, seed, false);
  return d;
}

}  // namespace atlas::model
