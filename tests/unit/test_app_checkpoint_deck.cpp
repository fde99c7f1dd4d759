// SPDX-License-Identifier: MIT
// app::checkpoint_deck (atlas sample, atlas export): a checkpoint's stored deck parses to its
// Config; one that does not parse (another atlas version's keys) gives no Config and a WARNING
// naming the file, the parser's problem and what the command takes instead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "atlas/app/commands.hpp"

namespace atlas::app {
namespace {

TEST(CheckpointDeck, AStoredDeckParses) {
  io::CheckpointContents c;
  c.meta.deck =
      "cluster.dcs = a\ncluster.gpus_per_dc = 1\nparallel.stages_per_dc = 1\nmodel.layers = 3\n"
      "data.tokenizer = gpt2\nmodel.vocab = 50257\n";
  ::testing::internal::CaptureStderr();
  const std::optional<Config> cfg = checkpoint_deck("x.h5", c, "anything");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_TRUE(cfg.has_value());
  EXPECT_EQ(cfg->model.layers, 3);
  EXPECT_EQ(cfg->data.tokenizer, TokenizerKind::Gpt2);
}

TEST(CheckpointDeck, ADeckThatDoesNotParseWarnsAndSaysWhatIsAssumed) {
  io::CheckpointContents c;
  c.meta.deck = "model.layers = 3\nmodel.flux_capacitor = 1\n";
  ::testing::internal::CaptureStderr();
  const std::optional<Config> cfg =
      checkpoint_deck("runs/x/ckpt/step-000007.h5", c, "the byte tokenizer (from model.vocab = 256)");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cfg.has_value());
  EXPECT_THAT(err, ::testing::HasSubstr("WARNING: the deck stored in 'runs/x/ckpt/step-000007.h5' does not parse"));
  EXPECT_THAT(err, ::testing::HasSubstr("model.flux_capacitor"));
  EXPECT_THAT(err, ::testing::HasSubstr("taking the byte tokenizer (from model.vocab = 256) instead"));
}

}  // namespace
}  // namespace atlas::app
