// SPDX-License-Identifier: MIT
// Token-shard datasets end to end (#26): the Brown corpus written as shards by atlas tokenize's
// code (GPT-2 BPE, several shards) holds exactly the tokens the text loader makes; training from
// those shards gives bitwise the losses (train, validation, unigram entropy) of training on the
// text, under DP too; a resume from a checkpoint continues the shards' data order exactly.
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>

#include "atlas/model/gpt2_tokenizer.hpp"
#include "atlas/model/shards.hpp"
#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;

std::string gpt2_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return (std::filesystem::path(env ? env : ATLAS_SOURCE_DIR) / "data/gpt2").string();
}

struct RunResult {
  std::vector<double> losses;
  double val_loss = 0.0;
  double unigram = 0.0;
  int first_step = 0;
};

RunResult run(const Config& cfg, const mpi::Comm& world, int until, int save_after = -1) {
  testing::TrainerRig rig(cfg, world);
  Trainer& trainer = rig.trainer;
  const topo::Communicators& comms = rig.comms;
  RunResult out;
  out.first_step = restore_checkpoint(trainer, cfg, comms).step;
  for (int s = out.first_step; s < until; ++s) {
    out.losses.push_back(trainer.train_step(s).loss);
    if (s + 1 == save_after) save_checkpoint(trainer, cfg, comms, s + 1);
  }
  out.val_loss = trainer.evaluate();
  out.unigram = trainer.validation_unigram_entropy();
  return out;
}

/// Brown as GPT-2 shards (rank 0 writes, once per process), small shards so windows cross files.
const std::string& brown_shards(const mpi::Comm& world) {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = testing::shared_temp_dir(world, "atlas-shards");
  if (world.rank() == 0) {
    auto bpe = std::make_shared<model::Gpt2Tokenizer>(gpt2_dir());
    model::TokenizeJob job;
    job.inputs = {testing::corpus_dir()};
    job.out_dir = dir;
    job.encode = [bpe](std::string_view t) { return bpe->encode(t); };
    job.val_fraction = 0.05;
    job.shard_tokens = 250'000;
    const model::TokenizeResult r = model::tokenize_to_shards(job);
    EXPECT_GT(r.train_shards.size(), 2u);
    EXPECT_GE(r.val_shards.size(), 1u);
  }
  world.barrier();
  return dir;
}

std::vector<std::string> gpt2_keys() {
  return {"data.tokenizer=gpt2", "data.tokenizer_dir=" + gpt2_dir(), "model.vocab=50257"};
}

std::vector<std::string> shard_keys(const std::string& dir) {
  auto k = gpt2_keys();
  k.push_back("data.format=shards");
  k.push_back("data.train_shards=" + dir + "/train_*.bin");
  k.push_back("data.val_shards=" + dir + "/val_*.bin");
  return k;
}

TEST(TrainShards, TokenizeWritesExactlyTheTextLoadersTokens) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string dir = brown_shards(world);
  if (world.rank() != 0) return;
  model::Gpt2Tokenizer bpe(gpt2_dir());
  const model::Corpus corpus = model::Corpus::load(
      testing::corpus_dir(), [&](std::string_view t) { return bpe.encode(t); });
  for (const auto split : {model::Split::Train, model::Split::Val}) {
    const bool train = split == model::Split::Train;
    const std::string key = train ? "data.train_shards" : "data.val_shards";
    const model::ShardSet set = model::ShardSet::open(
        model::expand_shard_globs({dir + (train ? "/train_*.bin" : "/val_*.bin")}, key), 50257, key);
    const auto want = corpus.split(split, 0.05);
    ASSERT_EQ(set.size(), static_cast<std::int64_t>(want.size()));
    std::vector<std::int32_t> got(want.size());
    set.copy(0, set.size(), got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << key;
  }
}

TEST(TrainShards, ShardsTrainBitwiseLikeTheText) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() > 2) GTEST_SKIP() << "runs at np 1 and 2";
  const std::string dir = brown_shards(world);
  const int dp = world.size();
  const RunResult text = run(make_cfg(1, dp, {1}, 2, gpt2_keys()), world, 3);
  const RunResult shards = run(make_cfg(1, dp, {1}, 2, shard_keys(dir)), world, 3);
  if (world.rank() == 0) {
    ASSERT_EQ(text.losses.size(), shards.losses.size());
    for (std::size_t s = 0; s < text.losses.size(); ++s) EXPECT_EQ(text.losses[s], shards.losses[s]) << "step " << s;
    EXPECT_EQ(text.val_loss, shards.val_loss);
    EXPECT_EQ(text.unigram, shards.unigram);
  }
}

TEST(TrainShards, ResumeContinuesTheDataOrderExactly) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() > 2) GTEST_SKIP() << "runs at np 1 and 2";
  const std::string dir = brown_shards(world);
  const int dp = world.size();
  auto keys = [&](const std::string& ckpt, bool resume) {
    auto k = shard_keys(dir);
    k.push_back("ckpt.dir=" + dir + "/" + ckpt);
    if (resume) k.push_back("run.resume=latest");
    return k;
  };
  const RunResult full = run(make_cfg(1, dp, {1}, 2, keys("a", false)), world, 4);
  (void)run(make_cfg(1, dp, {1}, 2, keys("b", false)), world, 2, /*save_after=*/2);
  const RunResult resumed = run(make_cfg(1, dp, {1}, 2, keys("b", true)), world, 4);
  if (world.rank() == 0) {
    EXPECT_EQ(resumed.first_step, 2);
    ASSERT_EQ(resumed.losses.size(), 2u);
    EXPECT_EQ(resumed.losses[0], full.losses[2]);  // bitwise
    EXPECT_EQ(resumed.losses[1], full.losses[3]);
  }
  // The same checkpoint over shards of as many tokens but another one (one id changed): refused
  // on every rank, naming the checkpoint and the stream's CRC, where the window count cannot tell.
  const std::string other = dir + "/other";
  if (world.rank() == 0) {
    std::filesystem::create_directories(other);
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file()) std::filesystem::copy_file(e.path(), other + "/" + e.path().filename().string(),
                                                          std::filesystem::copy_options::overwrite_existing);
    std::fstream f(other + "/train_000000.bin", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.is_open());
    std::uint16_t id = 0;  // token 10, after the 256-int32 header: another id below the vocabulary
    f.seekg(1024 + 2 * 10);
    f.read(reinterpret_cast<char*>(&id), sizeof id);
    id = id == 7 ? 8 : 7;
    f.seekp(1024 + 2 * 10);
    f.write(reinterpret_cast<const char*>(&id), sizeof id);
  }
  world.barrier();
  auto other_keys = keys("b", true);
  other_keys.push_back("data.train_shards=" + other + "/train_*.bin");
  other_keys.push_back("data.val_shards=" + other + "/val_*.bin");
  try {
    (void)run(make_cfg(1, dp, {1}, 2, other_keys), world, 4);
    ADD_FAILURE() << "a resume over other tokens was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("taken over other tokens"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("resuming from " + dir + "/b/"));
  }
}

}  // namespace
}  // namespace atlas::runtime
