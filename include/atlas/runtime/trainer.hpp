// SPDX-License-Identifier: MIT
// The executor: walks this rank's row of the static schedule table once per step and dispatches
// each slot (forward, backward, boundary sends and receives, DP all-reduce, optimizer, idle) to
// the model, the boundary transports and the optimizer. It does not decide the schedule: the
// table's slot marks say where the stagger is and which waits a BubbleFiller may fill. Files:
// trainer.cpp (set-up, the step's loss, evaluation, the tied-embedding exchange), trainer_step.cpp
// (the walk of the row), trainer_gradients.cpp (DP buckets, clipping, AdamW), trainer_gather.cpp.
// With device.backend = emulated the same walk runs without a model (trainer_emulated.cpp): each
// compute slot sleeps its predicted time, every message moves at its real size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/model/dataset.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"
#include "atlas/runtime/boundary.hpp"
#include "atlas/runtime/emulated.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"

namespace atlas::runtime {

/// What one step did, as seen by this rank (loss: the global mean, valid on world rank 0).
struct StepReport {
  int step = 0;
  double loss = 0.0;          ///< mean cross-entropy over the step's global batch (rank 0)
  double lr = 0.0;
  double grad_norm = 0.0;     ///< global norm before clipping
  double step_s = 0.0;        ///< wall time of this rank's step
  double compute_s = 0.0;     ///< forward + backward + optimizer
  double intra_s = 0.0;       ///< waits on intra-DC boundaries + DP all-reduce (inside a DC)
  double allreduce_s = 0.0;   ///< the AllReduce slot (the gradient sums not hidden), in intra_s or wan_s
  double exchange_s = 0.0;    ///< of it, the wait for the tied-embedding partner's half across the WAN (in wan_s)
  int dp_buckets = 0;         ///< DP all-reduce buckets this step (0 without DP)
  int dp_buckets_early = 0;   ///< of which started during the last backward (train.dp_overlap)
  double wan_s = 0.0;         ///< waits on WAN boundaries (+ the DP all-reduce with parallel.dp_across_dcs)
  double idle_s = 0.0;        ///< planned bubbles as executed
  double prefill_s = 0.0;     ///< BubbleTea work in bubbles
  std::int64_t prefill_tokens = 0;
  BoundaryStats boundary;
};

/// Hook for BubbleTea (bubbletea::WaitFiller and the Service implement it). The runtime calls
/// it where the table says: at every bubble (Idle/Prefill slot) and at every wait the table marks
/// sched::SlotMark::FillableWait. Every policy (what to fill, for how long, what to learn) is the
/// filler's; the runtime only hands them over and waits for its own data. Must never block on
/// another process.
class BubbleFiller {
 public:
  virtual ~BubbleFiller() = default;
  /// Work in the bubble `idle_slot` (predicted `budget_s` long). `ended`, when not null, says
  /// whether the bubble is already over (the receive that follows it has completed): a filler
  /// stops as soon as it returns true, and may go on past `budget_s` while it returns false.
  /// Returns (seconds of work, prompt tokens).
  virtual std::pair<double, std::int64_t> fill(int step, const sched::Slot& idle_slot, double budget_s,
                                               const std::function<bool()>* ended) = 0;
  /// A wait the table marks FillableWait begins in slot `index` of this rank's row (a receive;
  /// the WAN sum inside an AllReduce or Optimizer slot); `done` tests it without blocking. May
  /// run work while `done` says false, within its own budget. The runtime then completes the
  /// wait and calls wait_ended(index) where it ends. Returns (seconds of work, prompt tokens).
  virtual std::pair<double, std::int64_t> fill_wait(int step, const sched::Slot& slot, int index,
                                                    const std::function<bool()>& done) {
    (void)step, (void)slot, (void)index, (void)done;
    return {0.0, 0};
  }
  /// The wait fill_wait began at slot `index` is over (its data is in, its sum done).
  virtual void wait_ended(int index) { (void)index; }
  /// Whether the bubbles before the step's sums are watched. One right before the AllReduce slot
  /// (with DP, or marked ExchangeBubble: before a tied-embedding exchange across the WAN): the
  /// runtime starts the step's DP sums there and hands fill() a test that, once they are in,
  /// sends our half of an exchange (so neither a replica nor the partner waits for the fill) and
  /// then tests the partner's. One right before the Optimizer slot, once the AllReduce slot ran:
  /// the runtime starts the gradient-norm sum there and hands fill() its test (so this rank's
  /// share never waits for the fill).
  [[nodiscard]] virtual bool watches_exchange_bubbles() const { return false; }
};

/// The zero-bubble slot contract (docs/schedules.md, "split backward") on one table row: a row
/// has only Backward slots or only BackwardInput (B) + BackwardWeight (W) slots; every B has one
/// W of the same micro-batch and chunk later in the row, and every W one B before it; per chunk
/// the W's come in increasing micro order; every W comes before the row's AllReduce slot and
/// before a bubble marked ExchangeBubble (the gradient sums may start there).
/// Throws Internal naming the first violation (a schedule bug). `stage`, `dp`: for the message.
void check_split_backward_row(const std::vector<sched::Slot>& row, int stage, int dp);

class Trainer {
 public:
  /// Collective over comms.world (creates the embedding and replica communicators). Builds this
  /// rank's model shard, data loaders, optimizer and boundary exchange. `wan` may be null when
  /// no boundary of this rank crosses a DC.
  Trainer(const Config& cfg, const topo::Layout& layout, const topo::Communicators& comms,
          const sched::ScheduleTable& table, wan::PeerTransport* wan, device::Backend& backend,
          Profiler& profiler);
  ~Trainer();

  /// One optimizer step following the table. Collective over comms.world.
  StepReport train_step(int step);
  /// Mean validation loss over train.eval_batches micro-batches per pipeline (forward only).
  /// Collective over comms.world; the value is valid on world rank 0. Not on an emulated run.
  double evaluate();
  /// device.backend = emulated: no model, no loss (StepReport::loss is NaN), compute slots sleep
  /// their predicted time. model() and optimizer() must not be used then.
  [[nodiscard]] bool emulated() const noexcept { return m_emu.has_value(); }

  void set_bubble_filler(BubbleFiller* f) { m_filler = f; }

  [[nodiscard]] model::StageModel& model() { return *m_model; }
  [[nodiscard]] model::AdamW& optimizer() { return m_adamw; }
  [[nodiscard]] model::DataLoader& train_loader() { return *m_data.train; }
  /// Only the first and last stage read data.
  [[nodiscard]] bool has_train_loader() const { return m_data.train != nullptr; }
  [[nodiscard]] const topo::Layout& layout() const { return m_layout; }
  /// Unigram entropy (nats/token) of the validation split: the loss of a model that ignores
  /// context. Only on ranks that read data (first and last stage); 0 elsewhere.
  [[nodiscard]] double validation_unigram_entropy() const;
  /// Tokens a step consumes over the whole job.
  [[nodiscard]] std::int64_t tokens_per_step() const;
  /// Collective over comms.world: the full gradient of every logical tensor gathered on world
  /// rank 0 (name -> values, row-major full shape); empty elsewhere. For equivalence tests.
  [[nodiscard]] std::vector<std::pair<std::string, std::vector<float>>> gather_full(bool gradients) const;

 private:
  /// DP buckets, overlapped with the step's last backward: packs the gradients the model reports
  /// final into buckets and starts each bucket's sum as soon as it is full.
  void pack_ready(std::span<model::ParamTensor* const> params);
  void start_open_bucket();
  /// Waits for every started bucket and copies the sums back (end_gradient_sums).
  void finish_buckets();
  struct Bucket;
  /// Waits (wan.recv_timeout_s at most) for bucket `b`'s sum (the host backends' and the emulated
  /// one's); on a timeout keeps every bucket with a sum open (MPI may still write into their
  /// buffers) and throws naming `which` ("bucket 3 of 7", "emulated") and the stage's replicas.
  void wait_sum(Bucket& b, const std::string& which);
  /// The hook a fillable wait inside slot `index` (SlotMark::FillableWait) hands to the filler
  /// (empty without a filler or mark): adds the filler's seconds to `spent_prefill`, its tokens
  /// to `r`; wait_over() then tells the filler where the wait ended.
  Boundary::WaitHook wait_hook(int step, const sched::Slot& slot, std::size_t index, double& spent_prefill,
                               StepReport& r);
  /// Where a wait wait_hook's hook watched ends (after the exchange, after the norm sum; not after
  /// the optimizer's own work). No-op when no hook ran.
  void wait_over();
  /// A receive slot: hands its wait to the filler (marked FillableWait), then waits for the data.
  /// Returns the filler's seconds.
  double receive(int step, const sched::Slot& slot, std::size_t index, StepReport& r);
  /// Posts the tied-embedding exchange's receive from the partner across the WAN (at the step's
  /// start, so a bubble before the AllReduce slot can be watched).
  void post_embedding_recv();
  /// `fill`, when set, gets the WAN wait inside the slot (the filler's).
  void all_reduce_gradients(const Boundary::WaitHook& fill);
  /// all_reduce_gradients' first half, callable ahead of the AllReduce slot once the step's
  /// backwards are done: starts the DP sums (the buckets not started yet); returns at once.
  void start_gradient_sums();
  /// Drives the started DP sums on; true once all of them completed (true without DP).
  bool gradient_sums_done();
  /// Waits for the DP sums and copies them back, then sends our half of a tied-embedding exchange
  /// across the WAN (its gradient is final only now). Once a step: later calls return at once.
  void end_gradient_sums();
  /// Global gradient norm (a sum over m_replica), clipping, AdamW. `wait_s` = the sum's wait.
  double clip_and_step(int step, const Boundary::WaitHook& fill, double& wait_s);
  /// clip_and_step's first half, callable once the step's gradients are final (the AllReduce
  /// slot ran): this rank's squared norm goes into the pipeline's sum; returns at once.
  void start_norm_sum();
  /// The step's mean loss on world rank 0 (0 elsewhere); see send_step_loss.
  double step_loss();
  void send_step_loss();
  /// Waits for `req` at most wan.recv_timeout_s; then abandons it and throws Comm naming what().
  void wait_bounded(mpi::Request& req, const std::function<std::string()>& what);
  void post_loss_receives();
  // ---- emulated compute (trainer_emulated.cpp) ----
  /// Starts the DP sums of the stage's gradient size in bucket-sized pieces from two scratch
  /// buckets (two sums in flight: a third piece waits for its bucket's previous sum).
  void emulated_start_sums();
  /// Waits for those sums, then sends our half of the tied-embedding exchange from a scratch buffer.
  void emulated_end_sums();
  /// The tied embedding's gradient floats (this rank's shard; 0 without one).
  [[nodiscard]] std::size_t embed_floats();

  const Config& m_cfg;
  const topo::Layout& m_layout;
  const topo::Communicators& m_comms;
  const sched::ScheduleTable& m_table;
  device::Backend& m_backend;
  Profiler& m_profiler;
  topo::Coord m_me;
  mpi::Comm m_embed;    ///< first + last stage of this pipeline lane (tied embedding), pp > 1
  mpi::Comm m_replica;  ///< every rank with this dp index (the global gradient norm)
  bool m_replica_spans_dcs = false;  ///< m_replica's sum crosses the WAN (the pipeline spans DCs)
  bool m_dp_spans_dcs = false;       ///< the DP sum crosses the WAN (parallel.dp_across_dcs)
  int m_embed_wan_partner = -1;      ///< world rank of the tied-embedding partner across the WAN (-1: none)
  double m_exchange_s = 0.0;         ///< the last all_reduce_gradients' wait in that exchange (BubbleTea's fill included)
  bool m_sums_started = false;       ///< start_gradient_sums ran this step (ahead of the AllReduce slot)
  bool m_sums_ended = false;         ///< end_gradient_sums ran this step
  int m_wait_index = -1;             ///< the row slot whose wait the filler watches (wait_hook), -1: none
  std::unique_ptr<device::Collective> m_tp;  ///< sums over tp_comm (MPI on host, NCCL on CUDA)
  std::unique_ptr<device::Collective> m_dp;  ///< sums over dp_comm (gradients), dp > 1 only
  std::unique_ptr<model::StageModel> m_model;
  model::AdamW m_adamw;
  model::DataSplits m_data;  ///< the loaders (first and last stage; none on an emulated run)
  std::unique_ptr<Boundary> m_boundary;
  /// Boundary tensors travel as bf16 (device.precision = bf16, docs/precision.md): rounded RNE at
  /// the sender, widened at the receiver, half the bytes. Else fp32 as stored.
  bool m_bf16_wire = false;
  std::vector<float> m_wire_stage;  ///< fp32 host copy of one boundary tensor (bf16 wire only)
  /// Device tensor `src` into the wire format at `wire` (2 or 4 bytes a float).
  void to_wire(void* wire, const device::Buffer& src);
  /// The wire format at `wire` into device tensor `dst` (fp32).
  void from_wire(device::Buffer& dst, const void* wire);
  std::vector<device::Buffer> m_act_in, m_act_out, m_grad_in, m_grad_out;  // per micro-batch
  std::vector<std::int32_t> m_tokens, m_targets;
  /// One DP all-reduce bucket (train.dp_bucket_bytes) in the backend's memory and the gradient
  /// pieces packed into it. Buckets are kept across steps; dp > 1 only.
  struct Bucket {
    struct Piece {
      model::ParamTensor* p;
      std::size_t tensor_offset;  ///< floats into the tensor's gradient
      std::size_t bucket_offset;  ///< floats into the bucket
      std::size_t count;
    };
    device::Buffer buf;
    std::size_t fill = 0;
    std::vector<Piece> pieces;
    std::unique_ptr<device::PendingSum> sum;
  };
  std::vector<Bucket> m_buckets;
  std::size_t m_open = 0;          ///< the bucket being packed
  std::size_t m_packed_params = 0; ///< parameters packed this step (all of them before the sums end)
  /// The Backward slots that start the overlapped sums (train.dp_overlap): each model chunk's last
  /// (one chunk: the row's last backward), in row order.
  std::vector<int> m_overlap_backwards;
  int m_last_forward = -1;         ///< this row's last Forward slot: the last stage then sends the loss
  /// Buffers of non-blocking MPI operations that may still be pending when an error unwinds the
  /// trainer (MPI_Abort follows, after the destructors): on the heap, and then never freed, so a
  /// late write never lands in freed memory. The members below name them.
  struct InFlight {
    double loss_out = 0.0;
    double norm_sq = 0.0;
    double eval_loss = 0.0;  ///< the validation loss while it is summed and sent (trainer_eval.cpp)
    std::vector<double> loss_in;
    std::vector<float> embed_host;
  };
  std::unique_ptr<InFlight> m_in_flight = std::make_unique<InFlight>();
  double& m_loss_out = m_in_flight->loss_out;  ///< last stage, TP lane 0: this replica's mean loss of the step
  mpi::Request m_loss_send;
  std::vector<double>& m_loss_in = m_in_flight->loss_in;  ///< world rank 0: per DP replica
  std::vector<mpi::Request> m_loss_recvs;
  std::vector<int> m_loss_from;    ///< world rank 0: the sender of each m_loss_recvs entry
  double& m_norm_sq = m_in_flight->norm_sq;  ///< the gradient-norm sum's buffer
  mpi::Request m_norm_sum;         ///< the gradient-norm sum, once started (start_norm_sum)
  bool m_norm_started = false;     ///< start_norm_sum ran this step (ahead of the Optimizer slot)
  bool m_grads_final = false;      ///< the AllReduce slot ran this step: the gradients are final
  std::vector<float>& m_embed_host = m_in_flight->embed_host;  ///< the tied-embedding sum's host buffer
  int m_buckets_step = 0, m_buckets_early = 0;  ///< the last all-reduce's buckets (StepReport)
  BubbleFiller* m_filler = nullptr;
  std::optional<EmulatedStage> m_emu;  ///< device.backend = emulated: sizes and times of this stage
};

}  // namespace atlas::runtime
