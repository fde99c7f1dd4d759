// SPDX-License-Identifier: MIT
// `atlas sample CKPT [--prompt TEXT | --prompt-file FILE] [--tokens N] [--temperature T] [--top-k K]
// [--top-p P] [--seed S] [--samples N] [--tokenizer-dir DIR] [--device host|cuda] [--json FILE]`:
// text from a checkpoint, streamed to stdout. Wiring only: the forward pass with its KV cache is
// bubbletea/model.hpp's InferenceModel (the one BubbleTea serves with), the token choice
// model/sampling.hpp, the tokenizers model/. One process.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "atlas/app/commands.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/core/file.hpp"
#include "atlas/core/json.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"
#include "atlas/model/rng.hpp"
#include "atlas/model/sampling.hpp"

namespace atlas::app {

namespace {

/// The largest prompt file read (a prompt longer than any model's context is refused anyway).
constexpr std::uint64_t kMaxPromptBytes = 16 << 20;
/// Text to ids and back with the checkpoint's tokenizer. `vocab` = the ids the tokenizer makes
/// (256 for bytes): a model's ids beyond it (padding of model.vocab) are never drawn.
struct Tokenizer {
  std::unique_ptr<model::Gpt2Tokenizer> bpe;  ///< null: bytes
  int vocab = model::ByteTokenizer::kVocab;

  [[nodiscard]] std::vector<std::int32_t> encode(const std::string& text) const {
    return bpe ? bpe->encode(text) : model::ByteTokenizer::encode(text);
  }
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const {
    return bpe ? bpe->decode(ids) : model::ByteTokenizer::decode(ids);
  }
  [[nodiscard]] const char* name() const { return bpe ? "gpt2" : "byte"; }
};

double double_option(const Args& a, const std::string& name, double def) {
  if (!a.flag(name)) return def;
  const std::optional<double> v = units::parse_double(a.option(name));
  if (!v) throw UsageError(fmt::format("--{} expects a number, got '{}'", name, a.option(name)));
  return *v;
}

}  // namespace

int cmd_sample(Context& ctx) {
  require_one_process(ctx, "sample");
  const Args a = parse_args(ctx.args,
                            {"prompt", "prompt-file", "tokens", "temperature", "top-k", "top-p", "seed", "samples",
                             "tokenizer-dir", "device", "json"},
                            {"ignore-eot"},
                            {{"prompt", "TEXT: the text to continue (gpt2: empty starts at <|endoftext|>)"},
                             {"prompt-file", "FILE: the prompt from a file"},
                             {"tokens", "N: new tokens per sample (64)"},
                             {"temperature", "T: 0 = greedy (1)"},
                             {"top-k", "K: keep the K most likely tokens (0 = all)"},
                             {"top-p", "P: keep the fewest most likely tokens reaching P (1 = all)"},
                             {"seed", "S: the draws' seed (1)"},
                             {"samples", "N: samples drawn (1)"},
                             {"tokenizer-dir", "DIR: GPT-2's encoder.json and vocab.bpe (the checkpoint's)"},
                             {"device", "host|cuda: where the model runs (host)"},
                             {"json", "FILE: ids, settings, each token's logit and draw"},
                             {"ignore-eot", "go on past <|endoftext|> (gpt2)"}});
  if (!a.overrides.empty())
    throw UsageError("atlas sample takes no key=value overrides (got '" + a.overrides.front() +
                     "'): the checkpoint's own deck describes the model; the sampling settings are options");
  if (a.positional.size() != 1)
    throw UsageError("atlas sample needs one checkpoint file: atlas sample CKPT [--prompt TEXT] [--tokens N]");
  if (a.flag("prompt") && a.flag("prompt-file"))
    throw UsageError("atlas sample: give --prompt or --prompt-file, not both");
  model::SamplingParams sp;
  sp.temperature = double_option(a, "temperature", 1.0);
  sp.top_k = a.int_option("top-k", 0, 0, std::numeric_limits<int>::max());
  sp.top_p = double_option(a, "top-p", 1.0);
  try {
    model::check_sampling(sp, "atlas sample");
  } catch (const ConfigError& e) {
    std::string all;
    for (const std::string& p : e.problems()) all += (all.empty() ? "" : "\n") + p;
    throw UsageError(all);
  }
  const int max_new = a.int_option("tokens", 64, 1, 1 << 24);
  const int samples = a.int_option("samples", 1, 1, 1 << 20);
  const std::string seed_text = a.option("seed", "1");
  const std::optional<long long> seed = units::parse_int(seed_text);
  if (!seed || *seed < 0) throw UsageError("--seed expects an integer >= 0, got '" + seed_text + "'");
  const DeviceCfg dev = device_option(a, "sample");
  const std::string device_name = dev.backend == Backend::Cuda ? "cuda" : "host";
  const std::string json_path = a.option("json");
  if (!json_path.empty()) check_output_file("atlas sample", "--json", json_path);
  const std::string& ckpt = a.positional[0];

  // The model and its tokenizer, from the checkpoint and its own deck.
  const io::CheckpointContents contents = io::inspect_checkpoint(ckpt);
  const io::ModelShape& m = contents.meta.model;
  Tokenizer tok;
  std::string tokenizer_dir = "data/gpt2";
  bool gpt2 = m.vocab == model::Gpt2Tokenizer::kVocab;
  const std::optional<Config> deck_cfg = checkpoint_deck(
      ckpt, contents, fmt::format("the {} tokenizer (from model.vocab = {})", gpt2 ? "gpt2" : "byte", m.vocab));
  if (deck_cfg) {
    gpt2 = deck_cfg->data.tokenizer == TokenizerKind::Gpt2;
    if (!deck_cfg->data.tokenizer_dir.empty()) tokenizer_dir = deck_cfg->data.tokenizer_dir;
  }
  if (a.flag("tokenizer-dir")) tokenizer_dir = a.option("tokenizer-dir");
  if (gpt2) {
    tok.bpe = std::make_unique<model::Gpt2Tokenizer>(
        tokenizer_dir,
        a.flag("tokenizer-dir") ? "--tokenizer-dir" : "the checkpoint's data.tokenizer_dir (or --tokenizer-dir)");
    tok.vocab = model::Gpt2Tokenizer::kVocab;
  }
  if (!gpt2)
    for (const char* o : {"tokenizer-dir", "ignore-eot"})
      if (a.flag(o))
        fmt::print(stderr, "note: --{} is for a gpt2-tokenizer model; '{}' reads bytes, so it is ignored\n", o, ckpt);
  if (m.vocab < tok.vocab)
    throw ConfigError(fmt::format("'{}': model.vocab = {} is smaller than the {} tokenizer's {} ids\n  hint: this "
                                  "checkpoint was not trained with that tokenizer; it cannot be sampled as text",
                                  ckpt, m.vocab, tok.name(), tok.vocab));

  // The prompt.
  std::string prompt_text = a.option("prompt");
  if (a.flag("prompt-file")) prompt_text = deck::read_text_file(a.option("prompt-file"), kMaxPromptBytes, "prompt");
  std::vector<std::int32_t> prompt = tok.encode(prompt_text);
  if (prompt.empty()) {
    if (!gpt2)
      throw UsageError("atlas sample: the prompt is empty; a byte-tokenizer model has no start token\n  hint: give "
                       "--prompt TEXT (e.g. --prompt \"The \")");
    // GPT-2's convention: generation from nothing starts at <|endoftext|>.
    prompt.push_back(model::Gpt2Tokenizer::kEndOfText);
  }
  if (static_cast<std::int64_t>(prompt.size()) > m.seq_len)
    throw UsageError(fmt::format("atlas sample: the prompt is {} tokens, longer than the model's context "
                                 "(model.seq_len = {} in '{}')\n  hint: shorten the prompt to its last {} tokens or "
                                 "fewer",
                                 prompt.size(), m.seq_len, ckpt, m.seq_len));

  bubbletea::InferShape shape;
  shape.layers = static_cast<int>(m.layers);
  shape.hidden = static_cast<int>(m.hidden);
  shape.heads = static_cast<int>(m.heads);
  shape.context = static_cast<int>(m.seq_len);
  shape.vocab = static_cast<int>(m.vocab);
  const std::unique_ptr<device::Backend> backend = device::make_backend(dev);
  bubbletea::InferenceModel net(shape, bubbletea::LayerRange{0, shape.layers, true, true}, *backend, shape.context);
  bubbletea::load_weights(mpi::Comm::self(), ckpt, net, "atlas sample");

  fmt::print("# atlas sample: {} (step {}: {} layers, hidden {}, {} heads, context {}, vocab {}, {} tokenizer); "
             "temperature {}, top-k {}, top-p {}, seed {}\n",
             ckpt, contents.meta.step, m.layers, m.hidden, m.heads, m.seq_len, m.vocab, tok.name(), sp.temperature,
             sp.top_k, sp.top_p, *seed);
  std::fflush(stdout);
  bubbletea::GenerateOptions go;
  go.max_new = max_new;
  go.stop_token = gpt2 && !a.flag("ignore-eot") ? model::Gpt2Tokenizer::kEndOfText : -1;
  const std::string& prompt_shown = prompt_text;  // decode(encode(text)) == text for both tokenizers
  std::vector<std::vector<std::int32_t>> outs;
  std::vector<std::vector<float>> chosen_logits;  // the logit of each chosen token (--json)
  std::vector<std::vector<double>> draws;         // the uniform draw of each token (--json)
  std::int64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < samples; ++s) {
    fmt::print("# sample {} of {}\n{}", s + 1, samples, prompt_shown);
    std::fflush(stdout);
    const std::uint64_t key = model::rng::key(static_cast<std::uint64_t>(*seed), fmt::format("atlas.sample.{}", s));
    chosen_logits.emplace_back();
    draws.emplace_back();
    const auto choose = [&](std::span<const float> logits, int i) {
      const double u = model::rng::uniform(key, static_cast<std::uint64_t>(i));
      std::int32_t t = 0;
      try {
        t = model::sample_token(logits.first(static_cast<std::size_t>(tok.vocab)), sp, u);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("'{}', sample {}, new token {}: {}", ckpt, s + 1, i + 1, e.problems().front()));
      }
      chosen_logits.back().push_back(logits[static_cast<std::size_t>(t)]);
      draws.back().push_back(u);
      return t;
    };
    const auto emit = [&](std::int32_t id) {
      if (id == go.stop_token) return;
      const std::string piece = tok.decode(std::span<const std::int32_t>(&id, 1));
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
    outs.push_back(bubbletea::generate_with(net, prompt, go, choose, emit));
    tokens += static_cast<std::int64_t>(outs.back().size());
    const bool stopped = outs.back().back() == go.stop_token;
    fmt::print("\n{}", stopped ? "# <|endoftext|>\n" : "");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("# {} sample(s), {} new tokens in {:.2f} s ({:.1f} tokens/s on {}); prompt {} tokens\n", samples, tokens,
             secs, secs > 0 ? static_cast<double>(tokens) / secs : 0.0, device_name, prompt.size());

  if (!json_path.empty()) {
    // Numbers as shortest round-trip text ({} of fmt): the settings, logits and draws exact.
    const auto list = [](const auto& v) { return fmt::format("[{}]", fmt::join(v, ", ")); };
    const auto lists = [&](const auto& vs) {
      std::string out = "[";
      for (std::size_t s = 0; s < vs.size(); ++s) out += (s ? ",\n    " : "\n    ") + list(vs[s]);
      return out + "\n  ]";
    };
    // Finite: sample_token refuses non-finite logits and settings.
    const std::string j = fmt::format(
        "{{\n  \"checkpoint\": \"{}\",\n  \"step\": {},\n  \"tokenizer\": \"{}\",\n  \"temperature\": {},\n  "
        "\"top_k\": {},\n  \"top_p\": {},\n  \"seed\": {},\n  \"context\": {},\n  \"prompt_ids\": {},\n  "
        "\"samples\": {},\n  \"chosen_logits\": {},\n  \"draws\": {}\n}}\n",
        json::escape(ckpt), contents.meta.step, tok.name(), sp.temperature, sp.top_k, sp.top_p, *seed, m.seq_len,
        list(prompt), lists(outs), lists(chosen_logits), lists(draws));
    write_file_whole(json_path, j);
  }
  return 0;
}

}  // namespace atlas::app
