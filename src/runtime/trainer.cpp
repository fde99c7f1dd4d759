// SPDX-License-Identifier: MIT
// The executor. One step = one walk of this rank's table row; the switch below is the whole
// algorithm, in table order. Gradients are summed inside a DC (DP all-reduce over dp_comm); the
// only gradient that crosses a WAN link is the tied embedding's (first + last stage), once a step.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <cstring>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::runtime {

namespace {

// Message tags: mpi/tags.hpp.
constexpr int kLossTag = mpi::tags::kStepLoss;
/// The tied-embedding gradient exchange between the first and last stage over the WAN.
constexpr int kEmbeddingTag = mpi::tags::kEmbedding;

}  // namespace

Trainer::Trainer(const Config& cfg, const topo::Layout& layout, const topo::Communicators& comms,
                 const sched::ScheduleTable& table, wan::PeerTransport* wan, device::Backend& backend,
                 Profiler& profiler)
    : m_cfg(cfg),
      m_layout(layout),
      m_comms(comms),
      m_table(table),
      m_backend(backend),
      m_profiler(profiler),
      m_me(layout.coord(comms.world.rank())),
      m_adamw(cfg.train) {
  const int pp = layout.pp_size();
  const bool first = m_me.stage == 0;
  const bool last = m_me.stage == pp - 1;
  // ---- communicators beyond the four of the layout (collective over world) ----
  const bool in_embed = pp > 1 && (first || last);
  m_embed = comms.world.split(in_embed ? m_me.dp * layout.tp_size() + m_me.tp : MPI_UNDEFINED,
                              comms.world.rank());
  m_replica = comms.world.split(m_me.dp, comms.world.rank());
  m_replica_spans_dcs = layout.dc_of_stage(0) != layout.dc_of_stage(layout.pp_size() - 1);
  // The WAN waits BubbleTea may fill (bubbletea.fill_wan_waits), from the deck's matrices: the
  // tied-embedding exchange (one way + its bytes), the norm sum (a round trip across the
  // farthest pair of DCs the pipeline spans).
  if (pp > 1) {
    const int a = layout.dc_of_stage(0), b = layout.dc_of_stage(pp - 1);
    if (a != b) {
      const double bytes = static_cast<double>(cfg.model.vocab) * cfg.model.hidden / layout.tp_size() * sizeof(float);
      m_embed_wait_s = cfg.cluster.latency(a, b) * 1e-3 + bytes * 8 / (cfg.cluster.bandwidth(a, b) * 1e9);
    }
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < pp; ++t)
        m_norm_wait_s = std::max(m_norm_wait_s, 2 * cfg.cluster.latency(layout.dc_of_stage(s), layout.dc_of_stage(t)) * 1e-3);
  }

  // ---- data (first and last stage read the corpus; the verdict is collective) ----
  mpi::agree(comms.world, "loading the training data", [&] {
    const bool gpt2 = cfg.data.tokenizer == TokenizerKind::Gpt2;
    if (gpt2 && cfg.model.vocab != model::Gpt2Tokenizer::kVocab)
      throw ConfigError("model.vocab = " + std::to_string(cfg.model.vocab) +
                        " does not match data.tokenizer = gpt2's 50257 tokens\n  hint: set model.vocab = 50257");
    if (!gpt2 && cfg.model.vocab < model::ByteTokenizer::kVocab)
      throw ConfigError("model.vocab = " + std::to_string(cfg.model.vocab) +
                        " is smaller than the byte tokenizer's 256 symbols\n  hint: set model.vocab = 256");
    if (!first && !last) return;
    model::Corpus::Encoder encode;
    if (gpt2) {
      auto bpe = std::make_shared<model::Gpt2Tokenizer>(cfg.data.tokenizer_dir);
      encode = [bpe](std::string_view text) { return bpe->encode(text); };
    }
    m_corpus = model::Corpus::load(cfg.data.corpus_dir, encode);
    model::LoaderShape shape{cfg.model.seq_len, cfg.train.micro_batch_size, cfg.train.micro_batches,
                             layout.dp_size(), m_me.dp};
    m_train = std::make_unique<model::DataLoader>(m_corpus, model::Split::Train, cfg.data.val_fraction,
                                                  shape, static_cast<std::uint64_t>(cfg.run.seed), true);
    model::LoaderShape vshape = shape;
    vshape.micro_batches = cfg.train.eval_batches;
    m_val = std::make_unique<model::DataLoader>(m_corpus, model::Split::Val, cfg.data.val_fraction,
                                                vshape, static_cast<std::uint64_t>(cfg.run.seed), false);
  });

  // ---- intra-DC collectives (collective over tp_comm, then dp_comm): MPI on host memory,
  // NCCL on the CUDA backend, chosen by the device room ----
  if (layout.tp_size() > 1) m_tp = device::make_collective(comms.tp, backend);
  if (layout.dp_size() > 1) m_dp = device::make_collective(comms.dp, backend);

  // ---- model shard ----
  model::StageSpec spec{m_me.stage, pp, m_me.tp, layout.tp_size()};
  m_model = std::make_unique<model::StageModel>(cfg.model, cfg.train.micro_batch_size, spec, backend,
                                                m_tp.get(), static_cast<std::uint64_t>(cfg.run.seed));
  m_model->set_loss_scale(static_cast<float>(1.0 / (cfg.train.micro_batches * layout.dp_size())));

  const std::size_t floats = m_model->boundary_floats();
  const auto m = static_cast<std::size_t>(cfg.train.micro_batches);
  for (std::size_t i = 0; i < m; ++i) {
    if (!first) {
      m_act_in.push_back(backend.alloc_floats(floats));
      m_grad_in.push_back(backend.alloc_floats(floats));
    }
    if (!last) {
      m_act_out.push_back(backend.alloc_floats(floats));
      m_grad_out.push_back(backend.alloc_floats(floats));
    }
  }
  m_tokens.resize(m_model->tokens_per_micro());
  m_targets.resize(m_model->tokens_per_micro());
  if (m_dp) {
    m_buckets.emplace_back();
    m_buckets.back().buf = backend.alloc_floats(std::max<std::size_t>(1, cfg.train.dp_bucket_bytes / sizeof(float)));
    if (cfg.train.dp_overlap) {
      const auto& row = table.row(m_me.stage, m_me.dp);
      for (std::size_t i = 0; i < row.size(); ++i)
        if (row[i].kind == sched::SlotKind::Backward) m_last_backward = static_cast<int>(i);
    }
  }
  mpi::tags::check_pipeline(cfg.train.micro_batches, cfg.train.eval_batches, mpi::tag_upper_bound());
  m_boundary = std::make_unique<Boundary>(layout, comms, table, wan, profiler, floats * sizeof(float),
                                          cfg.wan.recv_timeout_s);
  {
    const auto& row = table.row(m_me.stage, m_me.dp);
    for (std::size_t i = 0; i < row.size(); ++i)
      if (row[i].kind == sched::SlotKind::Forward) m_last_forward = static_cast<int>(i);
    // The tied-embedding exchange crosses the WAN (the AllReduce slot): its receive is posted at
    // the step's start, so a bubble before that slot can be watched like one before a receive.
    const bool has_all_reduce = std::any_of(row.begin(), row.end(), [](const sched::Slot& s) {
      return s.kind == sched::SlotKind::AllReduce;
    });
    if (!m_embed.null() && has_all_reduce && m_boundary->has_wan()) {
      const int partner = layout.embedding_partner(m_me);
      if (layout.coord(partner).dc != m_me.dc) m_embed_wan_partner = partner;
    }
  }
}

Trainer::~Trainer() {
  // Unwinding after an error with DP sums in flight: the peers may never join them. Wait a
  // little; a sum that does not finish keeps its bucket (MPI or NCCL may still write into it)
  // and the job aborts.
  for (Bucket& b : m_buckets) {
    if (b.sum && !b.sum->settle(2.0)) {
      auto* kept = new device::Buffer(std::move(b.buf));  // deliberately never freed
      (void)kept;
    }
    b.sum.reset();
  }
}

double Trainer::validation_unigram_entropy() const {
  if (!m_val) return 0.0;
  return model::unigram_entropy(m_corpus.split(model::Split::Val, m_cfg.data.val_fraction), m_cfg.model.vocab);
}

std::int64_t Trainer::tokens_per_step() const {
  return m_cfg.tokens_per_step();
}

// ---- one step ----

StepReport Trainer::train_step(int step) {
  using sched::SlotKind;
  StepReport r;
  r.step = step;
  const bool first = m_model->is_first();
  const bool last = m_model->is_last();
  const double t_step = m_profiler.now();
  m_model->zero_grad();
  m_boundary->begin_step(step);
  if (m_embed_wan_partner >= 0)
    m_boundary->post_exchange_recv(m_embed_wan_partner, kEmbeddingTag,
                                   static_cast<std::size_t>(m_model->tied_embedding()->shard_numel()));
  post_loss_receives();

  const auto& row = m_table.row(m_me.stage, m_me.dp);
  for (std::size_t i = 0; i < row.size(); ++i) {
    const sched::Slot& slot = row[i];
    const auto micro = static_cast<std::size_t>(std::max(slot.micro, 0));
    const double t0 = m_profiler.now();
    double spent_prefill = 0.0;
    double norm_wait_s = 0.0;  // Optimizer: the gradient-norm sum's wait (communication, not compute)
    double sums_s = 0.0;       // a bubble before AllReduce: the gradient sums started in it
    switch (slot.kind) {
      case SlotKind::Forward: {
        if (first || last) m_train->fill(slot.micro, m_tokens.data(), m_targets.data());
        m_model->forward(slot.micro, first ? m_tokens.data() : nullptr, last ? m_targets.data() : nullptr,
                         first ? nullptr : &m_act_in[micro], last ? nullptr : &m_act_out[micro]);
        if (last && static_cast<int>(i) == m_last_forward) send_step_loss();
        break;
      }
      case SlotKind::Backward: {
        // The step's last backward: each group of gradients it finishes goes into a bucket, and
        // a full bucket's DP sum starts at once (the sums run while earlier layers compute).
        const model::StageModel::GradsReady ready = [this](std::span<model::ParamTensor* const> ps) { pack_ready(ps); };
        const bool overlap = static_cast<int>(i) == m_last_backward;
        m_model->backward(slot.micro, last ? nullptr : &m_grad_out[micro], first ? nullptr : &m_grad_in[micro],
                          overlap ? &ready : nullptr);
        break;
      }
      case SlotKind::WanRecv:
      case SlotKind::LocalRecv: {
        if (m_filler != nullptr && m_cfg.bubbletea.fill_recv_waits)
          spent_prefill = fill_recv_wait(step, slot, i, r);  // returns with the data in
        else
          m_boundary->wait_recv(slot);
        device::Buffer& dst = slot.flow == sched::Flow::Activation ? m_act_in[micro] : m_grad_out[micro];
        m_backend.upload(dst.data(), m_boundary->recv_buffer(slot.flow, slot.micro), dst.bytes());
        break;
      }
      case SlotKind::WanSend:
      case SlotKind::LocalSend: {
        const device::Buffer& src = slot.flow == sched::Flow::Activation ? m_act_out[micro] : m_grad_in[micro];
        m_backend.download(m_boundary->send_buffer(slot.flow, slot.micro), src.data(), src.bytes());
        m_boundary->post_send(slot, static_cast<int>(i));
        break;
      }
      case SlotKind::AllReduce:
        all_reduce_gradients(wan_wait_filler(step, slot, i, m_embed_wait_s, spent_prefill, r));
        r.dp_buckets = m_buckets_step;
        r.dp_buckets_early = m_buckets_early;
        break;
      case SlotKind::Optimizer:
        r.grad_norm = clip_and_step(step, wan_wait_filler(step, slot, i, m_norm_wait_s, spent_prefill, r), norm_wait_s);
        r.lr = model::lr_at(step, m_cfg.train, m_cfg.run.steps);
        break;
      case SlotKind::Prefill:
      case SlotKind::Idle:
        if (m_filler) {
          // The bubble ends when the receive after it completes (or, before the AllReduce slot,
          // the partner's half of the tied-embedding exchange): the filler watches it.
          const sched::Slot* next = i + 1 < row.size() ? &row[i + 1] : nullptr;
          std::function<bool()> ended;
          if (next != nullptr && sched::is_recv(next->kind))
            ended = [this, next] { return m_boundary->test_recv(*next); };
          else if (next != nullptr && next->kind == SlotKind::AllReduce && m_embed_wan_partner >= 0 &&
                   m_cfg.bubbletea.watch_recv) {
            // Our gradients are final: the DP sums end and our half leaves now, so the partner
            // does not wait for this bubble's prefill (its time is intra-DC communication).
            const double ts = m_profiler.now();
            start_gradient_sums();
            sums_s = m_profiler.now() - ts;
            ended = [this] { return m_boundary->exchange_arrived(); };
          }
          const auto [s, tokens] = m_filler->fill(step, slot, slot.duration_ms * 1e-3, ended ? &ended : nullptr);
          spent_prefill = s;
          r.prefill_tokens += tokens;
        }
        if (i == 0 && m_me.stage == 0 && m_table.kind == ScheduleKind::Atlas) {
          // The atlas stagger: pipeline d's first stage starts d * stagger after the step begins.
          // Every other Idle slot is a wait the next receive performs; this one is a deliberate
          // delay, kept so the pipelines' first transfers do not collide on the link.
          const double left = slot.duration_ms * 1e-3 - (m_profiler.now() - t0);
          if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
        }
        break;
    }
    const double t1 = m_profiler.now();
    // Prefill inside the slot (a bubble, or a WAN wait of the all-reduce / optimizer) is
    // BubbleTea's time, not the slot's.
    const double own = (t1 - t0) - spent_prefill;
    r.prefill_s += spent_prefill;
    switch (slot.kind) {
      case SlotKind::Forward:
      case SlotKind::Backward:
      case SlotKind::Optimizer: {
        const double wait = std::max(0.0, norm_wait_s - spent_prefill);
        r.compute_s += own - wait;
        (m_replica_spans_dcs ? r.wan_s : r.intra_s) += wait;
        break;
      }
      case SlotKind::LocalRecv: r.intra_s += own; break;
      case SlotKind::AllReduce:
        r.intra_s += own;
        r.allreduce_s += own;
        break;
      case SlotKind::WanRecv: r.wan_s += own; break;
      case SlotKind::Idle:
      case SlotKind::Prefill:
        r.idle_s += own - sums_s;
        r.intra_s += sums_s;
        r.allreduce_s += sums_s;
        break;
      default: break;
    }
    if (slot.kind != SlotKind::WanSend) {  // the boundary records WAN sends with their completion
      SlotEvent e;
      e.world_rank = m_comms.world.rank();
      e.step = step;
      e.slot_index = static_cast<int>(i);
      e.kind = static_cast<int>(slot.kind);
      e.micro = slot.micro;
      e.peer = slot.peer_stage >= 0 ? m_layout.world_rank(slot.peer_stage, m_me.dp, m_me.tp) : -1;
      e.link = slot.link;
      e.bytes = sched::is_send(slot.kind) || sched::is_recv(slot.kind) ? slot.bytes : 0;
      e.start_s = t0;
      e.end_s = t1;
      e.complete_s = t1;
      e.predicted_start_ms = slot.start_ms;
      e.predicted_ms = slot.duration_ms;
      m_profiler.record(e);
    }
  }
  r.boundary = m_boundary->end_step();
  r.loss = step_loss();
  if (m_train) m_train->advance();
  r.step_s = m_profiler.now() - t_step;
  return r;
}

void Trainer::pack_ready(std::span<model::ParamTensor* const> params) {
  const std::size_t cap = m_buckets.front().buf.floats();
  for (model::ParamTensor* p : params) {
    const auto n = static_cast<std::size_t>(p->shard_numel());
    std::size_t done = 0;
    while (done < n) {
      if (m_open == m_buckets.size()) {
        m_buckets.emplace_back();
        m_buckets.back().buf = m_backend.alloc_floats(cap);
      }
      Bucket& b = m_buckets[m_open];
      const std::size_t take = std::min(n - done, cap - b.fill);
      m_backend.copy(b.buf.f32() + b.fill, p->grad.f32() + done, take * sizeof(float));
      b.pieces.push_back({p, done, b.fill, take});
      b.fill += take;
      done += take;
      if (b.fill == cap) start_open_bucket();
    }
    ++m_packed_params;
  }
  // MPI moves a non-blocking collective on only inside MPI calls: one test per started bucket
  // at each layer boundary keeps the sums flowing while backward computes.
  for (std::size_t i = 0; i < m_open; ++i)
    if (m_buckets[i].sum) m_buckets[i].sum->test();
}

void Trainer::start_open_bucket() {
  if (m_open == m_buckets.size()) return;  // the last bucket filled up and started already
  Bucket& b = m_buckets[m_open];
  if (b.fill == 0) return;
  b.sum = m_dp->start_allreduce_sum(b.buf, b.fill);
  ++m_open;
}

void Trainer::finish_buckets() {
  start_open_bucket();
  m_buckets_step = static_cast<int>(m_open);
  for (std::size_t i = 0; i < m_open; ++i) {
    Bucket& b = m_buckets[i];
    b.sum->wait();
    for (const Bucket::Piece& pc : b.pieces)
      m_backend.copy(pc.p->grad.f32() + pc.tensor_offset, b.buf.f32() + pc.bucket_offset, pc.count * sizeof(float));
    b.sum.reset();
    b.pieces.clear();
    b.fill = 0;
  }
  m_open = 0;
  m_packed_params = 0;
}

double Trainer::fill_recv_wait(int step, const sched::Slot& slot, std::size_t index, StepReport& r) {
  const double t0 = m_profiler.now();
  RecentWaits& waits = m_recv_waits[index];
  double spent = 0.0;
  bool arrived_in_fill = false;
  double last_pending = t0;  // the last test that found the data not yet in
  if (!m_boundary->test_recv(slot)) {
    // Training first: the budget is the shortest wait of the last steps (0 until there are
    // RecentWaits::kCapacity of them), so a receive that is sometimes on time is never filled, and
    // a chunk that fits it ends before the data comes unless this wait is the shortest yet.
    const double budget = waits.full() ? waits.shortest() : 0.0;
    if (budget > 0.0) {
      const std::function<bool()> ended = [&] {
        if (m_boundary->test_recv(slot)) return arrived_in_fill = true;
        last_pending = m_profiler.now();
        return false;
      };
      const auto [s, tokens] = m_filler->fill(step, slot, budget, &ended);
      spent = s;
      r.prefill_tokens += tokens;
    }
  }
  // This step's wait, for the next steps' budget: when the fill saw the data, it came after the
  // last "not yet" (a lower bound: a chunk may have run past it); otherwise wait_recv polls.
  double wait = 0.0;
  if (arrived_in_fill) {
    wait = last_pending - t0;
  } else {
    m_boundary->wait_recv(slot);
    wait = m_profiler.now() - t0;
  }
  waits.push(wait);
  return spent;
}

Boundary::WaitHook Trainer::wan_wait_filler(int step, const sched::Slot& slot, std::size_t index, double budget_s,
                                            double& spent_prefill, StepReport& r) {
  m_wan_wait = WanWait{};
  if (m_filler == nullptr || !m_cfg.bubbletea.fill_wan_waits || budget_s <= 0) return {};
  return [this, step, &slot, index, budget_s, &spent_prefill, &r](const std::function<bool()>& done) {
    // The budget: the wait the deck's WAN predicts (x max_stretch), not the slot, so on a LAN-like
    // "WAN" no chunk fits and the sum is not delayed by one; or, when longer, what this slot's
    // real waits say (a host slower than the deck, an emulated WAN): bubbletea.wan_wait_quantile
    // of those of the last steps, from the first one on. The wait is watched (tested before every
    // chunk and between its blocks), so a budget past the real wait costs at most a block; but
    // both partners of the sum wait on it, so the default is the median, not the longest.
    const double learned = m_recv_waits[index].quantile(m_cfg.bubbletea.wan_wait_quantile);  // 0: none yet
    const double allowed = std::max(budget_s * m_cfg.bubbletea.max_stretch, learned);
    const double t0 = m_profiler.now();
    m_wan_wait = WanWait{true, index, t0, t0, false};
    const std::function<bool()> watched = [this, &done] {
      if (done()) return m_wan_wait.arrived = true;
      m_wan_wait.last_pending = m_profiler.now();
      return false;
    };
    const auto [s, tokens] = m_filler->fill(step, slot, allowed, &watched);
    spent_prefill += s;
    r.prefill_tokens += tokens;
  };
}

void Trainer::record_wan_wait() {
  if (!m_wan_wait.active) return;
  m_wan_wait.active = false;
  // Called where the wait ends (the exchange's sum is in, the norm sum is done). As for a
  // receive: when the fill saw it done, that came after the last "not yet" (a lower bound).
  const double end = m_wan_wait.arrived ? m_wan_wait.last_pending : m_profiler.now();
  m_recv_waits[m_wan_wait.index].push(end - m_wan_wait.start);
}

void Trainer::all_reduce_gradients(const Boundary::WaitHook& fill) {
  if (!m_sums_started) start_gradient_sums();
  m_sums_started = false;
  if (!m_embed.null()) {
    model::ParamTensor* wte = m_model->tied_embedding();
    const auto n = static_cast<std::size_t>(wte->shard_numel());
    std::vector<float>& host = m_embed_host;
    const int partner = m_layout.embedding_partner(m_me);
    if (m_embed_wan_partner >= 0) {
      // Across DCs over the WAN transport (tuned for the WAN; MPI's TCP is not); our half is
      // already on its way (start_gradient_sums).
      m_boundary->exchange_sum(partner, kEmbeddingTag, host.data(), n, m_me.stage == 0, fill);
      record_wan_wait();
    } else {
      mpi::Request sum = m_embed.iallreduce_sum(std::span<float>(host));
      wait_bounded(sum, [&] { return "the tied-embedding gradient sum with rank " + std::to_string(partner); });
    }
    m_backend.upload(wte->grad.data(), host.data(), n * sizeof(float));
  }
}

void Trainer::start_gradient_sums() {
  m_sums_started = true;
  auto& params = m_model->params();
  // DP: bucketed in-place sums over dp_comm (inside the DC), each bucket packed from the
  // gradients in the backend's memory and unpacked after its sum (on a device backend, on the
  // device). With train.dp_overlap the last backward has packed and started them already.
  if (m_dp) {
    // Buckets the last backward started (before this slot).
    m_buckets_early = static_cast<int>(m_open);
    if (m_packed_params == 0) {
      std::vector<model::ParamTensor*> all;
      for (auto& p : params) all.push_back(&p);
      pack_ready(all);
    }
    if (m_packed_params != params.size()) {
      ATLAS_THROW(Internal, "stage " << m_me.stage << ": the last backward reported " << m_packed_params << " of "
                                     << params.size() << " parameters to the DP all-reduce");
    }
    finish_buckets();
  }
  // Tied embedding: the first and last stage of this lane sum their wte gradients (crosses the
  // WAN once a step when those stages sit in different DCs); its gradient is final now.
  if (!m_embed.null()) {
    model::ParamTensor* wte = m_model->tied_embedding();
    ATLAS_ASSERT(wte, "first/last stage without a tied embedding");
    const auto n = static_cast<std::size_t>(wte->shard_numel());
    std::vector<float>& host = m_embed_host;  // a member: an abandoned sum keeps its buffer
    host.resize(n);
    m_backend.download(host.data(), wte->grad.data(), n * sizeof(float));
    if (m_embed_wan_partner >= 0) m_boundary->post_exchange_send(m_embed_wan_partner, kEmbeddingTag, host.data(), n);
  }
}

double Trainer::clip_and_step(int step, const Boundary::WaitHook& fill, double& wait_s) {
  double& sq = m_norm_sq;  // a member: an abandoned sum (wait_bounded) keeps its buffer
  sq = m_model->local_grad_sq_norm();
  const double t0 = m_profiler.now();
  mpi::Request sum = m_replica.iallreduce_sum(std::span<double>(&sq, 1));
  // The pipeline's sum crosses every DC it spans: a WAN round trip BubbleTea may fill.
  if (fill && m_replica_spans_dcs) fill([&sum] { return sum.test(); });
  wait_bounded(sum, [] { return std::string("the gradient-norm sum over the pipeline"); });
  wait_s = m_profiler.now() - t0;
  record_wan_wait();  // before the optimizer's own work
  const double norm = std::sqrt(sq);
  const double scale = model::clip_scale(norm, m_cfg.train.grad_clip);
  const double lr = model::lr_at(step, m_cfg.train, m_cfg.run.steps);
  m_adamw.step(m_model->params(), m_backend, lr, scale);
  return norm;
}

// The step's loss goes to world rank 0 (which prints it) as soon as the last stage has it: after
// its last forward, long before the step ends, so rank 0 (the first stage, in another DC when the
// pipeline spans DCs) does not wait a WAN trip for it at the end of every step. Each DP replica's
// last stage (TP lane 0) sends its mean over the micro-batches; rank 0 averages them in DP order.
void Trainer::send_step_loss() {
  if (m_me.tp != 0) return;
  double loss = 0.0;
  for (int m = 0; m < m_cfg.train.micro_batches; ++m) loss += m_model->micro_loss(m);
  m_loss_out = loss / m_cfg.train.micro_batches;
  if (m_comms.world.rank() != 0) m_loss_send = m_comms.world.isend(std::span<const double>(&m_loss_out, 1), 0, kLossTag);
}

void Trainer::post_loss_receives() {
  if (m_comms.world.rank() != 0) return;
  const int dp = m_layout.dp_size();
  m_loss_in.assign(static_cast<std::size_t>(dp), 0.0);
  m_loss_recvs.clear();
  m_loss_from.clear();
  for (int d = 0; d < dp; ++d) {
    const int from = m_layout.world_rank(m_layout.pp_size() - 1, d, 0);
    if (from == 0) continue;  // rank 0 is that replica's last stage (pp == 1): no message
    m_loss_from.push_back(from);
    m_loss_recvs.push_back(m_comms.world.irecv(std::span<double>(&m_loss_in[static_cast<std::size_t>(d)], 1), from, kLossTag));
  }
}

void Trainer::wait_bounded(mpi::Request& req, const std::function<std::string()>& what) {
  if (req.wait_polling_for(m_cfg.wan.recv_timeout_s)) return;
  req.abandon();  // unwinding to MPI_Abort: the buffer stays, the request is never freed
  ATLAS_THROW(Comm, "rank " << m_comms.world.rank() << ": " << what() << " did not complete within "
                            << m_cfg.wan.recv_timeout_s
                            << " s\n  hint: a peer may be stuck or dead; raise wan.recv_timeout_s if the link is slow");
}

double Trainer::step_loss() {
  if (m_comms.world.rank() != 0) {
    // A null request (no loss to send from this rank) completes at once.
    wait_bounded(m_loss_send, [] { return std::string("sending the step's loss to rank 0"); });
    return 0.0;
  }
  for (std::size_t k = 0; k < m_loss_recvs.size(); ++k)
    wait_bounded(m_loss_recvs[k], [&] {
      return "the step's loss from rank " + std::to_string(m_loss_from[k]) + " (the last pipeline stage)";
    });
  m_loss_recvs.clear();
  if (m_model->is_last() && m_me.tp == 0) m_loss_in[static_cast<std::size_t>(m_me.dp)] = m_loss_out;
  double sum = 0.0;
  for (double l : m_loss_in) sum += l;
  return sum / m_layout.dp_size();
}

// ---- evaluation ----

double Trainer::evaluate() {
  const bool first = m_model->is_first();
  const bool last = m_model->is_last();
  const int batches = m_cfg.train.eval_batches;
  const std::size_t floats = m_model->boundary_floats();
  std::vector<float> host(floats);
  device::Buffer in = m_backend.alloc_floats(floats);
  device::Buffer out = m_backend.alloc_floats(floats);
  double loss = 0.0;
  if (m_val) m_val->rewind();
  for (int m = 0; m < batches; ++m) {
    const int micro = 1000000 + m;  // never collides with a training micro-batch id
    const int tag = mpi::tags::eval(m, m_cfg.train.micro_batches);
    if (first || last) m_val->fill(m, m_tokens.data(), m_targets.data());
    if (!first) {
      m_boundary->recv_blocking(m_me.stage - 1, tag, host.data(), floats * sizeof(float));
      m_backend.upload(in.data(), host.data(), floats * sizeof(float));
    }
    m_model->forward(micro, first ? m_tokens.data() : nullptr, last ? m_targets.data() : nullptr,
                     first ? nullptr : &in, last ? nullptr : &out);
    if (last) loss += m_model->micro_loss(micro);
    m_model->release(micro);
    if (!last) {
      m_backend.download(host.data(), out.data(), floats * sizeof(float));
      m_boundary->send_blocking(m_me.stage + 1, tag, host.data(), floats * sizeof(float));
    }
  }
  if (last) loss = m_comms.dp.allreduce(loss / batches, MPI_SUM) / m_layout.dp_size();
  const int reporter = m_layout.world_rank(m_layout.pp_size() - 1, 0, 0);
  const int me = m_comms.world.rank();
  if (reporter == 0) return me == 0 ? loss : 0.0;
  if (me == reporter) m_comms.world.send(std::span<const double>(&loss, 1), 0, mpi::tags::kEvalLoss);
  if (me == 0) m_comms.world.recv(std::span<double>(&loss, 1), reporter, mpi::tags::kEvalLoss);
  return loss;
}

// ---- full tensors (tests) ----

std::vector<std::pair<std::string, std::vector<float>>> Trainer::gather_full(bool gradients) const {
  // Every rank of pipeline replica 0 serialises its shards; rank 0 assembles full tensors.
  std::vector<char> blob;
  auto put = [&blob](const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    blob.insert(blob.end(), c, c + n);
  };
  if (m_me.dp == 0) {
    for (const auto& p : m_model->params()) {
      if (p.tied_copy) continue;
      const auto numel = static_cast<std::size_t>(p.shard_numel());
      std::vector<float> v(numel);
      m_backend.download(v.data(), (gradients ? p.grad : p.value).data(), numel * sizeof(float));
      const auto nlen = static_cast<std::uint32_t>(p.name.size());
      const auto nd = static_cast<std::uint32_t>(p.full_shape.size());
      put(&nlen, 4);
      put(p.name.data(), nlen);
      put(&nd, 4);
      put(p.full_shape.data(), nd * 8);
      put(p.shard_offset.data(), nd * 8);
      put(p.shard_shape.data(), nd * 8);
      put(v.data(), numel * sizeof(float));
    }
  }
  const int mine = static_cast<int>(blob.size());
  const int n = m_comms.world.size();
  std::vector<int> sizes(static_cast<std::size_t>(n)), displs(static_cast<std::size_t>(n), 0);
  ATLAS_MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, m_comms.world.get()));
  int total = 0;
  for (int i = 0; i < n; ++i) {
    displs[static_cast<std::size_t>(i)] = total;
    total += sizes[static_cast<std::size_t>(i)];
  }
  std::vector<char> all(m_comms.world.rank() == 0 ? static_cast<std::size_t>(total) : 0);
  ATLAS_MPI_CHECK(MPI_Gatherv(blob.data(), mine, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0,
                              m_comms.world.get()));
  std::vector<std::pair<std::string, std::vector<float>>> out;
  if (m_comms.world.rank() != 0) return out;
  std::size_t at = 0;
  auto get = [&](void* p, std::size_t k) {
    std::memcpy(p, all.data() + at, k);
    at += k;
  };
  std::map<std::string, std::size_t> index;
  while (at < all.size()) {
    std::uint32_t nlen = 0, nd = 0;
    get(&nlen, 4);
    std::string name(nlen, '\0');
    get(name.data(), nlen);
    get(&nd, 4);
    std::vector<std::int64_t> full(nd), off(nd), shape(nd);
    get(full.data(), nd * 8);
    get(off.data(), nd * 8);
    get(shape.data(), nd * 8);
    std::size_t numel = 1, full_numel = 1;
    for (std::uint32_t d = 0; d < nd; ++d) {
      numel *= static_cast<std::size_t>(shape[d]);
      full_numel *= static_cast<std::size_t>(full[d]);
    }
    std::vector<float> v(numel);
    get(v.data(), numel * sizeof(float));
    if (!index.count(name)) {
      index[name] = out.size();
      out.emplace_back(name, std::vector<float>(full_numel, 0.0F));
    }
    auto& dst = out[index[name]].second;
    // Scatter the shard (a dense row-major hyperslab) into the full tensor.
    std::vector<std::int64_t> idx(nd, 0);
    for (std::size_t e = 0; e < numel; ++e) {
      std::size_t flat = 0;
      for (std::uint32_t d = 0; d < nd; ++d) flat = flat * static_cast<std::size_t>(full[d]) + static_cast<std::size_t>(off[d] + idx[d]);
      dst[flat] = v[e];
      for (int d = static_cast<int>(nd) - 1; d >= 0; --d) {
        if (++idx[static_cast<std::size_t>(d)] < shape[static_cast<std::size_t>(d)]) break;
        idx[static_cast<std::size_t>(d)] = 0;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace atlas::runtime
