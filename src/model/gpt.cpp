// SPDX-License-Identifier: MIT
// StageModel: parameters (layout-independent init), forward and backward of one pipeline stage /
// TP shard of the GPT model. All tensor math goes through device::Backend; this file only does
// pointer arithmetic on device addresses and host-side bookkeeping.
#include "atlas/model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::model {

using device::Trans;

namespace {

constexpr std::size_t kSlotAlign = 16;  // floats: 64-byte aligned sub-buffers

std::int64_t product(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// Host values of one shard: element i of the shard is element `full_index(i)` of the logical
// tensor, whose value is a pure function of (seed, name, full index).
std::vector<float> init_values(std::uint64_t seed, const ParamTensor& p, double init_std,
                               float init_value) {
  const auto n = static_cast<std::size_t>(p.shard_numel());
  std::vector<float> out(n, init_value);
  if (init_std <= 0.0) return out;
  const std::uint64_t key = rng::key(seed, p.name);
  const std::size_t dims = p.full_shape.size();
  std::vector<std::int64_t> idx(dims, 0);  // multi-index inside the shard
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < dims; ++d)
      flat = flat * p.full_shape[d] + p.shard_offset[d] + idx[d];
    out[i] = static_cast<float>(init_std * rng::normal(key, static_cast<std::uint64_t>(flat)));
    for (std::size_t d = dims; d-- > 0;) {  // odometer over the shard shape
      if (++idx[d] < p.shard_shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::size_t take(std::size_t& cursor, std::size_t floats) {
  const std::size_t at = cursor;
  cursor += (floats + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  return at;
}

}  // namespace

// ---- ParamTensor ----

std::int64_t ParamTensor::shard_numel() const { return product(shard_shape); }
std::int64_t ParamTensor::full_numel() const { return product(full_shape); }
int ParamTensor::shard_dim() const {
  for (std::size_t d = 0; d < full_shape.size(); ++d) {
    if (shard_shape[d] != full_shape[d]) return static_cast<int>(d);
  }
  return -1;
}

// ---- construction ----

StageModel::StageModel(const ModelCfg& cfg, int micro_batch_size, StageSpec spec,
                       device::Backend& backend, device::Collective* tp, std::uint64_t seed)
    : m_cfg(cfg), m_spec(spec), m_backend(backend), m_tp(tp) {
  ProblemList problems;
  if (cfg.layers < 1) problems.add(fmt::format("model.layers = {} must be >= 1", cfg.layers));
  if (cfg.hidden < 1) problems.add(fmt::format("model.hidden = {} must be >= 1", cfg.hidden));
  if (cfg.heads < 1) problems.add(fmt::format("model.heads = {} must be >= 1", cfg.heads));
  if (cfg.seq_len < 1) problems.add(fmt::format("model.seq_len = {} must be >= 1", cfg.seq_len));
  if (cfg.vocab < 1) problems.add(fmt::format("model.vocab = {} must be >= 1", cfg.vocab));
  if (micro_batch_size < 1) {
    problems.add(fmt::format("train.micro_batch_size = {} must be >= 1", micro_batch_size));
  }
  if (cfg.heads >= 1 && cfg.hidden % cfg.heads != 0) {
    problems.add(fmt::format("model.hidden = {} is not divisible by model.heads = {}\n"
                             "  hint: pick hidden = heads * head_dim",
                             cfg.hidden, cfg.heads));
  }
  if (spec.tp_size < 1 || (cfg.heads >= 1 && cfg.heads % spec.tp_size != 0)) {
    problems.add(fmt::format("model.heads = {} is not divisible by parallel.tp_size = {}\n"
                             "  hint: tensor parallelism splits whole heads across TP ranks",
                             cfg.heads, spec.tp_size));
  }
  if (spec.pp < 1 || spec.stage < 0 || spec.stage >= spec.pp) {
    problems.add(fmt::format("pipeline stage {} is outside [0, {})", spec.stage, spec.pp));
  }
  if (spec.tp_rank < 0 || spec.tp_rank >= std::max(1, spec.tp_size)) {
    problems.add(fmt::format("tp_rank {} is outside [0, {})", spec.tp_rank, spec.tp_size));
  }
  if (spec.pp >= 1) {
    if (!cfg.layers_per_stage.empty()) {
      if (static_cast<int>(cfg.layers_per_stage.size()) != spec.pp) {
        problems.add(fmt::format("model.layers_per_stage has {} entries but there are {} stages",
                                 cfg.layers_per_stage.size(), spec.pp));
      } else {
        const int sum = std::accumulate(cfg.layers_per_stage.begin(),
                                        cfg.layers_per_stage.end(), 0);
        if (sum != cfg.layers) {
          problems.add(fmt::format("model.layers_per_stage sums to {} but model.layers = {}", sum,
                                   cfg.layers));
        }
      }
    } else if (cfg.layers % spec.pp != 0) {
      problems.add(fmt::format("model.layers = {} does not split evenly over {} pipeline stages\n"
                               "  hint: set model.layers_per_stage",
                               cfg.layers, spec.pp));
    }
  }
  if (spec.tp_size > 1) {
    if (tp == nullptr) {
      problems.add(fmt::format("tp_size = {} but no TP collective was given", spec.tp_size));
    } else if (tp->size() != spec.tp_size || tp->rank() != spec.tp_rank) {
      problems.add(fmt::format("the TP collective has rank {} of {}, the stage expects {} of {}",
                               tp->rank(), tp->size(), spec.tp_rank, spec.tp_size));
    }
  }
  if (spec.graphs && !backend.can_capture())
    problems.add(fmt::format("device.cuda_graphs = true, but the {} backend records no graphs\n"
                             "  hint: use device.backend = cuda, or set device.cuda_graphs = false",
                             to_string(backend.kind())));
  if (spec.graphs && spec.tp_size > 1)
    problems.add(fmt::format("device.cuda_graphs = true with parallel.tp_size = {}: a block's TP sums are not "
                             "recorded in its graph\n  hint: set device.cuda_graphs = false, or parallel.tp_size = 1",
                             spec.tp_size));
  problems.throw_if_any();

  m_batch = micro_batch_size;
  m_seq = cfg.seq_len;
  m_hidden = cfg.hidden;
  m_vocab = cfg.vocab;
  m_heads = cfg.heads;
  m_local_heads = cfg.heads / spec.tp_size;
  m_head_dim = cfg.hidden / cfg.heads;
  m_local_hidden = m_local_heads * m_head_dim;
  m_local_ff = 4 * cfg.hidden / spec.tp_size;
  m_first_layer = cfg.stage_first_layer(spec.stage, spec.pp);
  m_n_layers = cfg.stage_layers(spec.stage, spec.pp);
  m_total_layers = cfg.layers;
  if (spec.chunks < 1 || m_n_layers % spec.chunks != 0) {
    ATLAS_THROW(Config, "pipeline stage " << spec.stage << " holds " << m_n_layers << " layers, which do not split into "
                                          << spec.chunks << " model chunks\n  hint: make every stage's layers a "
                                                            "multiple of schedule.virtual_stages");
  }
  m_chunk_layers = m_n_layers / spec.chunks;

  m_bf16_acts = m_backend.precision() == Precision::Bf16 && !spec.fp32_activations;
  build_params(seed);
  build_layout();

  const std::size_t n = tokens_per_micro();
  const auto c = static_cast<std::size_t>(m_hidden);
  m_dres = m_backend.alloc_floats(n * c);
  m_tp_buf = m_backend.alloc_floats(n * c);
  if (m_n_layers > 0) {
    m_dqkv = m_backend.alloc_floats(n * 3 * static_cast<std::size_t>(m_local_hidden));
    m_datty = m_backend.alloc_floats(n * static_cast<std::size_t>(m_local_hidden));
    m_dfc = m_backend.alloc_floats(n * static_cast<std::size_t>(m_local_ff));
    m_att_ws = m_backend.alloc_floats(
        m_backend.attention_workspace_floats(m_batch, m_seq, m_local_heads, m_head_dim));
  }
  m_graphs = std::make_unique<device::GraphCache>(m_backend, spec.graphs);
}

void StageModel::run_block(BlockPass pass, int chunk, int local_layer, const MicroState& st,
                           const std::function<void()>& work) {
  m_graphs->run({static_cast<int>(pass), chunk, local_layer, 0, st.arena.data()}, work);
}

StageModel::~StageModel() = default;

bool decays_by_role(std::string_view name) {
  if (name == "wte" || name == "wpe") return true;  // embeddings (wte is also the LM head)
  const auto dot = name.rfind('.');
  const std::string_view leaf = dot == std::string_view::npos ? name : name.substr(dot + 1);
  const std::string_view owner = dot == std::string_view::npos ? "" : name.substr(0, dot);
  const bool layer_norm = owner == "ln_f" || owner.ends_with(".ln_1") || owner.ends_with(".ln_2");
  if (leaf == "bias" || (layer_norm && leaf == "weight")) return false;
  if (leaf == "weight" && (owner.ends_with(".attn.qkv") || owner.ends_with(".attn.proj") ||
                           owner.ends_with(".mlp.fc") || owner.ends_with(".mlp.proj"))) {
    return true;
  }
  ATLAS_THROW(Internal, "no weight-decay rule for parameter '"
                            << name << "': give its role in model::decays_by_role");
}

void StageModel::add_param(const std::string& name, std::vector<std::int64_t> full_shape,
                           int shard_dim, double init_std, float init_value, bool tied_copy,
                           std::uint64_t seed) {
  ParamTensor p;
  p.name = name;
  p.full_shape = std::move(full_shape);
  p.shard_offset.assign(p.full_shape.size(), 0);
  p.shard_shape = p.full_shape;
  p.replicated_over_tp = shard_dim < 0;
  if (shard_dim >= 0) {
    const auto d = static_cast<std::size_t>(shard_dim);
    const std::int64_t part = p.full_shape[d] / m_spec.tp_size;
    p.shard_shape[d] = part;
    p.shard_offset[d] = part * m_spec.tp_rank;
  }
  p.decay = decays_by_role(name);
  p.tied_copy = tied_copy;
  p.counts_in_norm = !tied_copy && (!p.replicated_over_tp || m_spec.tp_rank == 0);
  const auto n = static_cast<std::size_t>(p.shard_numel());
  p.value = m_backend.alloc_floats(n);
  p.grad = m_backend.alloc_floats(n);
  p.adam_m = m_backend.alloc_floats(n);
  p.adam_v = m_backend.alloc_floats(n);
  const std::vector<float> host = init_values(seed, p, init_std, init_value);
  m_backend.upload(p.value.data(), host.data(), n * sizeof(float));
  m_params.push_back(std::move(p));
}

void StageModel::build_params(std::uint64_t seed) {
  const std::int64_t c = m_hidden;
  const double std_w = m_cfg.init_std;
  const double std_resid = m_cfg.init_std / std::sqrt(2.0 * m_total_layers);
  constexpr int kReplicated = -1;
  if (is_first()) {
    add_param("wte", {m_vocab, c}, kReplicated, std_w, 0.0F, false, seed);
    add_param("wpe", {m_seq, c}, kReplicated, std_w, 0.0F, false, seed);
  }
  for (int i = 0; i < m_n_layers; ++i) {
    const std::string h = fmt::format("h.{}.", chunk_first_layer(i / m_chunk_layers) + i % m_chunk_layers);
    add_param(h + "ln_1.weight", {c}, kReplicated, 0.0, 1.0F, false, seed);
    add_param(h + "ln_1.bias", {c}, kReplicated, 0.0, 0.0F, false, seed);
    add_param(h + "attn.qkv.weight", {3, c, c}, 1, std_w, 0.0F, false, seed);
    add_param(h + "attn.qkv.bias", {3, c}, 1, 0.0, 0.0F, false, seed);
    add_param(h + "attn.proj.weight", {c, c}, 1, std_resid, 0.0F, false, seed);
    add_param(h + "attn.proj.bias", {c}, kReplicated, 0.0, 0.0F, false, seed);
    add_param(h + "ln_2.weight", {c}, kReplicated, 0.0, 1.0F, false, seed);
    add_param(h + "ln_2.bias", {c}, kReplicated, 0.0, 0.0F, false, seed);
    add_param(h + "mlp.fc.weight", {4 * c, c}, 0, std_w, 0.0F, false, seed);
    add_param(h + "mlp.fc.bias", {4 * c}, 0, 0.0, 0.0F, false, seed);
    add_param(h + "mlp.proj.weight", {c, 4 * c}, 1, std_resid, 0.0F, false, seed);
    add_param(h + "mlp.proj.bias", {c}, kReplicated, 0.0, 0.0F, false, seed);
  }
  if (is_last()) {
    add_param("ln_f.weight", {c}, kReplicated, 0.0, 1.0F, false, seed);
    add_param("ln_f.bias", {c}, kReplicated, 0.0, 0.0F, false, seed);
    if (!is_first()) add_param("wte", {m_vocab, c}, kReplicated, std_w, 0.0F, true, seed);
  }

  // Pointers into m_params are taken only now that it no longer grows.
  m_wte = find_param("wte");
  m_wpe = find_param("wpe");
  m_lnf_w = find_param("ln_f.weight");
  m_lnf_b = find_param("ln_f.bias");
  for (int i = 0; i < m_n_layers; ++i) {
    const std::string h = fmt::format("h.{}.", chunk_first_layer(i / m_chunk_layers) + i % m_chunk_layers);
    auto get = [&](const char* suffix) { return find_param(h + suffix); };
    m_blocks.push_back(Block{get("ln_1.weight"), get("ln_1.bias"), get("attn.qkv.weight"),
                             get("attn.qkv.bias"), get("attn.proj.weight"), get("attn.proj.bias"),
                             get("ln_2.weight"), get("ln_2.bias"), get("mlp.fc.weight"),
                             get("mlp.fc.bias"), get("mlp.proj.weight"), get("mlp.proj.bias")});
  }
}

void StageModel::build_layout() {
  const std::size_t n = tokens_per_micro();
  const auto c = static_cast<std::size_t>(m_hidden);
  const auto cl = static_cast<std::size_t>(m_local_hidden);
  const auto ff = static_cast<std::size_t>(m_local_ff);
  std::size_t cur = 0;
  // A slot of `elements` values: fp32, or bf16 (2 bytes, half the 4-byte units) for the tensors
  // backward reads only as GEMM operands when stores_bf16_activations().
  auto slot = [&](const char* name, int layer, std::size_t elements, bool gemm_only) {
    const bool bf16 = gemm_only && m_bf16_acts;
    m_layout.saved.push_back({name, layer, elements, bf16 ? 2 : 4});
    return take(cur, bf16 ? (elements + 1) / 2 : elements);
  };
  // One chunk's blocks: a micro-batch is in flight per chunk (the whole stage with one chunk).
  for (int i = 0; i <= m_chunk_layers; ++i) m_layout.res.push_back(slot("res", i, n * c, false));
  for (int i = 0; i < m_chunk_layers; ++i) {
    LayerSlots s{};
    s.ln1 = slot("ln1", i, n * c, true);
    s.mean1 = slot("mean1", i, n, false);
    s.rstd1 = slot("rstd1", i, n, false);
    s.qkv = slot("qkv", i, n * 3 * cl, true);  // the attention reads q, k, v rounded
    // A split backward keeps the fp32 q/k/v gradient in this slot for W (block_backward): at bf16
    // storage the slot's other half is reserved too, so it holds n * 3 * cl floats.
    if (m_bf16_acts && m_spec.split_backward) {
      m_layout.saved.push_back({"qkv_grad", i, n * 3 * cl, 2});  // with qkv's bf16 half: n * 3 * cl floats
      take(cur, (n * 3 * cl + 1) / 2);
    }
    s.att = slot("att", i, m_backend.attention_saved_floats(m_batch, m_seq, m_local_heads, m_head_dim), false);
    s.atty = slot("atty", i, n * cl, false);  // also the attention backward's fp32 O
    s.x2 = slot("x2", i, n * c, false);
    s.ln2 = slot("ln2", i, n * c, true);
    s.mean2 = slot("mean2", i, n, false);
    s.rstd2 = slot("rstd2", i, n, false);
    s.fc = slot("fc", i, n * ff, false);  // the GELU pre-activation (gelu_backward)
    s.gelu = slot("gelu", i, n * ff, true);
    m_layout.layers.push_back(s);
  }
  m_layout.body = cur;
  if (is_last()) {
    m_layout.lnf = slot("lnf", -1, n * c, true);
    m_layout.lnf_mean = slot("lnf_mean", -1, n, false);
    m_layout.lnf_rstd = slot("lnf_rstd", -1, n, false);
    // the logits, then in place their gradient (fp32: the forward's cross-entropy reads them)
    m_layout.probs = slot("probs", -1, n * static_cast<std::size_t>(m_vocab), false);
    m_layout.losses = slot("losses", -1, n, false);
  }
  m_layout.total = cur;

  m_last_weight_micro.assign(static_cast<std::size_t>(m_spec.chunks), std::numeric_limits<int>::min());
}

std::vector<StageModel::SavedTensor> StageModel::saved_tensors() const { return m_layout.saved; }

// ---- shape and memory ----

std::size_t StageModel::tokens_per_micro() const noexcept {
  return static_cast<std::size_t>(m_batch) * static_cast<std::size_t>(m_seq);
}
std::size_t StageModel::boundary_floats() const noexcept {
  return tokens_per_micro() * static_cast<std::size_t>(m_hidden);
}
std::size_t StageModel::activation_bytes_per_micro(int chunk) const noexcept {
  // start_micro's id buffers: the tokens on the first stage, the targets on the last.
  return arena_floats(chunk) * sizeof(float) +
         static_cast<std::size_t>((is_first() ? 1 : 0) + (is_last() ? 1 : 0)) * tokens_per_micro() * sizeof(std::int32_t);
}
std::size_t StageModel::activation_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const auto& [key, st] : m_inflight) bytes += activation_bytes_per_micro(key % m_spec.chunks);
  return bytes;
}
std::vector<int> StageModel::weight_grads_pending() const {
  std::vector<int> keys;
  for (const auto& [key, st] : m_inflight)
    if (st.input_done) keys.push_back(key);
  return keys;
}
std::vector<int> StageModel::micros_in_flight() const {
  std::vector<int> ids;
  for (const auto& [key, st] : m_inflight)
    if (ids.empty() || ids.back() != key / m_spec.chunks) ids.push_back(key / m_spec.chunks);
  return ids;
}

// ---- parameters ----

void StageModel::poison_first_parameter() {
  ATLAS_ASSERT(!m_params.empty(), "a stage without parameters");
  // Every element: a single one may belong to a row no batch reads (a token that never occurs).
  ParamTensor& p = m_params.front();
  const std::vector<float> nan(static_cast<std::size_t>(p.shard_numel()), std::numeric_limits<float>::quiet_NaN());
  m_backend.upload(p.value.data(), nan.data(), nan.size() * sizeof(float));
}

ParamTensor* StageModel::find_param(std::string_view name) {
  for (auto& p : m_params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

ParamTensor* StageModel::tied_embedding() {
  if (m_spec.pp == 1 || !(is_first() || is_last())) return nullptr;
  return m_wte;
}

std::int64_t StageModel::local_parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : m_params) n += p.shard_numel();
  return n;
}

double StageModel::local_grad_sq_norm() const {
  // One call over every counted gradient: a device backend waits for the host once, not per tensor.
  std::vector<device::ConstFloats> grads;
  grads.reserve(m_params.size());
  for (const auto& p : m_params) {
    if (p.counts_in_norm) grads.push_back({p.grad.f32(), p.grad.floats()});
  }
  return m_backend.sq_norm_multi(grads);
}

void StageModel::zero_grad() {
  if (const std::vector<int> pending = weight_grads_pending(); !pending.empty()) {
    const int key = pending.front();
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": zero_grad with " << pending.size()
                                   << " backward_weight call(s) pending (micro-batch "
                                   << key / m_spec.chunks << ", chunk " << key % m_spec.chunks
                                   << " first): their weight gradients would be lost (the "
                                      "schedule must run every W before the step ends)");
  }
  for (auto& p : m_params) m_backend.fill(p.grad.f32(), 0.0F, p.grad.floats());
  m_losses.clear();
  m_loss_micro.clear();  // forwarded and never asked for: dropped with the step
  std::fill(m_last_weight_micro.begin(), m_last_weight_micro.end(), std::numeric_limits<int>::min());
}

// ---- forward ----

void StageModel::tp_allreduce(device::Buffer& buf) {
  if (m_spec.tp_size > 1) m_tp->allreduce_sum(buf, boundary_floats());
}

int StageModel::chunk_first_layer(int chunk) const noexcept {
  // Virtual stage chunk * pp + stage: every chunk of every stage holds stage_layers / chunks
  // blocks, so chunk c starts after c whole passes over the stages plus this stage's predecessors.
  return (chunk * m_total_layers + m_first_layer) / m_spec.chunks;
}

StageModel::MicroState& StageModel::start_micro(int key) {
  const int micro = key / m_spec.chunks;
  if (m_inflight.count(key) != 0) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": forward of micro-batch " << micro
                                   << " while its previous forward has not been backwarded or "
                                      "released (the schedule runs a micro-batch twice)");
  }
  MicroState st;
  const std::size_t floats = arena_floats(key % m_spec.chunks);
  std::vector<MicroState>& pool = floats == m_layout.total ? m_pool : m_body_pool;
  if (!pool.empty()) {
    st = std::move(pool.back());
    pool.pop_back();
  } else {
    st.arena = m_backend.alloc_floats(floats);
    if (is_first()) st.tokens = m_backend.alloc(tokens_per_micro() * sizeof(std::int32_t));
    if (is_last()) st.targets = m_backend.alloc(tokens_per_micro() * sizeof(std::int32_t));
  }
  st.input_done = false;
  return m_inflight.emplace(key, std::move(st)).first->second;
}

void StageModel::forward(int micro, const std::int32_t* tokens, const std::int32_t* targets,
                         const device::Buffer* act_in, device::Buffer* act_out, int chunk) {
  ATLAS_ASSERT(chunk >= 0 && chunk < m_spec.chunks, "forward of chunk " << chunk << " of " << m_spec.chunks);
  const bool embed = runs_embedding(chunk);
  const bool head = runs_head(chunk);
  const std::size_t n = tokens_per_micro();
  const std::size_t boundary = boundary_floats();
  // Check every argument before touching any state, so a failure leaves the model unchanged.
  auto check_ids = [&](const std::int32_t* ids, const char* what) {
    if (ids == nullptr) {
      ATLAS_THROW(Internal, "stage " << m_spec.stage << ": forward(micro " << micro
                                     << ") needs host " << what);
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= m_vocab) {
        ATLAS_THROW(Config, what << "[" << i << "] = " << ids[i] << " of micro-batch " << micro
                                 << " is outside the vocabulary [0, " << m_vocab
                                 << ")\n  hint: model.vocab must cover the tokenizer (256 for "
                                    "the byte-level tokenizer)");
      }
    }
  };
  auto check_buf = [&](const device::Buffer* b, const char* what) {
    if (b == nullptr || b->floats() < boundary) {
      ATLAS_THROW(Internal, "stage " << m_spec.stage << ": forward(micro " << micro << ") needs "
                                     << what << " of " << boundary << " floats, got "
                                     << (b ? b->floats() : 0));
    }
  };
  if (embed) check_ids(tokens, "tokens");
  else check_buf(act_in, "act_in");
  if (head) check_ids(targets, "targets");
  else check_buf(act_out, "act_out");

  MicroState& st = start_micro(key_of(micro, chunk));
  float* res0 = at(st, m_layout.res[0]);
  if (embed) {
    m_backend.upload(st.tokens.data(), tokens, n * sizeof(std::int32_t));
    m_backend.embedding_forward(res0, st.tokens.i32(), m_wte->value.f32(), m_wpe->value.f32(),
                                m_batch, m_seq, m_hidden);
  } else {
    m_backend.copy(res0, act_in->data(), boundary * sizeof(float));
  }
  for (int i = 0; i < m_chunk_layers; ++i)
    run_block(BlockPass::Forward, chunk, i, st, [&, i] { block_forward(i, st, chunk); });

  const float* out = at(st, m_layout.res[static_cast<std::size_t>(m_chunk_layers)]);
  if (!head) {
    m_backend.copy(act_out->data(), out, boundary * sizeof(float));
    return;
  }
  // final LayerNorm, tied LM head, softmax cross-entropy
  const int rows = static_cast<int>(n);
  float* lnf = m_bf16_acts ? m_dres.f32() : at(st, m_layout.lnf);  // fp32 (staged if bf16)
  float* probs = at(st, m_layout.probs);
  float* losses = at(st, m_layout.losses);
  m_backend.upload(st.targets.data(), targets, n * sizeof(std::int32_t));
  if (m_chunk_layers == 0) {  // else the last block's residual call did it (block_forward)
    m_backend.layernorm_forward(lnf, at(st, m_layout.lnf_mean), at(st, m_layout.lnf_rstd), out,
                                m_lnf_w->value.f32(), m_lnf_b->value.f32(), rows, m_hidden);
  }
  if (m_bf16_acts) {  // rounded into its slot, which the GEMM reads (as block_forward)
    m_backend.to_bf16(at_bf16(st, m_layout.lnf), lnf, boundary);
    m_backend.linear_forward_bf16_in(probs, nullptr, at_bf16(st, m_layout.lnf), m_wte->value.f32(),
                                     nullptr, rows, m_hidden, m_vocab, device::Activation::None);
  } else {
    m_backend.linear_forward(probs, nullptr, lnf, m_wte->value.f32(), nullptr, rows, m_hidden,
                             m_vocab, device::Activation::None);  // logits (tied head, no bias)
  }
  // Loss and dlogits in one pass over the logits (replaced in place by their gradient, which
  // backward() then uses): the loss scale is the one set when the forward runs.
  m_backend.softmax_xent_fused(losses, probs, probs, st.targets.i32(), rows, m_vocab,
                               m_loss_scale / static_cast<float>(rows));
  keep_losses(micro, losses);
}

void StageModel::keep_losses(int micro, const float* losses) {
  const std::size_t n = tokens_per_micro();
  if (m_loss_micro.size() == m_loss_slots) {
    // Full (or first use): fetch what it holds, and make room for twice as many from now on (a
    // step's micro-batches fit after a step or two: one download per step).
    download_losses();
    m_loss_slots = std::max<std::size_t>(8, 2 * m_loss_slots);
    m_loss_rows = device::Buffer();
    m_loss_rows = m_backend.alloc_floats(m_loss_slots * n);
  }
  m_backend.copy(m_loss_rows.f32() + m_loss_micro.size() * n, losses, n * sizeof(float));
  m_loss_micro.push_back(micro);
}

void StageModel::download_losses() const {
  if (m_loss_micro.empty()) return;
  const std::size_t n = tokens_per_micro();
  std::vector<float> host(m_loss_micro.size() * n);
  m_backend.download(host.data(), m_loss_rows.f32(), host.size() * sizeof(float));
  for (std::size_t k = 0; k < m_loss_micro.size(); ++k) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += host[k * n + i];
    m_losses[m_loss_micro[k]] = sum / static_cast<double>(n);  // a later forward of an id wins
  }
  m_loss_micro.clear();
}

void StageModel::block_forward(int i, MicroState& st, int chunk) {
  const Block& p = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i)];
  const LayerSlots& s = m_layout.layers[static_cast<std::size_t>(i)];
  const int n = static_cast<int>(tokens_per_micro());
  const int c = m_hidden;
  const int cl = m_local_hidden;
  const int ff = m_local_ff;
  const float* x = at(st, m_layout.res[static_cast<std::size_t>(i)]);
  float* out = at(st, m_layout.res[static_cast<std::size_t>(i) + 1]);
  // The fp32 values the forward computes: the arena's slots, or, for the slots stored as bf16,
  // staging in the backward's scratch (m_dres, m_dfc), rounded into the slot; the GEMMs then
  // read the slot, the attention the staged q/k/v (both round to bf16 themselves: bitwise the
  // same either way).
  const bool b16 = m_bf16_acts;
  const auto nn = static_cast<std::size_t>(n);
  float* ln1 = b16 ? m_dres.f32() : at(st, s.ln1);
  float* qkv = b16 ? m_dfc.f32() : at(st, s.qkv);
  float* atty = at(st, s.atty);
  float* x2 = at(st, s.x2);
  float* ln2 = b16 ? m_dres.f32() : at(st, s.ln2);
  float* fc = at(st, s.fc);
  float* gelu = b16 ? m_dfc.f32() : at(st, s.gelu);
  auto& be = m_backend;
  // A linear layer on the fp32 `in`; with bf16 storage `in` (staged) is first rounded into its
  // arena slot, which the GEMM then reads (on a device: no second rounding pass over `in`).
  auto linear_forward = [&](float* y, float* pre, const float* in, std::size_t slot, const ParamTensor* w,
                            const ParamTensor* b, int in_f, int out_f, device::Activation act) {
    const float* bias = b != nullptr ? b->value.f32() : nullptr;
    if (!b16) {
      be.linear_forward(y, pre, in, w->value.f32(), bias, n, in_f, out_f, act);
      return;
    }
    device::Bf16Bits* stored = at_bf16(st, slot);
    be.to_bf16(stored, in, nn * static_cast<std::size_t>(in_f));
    be.linear_forward_bf16_in(y, pre, stored, w->value.f32(), bias, n, in_f, out_f, act);
  };

  // attention: x2 = x + proj(attn(qkv(ln1(x))))  (qkv column-parallel, proj row-parallel);
  // ln1 of a block after the first was written by the previous block's residual call
  if (i == 0) {
    be.layernorm_forward(ln1, at(st, s.mean1), at(st, s.rstd1), x, p.ln1_w->value.f32(),
                         p.ln1_b->value.f32(), n, c);
  }
  linear_forward(qkv, nullptr, ln1, s.ln1, p.qkv_w, p.qkv_b, c, 3 * cl, device::Activation::None);
  be.attention_forward(atty, at(st, s.att), qkv, m_batch, m_seq, m_local_heads, m_head_dim,
                       m_att_ws.f32());
  if (b16) be.to_bf16(at_bf16(st, s.qkv), qkv, nn * 3 * static_cast<std::size_t>(cl));
  // proj without its bias: that is added after the TP sum (row-parallel)
  be.linear_forward(m_tp_buf.f32(), nullptr, atty, p.proj_w->value.f32(), nullptr, n, cl, c,
                    device::Activation::None);
  tp_allreduce(m_tp_buf);
  // x2 = x + proj + bias (the bias after the TP sum: it is replicated), then ln2 = LN(x2)
  be.residual_layernorm_forward(x2, ln2, at(st, s.mean2), at(st, s.rstd2), x, m_tp_buf.f32(),
                                p.proj_b->value.f32(), p.ln2_w->value.f32(),
                                p.ln2_b->value.f32(), n, c);

  // MLP: out = x2 + proj(gelu(fc(ln2(x2))))  (fc column-parallel, proj row-parallel)
  linear_forward(gelu, fc, ln2, s.ln2, p.fc_w, p.fc_b, c, ff, device::Activation::Gelu);
  linear_forward(m_tp_buf.f32(), nullptr, gelu, s.gelu, p.mp_w, nullptr, ff, c, device::Activation::None);
  tp_allreduce(m_tp_buf);
  // out = x2 + proj + bias, fused with the LayerNorm that reads it next: the next block's ln1,
  // or ln_f after the last block of the head chunk (the same calls in the same order as before)
  float* next_ln = nullptr;
  float* next_mean = nullptr;
  float* next_rstd = nullptr;
  const ParamTensor* next_w = nullptr;
  const ParamTensor* next_b = nullptr;
  if (i + 1 < m_chunk_layers) {
    const Block& q = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i + 1)];
    const LayerSlots& t = m_layout.layers[static_cast<std::size_t>(i) + 1];
    next_ln = b16 ? m_dres.f32() : at(st, t.ln1);
    next_mean = at(st, t.mean1);
    next_rstd = at(st, t.rstd1);
    next_w = q.ln1_w;
    next_b = q.ln1_b;
  } else if (runs_head(chunk)) {
    next_ln = b16 ? m_dres.f32() : at(st, m_layout.lnf);
    next_mean = at(st, m_layout.lnf_mean);
    next_rstd = at(st, m_layout.lnf_rstd);
    next_w = m_lnf_w;
    next_b = m_lnf_b;
  }
  be.residual_layernorm_forward(out, next_ln, next_mean, next_rstd, x2, m_tp_buf.f32(),
                                p.mp_b->value.f32(), next_w ? next_w->value.f32() : nullptr,
                                next_b ? next_b->value.f32() : nullptr, n, c);
}

double StageModel::micro_loss(int micro) const {
  if (!is_last()) {
    ATLAS_THROW(Internal, "micro_loss asked of stage " << m_spec.stage << " of " << m_spec.pp
                                                        << "; only the last stage has the loss");
  }
  download_losses();
  const auto it = m_losses.find(micro);
  if (it == m_losses.end()) {
    ATLAS_THROW(Internal, "no loss for micro-batch " << micro << " (not forwarded since the last "
                                                        "zero_grad)");
  }
  return it->second;
}

std::vector<float> StageModel::logits(int micro) {
  ATLAS_ASSERT(is_last(), "logits asked of stage " << m_spec.stage << " of " << m_spec.pp);
  const auto it = m_inflight.find(key_of(micro, m_spec.chunks - 1));
  ATLAS_ASSERT(it != m_inflight.end(), "no activations for micro-batch " << micro);
  const std::size_t n = tokens_per_micro();
  device::Buffer out = m_backend.alloc_floats(n * static_cast<std::size_t>(m_vocab));
  device::Buffer widened;  // the bf16-stored ln_f as fp32 (exact; the GEMM rounds to bf16 anyway)
  const float* lnf = at(it->second, m_layout.lnf);
  if (m_bf16_acts) {
    widened = m_backend.alloc_floats(boundary_floats());
    m_backend.from_bf16(widened.f32(), at_bf16(it->second, m_layout.lnf), boundary_floats());
    lnf = widened.f32();
  }
  m_backend.gemm(Trans::No, Trans::Yes, static_cast<int>(n), m_vocab, m_hidden, 1.0F, lnf,
                 m_hidden, m_wte->value.f32(), m_hidden, 0.0F, out.f32(), m_vocab);
  std::vector<float> host(n * static_cast<std::size_t>(m_vocab));
  m_backend.download(host.data(), out.data(), host.size() * sizeof(float));
  return host;
}

void StageModel::release(int micro, int chunk) {
  auto it = m_inflight.find(key_of(micro, chunk));
  if (it == m_inflight.end()) return;
  (arena_floats(chunk) == m_layout.total ? m_pool : m_body_pool).push_back(std::move(it->second));
  m_inflight.erase(it);
}

// ---- backward ----

void StageModel::backward(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                          const GradsReady* ready, int chunk) {
  run_backward(micro, grad_out, grad_in, ready, chunk, "backward", false);
  release(micro, chunk);
}

void StageModel::backward_input(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                                int chunk) {
  ATLAS_ASSERT(chunk >= 0 && chunk < m_spec.chunks, "backward_input of chunk " << chunk << " of " << m_spec.chunks);
  if (m_bf16_acts && !m_spec.split_backward) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": backward_input at bf16 activation storage, but the model "
                                   << "was built without StageSpec::split_backward (the q/k/v gradient W needs has "
                                      "no room in its bf16 slot): build it with split_backward = true");
  }
  run_backward(micro, grad_out, grad_in, nullptr, chunk, "backward_input", true);
  m_inflight.at(key_of(micro, chunk)).input_done = true;
}

void StageModel::backward_weight(int micro, const GradsReady* ready, int chunk) {
  ATLAS_ASSERT(chunk >= 0 && chunk < m_spec.chunks, "backward_weight of chunk " << chunk << " of " << m_spec.chunks);
  const int key = key_of(micro, chunk);
  int& last = m_last_weight_micro[static_cast<std::size_t>(chunk)];
  const auto it = m_inflight.find(key);
  if (it == m_inflight.end() || !it->second.input_done) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": backward_weight of micro-batch " << micro << " (chunk "
                                   << chunk << ") without a pending backward_input"
                                   << (micro == last ? ": its W already ran (W twice)"
                                                     : ": W before its B, or W twice")
                                   << " (the schedule's B/W slots are out of order)");
  }
  if (micro <= last) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": backward_weight of micro-batch " << micro << " (chunk "
                                   << chunk << ") after that of micro-batch " << last
                                   << ": the W's of a chunk must run in increasing micro order (each "
                                      "weight then sums its micro-batches in backward()'s order)");
  }
  MicroState& st = it->second;
  auto& be = m_backend;
  const int rows = static_cast<int>(tokens_per_micro());
  if (runs_head(chunk)) {
    if (m_bf16_acts) {
      be.linear_backward_weight_bf16_in(m_wte->grad.f32(), nullptr, at(st, m_layout.probs),
                                        at_bf16(st, m_layout.lnf), rows, m_hidden, m_vocab);
    } else {
      be.linear_backward_weight(m_wte->grad.f32(), nullptr, at(st, m_layout.probs), at(st, m_layout.lnf), rows,
                                m_hidden, m_vocab);
    }
    if (ready) {
      ParamTensor* const head[] = {m_lnf_w, m_lnf_b, m_wte};
      (*ready)(std::span<ParamTensor* const>(head, is_first() ? 2 : 3));
    }
  }
  for (int i = m_chunk_layers - 1; i >= 0; --i) {
    run_block(BlockPass::Weight, chunk, i, st, [&, i] { block_weight(i, st, chunk); });
    if (ready) {
      const Block& b = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i)];
      ParamTensor* const block[] = {b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b,
                                    b.ln2_w, b.ln2_b, b.fc_w,  b.fc_b,  b.mp_w,   b.mp_b};
      (*ready)(block);
    }
  }
  if (runs_embedding(chunk)) {
    // the embeddings' output gradient, which backward_input left over res[0]
    be.embedding_backward(m_wte->grad.f32(), m_wpe->grad.f32(), at(st, m_layout.res[0]), st.tokens.i32(), m_batch,
                          m_seq, m_hidden);
    if (ready) {
      ParamTensor* const embed[] = {m_wte, m_wpe};
      (*ready)(embed);
    }
  }
  last = micro;
  release(micro, chunk);
}

void StageModel::run_backward(int micro, const device::Buffer* grad_out, device::Buffer* grad_in,
                              const GradsReady* ready, int chunk, const char* what, bool split) {
  const bool embeds = runs_embedding(chunk);
  const bool heads = runs_head(chunk);
  auto it = m_inflight.find(key_of(micro, chunk));
  if (it == m_inflight.end()) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": " << what << " of micro-batch " << micro
                                   << " without its forward");
  }
  if (it->second.input_done) {
    ATLAS_THROW(Internal, "stage " << m_spec.stage << ": " << what << " of micro-batch " << micro << " (chunk "
                                   << chunk << ") after its backward_input (B twice, or B and a whole "
                                      "backward): its backward_weight is pending");
  }
  const std::size_t boundary = boundary_floats();
  auto check_buf = [&](const device::Buffer* b, const char* name) {
    if (b == nullptr || b->floats() < boundary) {
      ATLAS_THROW(Internal, "stage " << m_spec.stage << ": " << what << "(micro " << micro << ") needs "
                                     << name << " of " << boundary << " floats, got "
                                     << (b ? b->floats() : 0));
    }
  };
  if (!heads) check_buf(grad_out, "grad_out");
  if (!embeds) check_buf(grad_in, "grad_in");

  MicroState& st = it->second;
  auto& be = m_backend;
  const int rows = static_cast<int>(tokens_per_micro());
  float* dres = m_dres.f32();
  const float* top = at(st, m_layout.res[static_cast<std::size_t>(m_chunk_layers)]);
  if (heads) {
    // tied head (dlogits: the forward's softmax_xent_fused left them in place of the logits),
    // final LayerNorm; split: the head's weight gradient is W's (dlogits stay in the arena)
    const float* dlogits = at(st, m_layout.probs);
    float* dwte = split ? nullptr : m_wte->grad.f32();
    if (m_bf16_acts) {
      be.linear_backward_bf16_in(m_tp_buf.f32(), dwte, nullptr, dlogits, at_bf16(st, m_layout.lnf),
                                 m_wte->value.f32(), nullptr, rows, m_hidden, m_vocab,
                                 device::Activation::None);
    } else {
      be.linear_backward(m_tp_buf.f32(), dwte, nullptr, dlogits, at(st, m_layout.lnf),
                         m_wte->value.f32(), nullptr, rows, m_hidden, m_vocab,
                         device::Activation::None);
    }
    be.fill(dres, 0.0F, boundary);
    be.layernorm_backward(dres, m_lnf_w->grad.f32(), m_lnf_b->grad.f32(), m_tp_buf.f32(), top,
                          m_lnf_w->value.f32(), at(st, m_layout.lnf_mean),
                          at(st, m_layout.lnf_rstd), rows, m_hidden);
    if (ready) {
      // With one stage the embedding is the head's weight too: it is final only at the end.
      ParamTensor* const head[] = {m_lnf_w, m_lnf_b, m_wte};
      (*ready)(std::span<ParamTensor* const>(head, is_first() ? 2 : 3));
    }
  } else {
    be.copy(dres, grad_out->data(), boundary * sizeof(float));
  }
  for (int i = m_chunk_layers - 1; i >= 0; --i) {
    run_block(split ? BlockPass::BackwardInput : BlockPass::Backward, chunk, i, st,
              [&, i] { block_backward(i, st, chunk, split); });
    if (ready) {
      const Block& b = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i)];
      ParamTensor* const block[] = {b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b,
                                    b.ln2_w, b.ln2_b, b.fc_w,  b.fc_b,  b.mp_w,   b.mp_b};
      (*ready)(block);
    }
  }
  if (embeds) {
    if (split) {
      // W's embedding gradient, over the embedding output (block 0's backward consumed it)
      be.copy(at(st, m_layout.res[0]), dres, boundary * sizeof(float));
    } else {
      be.embedding_backward(m_wte->grad.f32(), m_wpe->grad.f32(), dres, st.tokens.i32(), m_batch,
                            m_seq, m_hidden);
    }
    if (ready) {
      ParamTensor* const embed[] = {m_wte, m_wpe};
      (*ready)(embed);
    }
  } else {
    be.copy(grad_in->data(), dres, boundary * sizeof(float));
  }
}

void StageModel::block_backward(int i, MicroState& st, int chunk, bool split) {
  const Block& p = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i)];
  const LayerSlots& s = m_layout.layers[static_cast<std::size_t>(i)];
  const int n = static_cast<int>(tokens_per_micro());
  const int c = m_hidden;
  const int cl = m_local_hidden;
  const int ff = m_local_ff;
  const float* x = at(st, m_layout.res[static_cast<std::size_t>(i)]);
  const float* qkv = at(st, s.qkv);
  const float* atty = at(st, s.atty);
  const float* x2 = at(st, s.x2);
  const float* fc = at(st, s.fc);
  float* dres = m_dres.f32();  // holds dL/d(block output) on entry, dL/dx on exit
  float* dtp = m_tp_buf.f32();
  float* dfc = m_dfc.f32();
  float* dqkv = m_dqkv.f32();
  float* datty = m_datty.f32();
  auto& be = m_backend;
  // Split: the input half only (no linear weight/bias gradient). The four linears' output
  // gradients, which their weight gradients need besides the saved inputs, are copied over
  // activations this backward has consumed (so W costs no memory beyond the arena): the block's
  // output res[i+1] (the next block's input, whose backward ran first, or the chunk's top),
  // fc (read by the GELU backward), x2 (read by ln_2's backward), qkv (read by attention's; at
  // bf16 storage its slot is reserved at fp32 size when StageSpec::split_backward).
  const auto nn = static_cast<std::size_t>(n);
  auto keep = [&](std::size_t slot, const float* src, std::size_t floats) {
    if (split) be.copy(at(st, slot), src, floats * sizeof(float));
  };
  auto wgrad = [split](ParamTensor* t) { return split ? nullptr : t->grad.f32(); };
  // linear_backward whose input is the saved activation in `slot` (bf16 or fp32, build_layout)
  auto linear_backward = [&](float* din, ParamTensor* w, ParamTensor* b, const float* dout,
                             std::size_t slot, const float* in_pre, int in_f, int out_f,
                             device::Activation act) {
    if (m_bf16_acts) {
      be.linear_backward_bf16_in(din, wgrad(w), wgrad(b), dout, at_bf16(st, slot),
                                 w->value.f32(), in_pre, n, in_f, out_f, act);
    } else {
      be.linear_backward(din, wgrad(w), wgrad(b), dout, at(st, slot), w->value.f32(), in_pre, n,
                         in_f, out_f, act);
    }
  };

  // MLP (dres = dL/dout, replicated over TP)
  // dfc = dL/d(fc pre-activation): the GELU backward rides on the proj's input gradient
  keep(m_layout.res[static_cast<std::size_t>(i) + 1], dres, nn * static_cast<std::size_t>(c));
  linear_backward(dfc, p.mp_w, p.mp_b, dres, s.gelu, fc, ff, c, device::Activation::Gelu);
  keep(s.fc, dfc, nn * static_cast<std::size_t>(ff));
  linear_backward(dtp, p.fc_w, p.fc_b, dfc, s.ln2, nullptr, c, ff, device::Activation::None);
  tp_allreduce(m_tp_buf);  // column-parallel input gradient
  be.layernorm_backward(dres, p.ln2_w->grad.f32(), p.ln2_b->grad.f32(), dtp, x2,
                        p.ln2_w->value.f32(), at(st, s.mean2), at(st, s.rstd2), n, c);

  // attention (dres = dL/dx2)
  keep(s.x2, dres, nn * static_cast<std::size_t>(c));
  be.linear_backward(datty, wgrad(p.proj_w), wgrad(p.proj_b), dres, atty, p.proj_w->value.f32(),
                     nullptr, n, cl, c, device::Activation::None);
  if (m_bf16_acts) {  // widened (exactly) into m_dfc, free again after the MLP's backward
    be.from_bf16(dfc, at_bf16(st, s.qkv), nn * 3 * static_cast<std::size_t>(cl));
    qkv = dfc;
  }
  be.attention_backward(dqkv, datty, qkv, atty, at(st, s.att), m_batch, m_seq, m_local_heads,
                        m_head_dim, m_att_ws.f32());
  keep(s.qkv, dqkv, nn * 3 * static_cast<std::size_t>(cl));
  linear_backward(dtp, p.qkv_w, p.qkv_b, dqkv, s.ln1, nullptr, c, 3 * cl, device::Activation::None);
  tp_allreduce(m_tp_buf);
  be.layernorm_backward(dres, p.ln1_w->grad.f32(), p.ln1_b->grad.f32(), dtp, x,
                        p.ln1_w->value.f32(), at(st, s.mean1), at(st, s.rstd1), n, c);
}

void StageModel::block_weight(int i, MicroState& st, int chunk) {
  const Block& p = m_blocks[static_cast<std::size_t>(chunk * m_chunk_layers + i)];
  const LayerSlots& s = m_layout.layers[static_cast<std::size_t>(i)];
  const int n = static_cast<int>(tokens_per_micro());
  const int c = m_hidden;
  const int cl = m_local_hidden;
  const int ff = m_local_ff;
  auto& be = m_backend;
  // The weight halves of block_backward's four linear_backward calls, in the same order, each
  // from the output gradient it kept (block_backward) and the forward's saved input.
  // `in` from its slot: bf16 where build_layout stores it so (gemm_only slots at bf16), else fp32
  auto weight = [&](ParamTensor* w, ParamTensor* b, const float* dout, std::size_t slot, bool gemm_only,
                    int in_f, int out_f) {
    if (gemm_only && m_bf16_acts) {
      be.linear_backward_weight_bf16_in(w->grad.f32(), b->grad.f32(), dout, at_bf16(st, slot), n, in_f, out_f);
    } else {
      be.linear_backward_weight(w->grad.f32(), b->grad.f32(), dout, at(st, slot), n, in_f, out_f);
    }
  };
  weight(p.mp_w, p.mp_b, at(st, m_layout.res[static_cast<std::size_t>(i) + 1]), s.gelu, true, ff, c);
  weight(p.fc_w, p.fc_b, at(st, s.fc), s.ln2, true, c, ff);
  weight(p.proj_w, p.proj_b, at(st, s.x2), s.atty, false, cl, c);
  weight(p.qkv_w, p.qkv_b, at(st, s.qkv), s.ln1, true, c, 3 * cl);
}

}  // namespace atlas::model
