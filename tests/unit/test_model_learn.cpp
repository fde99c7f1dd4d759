// SPDX-License-Identifier: MIT
// It learns: a tiny GPT trained in-process on the real Brown corpus (data/brown, installed by
// scripts/get-data.sh through the ctest fixture) must bring its validation loss clearly below the
// unigram entropy of the validation text, i.e. it must have learnt to use context. Label: slow.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "atlas/device/host_backend.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"

namespace atlas::model {
namespace {

double eval_loss(StageModel& model, DataLoader& val) {
  const std::size_t n = model.tokens_per_micro();
  std::vector<std::int32_t> tok(n), tgt(n);
  double sum = 0.0;
  val.rewind();
  const int micros = val.shape().micro_batches;
  for (int m = 0; m < micros; ++m) {
    val.fill(m, tok.data(), tgt.data());
    model.forward(1000 + m, tok.data(), tgt.data(), nullptr, nullptr);
    sum += model.micro_loss(1000 + m);
    model.release(1000 + m);
  }
  return sum / micros;
}

TEST(Learning, TinyModelGoesClearlyBelowTheUnigramEntropyOfBrown) {
  const auto t0 = std::chrono::steady_clock::now();
  const Corpus corpus = Corpus::load(std::string(ATLAS_SOURCE_DIR) + "/data/brown");
  ASSERT_EQ(corpus.file_count(), 500);
  const double val_fraction = 0.05;
  const double h_val = unigram_entropy(corpus.split(Split::Val, val_fraction), 256);
  const double h_train = unigram_entropy(corpus.split(Split::Train, val_fraction), 256);
  ASSERT_GT(h_val, 2.5) << "English bytes carry about 3 nats of unigram entropy";

  ModelCfg cfg;
  cfg.layers = 2;
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.seq_len = 64;
  cfg.vocab = 256;
  cfg.init_std = 0.02;
  TrainCfg train;
  train.micro_batch_size = 8;
  train.micro_batches = 2;
  train.lr = 3e-3;
  train.min_lr = 3e-4;
  train.warmup_steps = 20;
  train.weight_decay = 0.1;
  train.grad_clip = 1.0;
  const int steps = 500;

  // One thread: the suite runs tests in parallel on shared cores, where OpenMP fork/join
  // regions cost more than they gain for a model this small.
  auto backend = device::make_host_backend(1);
  StageModel model(cfg, train.micro_batch_size, StageSpec{}, *backend, nullptr, 1234);
  model.set_loss_scale(1.0F / static_cast<float>(train.micro_batches));
  DataLoader loader(corpus, Split::Train, val_fraction,
                    LoaderShape{.seq_len = cfg.seq_len, .micro_batch_size = train.micro_batch_size,
                                .micro_batches = train.micro_batches},
                    1234, true);
  DataLoader val(corpus, Split::Val, val_fraction,
                 LoaderShape{.seq_len = cfg.seq_len, .micro_batch_size = 8, .micro_batches = 16},
                 99, true);
  AdamW opt(train);

  const double initial = eval_loss(model, val);
  const std::size_t n = model.tokens_per_micro();
  std::vector<std::int32_t> tok(n), tgt(n);
  double train_loss = 0.0;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    train_loss = 0.0;
    for (int m = 0; m < train.micro_batches; ++m) {
      loader.fill(m, tok.data(), tgt.data());
      model.forward(m, tok.data(), tgt.data(), nullptr, nullptr);
      model.backward(m, nullptr, nullptr);
      train_loss += model.micro_loss(m) / train.micro_batches;
    }
    loader.advance();
    const double norm = std::sqrt(model.local_grad_sq_norm());
    ASSERT_TRUE(std::isfinite(norm)) << "step " << step;
    opt.step(model.params(), *backend, lr_at(step, train, steps),
             clip_scale(norm, train.grad_clip));
  }
  const double final_val = eval_loss(model, val);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("learning: %d steps of %zu tokens in %.1f s; unigram entropy val %.3f / train %.3f "
              "nats; val loss %.3f -> %.3f; last train loss %.3f\n",
              steps, n * train.micro_batches, seconds, h_val, h_train, initial, final_val,
              train_loss);
  EXPECT_NEAR(initial, std::log(256.0), 0.1) << "an untrained model is uniform over 256 bytes";
  EXPECT_LT(final_val, h_val - 0.5) << "the model must use context to beat the unigram entropy";
}

}  // namespace
}  // namespace atlas::model
