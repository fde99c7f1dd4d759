// SPDX-License-Identifier: MIT
// The inference model (see model.hpp). Every tensor operation goes through device::Backend; this
// file does pointer arithmetic on device addresses and host-side checks only. Attention over the
// KV cache: per head, scores = Q K^T / sqrt(D) over all cached positions, future positions of the
// chunk set to -inf, a row softmax (Backend::softmax_xent_forward with dummy targets: exp(-inf)
// is exactly 0, so the probabilities equal a softmax over the causal prefix), then P V.
#include "atlas/bubbletea/model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/model/rng.hpp"
#include "atlas/mpi/agree.hpp"

namespace atlas::bubbletea {

using device::Trans;

namespace {

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

}  // namespace

InferShape InferShape::from(const BubbleTeaCfg& cfg) {
  return InferShape{cfg.layers, cfg.hidden, cfg.heads, cfg.context, cfg.vocab};
}

LayerRange split_layers(int layers, int ranks, int index) {
  if (ranks < 1 || index < 0 || index >= ranks)
    ATLAS_THROW(Internal, "split_layers: index " << index << " outside [0, " << ranks << ")");
  if (layers < ranks)
    throw ConfigError(fmt::format(
        "bubbletea.layers = {} is fewer than the {} ranks of an inference pipeline (bubbletea.pipeline; every "
        "rank of it holds at least one inference block)\n  hint: set bubbletea.layers to {} or more",
        layers, ranks, ranks));
  const int base = layers / ranks;
  const int extra = layers % ranks;
  LayerRange r;
  r.count = base + (index < extra ? 1 : 0);
  r.first = index * base + std::min(index, extra);
  r.has_embedding = index == 0;
  r.has_head = index == ranks - 1;
  return r;
}

PipelinePlace pipeline_place(InferPipeline mode, const topo::Layout& layout, int world_rank) {
  const topo::Coord c = layout.coord(world_rank);
  const bool across = layout.dp_across_dcs();
  // The DC's stages: all of them with dp_across_dcs (each DC holds whole pipelines).
  const int first_stage = across ? 0 : layout.first_stage_of_dc(c.dc);
  const int stages = across ? layout.pp_size() : layout.stages_per_dc()[static_cast<std::size_t>(c.dc)];
  PipelinePlace p;
  p.dc = c.dc;
  if (mode == InferPipeline::Replica) {
    p.pipeline = c.dc * layout.dp_size() + c.dp;
    p.index = (c.stage - first_stage) * layout.tp_size() + c.tp;
    p.size = stages * layout.tp_size();
  } else {
    const int first_dp = across ? c.dc * layout.dp_per_dc() : 0;
    p.pipeline = c.dc;
    p.index = world_rank - layout.world_rank(topo::Coord{c.dc, first_stage, first_dp, 0});
    p.size = layout.ranks_in_dc(c.dc);
  }
  return p;
}

std::vector<PipelinePlace> serving_pipelines(InferPipeline mode, const topo::Layout& layout) {
  // A pipeline's first rank (index 0) stands for it; DC by DC, then by place within the DC.
  std::vector<std::vector<PipelinePlace>> per_dc(static_cast<std::size_t>(layout.dc_count()));
  for (int s = 0; s < layout.pp_size(); ++s)
    for (int d = 0; d < layout.dp_size(); ++d) {
      const PipelinePlace p = pipeline_place(mode, layout, layout.world_rank(s, d, 0));
      if (p.index == 0) per_dc[static_cast<std::size_t>(p.dc)].push_back(p);
    }
  std::vector<PipelinePlace> out;
  for (std::size_t k = 0;; ++k) {
    const std::size_t before = out.size();
    for (const auto& pipes : per_dc)
      if (k < pipes.size()) out.push_back(pipes[k]);
    if (out.size() == before) break;
  }
  return out;
}

std::size_t KvCache::bytes() const {
  std::size_t b = 0;
  for (const auto& x : k) b += x.bytes();
  for (const auto& x : v) b += x.bytes();
  return b + modelled_bytes;
}

std::vector<int> chunk_sizes(int prompt_tokens, int chunk_tokens) {
  std::vector<int> out;
  if (prompt_tokens <= 0) return out;
  if (chunk_tokens <= 0 || chunk_tokens >= prompt_tokens) return {prompt_tokens};
  for (int done = 0; done < prompt_tokens; done += chunk_tokens)
    out.push_back(std::min(chunk_tokens, prompt_tokens - done));
  return out;
}

// ---- construction ----

InferenceModel::InferenceModel(const InferShape& shape, LayerRange range, device::Backend& backend,
                               int max_chunk, bool emulated)
    : m_shape(shape), m_range(range), m_backend(backend), m_max_chunk(max_chunk), m_emulated(emulated) {
  ProblemList problems;
  if (shape.layers < 1 || shape.hidden < 1 || shape.heads < 1 || shape.context < 1 || shape.vocab < 1)
    problems.add(fmt::format("bubbletea model sizes must be positive (layers {}, hidden {}, heads {}, "
                             "context {}, vocab {})",
                             shape.layers, shape.hidden, shape.heads, shape.context, shape.vocab));
  else if (shape.hidden % shape.heads != 0)
    problems.add(fmt::format("bubbletea.hidden = {} is not divisible by bubbletea.heads = {}", shape.hidden,
                             shape.heads));
  if (range.first < 0 || range.count < 0 || range.first + range.count > shape.layers)
    problems.add(fmt::format("inference layer range [{}, {}) is outside the model's {} blocks", range.first,
                             range.first + range.count, shape.layers));
  if (max_chunk < 1 || max_chunk > shape.context)
    problems.add(fmt::format("inference chunk of {} tokens is outside [1, bubbletea.context = {}]", max_chunk,
                             shape.context));
  problems.throw_if_any();

  const std::int64_t c = shape.hidden;
  if (range.has_embedding) {
    add("wte", {shape.vocab, c});
    add("wpe", {shape.context, c});
  }
  for (int i = 0; i < range.count; ++i) {
    const std::string h = fmt::format("h.{}.", range.first + i);
    add(h + "ln_1.weight", {c});
    add(h + "ln_1.bias", {c});
    add(h + "attn.qkv.weight", {3, c, c});
    add(h + "attn.qkv.bias", {3, c});
    add(h + "attn.proj.weight", {c, c});
    add(h + "attn.proj.bias", {c});
    add(h + "ln_2.weight", {c});
    add(h + "ln_2.bias", {c});
    add(h + "mlp.fc.weight", {4 * c, c});
    add(h + "mlp.fc.bias", {4 * c});
    add(h + "mlp.proj.weight", {c, 4 * c});
    add(h + "mlp.proj.bias", {c});
  }
  if (range.has_head) {
    add("ln_f.weight", {c});
    add("ln_f.bias", {c});
    if (!range.has_embedding) add("wte", {shape.vocab, c});
  }
  // Pointers are taken once the list stopped growing.
  auto ptr = [this](const std::string& name) -> const float* {
    InferParam* p = find(name);
    return p ? p->value.f32() : nullptr;
  };
  m_wte = ptr("wte");
  m_wpe = ptr("wpe");
  m_lnf_w = ptr("ln_f.weight");
  m_lnf_b = ptr("ln_f.bias");
  for (int i = 0; i < range.count; ++i) {
    const std::string h = fmt::format("h.{}.", range.first + i);
    m_blocks.push_back(BlockParams{ptr(h + "ln_1.weight"), ptr(h + "ln_1.bias"), ptr(h + "attn.qkv.weight"),
                                   ptr(h + "attn.qkv.bias"), ptr(h + "attn.proj.weight"), ptr(h + "attn.proj.bias"),
                                   ptr(h + "ln_2.weight"), ptr(h + "ln_2.bias"), ptr(h + "mlp.fc.weight"),
                                   ptr(h + "mlp.fc.bias"), ptr(h + "mlp.proj.weight"), ptr(h + "mlp.proj.bias")});
  }

  if (emulated) return;  // shape only: no scratch
  const auto n = static_cast<std::size_t>(max_chunk);
  const auto cs = static_cast<std::size_t>(c);
  m_x = backend.alloc_floats(n * cs);
  m_tokens = backend.alloc(n * sizeof(std::int32_t));
  if (range.count > 0) {
    m_ln = backend.alloc_floats(n * cs);
    m_mean = backend.alloc_floats(n);
    m_rstd = backend.alloc_floats(n);
    m_qkv = backend.alloc_floats(n * 3 * cs);
    m_scores = backend.alloc_floats(n * static_cast<std::size_t>(shape.context));
    m_atty = backend.alloc_floats(n * cs);
    m_tmp = backend.alloc_floats(n * cs);
    m_fc = backend.alloc_floats(n * 4 * cs);
    m_zeros = backend.alloc(n * sizeof(std::int32_t));  // zero-filled: the softmax's dummy targets
    m_losses = backend.alloc_floats(n);
  }
  if (range.has_head) {
    if (m_ln.empty()) {
      m_ln = backend.alloc_floats(n * cs);
      m_mean = backend.alloc_floats(n);
      m_rstd = backend.alloc_floats(n);
    }
    m_logits = backend.alloc_floats(static_cast<std::size_t>(shape.vocab));
  }
}

void InferenceModel::add(const std::string& name, std::vector<std::int64_t> shape) {
  InferParam p;
  p.name = name;
  p.shape = shape;
  p.file_shape = std::move(shape);
  if (!m_emulated) p.value = m_backend.alloc_floats(static_cast<std::size_t>(numel(p.shape)));
  m_params.push_back(std::move(p));
}

InferParam* InferenceModel::find(const std::string& name) {
  for (auto& p : m_params)
    if (p.name == name) return &p;
  return nullptr;
}

void InferenceModel::init_random(std::uint64_t seed, double init_std) {
  if (m_emulated) return;
  const double std_resid = init_std / std::sqrt(2.0 * m_shape.layers);
  for (auto& p : m_params) {
    const auto n = static_cast<std::size_t>(numel(p.shape));
    const std::string& nm = p.name;
    auto ends_with = [&nm](const char* s) {
      const std::string suffix(s);
      return nm.size() >= suffix.size() && nm.compare(nm.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    std::vector<float> host(n, 0.0F);
    const bool ln_weight = ends_with("ln_1.weight") || ends_with("ln_2.weight") || nm == "ln_f.weight";
    const bool matrix = !ends_with("bias") && !ln_weight;  // wte, wpe and the *.weight matrices
    if (ln_weight) {
      std::fill(host.begin(), host.end(), 1.0F);
    } else if (matrix) {
      const double sd = ends_with("attn.proj.weight") || ends_with("mlp.proj.weight") ? std_resid : init_std;
      // Same draw as the training model: element i of the full tensor is normal(key, i); wpe's
      // first `context` rows are the first context * C elements of the training model's wpe.
      const std::uint64_t key = model::rng::key(seed, nm);
      for (std::size_t i = 0; i < n; ++i)
        host[i] = static_cast<float>(sd * model::rng::normal(key, static_cast<std::uint64_t>(i)));
    }
    m_backend.upload(p.value.data(), host.data(), n * sizeof(float));
  }
}

void InferenceModel::set_param(const std::string& name, std::span<const float> values) {
  InferParam* p = find(name);
  if (m_emulated) ATLAS_THROW(Internal, "tensor '" << name << "': an emulated inference model holds no values");
  if (!p) ATLAS_THROW(Internal, "inference layers [" << m_range.first << ", " << m_range.first + m_range.count
                                                     << ") hold no tensor named '" << name << "'");
  if (static_cast<std::int64_t>(values.size()) != numel(p->shape))
    ATLAS_THROW(Internal, "tensor '" << name << "' has " << numel(p->shape) << " elements, got " << values.size());
  m_backend.upload(p->value.data(), values.data(), values.size() * sizeof(float));
}

std::size_t InferenceModel::weight_bytes() const {
  std::size_t b = 0;
  // An emulated model allocates nothing but stands for its tensors (the memory cap counts them).
  for (const auto& p : m_params)
    b += m_emulated ? static_cast<std::size_t>(numel(p.shape)) * sizeof(float) : p.value.bytes();
  return b;
}

std::size_t InferenceModel::scratch_bytes() const {
  std::size_t b = 0;
  for (const auto* x : {&m_x, &m_ln, &m_mean, &m_rstd, &m_qkv, &m_scores, &m_atty, &m_tmp, &m_fc, &m_tokens,
                        &m_zeros, &m_losses, &m_logits})
    b += x->bytes();
  return b;
}

std::size_t InferenceModel::kv_bytes_per_token() const {
  return 2 * static_cast<std::size_t>(m_range.count) * static_cast<std::size_t>(m_shape.hidden) * sizeof(float);
}

KvCache InferenceModel::make_cache(int capacity) const {
  if (capacity < 1 || capacity > m_shape.context)
    ATLAS_THROW(Config, "a KV cache of " << capacity << " positions is outside [1, bubbletea.context = "
                                         << m_shape.context << "]");
  KvCache c;
  c.capacity = capacity;
  if (m_emulated) {
    c.modelled_bytes = kv_bytes_per_token() * static_cast<std::size_t>(capacity);
    return c;
  }
  const std::size_t floats = static_cast<std::size_t>(capacity) * static_cast<std::size_t>(m_shape.hidden);
  for (int i = 0; i < m_range.count; ++i) {
    c.k.push_back(m_backend.alloc_floats(floats));
    c.v.push_back(m_backend.alloc_floats(floats));
  }
  return c;
}

// ---- forward ----

void InferenceModel::forward(KvCache& cache, int n, const std::int32_t* tokens, const float* act_in,
                             float* act_out, float* logits) {
  forward_begin(cache, n, tokens, act_in);
  for (int i = 0; i < m_range.count; ++i) forward_block(cache, n, i);
  forward_end(cache, n, act_out, logits);
}

void InferenceModel::forward_begin(KvCache& cache, int n, const std::int32_t* tokens, const float* act_in) {
  const int c = m_shape.hidden;
  const std::size_t nc = static_cast<std::size_t>(n) * static_cast<std::size_t>(c);
  if (n < 1 || n > m_max_chunk)
    ATLAS_THROW(Internal, "inference chunk of " << n << " tokens is outside [1, " << m_max_chunk << "]");
  if (cache.len + n > cache.capacity || (!m_emulated && static_cast<int>(cache.k.size()) != m_range.count))
    ATLAS_THROW(Config, "inference chunk at positions [" << cache.len << ", " << cache.len + n
                                                         << ") does not fit its KV cache of " << cache.capacity
                                                         << " positions (bubbletea.context = " << m_shape.context << ")");
  const int pos = cache.len;
  if (m_range.has_embedding) {
    if (!tokens) ATLAS_THROW(Internal, "the embedding rank's forward needs token ids");
    for (int i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= m_shape.vocab)
        ATLAS_THROW(Config, "prompt token " << tokens[i] << " at position " << pos + i
                                            << " is outside the inference vocabulary [0, " << m_shape.vocab << ")");
    if (!m_emulated) {
      m_backend.upload(m_tokens.data(), tokens, static_cast<std::size_t>(n) * sizeof(std::int32_t));
      m_backend.embedding_forward(m_x.f32(), m_tokens.i32(), m_wte, m_wpe + static_cast<std::size_t>(pos) * c, 1, n,
                                  c);
    }
  } else {
    if (!act_in) ATLAS_THROW(Internal, "a non-embedding rank's forward needs the previous rank's activations");
    if (!m_emulated) m_backend.upload(m_x.data(), act_in, nc * sizeof(float));
  }
  m_chunk_n = n;
  m_chunk_blocks_done = 0;
}

void InferenceModel::forward_block(KvCache& cache, int n, int local) {
  ATLAS_ASSERT(n == m_chunk_n && local == m_chunk_blocks_done && local < m_range.count,
               "inference block " << local << " of a " << n << "-token chunk out of order (chunk of " << m_chunk_n
                                  << " tokens, " << m_chunk_blocks_done << " blocks done)");
  if (!m_emulated) block(local, cache, n, m_x.f32());  // emulated: no arithmetic
  ++m_chunk_blocks_done;
}

void InferenceModel::skip_block(int n, int local) {
  ATLAS_ASSERT(n == m_chunk_n && local == m_chunk_blocks_done && local < m_range.count,
               "inference block " << local << " of a " << n << "-token chunk skipped out of order (chunk of "
                                  << m_chunk_n << " tokens, " << m_chunk_blocks_done << " blocks done)");
  ++m_chunk_blocks_done;
}

void InferenceModel::forward_end(KvCache& cache, int n, float* act_out, float* logits) {
  ATLAS_ASSERT(n == m_chunk_n && m_chunk_blocks_done == m_range.count,
               "inference chunk ended after " << m_chunk_blocks_done << " of " << m_range.count << " blocks");
  m_chunk_n = 0;
  const int c = m_shape.hidden;
  const std::size_t nc = static_cast<std::size_t>(n) * static_cast<std::size_t>(c);
  cache.len += n;

  if (!m_range.has_head) {
    if (!act_out) ATLAS_THROW(Internal, "a non-head rank's forward needs an output buffer");
    if (!m_emulated) m_backend.download(act_out, m_x.data(), nc * sizeof(float));  // emulated: left as it is
    return;
  }
  if (!logits) return;
  if (m_emulated) {  // no arithmetic: every logit 0 (the greedy first token is id 0)
    std::fill(logits, logits + m_shape.vocab, 0.0F);
    return;
  }
  // Final LayerNorm and the tied LM head on the chunk's last token only.
  m_backend.layernorm_forward(m_ln.f32(), m_mean.f32(), m_rstd.f32(), m_x.f32() + nc - c, m_lnf_w, m_lnf_b, 1, c);
  m_backend.gemm(Trans::No, Trans::Yes, 1, m_shape.vocab, c, 1.0F, m_ln.f32(), c, m_wte, c, 0.0F, m_logits.f32(),
                 m_shape.vocab);
  m_backend.download(logits, m_logits.data(), static_cast<std::size_t>(m_shape.vocab) * sizeof(float));
}

void InferenceModel::block(int i, KvCache& cache, int n, float* x) {
  const BlockParams& p = m_blocks[static_cast<std::size_t>(i)];
  auto& be = m_backend;
  const int c = m_shape.hidden;
  const int heads = m_shape.heads;
  const int d = m_shape.head_dim();
  const int pos = cache.len;
  const int total = pos + n;  // keys visible to the chunk's last token
  const std::size_t nc = static_cast<std::size_t>(n) * static_cast<std::size_t>(c);
  float* kc = cache.k[static_cast<std::size_t>(i)].f32();
  float* vc = cache.v[static_cast<std::size_t>(i)].f32();
  float* ln = m_ln.f32();
  float* qkv = m_qkv.f32();
  float* scores = m_scores.f32();
  float* atty = m_atty.f32();
  float* tmp = m_tmp.f32();

  // attention: x += proj(attn(qkv(ln1(x)))) + bias
  be.layernorm_forward(ln, m_mean.f32(), m_rstd.f32(), x, p.ln1_w, p.ln1_b, n, c);
  be.gemm(Trans::No, Trans::Yes, n, 3 * c, c, 1.0F, ln, c, p.qkv_w, c, 0.0F, qkv, 3 * c);
  be.add_bias(qkv, p.qkv_b, n, 3 * c);
  const std::size_t row = static_cast<std::size_t>(c) * sizeof(float);
  for (int t = 0; t < n; ++t) {  // append this chunk's keys and values to the cache
    const std::size_t src = static_cast<std::size_t>(t) * 3 * static_cast<std::size_t>(c);
    const std::size_t dst = static_cast<std::size_t>(pos + t) * static_cast<std::size_t>(c);
    be.copy(kc + dst, qkv + src + c, row);
    be.copy(vc + dst, qkv + src + 2 * static_cast<std::size_t>(c), row);
  }
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  for (int h = 0; h < heads; ++h) {
    const std::size_t off = static_cast<std::size_t>(h) * static_cast<std::size_t>(d);
    be.gemm(Trans::No, Trans::Yes, n, total, d, scale, qkv + off, 3 * c, kc + off, c, 0.0F, scores, total);
    for (int t = 0; t + 1 < n; ++t)  // token pos + t sees keys [0, pos + t]
      be.fill(scores + static_cast<std::size_t>(t) * total + pos + t + 1, -std::numeric_limits<float>::infinity(),
              static_cast<std::size_t>(n - 1 - t));
    be.softmax_xent_forward(m_losses.f32(), scores, scores, m_zeros.i32(), n, total);
    be.gemm(Trans::No, Trans::No, n, d, total, 1.0F, scores, total, vc + off, c, 0.0F, atty + off, c);
  }
  be.gemm(Trans::No, Trans::Yes, n, c, c, 1.0F, atty, c, p.proj_w, c, 0.0F, tmp, c);
  be.add(x, x, tmp, nc);
  be.add_bias(x, p.proj_b, n, c);

  // MLP: x += proj(gelu(fc(ln2(x)))) + bias
  be.layernorm_forward(ln, m_mean.f32(), m_rstd.f32(), x, p.ln2_w, p.ln2_b, n, c);
  be.gemm(Trans::No, Trans::Yes, n, 4 * c, c, 1.0F, ln, c, p.fc_w, c, 0.0F, m_fc.f32(), 4 * c);
  be.add_bias(m_fc.f32(), p.fc_b, n, 4 * c);
  be.gelu_forward(m_fc.f32(), m_fc.f32(), static_cast<std::size_t>(n) * 4 * static_cast<std::size_t>(c));
  be.gemm(Trans::No, Trans::Yes, n, c, 4 * c, 1.0F, m_fc.f32(), 4 * c, p.mp_w, 4 * c, 0.0F, tmp, c);
  be.add(x, x, tmp, nc);
  be.add_bias(x, p.mp_b, n, c);
}

std::int32_t InferenceModel::argmax(std::span<const float> logits) {
  ATLAS_ASSERT(!logits.empty(), "argmax of no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

// ---- standalone generation ----

std::vector<std::int32_t> decode_greedy(InferenceModel& model, KvCache& cache, std::int32_t first, int max_new) {
  const LayerRange& r = model.range();
  ATLAS_ASSERT(r.first == 0 && r.count == model.shape().layers && r.has_embedding && r.has_head,
               "greedy decoding needs the whole inference model on one rank");
  std::vector<std::int32_t> out{first};
  std::vector<float> logits(static_cast<std::size_t>(model.shape().vocab));
  while (static_cast<int>(out.size()) < max_new) {
    const std::int32_t last = out.back();
    model.forward(cache, 1, &last, nullptr, nullptr, logits.data());
    out.push_back(InferenceModel::argmax(logits));
  }
  return out;
}

std::vector<std::int32_t> generate(InferenceModel& model, std::span<const std::int32_t> prompt, int chunk_tokens,
                                   int max_new) {
  const auto p = static_cast<int>(prompt.size());
  if (p < 1 || max_new < 1 || p + max_new > model.shape().context)
    ATLAS_THROW(Config, "a prompt of " << p << " tokens plus " << max_new << " new tokens does not fit bubbletea.context = "
                                       << model.shape().context);
  KvCache cache = model.make_cache(p + max_new);
  std::vector<float> logits(static_cast<std::size_t>(model.shape().vocab));
  int done = 0;
  const std::vector<int> chunks = chunk_sizes(p, chunk_tokens);
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    model.forward(cache, chunks[i], prompt.data() + done, nullptr, nullptr,
                  i + 1 == chunks.size() ? logits.data() : nullptr);
    done += chunks[i];
  }
  return decode_greedy(model, cache, InferenceModel::argmax(logits), max_new);
}

std::vector<std::int32_t> generate_with(InferenceModel& model, std::span<const std::int32_t> prompt,
                                        const GenerateOptions& options,
                                        const std::function<std::int32_t(std::span<const float>, int)>& choose,
                                        const std::function<void(std::int32_t)>& emit) {
  const LayerRange& r = model.range();
  const int context = model.shape().context;
  ATLAS_ASSERT(r.first == 0 && r.count == model.shape().layers && r.has_embedding && r.has_head,
               "generation needs the whole inference model on one rank");
  ATLAS_ASSERT(model.max_chunk() >= context, "generation needs max_chunk " << model.max_chunk() << " >= the context "
                                                                           << context);
  const auto p = static_cast<int>(prompt.size());
  if (p < 1 || p > context)
    ATLAS_THROW(Config,
                "a prompt of " << p << " tokens: it must hold 1 to " << context << " tokens (the model's context)");
  std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
  std::vector<std::int32_t> out;
  std::vector<float> logits(static_cast<std::size_t>(model.shape().vocab));
  KvCache cache = model.make_cache(context);
  model.forward(cache, p, seq.data(), nullptr, nullptr, logits.data());
  while (static_cast<int>(out.size()) < options.max_new) {
    const std::int32_t t = choose(logits, static_cast<int>(out.size()));
    out.push_back(t);
    seq.push_back(t);
    emit(t);
    if (t == options.stop_token || static_cast<int>(out.size()) == options.max_new) break;
    if (cache.len < context) {
      model.forward(cache, 1, &t, nullptr, nullptr, logits.data());
    } else {  // the window slides: the last context / 2 tokens, from position 0
      const int keep = std::max(1, context / 2);
      cache.len = 0;
      model.forward(cache, keep, seq.data() + (seq.size() - static_cast<std::size_t>(keep)), nullptr, nullptr,
                    logits.data());
    }
  }
  return out;
}

void load_weights(const mpi::Comm& world, const std::string& path, InferenceModel& model, std::string_view setting) {
  const io::CheckpointContents contents = io::inspect_checkpoint(world, path);
  const InferShape& sh = model.shape();
  // The deck section that sized the model ("bubbletea.weights" -> "bubbletea."), for messages.
  const std::size_t dot = setting.find('.');
  const std::string_view section =
      dot == std::string_view::npos ? std::string_view("the model's ") : setting.substr(0, dot + 1);
  mpi::agree(world, fmt::format("reading {}", setting), [&] {
    ProblemList problems;
    const io::ModelShape& m = contents.meta.model;
    auto check = [&](const char* key, std::int64_t file, int deck) {
      if (file != deck)
        problems.add(fmt::format("{} '{}': model.{} is {} in the checkpoint but {}{} = {}", setting, path, key, file,
                                 section, key, deck));
    };
    check("layers", m.layers, sh.layers);
    check("hidden", m.hidden, sh.hidden);
    check("heads", m.heads, sh.heads);
    check("vocab", m.vocab, sh.vocab);
    if (m.seq_len < sh.context)
      problems.add(fmt::format("{}context = {} exceeds the checkpoint's model.seq_len = {} ('{}' has no position "
                               "embedding beyond it)",
                               section, sh.context, m.seq_len, path));
    problems.throw_if_any();
    for (auto& p : model.params()) {
      auto it = std::find_if(contents.tensors.begin(), contents.tensors.end(),
                             [&](const io::TensorEntry& t) { return t.name == p.name; });
      if (it == contents.tensors.end()) {
        problems.add(fmt::format("{} '{}' holds no tensor '{}'", setting, path, p.name));
        continue;
      }
      p.file_shape = it->shape;
    }
    problems.throw_if_any();
  });
  std::vector<std::vector<float>> host;
  std::vector<io::ReadShard> shards;
  host.reserve(model.params().size());
  for (auto& p : model.params()) {
    std::int64_t n = 1;
    for (auto d : p.shape) n *= d;
    host.emplace_back(static_cast<std::size_t>(n));
    io::ReadShard s;
    s.name = p.name;
    s.full_shape = p.file_shape;
    s.offset.assign(p.shape.size(), 0);
    s.shape = p.shape;
    s.value = host.back().data();
    shards.push_back(std::move(s));
  }
  io::ReadOptions opt;
  (void)io::read_checkpoint(world, path, shards, opt);
  for (std::size_t i = 0; i < shards.size(); ++i) model.set_param(shards[i].name, host[i]);
}

}  // namespace atlas::bubbletea
