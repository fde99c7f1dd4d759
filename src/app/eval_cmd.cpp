// SPDX-License-Identifier: MIT
// `atlas eval CKPT [data.*=... train.eval_batches=N train.micro_batch_size=B] [--batches N]
// [--device host|cuda] [--json FILE]`: a checkpoint's loss and perplexity on the validation split
// of its own data (the checkpoint's deck) or of other data (data.* overrides: a text corpus or
// token shards). By default the batches of the run's own evaluation (train.eval_batches for each
// of its DP replicas) at the run's device.precision, so the loss is the one the run logged at that
// step (exactly for a host run with tp = 1; to rounding otherwise). Wiring only: the model
// is model::StageModel's forward pass, the data model/dataset.hpp's loaders. One process.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/app/commands.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/json.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/model/dataset.hpp"

namespace atlas::app {

namespace {

/// Deck keys atlas eval takes on its command line: where the data is and how it is batched; the
/// model is the checkpoint's.
bool eval_key(const std::string& word) {
  const std::string key = word.substr(0, word.find('='));
  return key.rfind("data.", 0) == 0 || key == "train.eval_batches" || key == "train.micro_batch_size";
}

}  // namespace

int cmd_eval(Context& ctx) {
  require_one_process(ctx, "eval");
  const Args a = parse_args(ctx.args, {"batches", "device", "json"}, {},
                            {{"batches", "N: validation batches (train.eval_batches x the run's DP replicas)"},
                             {"device", "host|cuda: where the model runs (host)"},
                             {"json", "FILE: the figures as JSON"}});
  if (a.positional.size() != 1)
    throw UsageError("atlas eval needs one checkpoint file: atlas eval CKPT [data.KEY=VALUE ...] [--batches N]");
  for (const std::string& o : a.overrides)
    if (!eval_key(o))
      throw UsageError("atlas eval takes data.* keys, train.eval_batches and train.micro_batch_size, not '" + o +
                       "'\n  hint: the model and its sizes are the checkpoint's; point data.* at other data to "
                       "evaluate on it");
  DeviceCfg dev = device_option(a, "eval");
  const std::string json_path = a.option("json");
  if (!json_path.empty()) check_output_file("atlas eval", "--json", json_path);
  const std::string& ckpt = a.positional[0];

  const io::CheckpointContents contents = io::inspect_checkpoint(ckpt);
  // The checkpoint's own deck with the data overrides: its data.*, batch size and precision.
  Config cfg = deck::parse(ckpt + ":/deck", contents.meta.deck, a.overrides);
  const io::ModelShape& m = contents.meta.model;
  cfg.model.vocab = static_cast<int>(m.vocab);
  cfg.model.seq_len = static_cast<int>(m.seq_len);
  dev.precision = cfg.device.precision;  // the run's matmul numbers (auto: as this backend resolves it)
  const bool shards = cfg.data.format == DataFormat::Shards;
  if (shards && cfg.data.val_shards.empty())
    throw ConfigError("atlas eval: data.format = shards needs data.val_shards (glob patterns of token shards)\n  hint: "
                      "data.val_shards='DIR/val_*.bin' (shards written by atlas tokenize or llm.c)");
  if (!shards && !cfg.data.val_shards.empty())
    throw ConfigError("atlas eval: data.val_shards is set but data.format = text reads data.corpus_dir\n  hint: add "
                      "data.format=shards to evaluate on the shards");
  if (contents.meta.layout.dp_size < 1)
    throw ConfigError(fmt::format("'{}': its layout says dp_size = {}; a checkpoint written by atlas has at least 1\n"
                                  "  hint: give --batches N",
                                  ckpt, contents.meta.layout.dp_size));
  const auto dp = static_cast<int>(contents.meta.layout.dp_size);
  const bool asked = a.flag("batches");
  const int batches = asked ? a.int_option("batches", 1, 1, 1 << 24) : cfg.train.eval_batches * dp;
  const int b = cfg.train.micro_batch_size;
  const int t = cfg.model.seq_len;
  // The run's own validation batches: nothing overridden, and a run (its loader's position) wrote it.
  const bool runs_own = !asked && a.overrides.empty() && contents.meta.state.count("loader") > 0;

  try {
    model::check_vocab_fits_tokenizer(cfg);
  } catch (const ConfigError&) {
    throw ConfigError(fmt::format(
        "'{}': the checkpoint's model.vocab = {} cannot read data.tokenizer = {}'s ids\n  hint: evaluate it on data "
        "of the tokenizer it was trained with (data.tokenizer = {})",
        ckpt, m.vocab, cfg.data.tokenizer == TokenizerKind::Gpt2 ? "gpt2" : "byte",
        m.vocab == 50257 ? "gpt2" : "byte"));
  }
  const model::LoaderShape vshape{t, b, batches, 1, 0};
  model::DataSplits data;
  try {
    data = model::open_data(cfg, std::nullopt, vshape);
  } catch (const ConfigError& e) {
    // The loaders' hints are a training deck's: here model.seq_len is the checkpoint's, and the
    // data settings come from its deck unless given on this command line.
    std::vector<std::string> problems;
    for (std::string p : e.problems()) {
      if (const auto at = p.find("  hint: lower model.seq_len or "); at != std::string::npos)
        p.replace(at, std::string("  hint: lower model.seq_len or ").size(),
                  "  hint: (model.seq_len is the checkpoint's) ");
      constexpr std::string_view kLarger = "  hint: the shard was written by a tokenizer with a larger vocabulary";
      if (const auto at = p.find(kLarger); at != std::string::npos)
        p = p.substr(0, at) + fmt::format("{} than this checkpoint's {} ids: evaluate it on shards written with "
                                          "`atlas tokenize --tokenizer {}`",
                                          kLarger, m.vocab, m.vocab == 50257 ? "gpt2" : "byte");
      problems.push_back(p + "\n  note: atlas eval '" + ckpt +
                         "' reads data.* from the checkpoint's deck unless given on the command line; relative "
                         "paths are from the current directory");
    }
    throw ConfigError(problems);
  }
  const std::int64_t samples = static_cast<std::int64_t>(batches) * b;
  if (data.val->epoch_samples() < samples)
    fmt::print(stderr,
               "WARNING: the validation split holds {} window(s) of {} tokens, but {} batch(es) of {} take {} samples: "
               "windows count more than once in the loss\n  hint: lower --batches (or train.eval_batches), or give "
               "the split more tokens\n",
               data.val->epoch_samples(), t + 1, batches, b, samples);
  const std::unique_ptr<device::Backend> backend = device::make_backend(dev);
  const std::unique_ptr<model::StageModel> net = load_whole_model(ckpt, contents, cfg.model, b, *backend);

  const std::string data_name =
      cfg.data.format == DataFormat::Shards
          ? "shards " + fmt::format("{}", fmt::join(cfg.data.val_shards, " "))
          : fmt::format("the last {} of {}", cfg.data.val_fraction, cfg.data.corpus_dir);
  fmt::print("# atlas eval: {} (step {}: {} layers, hidden {}, {} heads, context {}, vocab {})\n", ckpt,
             contents.meta.step, m.layers, m.hidden, m.heads, m.seq_len, m.vocab);
  const char* tokenizer = cfg.data.tokenizer == TokenizerKind::Gpt2 ? "gpt2" : "byte";
  std::string why;
  if (!asked)
    why = fmt::format(" (train.eval_batches {} x {} DP replica(s){})", cfg.train.eval_batches, dp,
                      runs_own ? ": the run's own validation batches" : "");
  fmt::print("# validation split: {} ({} tokenizer); {} batch{} of {} x {} tokens{}\n", data_name, tokenizer,
             batches, batches == 1 ? "" : "es", b, t, why);
  std::fflush(stdout);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b) * static_cast<std::size_t>(t));
  std::vector<std::int32_t> targets(tokens.size());
  double sum = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < batches; ++i) {
    data.val->fill(i, tokens.data(), targets.data());
    net->forward(i, tokens.data(), targets.data(), nullptr, nullptr);
    const double l = net->micro_loss(i);
    net->release(i);
    if (!std::isfinite(l))
      throw CollectiveError(ExitCode::Diverged,
                            {fmt::format("'{}' (step {}): the loss of validation batch {} is {} (not finite): the "
                                         "weights give no distribution over the next token\n  hint: the checkpoint "
                                         "holds non-finite values (a diverged run); evaluate an earlier checkpoint",
                                         ckpt, contents.meta.step, i, l)});
    sum += l;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double loss = sum / batches;
  const std::int64_t n = static_cast<std::int64_t>(batches) * b * t;
  const double floor = data.val_unigram_entropy(cfg.model.vocab, cfg.data.val_fraction);
  fmt::print("loss {:.6f} nats/token, perplexity {:.4g} (unigram entropy of the split {:.4f}); {} tokens in {:.2f} s "
             "({:.0f} tokens/s on {})\n",
             loss, std::exp(loss), floor, n, secs, secs > 0 ? static_cast<double>(n) / secs : 0.0,
             dev.backend == Backend::Cuda ? "cuda" : "host");
  if (!json_path.empty())
    write_file_whole(json_path,
                     fmt::format("{{\"checkpoint\": \"{}\", \"step\": {}, \"split\": \"val\", \"data\": \"{}\", "
                                 "\"tokenizer\": \"{}\", \"batches\": {}, \"micro_batch_size\": {}, \"seq_len\": {}, "
                                 "\"tokens\": {}, \"loss\": {}, \"perplexity\": {}, \"unigram_entropy\": {}}}\n",
                                 json::escape(ckpt), contents.meta.step, json::escape(data_name), tokenizer, batches, b,
                                 t, n, json::number(loss, 9), json::number(std::exp(loss), 6), json::number(floor, 9)));
  return 0;
}

}  // namespace atlas::app
