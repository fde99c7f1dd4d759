// SPDX-License-Identifier: MIT
// `atlas export CKPT --format hf --out DIR` and `atlas import --format hf DIR --out CKPT_DIR
// [--deck DECK] [key=value ...]`: wiring only (io/hf.hpp holds the formats and the mapping).
// One process: both read and write whole tensors with serial HDF5 and MPI_COMM_SELF.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

#include "atlas/app/commands.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/io/hf.hpp"
#include "atlas/model/gpt.hpp"

namespace atlas::app {

namespace {

void want_hf(const Args& a, const char* command) {
  const std::string f = a.option("format");
  if (f.empty()) throw UsageError(fmt::format("atlas {}: --format hf is required (the only format)", command));
  if (f != "hf") throw UsageError(fmt::format("atlas {}: unknown --format '{}' (known: hf)", command, f));
}

/// --logits FILE: atlas's own logits (host backend) of the checkpoint on fixed tokens, for
/// scripts/hf/check_logits.py to compare with transformers'. FILE is a safetensors file with
/// "tokens" [T] (ids as F32, exact below 2^24) and "logits" [T, V].
void write_logits(const std::string& ckpt, const io::CheckpointContents& contents, const ModelCfg& deck_model,
                  const std::string& file) {
  const std::unique_ptr<device::Backend> be = device::make_backend(DeviceCfg{});
  const std::unique_ptr<model::StageModel> whole = load_whole_model(ckpt, contents, deck_model, 1, *be);
  model::StageModel& sm = *whole;
  const auto seq_len = static_cast<int>(contents.meta.model.seq_len);
  const auto vocab = static_cast<int>(contents.meta.model.vocab);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq_len));
  std::vector<std::int32_t> targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7919 + 13) % static_cast<std::size_t>(vocab));
  for (std::size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  sm.forward(0, tokens.data(), targets.data(), nullptr, nullptr);
  io::SafeTensor t{"tokens", {seq_len}, std::vector<float>(tokens.begin(), tokens.end())};
  io::SafeTensor l{"logits", {seq_len, vocab}, sm.logits(0)};
  sm.release(0);
  io::write_safetensors(file, {t, l}, {{"format", "pt"}, {"checkpoint", ckpt}});
  fmt::print("# atlas logits on {} fixed tokens -> {}\n", seq_len, file);
}

/// The deck keys atlas import takes from config.json, with config.json's names.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kFromConfigJson{{
    {"model.layers", "n_layer"},
    {"model.hidden", "n_embd"},
    {"model.heads", "n_head"},
    {"model.seq_len", "n_positions"},
    {"model.vocab", "vocab_size"},
    {"model.init_std", "initializer_range"},
}};

/// import's deck is config.json's values as key=value overrides: a value atlas cannot take is
/// config.json's, not the command line's ("command line: model.layers = ..., drop the override").
std::vector<std::string> blame_config_json(std::vector<std::string> problems, const std::string& config_path,
                                           const std::vector<std::string>& user_overrides) {
  for (std::string& p : problems) {
    for (const auto& [key, json] : kFromConfigJson) {
      const std::string prefix = fmt::format("command line: {} = ", key);
      if (p.rfind(prefix, 0) != 0) continue;
      const bool users = std::any_of(user_overrides.begin(), user_overrides.end(), [&](const std::string& o) {
        return o.rfind(std::string(key) + "=", 0) == 0;
      });
      if (users) break;  // the user's own override: the message stands
      std::string rest = p.substr(prefix.size());
      if (const auto hint = rest.find("\n  hint:"); hint != std::string::npos) rest.erase(hint);
      p = fmt::format("'{}': {} = {} (atlas's {})\n  hint: atlas cannot import this model as it is; the limits are "
                      "atlas's deck limits (atlas schedule --help-deck)",
                      config_path, json, rest, key);
      break;
    }
  }
  return problems;
}

}  // namespace

int cmd_export(Context& ctx) {
  require_one_process(ctx, "export");
  const Args a = parse_args(ctx.args, {"format", "out", "logits"}, {},
                            {{"format", "hf: Hugging Face GPT-2 (model.safetensors + config.json)"},
                             {"out", "DIR: where the files go"},
                             {"logits", "FILE: atlas's logits on fixed tokens, for scripts/hf/check_logits.py"}});
  want_hf(a, "export");
  // The checkpoint holds its deck: key=value words were read and never used.
  if (!a.overrides.empty())
    throw UsageError("atlas export takes no key=value overrides (got '" + a.overrides.front() +
                     "'): the checkpoint's own deck describes the model");
  if (a.positional.size() != 1)
    throw UsageError("atlas export needs one checkpoint file: atlas export CKPT --format hf --out DIR");
  const std::string out = a.option("out");
  if (out.empty()) throw UsageError("atlas export: --out DIR is required");
  check_output_dir("atlas export", out);
  if (a.flag("logits")) {  // checked before anything is written
    const std::string logits = a.option("logits");
    check_output_file("atlas export", "--logits", logits);
    std::error_code e1, e2;
    if (std::filesystem::weakly_canonical(logits, e1) == std::filesystem::weakly_canonical(out, e2) && !e1 && !e2)
      throw ConfigError("atlas export: --logits " + logits + " is the --out directory\n  hint: name a file, e.g. " +
                        (std::filesystem::path(out) / "atlas_logits.safetensors").string());
  }
  const std::string& ckpt = a.positional[0];

  // config.json's initializer_range and special tokens come from the checkpoint's own deck.
  const io::CheckpointContents contents = io::inspect_checkpoint(ckpt);
  io::Gpt2Config cfg;
  cfg.gpt2_tokenizer = contents.meta.model.vocab == 50257;
  ModelCfg deck_model;
  const std::optional<Config> deck_cfg = checkpoint_deck(
      ckpt, contents,
      fmt::format("initializer_range {} and {} special tokens", cfg.initializer_range,
                  cfg.gpt2_tokenizer ? "GPT-2's" : "no"));
  if (deck_cfg) {
    deck_model = deck_cfg->model;
    cfg.initializer_range = deck_cfg->model.init_std;
    cfg.gpt2_tokenizer = deck_cfg->data.tokenizer == TokenizerKind::Gpt2;
  }
  const std::vector<std::string> names = io::export_hf(ckpt, out, cfg);
  const auto& m = contents.meta.model;
  fmt::print("# exported {} (step {}, {} layers, hidden {}, {} heads, seq_len {}, vocab {}) -> "
             "{}/model.safetensors ({} tensors) + {}/config.json\n",
             ckpt, contents.meta.step, m.layers, m.hidden, m.heads, m.seq_len, m.vocab, out,
             names.size(), out);
  if (const std::string f = a.option("logits"); !f.empty()) write_logits(ckpt, contents, deck_model, f);
  return 0;
}

int cmd_import(Context& ctx) {
  require_one_process(ctx, "import");
  const Args a = parse_args(ctx.args, {"format", "out", "deck"}, {},
                            {{"format", "hf: a Hugging Face GPT-2 directory"},
                             {"out", "CKPT_DIR: where step-000000.h5 goes"},
                             {"deck", "DECK: the deck stored with it (default: one from config.json)"}});
  want_hf(a, "import");
  if (a.positional.size() != 1)
    throw UsageError("atlas import needs one model directory: atlas import --format hf DIR --out CKPT_DIR");
  const std::string out = a.option("out");
  if (out.empty()) throw UsageError("atlas import: --out CKPT_DIR is required");
  check_output_dir("atlas import", out);
  const std::string& dir = a.positional[0];
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  const io::Gpt2Config hc = io::read_gpt2_config(config_path);

  std::string deck_text;
  std::optional<io::ModelShape> expect;
  const std::string deck_path = a.option("deck");
  if (!deck_path.empty()) {
    const Config cfg = load_offline_deck(deck_path, a.overrides);
    if (std::string why = deck::runtime_block_mismatch(cfg); !why.empty()) throw ConfigError(why);
    expect = io::ModelShape{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq_len,
                            cfg.model.vocab};
    deck_text = deck::resolved_deck(cfg);
  } else {
    const auto& m = hc.model;
    std::vector<std::string> ov = {
        fmt::format("model.layers={}", m.layers),   fmt::format("model.hidden={}", m.hidden),
        fmt::format("model.heads={}", m.heads),     fmt::format("model.seq_len={}", m.seq_len),
        fmt::format("model.vocab={}", m.vocab),     fmt::format("model.init_std={}", hc.initializer_range)};
    // A deck needs a cluster; this one describes the model only (atlas train takes its own deck).
    ov.emplace_back("cluster.dcs=local");
    ov.emplace_back("cluster.gpus_per_dc=1");
    ov.emplace_back("parallel.stages_per_dc=1");
    if (hc.gpt2_tokenizer) ov.emplace_back("data.tokenizer=gpt2");
    ov.insert(ov.end(), a.overrides.begin(), a.overrides.end());
    // Checked as a --deck is: the user's key=value overrides may not leave a deck atlas train
    // refuses, nor a model.* that disagrees with the weights (import_hf compares it).
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = cuda_built();
    const Config cfg = [&] {
      try {
        return deck::parse_and_validate(config_path, "", ov, shape);
      } catch (const ConfigError& e) {
        throw ConfigError(blame_config_json(e.problems(), config_path, a.overrides));
      }
    }();
    if (std::string why = deck::runtime_block_mismatch(cfg); !why.empty()) throw ConfigError(why);
    expect = io::ModelShape{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq_len, cfg.model.vocab};
    deck_text = deck::resolved_deck(cfg);
  }
  const std::string path = io::import_hf(dir, out, deck_text, expect);
  const auto& m = hc.model;
  fmt::print("# imported {} ({} layers, hidden {}, {} heads, n_positions {}, vocab {}) -> {}\n", dir,
             m.layers, m.hidden, m.heads, m.seq_len, m.vocab, path);
  fmt::print("# fine-tune from it: atlas train DECK run.resume={}  (the deck's model.* must match)\n", path);
  return 0;
}

}  // namespace atlas::app
