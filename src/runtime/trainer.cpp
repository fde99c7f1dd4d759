// SPDX-License-Identifier: MIT
// The executor's set-up and its messages: the trainer's communicators, data, model shard and
// buffers; the step's loss to rank 0; evaluation; the tied-embedding exchange. Gradients are
// summed inside a DC (DP all-reduce over dp_comm, trainer_gradients.cpp); the only gradient that
// crosses a WAN link is the tied embedding's (first + last stage), once a step. The walk of a
// step is trainer_step.cpp.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/device/rounding.hpp"
#include "atlas/model/dataset.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::runtime {

namespace {

// Message tags: mpi/tags.hpp.
constexpr int kLossTag = mpi::tags::kStepLoss;
/// The tied-embedding gradient exchange between the first and last stage over the WAN.
constexpr int kEmbeddingTag = mpi::tags::kEmbedding;

}  // namespace

void check_split_backward_row(const std::vector<sched::Slot>& row, int stage, int dp) {
  using sched::SlotKind;
  bool whole = false;
  bool split = false;
  bool all_reduced = false;
  std::map<std::pair<int, int>, int> open;  // (chunk, micro) -> slot index of its B, W pending
  std::map<int, int> last_w;                // chunk -> micro of its last W
  auto where = [&](std::size_t i, const sched::Slot& s) {
    return fmt::format("stage {} (dp {}) slot {}: {} of micro-batch {} chunk {}", stage, dp, i,
                       sched::to_string(s.kind), s.micro, s.chunk);
  };
  for (std::size_t i = 0; i < row.size(); ++i) {
    const sched::Slot& s = row[i];
    // The gradient sums start at the AllReduce slot, or at an ExchangeBubble bubble before it.
    if (s.kind == SlotKind::AllReduce || s.has(sched::SlotMark::ExchangeBubble)) all_reduced = true;
    if (s.kind == SlotKind::Backward) whole = true;
    if (s.kind != SlotKind::BackwardInput && s.kind != SlotKind::BackwardWeight) continue;
    split = true;
    const std::pair<int, int> key{s.chunk, s.micro};
    if (s.kind == SlotKind::BackwardInput) {
      if (!open.emplace(key, static_cast<int>(i)).second)
        ATLAS_THROW(Internal, where(i, s) << " while the previous B of it has no W yet (the split-backward contract)");
      continue;
    }
    if (open.erase(key) == 0)
      ATLAS_THROW(Internal, where(i, s) << " without a B before it (the split-backward contract: one B, then one W)");
    if (all_reduced)
      ATLAS_THROW(Internal, where(i, s) << " after the AllReduce slot or the bubble marked ExchangeBubble before it "
                                           "(every W comes before the gradient sums start)");
    const auto l = last_w.find(s.chunk);
    if (l != last_w.end() && s.micro < l->second)
      ATLAS_THROW(Internal, where(i, s) << " after the W of micro-batch " << l->second
                                        << " (a chunk's W's come in increasing micro order)");
    last_w[s.chunk] = s.micro;
  }
  if (whole && split)
    ATLAS_THROW(Internal, fmt::format("stage {} (dp {}): the row mixes Backward with BackwardInput/BackwardWeight slots "
                                      "(a row is either split or not)", stage, dp));
  if (!open.empty()) {
    const auto& [key, i] = *open.begin();
    ATLAS_THROW(Internal, where(static_cast<std::size_t>(i), row[static_cast<std::size_t>(i)])
                              << " has no W after it (its weight gradients would never be computed)");
  }
}

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
  check_split_backward_row(table.row(m_me.stage, m_me.dp), m_me.stage, m_me.dp);
  if (cfg.device.backend == Backend::Emulated) m_emu = emulated_stage(cfg, layout, table, m_me.stage);
  const bool first = m_me.stage == 0;
  const bool last = m_me.stage == pp - 1;
  // ---- communicators beyond the four of the layout (collective over world) ----
  const bool in_embed = pp > 1 && (first || last);
  m_embed = comms.world.split(in_embed ? m_me.dp * layout.tp_size() + m_me.tp : MPI_UNDEFINED,
                              comms.world.rank());
  m_replica = comms.world.split(m_me.dp, comms.world.rank());
  m_replica_spans_dcs = layout.dc_of_stage(0) != layout.dc_of_stage(layout.pp_size() - 1);
  m_dp_spans_dcs = layout.dp_across_dcs() && layout.dc_count() > 1;
  // ---- data (first and last stage read the corpus; the verdict is collective) ----
  mpi::agree(comms.world, "loading the training data", [&] {
    const model::LoaderShape shape{cfg.model.seq_len, cfg.train.micro_batch_size, cfg.train.micro_batches,
                                   layout.dp_size(), m_me.dp};
    model::LoaderShape vshape = shape;
    vshape.micro_batches = cfg.train.eval_batches;
    model::check_vocab_fits_tokenizer(cfg);
    if ((!first && !last) || m_emu) return;  // emulated compute reads no data
    m_data = model::open_data(cfg, shape, vshape);
  });
  // World rank 0 (first stage) reads the data: a split smaller than what a step takes is said once.
  if (comms.world.rank() == 0)
    for (const auto* l : {m_data.train.get(), m_data.val.get()})
      if (l != nullptr)
        if (const std::string w = l->repeat_warning(); !w.empty()) log::warn("{}", w);

  // ---- intra-DC collectives (collective over tp_comm, then dp_comm): MPI on host memory,
  // NCCL on the CUDA backend, chosen by the device room ----
  // (emulated: the TP sums are inside the forward and backward times; the DP sums run for real)
  if (layout.tp_size() > 1 && !m_emu) {
    m_tp = device::make_collective(comms.tp, backend);
    // A TP member that stops must not leave the others waiting forever (the DP sums and the
    // boundaries have the same bound).
    m_tp->bound_waits(cfg.wan.recv_timeout_s, "tensor-parallel", "wan.recv_timeout_s");
  }
  // DP across DCs on host memory: the ring over point-to-point (as Gloo), not MPI's collective
  // (device::make_ring_collective says why); sched::wan_dp_allreduce predicts it.
  const bool dp_ring = layout.dp_size() > 1 && layout.dp_across_dcs() && backend.host_accessible();
  if (dp_ring && comms.world.rank() == 0 && mpi::Environment::tcp_put_protocol().value_or(false))
    log::warn("parallel.dp_across_dcs over Open MPI's TCP transport with its put protocol on: the DP ring's two "
              "directions between a pair of members go one at a time (a two-member ring takes about twice its "
              "time); leave put out of btl_tcp_flags (docs/wan.md, \"Open MPI's put protocol\")");
  if (layout.dp_size() > 1)
    m_dp = dp_ring ? device::make_ring_collective(comms.dp) : device::make_collective(comms.dp, backend);

  mpi::tags::check_pipeline(cfg.train.micro_batches, cfg.train.eval_batches, mpi::tag_upper_bound(), table.virtual_stages);
  if (m_emu) {
    // No model, no parameter tensors: two scratch DP buckets and one buffer per boundary direction.
    if (m_dp)
      for (int k = 0; k < 2; ++k) {
        m_buckets.emplace_back();
        m_buckets.back().buf = backend.alloc_floats(m_emu->bucket_floats);
      }
    m_boundary = std::make_unique<Boundary>(layout, comms, table, wan, profiler, m_emu->boundary_bytes,
                                            cfg.wan.recv_timeout_s, true);
  } else {
    // ---- model shard ----
    model::StageSpec spec{m_me.stage, pp, m_me.tp, layout.tp_size()};
    spec.chunks = table.virtual_stages;  // interleaved 1F1B: this stage's model chunks
    spec.graphs = cfg.device.cuda_graphs;
    const auto& my_row = table.row(m_me.stage, m_me.dp);
    spec.split_backward = std::any_of(my_row.begin(), my_row.end(),
                                      [](const sched::Slot& sl) { return sl.kind == sched::SlotKind::BackwardInput; });
    m_model = std::make_unique<model::StageModel>(cfg.model, cfg.train.micro_batch_size, spec, backend,
                                                  m_tp.get(), static_cast<std::uint64_t>(cfg.run.seed));
    m_model->set_loss_scale(static_cast<float>(1.0 / (cfg.train.micro_batches * layout.dp_size())));

    const std::size_t floats = m_model->boundary_floats();
    // Boundary tensors per (micro-batch, chunk), [micro * chunks + chunk]: with chunks every stage
    // receives and sends (the last stage hands a micro-batch back to the first for the next chunk).
    const int chunks = table.virtual_stages;
    const auto m = static_cast<std::size_t>(cfg.train.micro_batches * chunks);
    for (std::size_t i = 0; i < m; ++i) {
      if (!first || chunks > 1) {
        m_act_in.push_back(backend.alloc_floats(floats));
        m_grad_in.push_back(backend.alloc_floats(floats));
      }
      if (!last || chunks > 1) {
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
        // The last backward of each model chunk finishes that chunk's gradients: they go into
        // buckets as it reports them (one chunk: the row's last backward). The chunks' last
        // backwards run from the last chunk to the first, so the buckets are packed in the same
        // order as with one chunk (head, blocks from the last to the first, embeddings). A split
        // row (BackwardInput + BackwardWeight, never with Backward) finishes them in the chunk's
        // last W: the weight gradients come last, every B of the chunk ran before it.
        const auto& row = table.row(m_me.stage, m_me.dp);
        std::vector<int> last_of_chunk(static_cast<std::size_t>(chunks), -1);
        for (std::size_t i = 0; i < row.size(); ++i)
          if (row[i].kind == sched::SlotKind::Backward || row[i].kind == sched::SlotKind::BackwardWeight)
            last_of_chunk[static_cast<std::size_t>(row[i].chunk)] = static_cast<int>(i);
        m_overlap_backwards = last_of_chunk;
        std::sort(m_overlap_backwards.begin(), m_overlap_backwards.end());
      }
    }
    m_bf16_wire = effective_precision(cfg.device) == Precision::Bf16;
    if (m_bf16_wire) m_wire_stage.resize(floats);
    m_boundary = std::make_unique<Boundary>(layout, comms, table, wan, profiler,
                                            floats * static_cast<std::size_t>(activation_bytes(effective_precision(cfg.device))),
                                            cfg.wan.recv_timeout_s);
  }
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
  // little (2 s for all of them, not each); a sum that does not finish keeps its bucket and its
  // own buffers (the ring's receive piece): MPI or NCCL may still write into them until the job
  // aborts.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (Bucket& b : m_buckets) {
    if (!b.sum) continue;
    const double left = std::max(0.0, std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count());
    if (!b.sum->settle(left)) {
      (void)b.sum.release();                               // deliberately never freed
      auto* kept = new device::Buffer(std::move(b.buf));  // deliberately never freed
      (void)kept;
    }
    b.sum.reset();
  }
  if (std::uncaught_exceptions() > 0) (void)m_in_flight.release();  // the loss, norm and embedding sums' buffers
}

double Trainer::validation_unigram_entropy() const {
  return m_data.val_unigram_entropy(m_cfg.model.vocab, m_cfg.data.val_fraction);
}

std::int64_t Trainer::tokens_per_step() const {
  return m_cfg.tokens_per_step();
}

void Trainer::post_embedding_recv() {
  if (m_embed_wan_partner >= 0) m_boundary->post_exchange_recv(m_embed_wan_partner, kEmbeddingTag, embed_floats());
}

std::size_t Trainer::embed_floats() {
  if (m_emu) return m_emu->embed_floats;
  const model::ParamTensor* wte = m_model->tied_embedding();
  return wte ? static_cast<std::size_t>(wte->shard_numel()) : 0;
}

// ---- the tied-embedding exchange ----

void Trainer::all_reduce_gradients(const Boundary::WaitHook& fill) {
  m_exchange_s = 0.0;
  if (!m_sums_started) start_gradient_sums();
  end_gradient_sums();
  m_sums_started = false;
  m_sums_ended = false;
  if (!m_embed.null()) {
    const std::size_t n = embed_floats();
    std::vector<float>& host = m_embed_host;
    const int partner = m_layout.embedding_partner(m_me);
    if (m_embed_wan_partner >= 0) {
      // Across DCs over the WAN transport (tuned for the WAN; MPI's TCP is not); our half is
      // already on its way (start_gradient_sums).
      const double t0 = m_profiler.now();
      m_boundary->exchange_sum(partner, kEmbeddingTag, host.data(), n, m_me.stage == 0, fill);
      wait_over();
      m_exchange_s = m_profiler.now() - t0;
    } else {
      mpi::Request sum = m_embed.iallreduce_sum(std::span<float>(host));
      wait_bounded(sum, [&] { return "the tied-embedding gradient sum with rank " + std::to_string(partner); });
    }
    if (!m_emu) m_backend.upload(m_model->tied_embedding()->grad.data(), host.data(), n * sizeof(float));
  }
}

void Trainer::start_gradient_sums() {
  m_sums_started = true;
  m_sums_ended = false;
  if (m_emu) {
    emulated_start_sums();
    return;
  }
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
    start_open_bucket();
    m_buckets_step = static_cast<int>(m_open);
  }
}

bool Trainer::gradient_sums_done() {
  bool done = true;
  for (Bucket& b : m_buckets)
    if (b.sum && !b.sum->test()) done = false;  // test every one: each test drives its sum on
  return done;
}

void Trainer::end_gradient_sums() {
  if (m_sums_ended) return;
  m_sums_ended = true;
  if (m_emu) {
    emulated_end_sums();
    return;
  }
  if (m_dp) finish_buckets();
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

// ---- the step's loss ----

// The step's loss goes to world rank 0 (which prints it) as soon as the last stage has it: after
// its last forward, long before the step ends, so rank 0 (the first stage, in another DC when the
// pipeline spans DCs) does not wait a WAN trip for it at the end of every step. Each DP replica's
// last stage (TP lane 0) sends its mean over the micro-batches; rank 0 averages them in DP order.
void Trainer::send_step_loss() {
  if (m_me.tp != 0 || m_emu) return;
  double loss = 0.0;
  for (int m = 0; m < m_cfg.train.micro_batches; ++m) loss += m_model->micro_loss(m);
  m_loss_out = loss / m_cfg.train.micro_batches;
  if (m_comms.world.rank() != 0) m_loss_send = m_comms.world.isend(std::span<const double>(&m_loss_out, 1), 0, kLossTag);
}

void Trainer::post_loss_receives() {
  if (m_comms.world.rank() != 0 || m_emu) return;
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
  req.cancel();  // the job ends: a receive must not write its buffer after the throw (a sum's stays: m_in_flight)
  ATLAS_THROW(Comm, "rank " << m_comms.world.rank() << ": " << what() << " did not complete within "
                            << m_cfg.wan.recv_timeout_s
                            << " s (wan.recv_timeout_s)\n  hint: a peer may be stuck or dead (the other ranks' errors "
                               "name it); raise wan.recv_timeout_s if the link is slow");
}

double Trainer::step_loss() {
  if (m_emu) return std::numeric_limits<double>::quiet_NaN();  // no loss is computed
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

void Trainer::to_wire(void* wire, const device::Buffer& src) {
  if (!m_bf16_wire) {
    m_backend.download(wire, src.data(), src.bytes());
    return;
  }
  ATLAS_ASSERT(src.floats() == m_wire_stage.size(), "boundary tensor of " << src.floats() << " floats, wire stage of "
                                                                           << m_wire_stage.size());
  m_backend.download(m_wire_stage.data(), src.data(), src.bytes());
  device::pack_bf16(m_wire_stage.data(), wire, m_wire_stage.size());
}

void Trainer::from_wire(device::Buffer& dst, const void* wire) {
  if (!m_bf16_wire) {
    m_backend.upload(dst.data(), wire, dst.bytes());
    return;
  }
  ATLAS_ASSERT(dst.floats() == m_wire_stage.size(), "boundary tensor of " << dst.floats() << " floats, wire stage of "
                                                                           << m_wire_stage.size());
  device::unpack_bf16(wire, m_wire_stage.data(), m_wire_stage.size());
  m_backend.upload(dst.data(), m_wire_stage.data(), dst.bytes());
}

}  // namespace atlas::runtime
