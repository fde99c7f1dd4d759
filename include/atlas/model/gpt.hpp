// SPDX-License-Identifier: MIT
// The GPT-2-style decoder, one pipeline stage and one tensor-parallel shard at a time: StageModel
// holds blocks [first_layer, first_layer + n_layers) of a ModelCfg (plus the embeddings on the
// first stage and the final LayerNorm, tied LM head and loss on the last), runs hand-written
// forward and backward passes through a device::Backend, and keeps per-micro-batch activations
// so several micro-batches can be in flight (1F1B). It knows nothing about the schedule or which
// transport moves its boundary activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/graph_cache.hpp"
#include "atlas/device/collective.hpp"

namespace atlas::model {

/// Where one StageModel sits in the parallel layout.
struct StageSpec {
  int stage = 0;    ///< pipeline stage id, 0 <= stage < pp
  int pp = 1;       ///< pipeline stages of the model
  int tp_rank = 0;  ///< rank in the tensor-parallel group, 0 <= tp_rank < tp_size
  int tp_size = 1;  ///< tensor-parallel group size (must divide model.heads)
  /// Model chunks of this stage (interleaved 1F1B, schedule.virtual_stages): chunk c holds the
  /// layers of virtual stage c * pp + stage, stage_layers(stage) / chunks of them. The first
  /// stage's chunk 0 runs the embeddings, the last stage's last chunk the head and the loss.
  int chunks = 1;
  /// Keep every saved activation fp32 even when the backend computes at bf16 (the reference of
  /// the bf16-storage tests: losses are bitwise the same either way). Default: bf16 storage at
  /// bf16 (StageModel::stores_bf16_activations).
  bool fp32_activations = false;
  /// The schedule splits this stage's backwards (backward_input + backward_weight): at bf16
  /// activation storage the q/k/v slot is then reserved at fp32 size, for the q/k/v gradient that
  /// backward_input keeps there for backward_weight (without it backward_input refuses at bf16).
  bool split_backward = false;
  /// Run each block's forward, backward and weight pass as a recorded graph (device.cuda_graphs;
  /// device::GraphCache): the backend must record graphs (can_capture) and tp_size be 1 (a
  /// block's TP sums are not recorded), else the constructor throws ConfigError.
  bool graphs = false;
};

/// One parameter tensor of this rank: its shard of a logical (full, unsharded) tensor, plus the
/// gradient and AdamW moments of that shard (all device Buffers of shard_numel() floats).
///
/// Logical tensors (C = hidden, H = heads, V = vocab, T = seq_len, l = GLOBAL layer index), all
/// row-major; "dim k / tp" means tp rank r holds rows [r*n/tp, (r+1)*n/tp) of dimension k:
///   wte                    [V, C]     replicated (token embedding; also the tied LM head)
///   wpe                    [T, C]     replicated (position embedding)
///   h.l.ln_1.weight/.bias  [C]        replicated
///   h.l.attn.qkv.weight    [3, C, C]  dim 1 / tp  ([q|k|v], output channel = head*D + d, input)
///   h.l.attn.qkv.bias      [3, C]     dim 1 / tp
///   h.l.attn.proj.weight   [C, C]     dim 1 / tp  ([output, input]; input = head*D + d)
///   h.l.attn.proj.bias     [C]        replicated
///   h.l.ln_2.weight/.bias  [C]        replicated
///   h.l.mlp.fc.weight      [4C, C]    dim 0 / tp  ([output, input])
///   h.l.mlp.fc.bias        [4C]       dim 0 / tp
///   h.l.mlp.proj.weight    [C, 4C]    dim 1 / tp  ([output, input])
///   h.l.mlp.proj.bias      [C]        replicated
///   ln_f.weight/.bias      [C]        replicated
/// A shard is one hyperslab: full_shape, shard_offset and shard_shape describe it exactly, and
/// the shard's memory is that hyperslab, row-major and dense.
struct ParamTensor {
  std::string name;                        ///< stable name, e.g. "h.3.attn.qkv.weight"
  std::vector<std::int64_t> full_shape;    ///< logical tensor shape
  std::vector<std::int64_t> shard_offset;  ///< this shard's start in the logical tensor
  std::vector<std::int64_t> shard_shape;   ///< this shard's shape
  device::Buffer value;                    ///< parameter values
  device::Buffer grad;                     ///< accumulated gradient (see StageModel::backward)
  device::Buffer adam_m;                   ///< AdamW first moment
  device::Buffer adam_v;                   ///< AdamW second moment
  bool decay = false;               ///< AdamW weight decay applies: decays_by_role(name)
  bool replicated_over_tp = true;   ///< every TP rank holds the whole tensor (identical values)
  /// The last stage's copy of "wte" when pp > 1: same values as the first stage's, gradient to
  /// be summed with it (see StageModel::tied_embedding). Checkpoints store the first stage's.
  bool tied_copy = false;
  /// This rank's copy counts towards the global gradient norm: false for replicated tensors on
  /// tp_rank != 0 and for the tied copy, so each logical element is counted exactly once.
  bool counts_in_norm = true;

  [[nodiscard]] std::int64_t shard_numel() const;
  [[nodiscard]] std::int64_t full_numel() const;
  /// The sharded dimension, or -1 when shard == full tensor.
  [[nodiscard]] int shard_dim() const;
};

/// AdamW weight decay by a parameter's role, read from its name (GPT-2 practice): the weight
/// matrices (h.l.attn.qkv.weight, attn.proj.weight, mlp.fc.weight, mlp.proj.weight) and the
/// embeddings (wte, also as the tied LM head, and wpe) decay; no bias (h.l.attn.qkv.bias included,
/// although it is stored as [3, C]) and no LayerNorm parameter (ln_1, ln_2, ln_f weight and bias)
/// does. By role, not by shape or by shard: the same on every rank and in every layout. A name
/// of no known role is an internal error (a new parameter must be given its rule here).
[[nodiscard]] bool decays_by_role(std::string_view name);

/// One pipeline stage / TP shard of the GPT model. Not thread-safe. Buffers it is handed (act_in,
/// act_out, grad_out, grad_in) are B*T*C fp32 boundary activations on the same backend.
///
/// Tied embedding rule: with pp == 1 the one "wte" receives both the embedding and the LM-head
/// gradient. With pp > 1 the first and last stage each hold a copy of "wte" (initialised to the
/// same values); after the backward passes of a step the runtime must sum tied_embedding()->grad
/// over the embedding group (first and last stage of this pipeline, same dp and tp coordinate)
/// before clipping and the optimizer step; the copies then stay identical.
class StageModel {
 public:
  /// Builds this rank's stage and initialises its parameters: every element of every logical
  /// tensor is drawn from a counter-based RNG keyed by (seed, name, flat index in the logical
  /// tensor), so values do not depend on pp/tp. Weights ~ N(0, init_std), residual projections
  /// (attn.proj.weight, mlp.proj.weight) ~ N(0, init_std / sqrt(2 * layers)), LayerNorm weights 1,
  /// all biases 0. `tp` is the TP group (may be null when tp_size == 1); it must outlive *this.
  /// Throws atlas::ConfigError listing every inconsistency (heads vs hidden vs tp_size, the
  /// layer split, the TP group size). Not collective.
  StageModel(const ModelCfg& cfg, int micro_batch_size, StageSpec spec, device::Backend& backend,
             device::Collective* tp, std::uint64_t seed);
  ~StageModel();
  StageModel(const StageModel&) = delete;
  StageModel& operator=(const StageModel&) = delete;

  // ---- shape ----
  [[nodiscard]] const StageSpec& spec() const noexcept { return m_spec; }
  [[nodiscard]] bool is_first() const noexcept { return m_spec.stage == 0; }
  [[nodiscard]] bool is_last() const noexcept { return m_spec.stage == m_spec.pp - 1; }
  /// First block of chunk 0 (with one chunk: the stage's first block).
  [[nodiscard]] int first_layer() const noexcept { return chunk_first_layer(0); }
  /// Blocks of the stage, all chunks together.
  [[nodiscard]] int n_layers() const noexcept { return m_n_layers; }
  /// First global block index of model chunk `chunk` (interleaved 1F1B; StageSpec::chunks).
  [[nodiscard]] int chunk_first_layer(int chunk) const noexcept;
  [[nodiscard]] int micro_batch_size() const noexcept { return m_batch; }
  [[nodiscard]] int seq_len() const noexcept { return m_seq; }
  [[nodiscard]] int hidden() const noexcept { return m_hidden; }
  [[nodiscard]] int vocab() const noexcept { return m_vocab; }
  /// Tokens per micro-batch (B*T): the length of the tokens/targets arrays.
  [[nodiscard]] std::size_t tokens_per_micro() const noexcept;
  /// Floats of one boundary activation (B*T*C); bytes = 4x.
  [[nodiscard]] std::size_t boundary_floats() const noexcept;
  [[nodiscard]] device::Backend& backend() const noexcept { return m_backend; }

  // ---- training ----
  /// Multiplier of the loss gradient (the runtime sets 1 / (micro_batches * dp_size) so the
  /// accumulated gradient is that of the mean loss over the global batch). Default 1. The last
  /// stage computes dlogits during forward(), so the scale in force then is the one used.
  void set_loss_scale(float scale) noexcept { m_loss_scale = scale; }
  [[nodiscard]] float loss_scale() const noexcept { return m_loss_scale; }

  /// Forward pass of micro-batch `micro` (any int id; at most once until its backward/release).
  /// First stage: `tokens` = host array of B*T token ids in [0, vocab). Other stages: `act_in` =
  /// the previous stage's act_out. Last stage: `targets` = host array of B*T ids, the loss is
  /// computed (micro_loss). Other stages: writes `act_out` (>= B*T*C floats). Unused arguments
  /// may be null. Keeps the activations for backward(micro). Collective over the TP group.
  /// With chunks (StageSpec::chunks > 1) the pass runs model chunk `chunk` only; "first stage"
  /// above means chunk 0 of stage 0 and "last stage" the last chunk of the last stage, and a
  /// micro-batch is in flight per chunk.
  void forward(int micro, const std::int32_t* tokens, const std::int32_t* targets,
               const device::Buffer* act_in, device::Buffer* act_out, int chunk = 0);
  /// Mean cross-entropy (nats/token, unscaled) of micro-batch `micro`; last stage only, valid
  /// from its forward until the next zero_grad(). The first call after forwards waits for the
  /// device once and fetches every loss forwarded since (a step asks after its last forward).
  [[nodiscard]] double micro_loss(int micro) const;
  /// Backward pass of micro-batch `micro` (after its forward). Non-last stages: `grad_out` =
  /// dL/d act_out from the next stage. Non-first stages: writes `grad_in` = dL/d act_in (>= B*T*C
  /// floats). Gradients ACCUMULATE into every ParamTensor::grad; the micro-batch's activations
  /// are released. Collective over the TP group.
  /// `ready`, when given, is called as soon as a group of parameters has received this
  /// micro-batch's gradient: the head (last stage), each block from the last to the first, the
  /// embeddings (first stage). Every parameter of the stage is reported exactly once per call. On
  /// the step's last backward those gradients are final, so their DP all-reduce can start while
  /// the rest of the backward runs.
  using GradsReady = std::function<void(std::span<ParamTensor* const>)>;
  /// With chunks: the backward of model chunk `chunk`; `ready` reports that chunk's parameters.
  void backward(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                const GradsReady* ready = nullptr, int chunk = 0);

  // ---- split backward (zero-bubble; schedule.split_backward, docs/schedules.md) ----
  // backward() in two calls: backward_input (B) gives the previous stage its gradient at once,
  // backward_weight (W) computes the weight gradients later, in a wait. For every micro-batch
  // and chunk, B then W (later, after any other forwards and B's) give bit for bit the
  // gradients and grad_in of backward(), provided each parameter receives its micro-batches in
  // backward()'s order: per chunk the W's run in increasing micro order (checked) and the B's
  // in the order the backwards would have run. (With pp = 1 and chunks > 1 the tied "wte" takes
  // the head chunk's and the embedding chunk's W's: their interleaving must also be backward()'s.)

  /// The input-gradient half (B) of backward(micro, grad_out, grad_in, -, chunk): same
  /// arguments, the same grad_in. Computes every input gradient (the linears' din, attention,
  /// GELU, LayerNorm, the TP sums) and the LayerNorm parameters' gradients (ln_1, ln_2, ln_f:
  /// one kernel gives them together with the LayerNorm's input gradient, and they are cheap);
  /// no linear weight or bias gradient and no embedding gradient. Keeps the micro-batch's
  /// activations for backward_weight, and writes what W needs beyond them (the linears' output
  /// gradients; on the first stage's chunk 0 the embeddings' output gradient) over activations
  /// it has consumed (a block's output, x2, the fc pre-activation, qkv; the embedding output):
  /// no memory beyond the activations, which are now held until W. Collective over the TP
  /// group. Internal error: no forward, or B twice.
  void backward_input(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                      int chunk = 0);
  /// The weight-gradient half (W) of micro-batch `micro`'s backward, after its backward_input:
  /// every linear's weight and bias gradient (the tied LM head's included) and the embeddings'
  /// (wte, wpe: with pp = 1 "wte" is also the head's weight, and both contributions must land
  /// in backward()'s order), accumulated into ParamTensor::grad; then the micro-batch's
  /// activations and kept gradients are released. `ready` as in backward(): the same groups in
  /// the same order (the LayerNorm parameters' gradients are final since the B's). Not
  /// collective (no TP sum). Internal error: no backward_input pending for (micro, chunk) (W
  /// before its B, or twice), or a micro below one whose W already ran for this chunk since
  /// zero_grad() (W's out of micro order).
  void backward_weight(int micro, const GradsReady* ready = nullptr, int chunk = 0);
  /// (micro, chunk) pairs between their backward_input and backward_weight, as keys
  /// micro * chunks + chunk in increasing order.
  [[nodiscard]] std::vector<int> weight_grads_pending() const;

  /// Last stage: the LM-head logits [B*T, V] of micro-batch `micro` (forwarded, not yet
  /// backwarded or released), recomputed from its saved final LayerNorm output with the
  /// forward's own GEMM, as a host copy. For checks against other implementations (atlas export
  /// --logits). Internal error when not the last stage or `micro` is not in flight.
  [[nodiscard]] std::vector<float> logits(int micro);
  /// Drops the activations of a forward-only micro-batch (evaluation). No-op if none are held.
  /// Also drops a micro-batch whose backward_weight is pending (its weight gradients are lost).
  void release(int micro, int chunk = 0);
  /// Zeroes every gradient and forgets the micro-batch losses (and the W order). Internal error
  /// while a backward_weight is pending (its gradients would be lost).
  void zero_grad();

  // ---- memory ----
  /// Bytes of activations currently held for micro-batches in flight (forwarded, not yet
  /// backwarded, or between backward_input and backward_weight).
  [[nodiscard]] std::size_t activation_bytes() const noexcept;
  /// Bytes of activations one micro-batch in flight holds (with model chunks: in the chunk that
  /// runs the head, the most; the last stage's other chunks hold no head slots, arena_floats).
  [[nodiscard]] std::size_t activation_bytes_per_micro() const noexcept {
    return activation_bytes_per_micro(m_spec.chunks - 1);
  }
  /// Bytes of activations one micro-batch in flight holds in `chunk`.
  [[nodiscard]] std::size_t activation_bytes_per_micro(int chunk) const noexcept;
  /// Micro-batch ids whose activations are held (forwarded, not yet backwarded/released).
  [[nodiscard]] std::vector<int> micros_in_flight() const;
  /// True when the activations that backward reads only as GEMM operands (ln1, qkv, ln2, gelu,
  /// ln_f) are stored as bf16: the backend's precision() is Bf16 (docs/precision.md, "Storage").
  [[nodiscard]] bool stores_bf16_activations() const noexcept { return m_bf16_acts; }
  /// One saved tensor of a micro-batch in flight (per block, `layer` = the chunk-local block, -1
  /// for the stage's own tensors): its name (res, ln1, mean1, rstd1, qkv, att, atty, x2, ln2,
  /// mean2, rstd2, fc, gelu, lnf, lnf_mean, lnf_rstd, probs, losses), elements and bytes per
  /// element (2: bf16, 4: fp32). Their sum, rounded up to 64-byte slots, is
  /// activation_bytes_per_micro() less the token ids.
  struct SavedTensor {
    std::string name;
    int layer = -1;
    std::size_t elements = 0;
    int element_bytes = 4;
  };
  [[nodiscard]] std::vector<SavedTensor> saved_tensors() const;

  // ---- parameters ----
  [[nodiscard]] std::vector<ParamTensor>& params() noexcept { return m_params; }
  [[nodiscard]] const std::vector<ParamTensor>& params() const noexcept { return m_params; }
  /// Fault injection (ATLAS_FAULT_NAN): sets every element of this stage's first parameter to
  /// NaN, so the next forward diverges.
  void poison_first_parameter();
  /// The parameter named `name`, or nullptr if this stage does not hold it.
  [[nodiscard]] ParamTensor* find_param(std::string_view name);
  /// The "wte" copy whose gradient must be summed over the embedding group (first and last
  /// stage) when pp > 1; nullptr when pp == 1 or this stage is neither first nor last.
  [[nodiscard]] ParamTensor* tied_embedding();
  /// Floats of all parameter shards on this rank.
  [[nodiscard]] std::int64_t local_parameter_count() const;
  /// Sum of squared gradients over the tensors with counts_in_norm (double, host value). The
  /// global norm is sqrt of its sum over the TP group and all pipeline stages (NOT over DP, whose
  /// gradients are identical after the DP all-reduce), taken after the embedding-group sum.
  [[nodiscard]] double local_grad_sq_norm() const;
  /// What the block graphs did (StageSpec::graphs; zeros and eager runs only when off).
  [[nodiscard]] const device::GraphStats& graph_stats() const noexcept { return m_graphs->stats(); }

 private:
  /// The twelve tensors of one transformer block on this rank.
  struct Block {
    ParamTensor *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    ParamTensor *ln2_w, *ln2_b, *fc_w, *fc_b, *mp_w, *mp_b;
  };
  /// Float offsets of one block's saved activations inside a micro-batch arena.
  struct LayerSlots {
    std::size_t ln1, mean1, rstd1, qkv, att, atty, x2, ln2, mean2, rstd2, fc, gelu;
  };
  /// Layout of a micro-batch arena: residual stream res[0..n_layers], per-block activations and
  /// (last stage) the final LayerNorm, probabilities and per-token losses.
  struct ArenaLayout {
    std::vector<std::size_t> res;
    std::vector<LayerSlots> layers;
    std::size_t lnf = 0, lnf_mean = 0, lnf_rstd = 0, probs = 0, losses = 0;
    std::size_t total = 0;
    /// Where the last stage's head slots (lnf ... losses) begin: the arena of a chunk that does
    /// not run the head (model chunks) ends here; total elsewhere.
    std::size_t body = 0;
    std::vector<SavedTensor> saved;  // saved_tensors()
  };
  /// Everything one micro-batch in flight keeps between its forward and backward.
  struct MicroState {
    device::Buffer arena;    ///< arena_floats(chunk) floats
    device::Buffer tokens;   ///< int32 [B*T] (first stage)
    device::Buffer targets;  ///< int32 [B*T] (last stage)
    bool input_done = false; ///< backward_input ran; backward_weight is pending
  };


  void build_params(std::uint64_t seed);
  void add_param(const std::string& name, std::vector<std::int64_t> full_shape, int shard_dim,
                 double init_std, float init_value, bool tied_copy, std::uint64_t seed);
  void build_layout();
  MicroState& start_micro(int key);
  /// Block `local_layer` of model chunk `chunk` (m_blocks[chunk * m_chunk_layers + local_layer]).
  void block_forward(int local_layer, MicroState& st, int chunk);
  /// `split` false: the whole backward of the block. True: the input half (split backward): no
  /// linear weight/bias gradient; the four linears' output gradients are written over arena
  /// slots this backward has consumed, for block_weight: dL/d of mlp.proj's output over the
  /// block's output res[i+1], of mlp.fc's pre-activation over fc, of attn.proj's output over
  /// x2, of attn.qkv's output over qkv.
  void block_backward(int local_layer, MicroState& st, int chunk, bool split = false);
  /// The weight half of block `local_layer` from the output gradients block_backward kept.
  void block_weight(int local_layer, MicroState& st, int chunk);
  /// Which block pass a graph records (GraphCache::Key::a).
  enum class BlockPass { Forward, Backward, BackwardInput, Weight };
  /// Runs `work` (one block pass of `st`'s arena) through m_graphs.
  void run_block(BlockPass pass, int chunk, int local_layer, const MicroState& st, const std::function<void()>& work);
  /// backward() and backward_input(); `ready` only when not split.
  void run_backward(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                    const GradsReady* ready, int chunk, const char* what, bool split);
  /// Key of (micro, chunk) in m_inflight.
  [[nodiscard]] int key_of(int micro, int chunk) const noexcept { return micro * m_spec.chunks + chunk; }
  [[nodiscard]] bool runs_embedding(int chunk) const noexcept { return is_first() && chunk == 0; }
  [[nodiscard]] bool runs_head(int chunk) const noexcept { return is_last() && chunk == m_spec.chunks - 1; }
  /// Floats of a micro-batch's arena in `chunk`: without the head's slots where the chunk does
  /// not run the head (the last stage's other chunks), so the logits are held once per pass.
  [[nodiscard]] std::size_t arena_floats(int chunk) const noexcept {
    return is_last() && !runs_head(chunk) ? m_layout.body : m_layout.total;
  }
  void tp_allreduce(device::Buffer& buf);
  [[nodiscard]] static float* at(MicroState& st, std::size_t offset) {
    return st.arena.f32() + offset;
  }
  /// A bf16 slot of the arena (stores_bf16_activations(); offsets stay in 4-byte units).
  [[nodiscard]] static device::Bf16Bits* at_bf16(MicroState& st, std::size_t offset) {
    return reinterpret_cast<device::Bf16Bits*>(st.arena.f32() + offset);
  }

  ModelCfg m_cfg;
  StageSpec m_spec;
  device::Backend& m_backend;
  device::Collective* m_tp;
  int m_batch, m_seq, m_hidden, m_vocab, m_heads, m_local_heads, m_head_dim;
  int m_local_hidden, m_local_ff;  // C/tp and 4C/tp
  int m_first_layer, m_n_layers, m_total_layers;
  int m_chunk_layers;  // blocks per model chunk (m_n_layers with one chunk)
  float m_loss_scale = 1.0F;
  bool m_bf16_acts = false;  // stores_bf16_activations()

  std::vector<ParamTensor> m_params;
  std::vector<Block> m_blocks;
  ParamTensor* m_wte = nullptr;
  ParamTensor* m_wpe = nullptr;
  ParamTensor* m_lnf_w = nullptr;
  ParamTensor* m_lnf_b = nullptr;

  // activation arena layout and the micro-batches in flight
  ArenaLayout m_layout;
  std::map<int, MicroState> m_inflight;
  std::vector<MicroState> m_pool;       // released arenas of ArenaLayout::total floats
  std::vector<MicroState> m_body_pool;  // released arenas of chunks without the head (body)
  // The last stage's per-token losses of the micro-batches forwarded since the last download,
  // one row of tokens_per_micro() floats each (m_loss_micro: their ids in order), downloaded
  // together when a loss is first asked for (micro_loss): one wait for the device per step
  // (send_step_loss after the last forward), not one per micro-batch. Then summed as before.
  mutable std::map<int, double> m_losses;
  mutable std::vector<int> m_loss_micro;
  device::Buffer m_loss_rows;
  std::size_t m_loss_slots = 0;  // rows m_loss_rows holds
  /// Keeps micro-batch `micro`'s per-token losses (device) for micro_loss.
  void keep_losses(int micro, const float* losses);
  /// Downloads the kept rows and sums each into m_losses.
  void download_losses() const;
  // split backward: per chunk the last micro whose backward_weight ran since zero_grad()
  std::vector<int> m_last_weight_micro;

  // scratch shared by all micro-batches (calls never overlap; no call reads what an earlier call
  // left there). With bf16 activations the forward also stages the fp32 values of the bf16
  // slots in m_dres (ln1, ln2, ln_f: [B*T, C]) and m_dfc (qkv, gelu), and block_backward widens
  // qkv into m_dfc for the attention backward.
  device::Buffer m_dres, m_tp_buf, m_dqkv, m_datty, m_dfc, m_att_ws;
  // The blocks' graphs (StageSpec::graphs), keyed by pass, chunk, block and arena; declared after
  // every Buffer a graph reads, so the graphs go first.
  std::unique_ptr<device::GraphCache> m_graphs;
};

}  // namespace atlas::model
