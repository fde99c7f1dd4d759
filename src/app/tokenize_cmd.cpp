// SPDX-License-Identifier: MIT
// `atlas tokenize TEXT... --out DIR [--tokenizer byte|gpt2] [--tokenizer-dir DIR]
// [--val-fraction F] [--shard-tokens N]`: text files (or directories of .txt files) to llm.c token
// shards DIR/train_NNNNNN.bin and DIR/val_NNNNNN.bin, for data.format = shards. Wiring only: the
// encoding and the format are model/shards.cpp.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"
#include "atlas/model/shards.hpp"

namespace atlas::app {

int cmd_tokenize(Context& ctx) {
  if (ctx.env.world_rank() != 0) return 0;
  const Args args = parse_args(ctx.args, {"out", "tokenizer", "tokenizer-dir", "val-fraction", "shard-tokens"}, {},
                               {{"out", "DIR: where train_*.bin and val_*.bin go"},
                                {"tokenizer", "byte|gpt2: how text becomes ids (byte)"},
                                {"tokenizer-dir", "DIR: GPT-2's encoder.json and vocab.bpe (data/gpt2)"},
                                {"val-fraction", "F: the tail of the text held out for validation (0.05)"},
                                {"shard-tokens", "N: tokens per shard file (100000000)"}});
  // A word with '=' is an input when it names a file or directory (a file name may hold one);
  // otherwise it is a deck key, which tokenize does not take: its settings are options.
  std::vector<std::string> inputs = args.positional;
  for (const std::string& word : args.overrides) {
    std::error_code ec;
    if (!std::filesystem::exists(word, ec))
      throw UsageError(fmt::format("atlas tokenize takes no deck keys ('{}' is neither a key it reads nor an input "
                                   "file): its settings are the options --tokenizer, --tokenizer-dir, "
                                   "--val-fraction and --shard-tokens",
                                   word));
    inputs.push_back(word);
  }
  if (inputs.empty())
    throw UsageError("atlas tokenize needs text files or directories: atlas tokenize TEXT... --out DIR");
  if (!args.flag("out") || args.option("out").empty())
    throw UsageError("atlas tokenize needs --out DIR (where the shards go)");

  model::TokenizeJob job;
  job.inputs = inputs;
  job.out_dir = args.option("out");
  const std::string kind = args.option("tokenizer", "byte");
  if (kind == "gpt2") {
    auto bpe = std::make_shared<model::Gpt2Tokenizer>(args.option("tokenizer-dir", "data/gpt2"), "--tokenizer-dir");
    job.encode = [bpe](std::string_view text) { return bpe->encode(text); };
    job.cut = [](std::string_view text, std::size_t from) { return model::gpt2_last_cut(text, from); };
  } else if (kind != "byte") {
    throw UsageError("--tokenizer must be byte or gpt2, not '" + kind + "'");
  }
  const std::string vf = args.option("val-fraction", "0.05");
  const auto val_fraction = units::parse_double(vf);
  if (!val_fraction)
    throw UsageError(fmt::format("--val-fraction expects a number in [{}, {}], got '{}'", deck::limits::kMinValFraction,
                                 deck::limits::kMaxValFraction, vf));
  job.val_fraction = *val_fraction;
  job.shard_tokens = args.int_option("shard-tokens", 100'000'000, 1, std::numeric_limits<int>::max());

  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  job.progress = [&](std::int64_t done, std::int64_t all, std::int64_t tokens) {
    const double s = seconds();
    fmt::print(stderr, "tokenize: {:.1f} of {:.1f} MiB, {} tokens, {:.3g} tokens/s\n",
               static_cast<double>(done) / (1 << 20), static_cast<double>(all) / (1 << 20), tokens,
               s > 0 ? static_cast<double>(tokens) / s : 0.0);
  };
  const model::TokenizeResult r = model::tokenize_to_shards(job);
  const double s = seconds();
  const std::int64_t tokens = r.train_tokens + r.val_tokens;
  fmt::print("tokenized {} file(s), {} bytes, with the {} tokenizer: {} tokens in {:.2f} s "
             "({:.3g} tokens/s, {:.3g} bytes/token)\n",
             r.files, r.bytes, kind, tokens, s, s > 0 ? static_cast<double>(tokens) / s : 0.0,
             tokens > 0 ? static_cast<double>(r.bytes) / static_cast<double>(tokens) : 0.0);
  fmt::print("  train: {} tokens in {} shard(s) {}/train_*.bin\n", r.train_tokens, r.train_shards.size(),
             job.out_dir);
  fmt::print("  val:   {} tokens in {} shard(s) {}/val_*.bin (val fraction {})\n", r.val_tokens,
             r.val_shards.size(), job.out_dir, job.val_fraction);
  fmt::print("  deck:  data.format = shards  data.train_shards = {}/train_*.bin  data.val_shards = "
             "{}/val_*.bin{}\n",
             job.out_dir, job.out_dir, kind == "gpt2" ? "  data.tokenizer = gpt2  model.vocab = 50257" : "");
  for (const auto& dir : r.removed_staging)
    fmt::print("  note:  removed {}, the staging directory of an earlier tokenize that was killed\n", dir);
  // A deck's shard lists split at spaces and expand * ? [ as globs: a path with them cannot be pasted.
  if (job.out_dir.find_first_of(" \t*?[") != std::string::npos)
    fmt::print("  note:  {} holds a space or a glob character (* ? [): data.train_shards splits at spaces and "
               "expands those, so move the shards to a path without them\n",
               job.out_dir);
  return 0;
}

}  // namespace atlas::app
