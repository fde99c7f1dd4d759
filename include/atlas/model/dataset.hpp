// SPDX-License-Identifier: MIT
// A deck's data (data.*) opened: the training and validation loaders over the text corpus
// (tokenized with data.tokenizer) or over token shards (data.format = shards), and the
// validation split's unigram entropy. The one place that turns data.* into loaders, for the
// trainer and for atlas eval. Not the loaders themselves (data.hpp) nor the shard format
// (shards.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "atlas/deck/config.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/shards.hpp"

namespace atlas::model {

/// The loaders of one rank (or one process) and what keeps their tokens alive.
struct DataSplits {
  std::unique_ptr<DataLoader> train;  ///< null when no train shape was asked for
  std::unique_ptr<DataLoader> val;
  Corpus corpus;                                ///< data.format = text: the whole corpus
  std::shared_ptr<const ShardSet> val_shards;  ///< data.format = shards: the validation stream

  /// The validation split's unigram entropy in nats per token (the loss floor of a model that
  /// ignores context); 0 without a validation loader.
  [[nodiscard]] double val_unigram_entropy(int vocab, double val_fraction) const;
};

/// Throws ConfigError when model.vocab cannot hold data.tokenizer's ids (gpt2: exactly 50257;
/// byte: at least 256).
void check_vocab_fits_tokenizer(const Config& cfg);

/// Opens `cfg.data` for a model of `cfg.model.vocab` ids: the train loader of shape `train`
/// (shuffled; none when std::nullopt, and then data.train_shards is not read) and the
/// validation loader of shape `val` (in order), both
/// seeded by run.seed. Throws ConfigError when model.vocab does not fit data.tokenizer
/// (check_vocab_fits_tokenizer), a corpus
/// directory, tokenizer file or shard is missing or bad, or a split is shorter than one sample.
[[nodiscard]] DataSplits open_data(const Config& cfg, const std::optional<LoaderShape>& train, const LoaderShape& val);

}  // namespace atlas::model
