// SPDX-License-Identifier: MIT
// Hugging Face interchange: a safetensors reader and writer (an 8-byte little-endian header
// length, a JSON header, raw little-endian tensors; no library needed) and the mapping between an
// atlas checkpoint and a transformers GPT-2 model (GPT2LMHeadModel names, Conv1D [in, out]
// weights, c_attn = q|k|v, the LM head tied to wte) with its config.json. One process; not for
// anything but GPT-2-shaped models. Layout and rules: docs/formats.md, "Hugging Face export".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "atlas/io/checkpoint.hpp"

namespace atlas::io {

/// One tensor of a safetensors file, held as float32 whatever its stored dtype.
struct SafeTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;    ///< row-major, shape's product elements (empty where !loaded)
  std::string dtype = "F32";  ///< as stored: F32, F16 or BF16 (written: always F32), or another
                              ///< safetensors dtype atlas does not read (then !loaded)
  /// False for a dtype other than F32, F16 and BF16 (BOOL, U8, I64, ...): its bytes were checked
  /// but not read, and `data` is empty. A reader that needs the tensor refuses it (the causal-mask
  /// buffers older transformers saved as BOOL or U8 are skipped by read_hf_gpt2).
  bool loaded = true;
};

/// What read_safetensors returns.
struct SafeTensorsFile {
  std::map<std::string, std::string> metadata;  ///< the "__metadata__" object (string values)
  std::vector<SafeTensor> tensors;              ///< in the order of their data in the file
};

/// The bytes of a safetensors file of `tensors` (float32): the header lists "__metadata__"
/// first, then the tensors in the given order, their data back to back in that order, the header
/// padded with spaces to a multiple of 8 bytes. Depends only on the arguments.
std::string safetensors_bytes(const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata);

/// Writes safetensors_bytes(tensors, metadata) to `path` atomically and durably (PATH.tmp,
/// fsync, rename). Throws atlas::Error (Io) when the file cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// Reads a whole safetensors file, checking everything the format promises before any data is
/// used: the header length against the file, the header as a JSON object of entries
/// {dtype, shape, data_offsets}, known dtypes (F32, F16, BF16 are read; other safetensors dtypes
/// are refused by name), each range's length against its dtype and shape, ranges that tile the
/// data area exactly (no overlap, no hole, none past the end: a truncated file is caught), no
/// duplicate names. Throws ConfigError naming the file, the problem and the fix.
[[nodiscard]] SafeTensorsFile read_safetensors(const std::string& path);

/// What atlas writes into and reads from a transformers GPT-2 config.json.
struct Gpt2Config {
  ModelShape model;             ///< n_layer, n_embd, n_head, n_positions, vocab_size
  double initializer_range = 0.02;
  bool gpt2_tokenizer = false;  ///< write bos/eos = 50256 (atlas data.tokenizer = gpt2)
};

/// The config.json text of a transformers GPT2LMHeadModel of this shape: gelu_new (atlas's GELU
/// is the tanh approximation), layer_norm_epsilon 1e-5, no dropout, tied embeddings.
[[nodiscard]] std::string gpt2_config_json(const Gpt2Config& cfg);

/// Parses DIR/config.json and checks that the model is one atlas computes exactly: model_type
/// gpt2, activation gelu_new (or gelu_pytorch_tanh), layer_norm_epsilon 1e-5, n_inner null or
/// 4 * n_embd, tied embeddings, attention scaled by 1/sqrt(head size) only, no cross-attention.
/// Throws ConfigError naming the file, every key that differs and the fix (a missing file too).
[[nodiscard]] Gpt2Config read_gpt2_config(const std::string& path);

/// The atlas tensors (names and logical shapes, docs of model::ParamTensor) of a GPT-2 model of
/// this shape, in checkpoint (name) order.
[[nodiscard]] std::vector<TensorEntry> atlas_gpt2_tensors(const ModelShape& m);

/// `atlas export CKPT --format hf --out DIR`: reads every parameter of checkpoint `ckpt` (whatever
/// layout wrote it) and writes DIR/model.safetensors and DIR/config.json. `cfg.model` is
/// replaced by the checkpoint's. A checkpoint whose tensors are not exactly those of
/// atlas_gpt2_tensors is a ConfigError naming each difference. One process (serial HDF5 +
/// MPI_COMM_SELF). Returns the tensors written (HF names).
std::vector<std::string> export_hf(const std::string& ckpt, const std::string& out_dir,
                                   Gpt2Config cfg);

/// `atlas import --format hf DIR --out CKPT_DIR`: reads DIR/config.json and DIR/model.safetensors
/// (GPT2LMHeadModel or GPT2Model names, with or without the "transformer." prefix; the causal
/// mask buffers attn.bias / attn.masked_bias are skipped; an lm_head.weight must equal wte) and
/// writes checkpoint step 0 (zero AdamW moments, AdamW step 0, no data position) to
/// CKPT_DIR/step-000000.h5 with `deck_text` as its /deck. `atlas train DECK run.resume=THAT_FILE`
/// then fine-tunes from these weights. `expect`, when set, must equal the config's shape.
/// Returns the checkpoint's path. Throws ConfigError naming the file and the fix on bad input,
/// and when CKPT_DIR/step-000000.h5 exists already (it is never replaced).
std::string import_hf(const std::string& dir, const std::string& out_dir, const std::string& deck_text,
                      const std::optional<ModelShape>& expect = std::nullopt);

/// The parts of import_hf: DIR's config, then the atlas tensors of its weights (name order).
struct HfModel {
  Gpt2Config config;
  std::vector<SafeTensor> atlas_tensors;  ///< atlas names and logical shapes
};
[[nodiscard]] HfModel read_hf_gpt2(const std::string& dir);

}  // namespace atlas::io
