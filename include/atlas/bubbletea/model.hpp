// SPDX-License-Identifier: MIT
// BubbleTea's inference model: a GPT-2-style decoder (same tensor names and layouts as the
// training model, so an atlas checkpoint loads into it) cut into contiguous layer ranges, one per
// rank of a DC's inference pipeline. It runs prefill chunks and decode steps over a per-request
// KV cache through device::Backend ops only (attention over the cache is composed here from
// gemm, a masked row softmax and gemm). No training, no communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::bubbletea {

/// Size of the inference model (deck section [bubbletea]).
struct InferShape {
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int context = 128;  ///< longest sequence (prompt + generated tokens); rows of wpe used
  int vocab = 256;

  [[nodiscard]] int head_dim() const { return hidden / heads; }
  static InferShape from(const BubbleTeaCfg& cfg);
  bool operator==(const InferShape&) const = default;
};

/// The layer range one rank of an inference pipeline holds.
struct LayerRange {
  int first = 0;  ///< first global block index
  int count = 0;  ///< number of blocks
  bool has_embedding = false;  ///< first rank: wte + wpe
  bool has_head = false;       ///< last rank: ln_f + (tied) wte as LM head
};

/// Splits `layers` blocks over `ranks` pipeline ranks: contiguous, as even as possible, the
/// first ranks take one extra when it does not divide. Throws ConfigError when layers < ranks
/// (every rank of the DC must hold at least one block).
[[nodiscard]] LayerRange split_layers(int layers, int ranks, int index);

/// A rank's inference pipeline (bubbletea.pipeline): `dc` = one per DC over its ranks in world
/// rank order; `replica` = one per DP replica inside a DC, its ranks in world rank order (stage,
/// then TP rank). The same placement for the runtime (bubbletea::Service), the table's Prefill
/// slots (prefill_plan) and the simulator's service prediction.
struct PipelinePlace {
  int pipeline = 0;  ///< id: the DC, or DC x dp + replica (equal ids = same pipeline)
  int dc = 0;
  int index = 0;     ///< place in the pipeline (0 admits the requests)
  int size = 1;      ///< its ranks
};
[[nodiscard]] PipelinePlace pipeline_place(InferPipeline mode, const topo::Layout& layout, int world_rank);

/// The pipelines that serve requests, in the order requests are dealt to them (request id modulo
/// the count): each DC's first pipeline, DC by DC, then the second ones, and so on; DCs that hold
/// no rank serve nothing.
[[nodiscard]] std::vector<PipelinePlace> serving_pipelines(InferPipeline mode, const topo::Layout& layout);

/// One request's keys and values on one rank: for each local block, K and V of `capacity`
/// positions x hidden floats (row = position, channel = head * head_dim + d). `len` positions
/// are filled. Device memory on the model's backend.
struct KvCache {
  std::vector<device::Buffer> k, v;  ///< one Buffer per local block (none on an emulated model)
  int capacity = 0;
  int len = 0;
  std::size_t modelled_bytes = 0;  ///< an emulated model's cache: the bytes it stands for, not allocated
  [[nodiscard]] std::size_t bytes() const;
};

/// One named parameter tensor of the inference model (full logical tensor; no TP sharding).
struct InferParam {
  std::string name;                    ///< training-model name, e.g. "h.3.attn.qkv.weight"
  std::vector<std::int64_t> shape;     ///< this rank's tensor (wpe: [context, C])
  std::vector<std::int64_t> file_shape;  ///< shape in a checkpoint (wpe: [seq_len, C]) if known
  device::Buffer value;
};

/// Layers `range` of the inference GPT on `backend`. Not thread-safe (one thread, like the
/// backend). Weights are zero until init_random() or set_param() fill them.
class InferenceModel {
 public:
  /// `max_chunk` = the most tokens one forward() call may carry (sizes the scratch buffers).
  /// `emulated` (device.backend = emulated): the model has its shape and no storage: no weight,
  /// scratch or KV buffer is allocated (weight_bytes() and KvCache::bytes() report what they stand
  /// for), and forward_* do the bookkeeping (positions, order checks) without arithmetic, so a
  /// paper-sized inference model costs a rank nothing; the caller sleeps the chunk's time.
  /// Throws ConfigError when hidden is not a multiple of heads or a size is not positive.
  InferenceModel(const InferShape& shape, LayerRange range, device::Backend& backend, int max_chunk,
                 bool emulated = false);
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  [[nodiscard]] const InferShape& shape() const noexcept { return m_shape; }
  [[nodiscard]] const LayerRange& range() const noexcept { return m_range; }
  [[nodiscard]] int max_chunk() const noexcept { return m_max_chunk; }
  [[nodiscard]] device::Backend& backend() const noexcept { return m_backend; }
  [[nodiscard]] bool emulated() const noexcept { return m_emulated; }

  /// Random weights from the training model's rule, keyed by (seed, tensor name, flat index):
  /// matrices ~ N(0, init_std), residual projections ~ N(0, init_std / sqrt(2 * layers)),
  /// LayerNorm weights 1, biases 0. The same seed gives the same tensors on any layer split.
  /// Does nothing on an emulated model (it holds no values).
  void init_random(std::uint64_t seed, double init_std);
  /// This rank's tensors (for a checkpoint read or to ship weights to a decode worker).
  [[nodiscard]] std::vector<InferParam>& params() noexcept { return m_params; }
  [[nodiscard]] const std::vector<InferParam>& params() const noexcept { return m_params; }
  /// Copies `values` (host, the tensor's numel floats) into the tensor `name`. Throws
  /// atlas::Error (Internal) for an unknown name or a size mismatch.
  void set_param(const std::string& name, std::span<const float> values);

  // ---- memory (bytes on the backend) ----
  [[nodiscard]] std::size_t weight_bytes() const;
  [[nodiscard]] std::size_t scratch_bytes() const;
  /// KV-cache bytes per token on this rank (2 x local blocks x hidden x 4).
  [[nodiscard]] std::size_t kv_bytes_per_token() const;
  /// A cache for `capacity` positions (allocates kv_bytes_per_token() * capacity bytes).
  [[nodiscard]] KvCache make_cache(int capacity) const;

  /// Forward pass of `n` tokens at positions [cache.len, cache.len + n) through this rank's
  /// blocks, appending their keys and values to `cache` (cache.len += n).
  /// Input: `tokens` (host, n ids in [0, vocab)) on the embedding rank, else `act_in` (host,
  /// n x hidden floats from the previous rank). Output: `act_out` (host, n x hidden) on non-head
  /// ranks; on the head rank, when `logits` is non-null, the logits (host, vocab floats) of the
  /// last of the n tokens. Throws atlas::Error (Config) for an id outside the vocabulary or a
  /// chunk beyond the cache, (Internal) for n > max_chunk or a missing argument.
  void forward(KvCache& cache, int n, const std::int32_t* tokens, const float* act_in,
               float* act_out, float* logits);
  /// forward() in pieces, so a chunk can stop between blocks and go on later (BubbleTea stops
  /// a chunk when training's data arrives): forward_begin (the input), forward_block for local
  /// blocks 0, 1, ... in order, forward_end (the output; cache.len += n). Bitwise the same as
  /// forward(). One chunk at a time: no other forward may run on this model in between (the
  /// activations stay in its scratch). Same arguments and errors as forward().
  void forward_begin(KvCache& cache, int n, const std::int32_t* tokens, const float* act_in);
  void forward_block(KvCache& cache, int n, int local);
  /// device.backend = emulated: block `local` of the chunk counts as done without any arithmetic
  /// (its KV cache entries stay as they were). Same order rules as forward_block().
  void skip_block(int n, int local);
  void forward_end(KvCache& cache, int n, float* act_out, float* logits);

  /// The first token of the greedy decode: index of the largest logit (lowest on ties).
  [[nodiscard]] static std::int32_t argmax(std::span<const float> logits);

 private:
  void add(const std::string& name, std::vector<std::int64_t> shape);
  [[nodiscard]] InferParam* find(const std::string& name);
  void block(int local, KvCache& cache, int n, float* x);
  int m_chunk_n = 0;            ///< the chunk begun (forward_begin) and not ended; 0: none
  int m_chunk_blocks_done = 0;  ///< its blocks run so far

  struct BlockParams {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *mp_w, *mp_b;
  };

  InferShape m_shape;
  LayerRange m_range;
  device::Backend& m_backend;
  int m_max_chunk;
  bool m_emulated = false;
  std::vector<InferParam> m_params;
  std::vector<BlockParams> m_blocks;
  const float* m_wte = nullptr;
  const float* m_wpe = nullptr;
  const float* m_lnf_w = nullptr;
  const float* m_lnf_b = nullptr;
  // scratch for one chunk (n <= max_chunk rows)
  device::Buffer m_x, m_ln, m_mean, m_rstd, m_qkv, m_scores, m_atty, m_tmp, m_fc, m_tokens,
      m_zeros, m_losses, m_logits;
};

/// A standalone greedy generation with a whole model on one backend (the reference BubbleTea
/// must match): prefill `prompt` in chunks of `chunk_tokens` (0 = the whole prompt at once), then
/// decode until `max_new` tokens (the first one included). `model` must hold every layer, the
/// embedding and the head. Returns the generated ids.
[[nodiscard]] std::vector<std::int32_t> generate(InferenceModel& model, std::span<const std::int32_t> prompt,
                                                 int chunk_tokens, int max_new);

/// Greedy decode after a prefill: `cache` holds the prompt's keys and values of every layer,
/// `first` is the first generated token; produces `max_new` tokens in total (first included).
[[nodiscard]] std::vector<std::int32_t> decode_greedy(InferenceModel& model, KvCache& cache,
                                                      std::int32_t first, int max_new);

/// generate_with's limits: `max_new` tokens at most; a chosen `stop_token` (>= 0) ends it.
struct GenerateOptions {
  int max_new = 1;
  std::int32_t stop_token = -1;
};

/// Generation with a token chooser (atlas sample), on a model that holds every layer, the
/// embedding and the head, built with max_chunk >= its context: prefills `prompt` (1 to context
/// tokens), then for each new token i = 0, 1, ... calls `choose(logits of the next token, i)` and
/// `emit(the chosen id)`, until `options.max_new` tokens or until `options.stop_token` was chosen
/// (it is emitted and returned). Past the context the cache restarts: once the sequence fills
/// the context, a fresh cache is prefilled with its last context / 2 tokens (positions from 0
/// again) and decoding goes on, so a token past the context sees the last context / 2 to context
/// tokens (nanoGPT's sampler instead re-runs the last context tokens for every token). Returns
/// the new ids. Throws atlas::Error (Config) for an empty or too long prompt or an id outside the
/// vocabulary.
std::vector<std::int32_t> generate_with(InferenceModel& model, std::span<const std::int32_t> prompt,
                                        const GenerateOptions& options,
                                        const std::function<std::int32_t(std::span<const float>, int)>& choose,
                                        const std::function<void(std::int32_t)>& emit);

/// Reads `model`'s tensors (its layer range) from the atlas checkpoint `path`, whose model.*
/// must be the model's shape (its seq_len at least the model's context). `setting` says where
/// the path came from in messages ("bubbletea.weights", "atlas sample"). Collective over `comm`
/// (every rank reads its own tensors); throws ConfigError naming the file and the mismatch.
void load_weights(const mpi::Comm& comm, const std::string& path, InferenceModel& model, std::string_view setting);

/// Chunk boundaries of a prompt of `prompt_tokens`: chunks of `chunk_tokens` (0 = one chunk),
/// the last one shorter. Fixed by the prompt length alone, so a prefill's arithmetic does not
/// depend on which bubbles it ran in.
[[nodiscard]] std::vector<int> chunk_sizes(int prompt_tokens, int chunk_tokens);

}  // namespace atlas::bubbletea
