// SPDX-License-Identifier: MIT
// atlas checkpoint <-> transformers GPT-2 (GPT2LMHeadModel): the name and layout mapping, the
// config.json written and checked, and the two commands' I/O. Every atlas weight matrix is
// [output, input] (qkv: [3, C, C] = [q|k|v, output, input]); a transformers Conv1D weight is
// [input, output] with c_attn's outputs q|k|v, so each weight is the transpose of the atlas
// tensor seen as a 2-D matrix [rows, last dim]. Biases, LayerNorms and embeddings are the same
// bytes (qkv.bias [3, C] is c_attn.bias [3C]).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/file.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/io/hf.hpp"
#include "hf_json.hpp"

namespace atlas::io {

namespace fs = std::filesystem;

namespace {

/// Stands in an export directory while its two files are renamed into place (export_hf).
constexpr const char* kExportMarker = ".atlas-export-incomplete";

constexpr const char* kHfPrefix = "transformer.";
constexpr double kLayerNormEps = 1e-5;  // device::Backend::layernorm_forward
constexpr std::int64_t kGpt2EndOfText = 50256;
constexpr std::int64_t kGpt2Vocab = 50257;

/// How one atlas tensor of a block (or of the model) becomes one transformers tensor.
struct MapEntry {
  const char* atlas;  ///< atlas suffix ("ln_1.weight") or whole name ("wte")
  const char* hf;     ///< transformers suffix / name without the "transformer." prefix
  bool transpose;     ///< weight: transformers holds the transpose of the 2-D view
  bool flatten;       ///< qkv.bias [3, C] -> [3C]
};

constexpr MapEntry kBlockMap[] = {
    {"ln_1.weight", "ln_1.weight", false, false},
    {"ln_1.bias", "ln_1.bias", false, false},
    {"attn.qkv.weight", "attn.c_attn.weight", true, false},
    {"attn.qkv.bias", "attn.c_attn.bias", false, true},
    {"attn.proj.weight", "attn.c_proj.weight", true, false},
    {"attn.proj.bias", "attn.c_proj.bias", false, false},
    {"ln_2.weight", "ln_2.weight", false, false},
    {"ln_2.bias", "ln_2.bias", false, false},
    {"mlp.fc.weight", "mlp.c_fc.weight", true, false},
    {"mlp.fc.bias", "mlp.c_fc.bias", false, false},
    {"mlp.proj.weight", "mlp.c_proj.weight", true, false},
    {"mlp.proj.bias", "mlp.c_proj.bias", false, false},
};

/// One tensor of the mapping, fully named.
struct Mapped {
  std::string atlas, hf;  ///< hf without the prefix
  std::vector<std::int64_t> atlas_shape, hf_shape;
  bool transpose = false;
};

std::vector<Mapped> gpt2_mapping(const ModelShape& m) {
  const std::int64_t c = m.hidden, v = m.vocab, t = m.seq_len;
  auto shape_of = [&](const std::string& suffix) -> std::vector<std::int64_t> {
    if (suffix == "attn.qkv.weight") return {3, c, c};
    if (suffix == "attn.qkv.bias") return {3, c};
    if (suffix == "attn.proj.weight") return {c, c};
    if (suffix == "mlp.fc.weight") return {4 * c, c};
    if (suffix == "mlp.fc.bias") return {4 * c};
    if (suffix == "mlp.proj.weight") return {c, 4 * c};
    return {c};
  };
  auto add = [](std::vector<Mapped>& out, std::string a, std::string h, std::vector<std::int64_t> s,
                bool transpose, bool flatten) {
    Mapped x{std::move(a), std::move(h), s, s, transpose};
    if (transpose) {
      std::int64_t rows = 1;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) rows *= s[i];
      x.hf_shape = {s.back(), rows};
    } else if (flatten) {
      std::int64_t n = 1;
      for (auto d : s) n *= d;
      x.hf_shape = {n};
    }
    out.push_back(std::move(x));
  };
  std::vector<Mapped> out;
  add(out, "wte", "wte.weight", {v, c}, false, false);
  add(out, "wpe", "wpe.weight", {t, c}, false, false);
  for (std::int64_t l = 0; l < m.layers; ++l) {
    for (const auto& e : kBlockMap)
      add(out, fmt::format("h.{}.{}", l, e.atlas), fmt::format("h.{}.{}", l, e.hf), shape_of(e.atlas),
          e.transpose, e.flatten);
  }
  add(out, "ln_f.weight", "ln_f.weight", {c}, false, false);
  add(out, "ln_f.bias", "ln_f.bias", {c}, false, false);
  return out;
}

/// Transposes a row-major [rows, cols] matrix.
std::vector<float> transposed(const std::vector<float>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<float> o(a.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < cols; ++k) o[static_cast<std::size_t>(k * rows + r)] = a[static_cast<std::size_t>(r * cols + k)];
  return o;
}

std::string dims(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::string num(double x) { return fmt::format("{}", x); }

}  // namespace

std::vector<TensorEntry> atlas_gpt2_tensors(const ModelShape& m) {
  std::vector<TensorEntry> out;
  for (auto& x : gpt2_mapping(m)) out.push_back({x.atlas, x.atlas_shape, true, {}});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::string gpt2_config_json(const Gpt2Config& cfg) {
  const ModelShape& m = cfg.model;
  std::vector<std::pair<std::string, std::string>> kv = {
      {"activation_function", "\"gelu_new\""},
      {"architectures", "[\n    \"GPT2LMHeadModel\"\n  ]"},
      {"attn_pdrop", "0.0"},
      {"embd_pdrop", "0.0"},
      {"initializer_range", num(cfg.initializer_range)},
      {"layer_norm_epsilon", "1e-05"},
      {"model_type", "\"gpt2\""},
      {"n_ctx", std::to_string(m.seq_len)},
      {"n_embd", std::to_string(m.hidden)},
      {"n_head", std::to_string(m.heads)},
      {"n_inner", "null"},
      {"n_layer", std::to_string(m.layers)},
      {"n_positions", std::to_string(m.seq_len)},
      {"reorder_and_upcast_attn", "false"},
      {"resid_pdrop", "0.0"},
      {"scale_attn_by_inverse_layer_idx", "false"},
      {"scale_attn_weights", "true"},
      {"tie_word_embeddings", "true"},
      {"torch_dtype", "\"float32\""},
      {"use_cache", "true"},
      {"vocab_size", std::to_string(m.vocab)},
  };
  if (cfg.gpt2_tokenizer) {
    kv.emplace_back("bos_token_id", std::to_string(kGpt2EndOfText));
    kv.emplace_back("eos_token_id", std::to_string(kGpt2EndOfText));
    std::sort(kv.begin(), kv.end());
  }
  std::string o = "{\n";
  for (std::size_t i = 0; i < kv.size(); ++i)
    o += fmt::format("  \"{}\": {}{}\n", kv[i].first, kv[i].second, i + 1 < kv.size() ? "," : "");
  return o + "}\n";
}

Gpt2Config read_gpt2_config(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw ConfigError(fmt::format(
        "'{}' does not exist: a Hugging Face model directory holds config.json next to "
        "model.safetensors\n  hint: save the model with transformers' save_pretrained(DIR) (or "
        "atlas export --format hf), which writes both files",
        path));
  const std::string text = deck::read_text_file(path, 16ull << 20, "config.json");
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const json::ParseError& e) {
    throw ConfigError(fmt::format("'{}' is not valid JSON: {}\n  hint: write it again with "
                                  "transformers' save_pretrained(DIR)", path, e.what()));
  }
  if (!root.is_object()) throw ConfigError(fmt::format("'{}' is not a JSON object", path));
  std::vector<std::string> problems;
  auto key = [&](const char* k) { return root.find(k); };
  // Bounded by the deck's limits for the model key it becomes: a config.json is untrusted input,
  // and the tensor list is built from these before anything else is compared.
  auto get_int = [&](const char* k, const char* alt, const char* deck_key, double max) -> std::int64_t {
    const json::Value* v = key(k);
    if (!v && alt) v = key(alt);
    std::uint64_t x = 0;
    if (!v) {
      problems.push_back(fmt::format("'{}' has no \"{}\"", path, k));
      return 0;
    }
    if (!v->as_u64(x) || x == 0) {
      problems.push_back(fmt::format("'{}': \"{}\" is {}, not a positive integer", path, k, v->describe()));
      return 0;
    }
    if (static_cast<double>(x) > max) {
      problems.push_back(fmt::format("'{}': {} = \"{}\": expected an integer in [1, {}] (atlas's {})\n  hint: atlas "
                                     "cannot import this model as it is; the limits are atlas's deck limits (atlas "
                                     "schedule --help-deck)",
                                     path, k, x, max, deck_key));
      return 0;
    }
    return static_cast<std::int64_t>(x);
  };
  auto get_bool = [&](const char* k, bool def) {
    const json::Value* v = key(k);
    return v && v->is_bool() ? v->b : def;
  };
  Gpt2Config c;
  if (const auto* mt = key("model_type"); mt && (!mt->is_string() || mt->str != "gpt2"))
    problems.push_back(fmt::format("'{}': model_type is {}, not \"gpt2\"", path,
                                   mt->is_string() ? "\"" + mt->str + "\"" : std::string("not a string")));
  c.model.vocab = get_int("vocab_size", nullptr, "model.vocab", deck::limits::kMaxTokens);
  c.model.seq_len = get_int("n_positions", "n_ctx", "model.seq_len", deck::limits::kMaxTokens);
  c.model.hidden = get_int("n_embd", nullptr, "model.hidden", deck::limits::kMaxHidden);
  c.model.layers = get_int("n_layer", nullptr, "model.layers", deck::limits::kMaxLayers);
  c.model.heads = get_int("n_head", nullptr, "model.heads", deck::limits::kMaxHidden);
  if (c.model.hidden > 0 && c.model.heads > 0 && c.model.hidden % c.model.heads != 0)
    problems.push_back(fmt::format("'{}': n_embd {} is not a multiple of n_head {}", path,
                                   c.model.hidden, c.model.heads));
  if (const auto* a = key("activation_function");
      a && (!a->is_string() || (a->str != "gelu_new" && a->str != "gelu_pytorch_tanh")))
    problems.push_back(fmt::format(
        "'{}': activation_function is \"{}\"; atlas computes GELU's tanh approximation only "
        "(gelu_new or gelu_pytorch_tanh)", path, a->is_string() ? a->str : std::string("?")));
  if (const auto* e = key("layer_norm_epsilon");
      e && (!e->is_number() || std::fabs(e->as_double() - kLayerNormEps) > 1e-12))
    problems.push_back(fmt::format("'{}': layer_norm_epsilon is {}; atlas's LayerNorm uses 1e-05",
                                   path, e->is_number() ? e->num : std::string("not a number")));
  if (const auto* n = key("n_inner"); n && !n->is_null()) {
    std::uint64_t x = 0;
    if (!n->as_u64(x) || static_cast<std::int64_t>(x) != 4 * c.model.hidden)
      problems.push_back(fmt::format("'{}': n_inner is {}; atlas's MLP is 4 * n_embd = {} wide",
                                     path, n->num.empty() ? std::string("not a number") : n->num,
                                     4 * c.model.hidden));
  }
  if (!get_bool("tie_word_embeddings", true))
    problems.push_back(fmt::format("'{}': tie_word_embeddings is false; atlas's LM head is the "
                                   "token embedding (wte) itself", path));
  if (!get_bool("scale_attn_weights", true))
    problems.push_back(fmt::format("'{}': scale_attn_weights is false; atlas scales attention "
                                   "scores by 1/sqrt(head size)", path));
  if (get_bool("scale_attn_by_inverse_layer_idx", false))
    problems.push_back(fmt::format("'{}': scale_attn_by_inverse_layer_idx is true; atlas scales "
                                   "attention scores by 1/sqrt(head size) only", path));
  if (get_bool("add_cross_attention", false))
    problems.push_back(fmt::format("'{}': add_cross_attention is true; atlas's blocks have no "
                                   "cross-attention", path));
  if (const auto* r = key("initializer_range"); r && r->is_number()) c.initializer_range = r->as_double();
  c.gpt2_tokenizer = c.model.vocab == kGpt2Vocab;
  if (!problems.empty()) {
    problems.back() += "\n  hint: atlas imports GPT-2 models (GPT2LMHeadModel with the settings of "
                       "the published gpt2 checkpoints: gelu_new, layer_norm_epsilon 1e-05, tied "
                       "embeddings, n_inner null); another architecture cannot be imported";
    throw ConfigError(problems);
  }
  return c;
}

std::vector<std::string> export_hf(const std::string& ckpt, const std::string& out_dir, Gpt2Config cfg) {
  const CheckpointContents contents = inspect_checkpoint(ckpt);
  const ModelShape& m = contents.meta.model;
  cfg.model = m;
  // The checkpoint must hold exactly the GPT-2 tensors of its shape.
  std::vector<std::string> problems;
  if (m.heads <= 0 || m.hidden % m.heads != 0)
    problems.push_back(fmt::format("model.hidden {} is not a multiple of model.heads {}", m.hidden, m.heads));
  const std::vector<TensorEntry> want = atlas_gpt2_tensors(m);
  std::map<std::string, const TensorEntry*> have;
  for (const auto& t : contents.tensors) have[t.name] = &t;
  std::set<std::string> wanted;
  for (const auto& w : want) {
    wanted.insert(w.name);
    const auto it = have.find(w.name);
    if (it == have.end())
      problems.push_back(fmt::format("it has no tensor '{}' (GPT-2 shape {})", w.name, dims(w.shape)));
    else if (it->second->shape != w.shape)
      problems.push_back(fmt::format("tensor '{}' has shape {}, GPT-2 has {}", w.name,
                                     dims(it->second->shape), dims(w.shape)));
  }
  for (const auto& t : contents.tensors)
    if (!wanted.count(t.name))
      problems.push_back(fmt::format("tensor '{}' {} has no GPT-2 counterpart", t.name, dims(t.shape)));
  if (!problems.empty()) {
    for (auto& p : problems) p = fmt::format("checkpoint '{}' is not a GPT-2-shaped model: {}", ckpt, p);
    problems.back() += "\n  hint: atlas export --format hf writes GPT-2 models only (transformers' "
                       "GPT2LMHeadModel: tied embeddings, biases, LayerNorm, tanh GELU); export a "
                       "checkpoint of atlas's GPT model";
    throw ConfigError(problems);
  }

  // Read every parameter whole (any layout wrote it: each read is a hyperslab of the full tensor).
  const std::vector<Mapped> map = gpt2_mapping(m);
  std::vector<std::vector<float>> values(map.size());
  std::vector<ReadShard> shards;
  for (std::size_t i = 0; i < map.size(); ++i) {
    std::int64_t n = 1;
    for (auto d : map[i].atlas_shape) n *= d;
    values[i].resize(static_cast<std::size_t>(n));
    ReadShard s;
    s.name = map[i].atlas;
    s.full_shape = map[i].atlas_shape;
    s.offset.assign(s.full_shape.size(), 0);
    s.shape = s.full_shape;
    s.value = values[i].data();
    shards.push_back(std::move(s));
  }
  const mpi::Comm self = mpi::Comm::self();
  ReadOptions ro;
  ro.expect_model = m;
  (void)read_checkpoint(self, ckpt, shards, ro);

  std::vector<SafeTensor> tensors;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < map.size(); ++i) {
    SafeTensor t;
    t.name = kHfPrefix + map[i].hf;
    t.shape = map[i].hf_shape;
    t.data = map[i].transpose ? transposed(values[i], map[i].hf_shape[1], map[i].hf_shape[0])
                              : std::move(values[i]);
    names.push_back(t.name);
    tensors.push_back(std::move(t));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) ATLAS_THROW(Io, "cannot create directory '" << out_dir << "': " << ec.message());
  // Both files or neither: a failed write leaves an earlier export in out_dir whole (the weights
  // of one model beside the config of another would load as garbage). The two renames are not one
  // step, so a marker stands in the directory from before the first to after the second: a crash
  // between them leaves it, and import refuses the directory (kExportMarker).
  // It goes down only once both files are written (a failed write before it leaves the earlier
  // export whole and importable).
  const std::string marker = (fs::path(out_dir) / kExportMarker).string();
  write_files_whole({{(fs::path(out_dir) / "model.safetensors").string(), safetensors_bytes(tensors, {{"format", "pt"}})},
                     {(fs::path(out_dir) / "config.json").string(), gpt2_config_json(cfg)}},
                    true, [&] {
                      write_file_whole(marker, "an atlas export is renaming its files into this directory; if no "
                                               "export runs, it was interrupted\n", true);
                    });
  if (!fs::remove(marker, ec) || ec) ATLAS_THROW(Io, "cannot remove '" << marker << "': " << ec.message());
  fsync_path(out_dir, true);
  return names;
}

HfModel read_hf_gpt2(const std::string& dir) {
  HfModel out;
  if (std::error_code ec; fs::exists(fs::path(dir) / kExportMarker, ec))
    throw ConfigError(fmt::format("'{}' holds {}: an atlas export into it was interrupted between writing "
                                  "model.safetensors and config.json, which may belong to different models\n"
                                  "  hint: run the atlas export again (or remove the marker if the files are known to match)",
                                  dir, kExportMarker));
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const std::string st_path = (fs::path(dir) / "model.safetensors").string();
  out.config = read_gpt2_config(cfg_path);
  SafeTensorsFile file = read_safetensors(st_path);
  const std::vector<Mapped> map = gpt2_mapping(out.config.model);
  std::map<std::string, SafeTensor*> by_name;
  const SafeTensor* lm_head = nullptr;
  std::vector<std::string> problems;
  for (auto& t : file.tensors) {
    std::string n = t.name;
    if (n.rfind(kHfPrefix, 0) == 0) n = n.substr(std::strlen(kHfPrefix));
    // The causal-mask buffers older transformers saved with the weights (float, BOOL or U8).
    const bool mask = n.rfind("h.", 0) == 0 && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) &&
                      n.find(".c_") == std::string::npos;
    if (!t.loaded && !mask)
      problems.push_back(fmt::format("'{}': tensor '{}' is stored as {}; atlas reads F32, F16 and BF16\n"
                                     "  hint: save the model in float32 (model.float().save_pretrained(DIR))",
                                     st_path, t.name, t.dtype));
    if (n == "lm_head.weight") {
      if (lm_head != nullptr)
        problems.push_back(fmt::format("'{}' holds 'lm_head.weight' twice (with and without the \"{}\" prefix)",
                                       st_path, kHfPrefix));
      lm_head = &t;
      continue;
    }
    if (mask) continue;
    if (!by_name.emplace(n, &t).second)
      problems.push_back(fmt::format("'{}' holds '{}' twice (with and without the \"{}\" prefix)",
                                     st_path, n, kHfPrefix));
  }
  std::set<std::string> known;
  for (const auto& x : map) {
    known.insert(x.hf);
    const auto it = by_name.find(x.hf);
    if (it == by_name.end()) {
      problems.push_back(fmt::format("'{}' has no tensor '{}{}' (shape {})", st_path, kHfPrefix, x.hf,
                                     dims(x.hf_shape)));
      continue;
    }
    if (it->second->shape != x.hf_shape)
      problems.push_back(fmt::format("'{}': tensor '{}' has shape {}, but config.json's model needs {}",
                                     st_path, it->second->name, dims(it->second->shape), dims(x.hf_shape)));
  }
  for (const auto& [n, t] : by_name)
    if (!known.count(n))
      problems.push_back(fmt::format("'{}': tensor '{}' is not part of a GPT-2 model of config.json's "
                                     "shape ({} layers)", st_path, t->name, out.config.model.layers));
  if (problems.empty() && lm_head) {
    const SafeTensor* wte = by_name.at("wte.weight");
    if (lm_head->shape != wte->shape ||
        std::memcmp(lm_head->data.data(), wte->data.data(), wte->data.size() * 4) != 0)
      problems.push_back(fmt::format("'{}': lm_head.weight differs from wte.weight; atlas's LM head "
                                     "is the token embedding itself (tied)", st_path));
  }
  if (!problems.empty()) {
    problems.back() += "\n  hint: the directory must hold one GPT-2 model whose config.json matches "
                       "model.safetensors (write both with save_pretrained(DIR) or atlas export --format hf)";
    throw ConfigError(problems);
  }
  for (const auto& x : map) {
    SafeTensor& h = *by_name.at(x.hf);
    SafeTensor a;
    a.name = x.atlas;
    a.shape = x.atlas_shape;
    a.data = x.transpose ? transposed(h.data, x.hf_shape[0], x.hf_shape[1]) : std::move(h.data);
    out.atlas_tensors.push_back(std::move(a));
  }
  std::sort(out.atlas_tensors.begin(), out.atlas_tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::string import_hf(const std::string& dir, const std::string& out_dir, const std::string& deck_text,
                      const std::optional<ModelShape>& expect) {
  // Nothing already written is replaced: an earlier import (or a run's step 0) stays.
  const std::string target = checkpoint_path(out_dir, 0);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec)))
    throw ConfigError(fmt::format("atlas import: '{}' already exists (an earlier import, or a run's first checkpoint)\n"
                                  "  hint: remove it, or give another --out directory",
                                  target));
  HfModel hf = read_hf_gpt2(dir);
  const ModelShape& m = hf.config.model;
  if (expect && *expect != m) {
    const std::string cfg_path = (fs::path(dir) / "config.json").string();
    std::vector<std::string> p;
    auto cmp = [&](const char* key, const char* hf_key, std::int64_t in_cfg, std::int64_t in_deck) {
      if (in_cfg != in_deck)
        p.push_back(fmt::format("'{}' has {} = {} ({}), the deck {}", cfg_path, key, in_cfg, hf_key, in_deck));
    };
    cmp("model.layers", "n_layer", m.layers, expect->layers);
    cmp("model.hidden", "n_embd", m.hidden, expect->hidden);
    cmp("model.heads", "n_head", m.heads, expect->heads);
    cmp("model.seq_len", "n_positions", m.seq_len, expect->seq_len);
    cmp("model.vocab", "vocab_size", m.vocab, expect->vocab);
    p.back() += "\n  hint: set the deck's model.* keys (--deck, or key=value overrides) to config.json's values, or leave them out: the import takes config.json's";
    throw ConfigError(p);
  }
  CheckpointMeta meta;
  meta.step = 0;
  meta.git_sha = build::kGitSha;
  meta.deck = deck_text;
  meta.model = m;
  meta.layout.stages_per_dc = {1};  // one DC, one stage (docs/formats.md: shape (dc_count,))
  meta.state["adam_t"] = {0};
  std::vector<std::vector<float>> zeros;
  zeros.reserve(hf.atlas_tensors.size());
  std::vector<WriteShard> shards;
  for (const auto& t : hf.atlas_tensors) {
    zeros.emplace_back(t.data.size(), 0.0F);
    WriteShard s;
    s.name = t.name;
    s.full_shape = t.shape;
    s.offset.assign(t.shape.size(), 0);
    s.shape = t.shape;
    s.writer = true;
    s.value = t.data.data();
    s.adam_m = zeros.back().data();
    s.adam_v = zeros.back().data();
    shards.push_back(std::move(s));
  }
  WriteOptions wo;
  wo.keep_last = 0;
  const mpi::Comm self = mpi::Comm::self();
  return write_checkpoint(self, out_dir, meta, shards, wo).path;
}

}  // namespace atlas::io
