// SPDX-License-Identifier: MIT
// BubbleTea's prefill service inside `atlas train`: installed as the runtime's BubbleFiller, it
// runs inference prefill chunks in this rank's bubbles (the schedule table's Idle slots) when
// their predicted time fits what is left of the bubble, passes activations along the DC's
// inference pipeline (ranks of one DC, never over the WAN), hands each finished request's KV
// cache and first token to the DC's decode worker, and accounts for everything. It never waits
// on another rank or on the worker inside a bubble, and never touches training state.
#pragma once

#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "atlas/bubbletea/cost.hpp"
#include "atlas/bubbletea/decode.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/bubbletea/report.hpp"
#include "atlas/bubbletea/requests.hpp"
#include "atlas/bubbletea/wire.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/bubbletea/wait_filler.hpp"
#include "atlas/bubbletea/wait_queue.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"

namespace atlas::bubbletea {

struct ServiceOptions {
  std::string worker_program;   ///< "" = default_worker_program()
  int worker_nice = 19;         ///< the decode worker's CPU priority (shares a host with training)
  int worker_threads = 1;
  double timeout_s = 60.0;      ///< start-up and teardown waits on the worker and the pipeline
  int calibration_repeats = 3;
};

class Service final : public WaitFiller {
 public:
  /// Collective over comms.world. Builds this rank's inference layers (bubbletea.weights: random
  /// from run.seed, or read from an atlas checkpoint), calibrates the prefill cost model on
  /// `backend`, loads the requests (trace read by world rank 0 and broadcast), checks the memory
  /// cap, starts the DC's decode worker (DC rank 0) and sends it this rank's weights.
  /// Throws ConfigError on every rank for a bad trace, a model that does not fit
  /// bubbletea.kv_cap_bytes, a layer split that leaves a rank without blocks, or a worker that
  /// cannot start. `backend` and `profiler` must outlive *this.
  Service(const Config& cfg, const topo::Layout& layout, const topo::Communicators& comms,
          const sched::ScheduleTable& table, device::Backend& backend, runtime::Profiler& profiler,
          ServiceOptions options = {});
  ~Service() override;
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  /// Starts the request clock: arrival times count from now (profiler clock). Not collective;
  /// call on every rank right after Profiler::sync_epoch, before the first step.
  void start();

  /// The runtime's hook at an Idle/Prefill slot (and WaitFiller's, in a fillable wait): runs prefill chunks whose predicted time (plus
  /// bubbletea.guard_ms) fits what is left of the bubble, and non-blocking bookkeeping (MPI
  /// tests, socket writes). Where the bubble ends in a receive (`ended` given), BubbleTea tests
  /// it before every chunk and stops as soon as it has arrived, or at the end of `budget_s` (the
  /// table's prediction) or, past it, of the bubbletea.stretch_quantile of this bubble's real
  /// lengths over its last RecentWaits::kCapacity steps (up to max_stretch x `budget_s`). A WAN wait inside
  /// a training slot (AllReduce, Optimizer; `ended` given) is filled within `budget_s` as given
  /// (WaitFiller::fill_wait stretched it). Otherwise the bubble is `budget_s` (the table's prediction) or,
  /// when the profiler records slots, an allowance learned from the wait that followed it the last time
  /// (a real bubble shorter than predicted shrinks it; a measured longer one lets it grow, up to
  /// max_stretch x `budget_s`). Returns (seconds of prefill work, prompt tokens through this
  /// rank's layers). Never blocks on another process. Not collective.
  std::pair<double, std::int64_t> fill(int step, const sched::Slot& slot, double budget_s,
                                       const std::function<bool()>* ended) override;

  /// How long the watched bubble at `index` of this rank's row may be filled when the table
  /// says `budget_s`: the table's length until a real length is known, then the
  /// bubbletea.stretch_quantile of the last (up to RecentWaits::kCapacity) real lengths, within [budget_s, max_stretch x budget_s]. A real length comes
  /// from a receive that arrived during the fill, or (profiler on) from its recorded end.
  [[nodiscard]] double watched_allowance_s(int index, double budget_s);

  /// Adds one training step's timings to this rank's account.
  void after_step(const runtime::StepReport& rep);

  /// Collective over comms.world: stops prefilling, drains the DC pipelines' messages, flushes
  /// the KV handoffs, waits for the decode workers' results, and gathers the report (complete on
  /// every rank). Call once, after the last step.
  Report finish();

  [[nodiscard]] const InferenceModel& model() const { return *m_model; }
  /// "#"-prefixed lines for the run's header: the inference model, each rank's blocks, memory
  /// and calibrated cost, the requests and the decode workers (same text on every rank).
  [[nodiscard]] const std::string& setup_summary() const noexcept { return m_summary; }
  /// Requests whose prefill finished on this rank (the head of its DC's pipeline), so far.
  [[nodiscard]] int prefilled_here() const;
  /// This rank's place in its inference pipeline (bubbletea.pipeline); 0 admits the requests.
  [[nodiscard]] int pipeline_index() const noexcept { return m_index; }
  [[nodiscard]] const PrefillCost& cost() const { return m_cost; }

 private:
  static constexpr int kTagChunk = mpi::tags::kBubbleChunk;      ///< activations along the DC pipeline (m_comm)
  static constexpr int kTagRelease = mpi::tags::kBubbleRelease;  ///< releases and prefill-done notices to the dispatcher
  struct ChunkHeader {
    std::int64_t request;
    std::int32_t chunk, n_chunks, pos, n, prompt_tokens, max_new_tokens;
    double arrival_s, start_s;
  };
  struct Incoming {
    ChunkHeader h;
    std::vector<char> bytes;  ///< header + n x hidden floats
  };
  struct PendingRecv {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<char> bytes;
  };
  struct PendingSend {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<char> bytes;
  };
  struct Active {  ///< a request with KV on this rank
    KvCache cache;
    int next_chunk = 0;
  };
  /// The chunk begun and not ended on this rank (its activations are in the model's scratch).
  struct Running {
    bool active = false;
    ChunkHeader h{};
    int blocks_done = 0;
    double spent_s = 0.0;  ///< its run time so far, over its pieces
  } m_running;

  void poll();
  void admit_arrivals(double now_job);
  /// Runs (or goes on with) one chunk predicted to fit `remaining_ms`; false when none does.
  /// `stop` (may be empty) is tested between the chunk's blocks: when it says true, the chunk
  /// pauses there (its activations stay in the model) and the next run_one goes on with it first.
  bool run_one(double remaining_ms, const std::function<bool()>& stop);
  /// Nothing to run whatever the time left: no paused chunk, and on a later rank no chunk from
  /// the previous one; on the DC's first rank no started request and none admissible (the queue
  /// empty, or bubbletea.max_in_flight reached).
  [[nodiscard]] bool starved() const;
  [[nodiscard]] int max_in_flight() const;  ///< bubbletea.max_in_flight, or 2 x the DC's ranks
  /// Starts chunk `h` (input: prompt `tokens` on the DC's first rank, else `act_in`), then
  /// continue_chunk.
  void run_chunk(const ChunkHeader& h, const std::int32_t* tokens, const float* act_in,
                 const std::function<bool()>& stop);
  /// Runs the paused chunk's next blocks until `stop` says true between two of them (paused
  /// again) or the chunk ends (its output: to the next rank, or first token + KV handoff). `t0`:
  /// when this piece of it began (the profiler's event).
  void continue_chunk(const std::function<bool()>& stop, double t0);
  /// The profiler's event of a chunk's piece [t0, t1] (the whole chunk when it never paused).
  void record_chunk_event(const ChunkHeader& h, double t0, double t1);
  /// This rank is done with `request` (its KV is in the worker's socket, or dropped): tell the
  /// dispatcher (or, on the dispatcher, count it).
  void released_here(std::int64_t request);
  /// The DC's last rank finished `request`'s prefill: it no longer occupies the pipeline (its
  /// KV handoff may still wait for the worker, bounded by the memory reservation).
  void prefilled_here(std::int64_t request);
  /// A release (id >= 0) or a prefill-done notice (-id - 1) to the dispatcher (DC rank 0).
  void notify_dispatcher(std::int64_t message);
  /// The dispatcher's count of a release (frees the reservation once every rank released
  /// `request`) or of a prefill-done notice (request < 0: one fewer in flight).
  void release(std::int64_t request, int from);
  [[nodiscard]] double job_now() const;
  void track_memory();
  /// Updates the allowance of the previous bubble from the wait of the slot after it.
  void learn_from_last_bubble();

  const Config& m_cfg;
  const topo::Layout& m_layout;
  const topo::Communicators& m_comms;
  const sched::ScheduleTable& m_table;
  device::Backend& m_backend;
  runtime::Profiler& m_profiler;
  ServiceOptions m_opt;

  bool m_emulated = false;  ///< device.backend = emulated: no arithmetic, no decode worker
  EmulatedDecoder m_decoder;  ///< emulated, the DC's last rank: the decode worker's clock
  mpi::Comm m_comm;  ///< a dup of the DC communicator: inference activations and releases only
  int m_index = 0;   ///< position in this rank's inference pipeline (bubbletea.pipeline)
  int m_pipeline = 0;  ///< its id (PipelinePlace::pipeline)
  int m_size = 1;
  std::unique_ptr<InferenceModel> m_model;
  PrefillCost m_cost;

  // requests (the dispatcher on index 0 owns the queue)
  std::vector<Request> m_requests;    ///< every request of the job (id order)
  std::vector<int> m_mine;            ///< ids of this DC's requests, in arrival order
  std::size_t m_next_arrival = 0;     ///< next of m_mine not yet arrived
  WaitQueue m_waiting;                ///< arrived, not started (dispatcher): positions in m_mine
  std::vector<int> m_started;         ///< started, chunks left at index 0 (dispatcher)
  std::map<std::int64_t, Active> m_active;
  std::deque<Incoming> m_ready;       ///< received chunks waiting for a bubble (index > 0)
  std::deque<PendingRecv> m_recvs;
  std::vector<PendingSend> m_sends;
  std::int64_t m_chunks_sent = 0, m_chunks_received = 0;
  std::int64_t m_releases_sent = 0, m_releases_received = 0;

  // memory cap (dispatcher's reservation over the whole DC pipeline)
  std::uint64_t m_reserve_per_token = 0;  ///< max over the DC's ranks: KV + activation buffers
  std::uint64_t m_reserve_budget = 0;     ///< min over the DC's ranks: cap - weights - scratch
  std::uint64_t m_reserved = 0;
  int m_in_flight = 0;  ///< dispatcher: requests started and not yet prefilled by the DC's last rank
  std::map<std::int64_t, int> m_release_count;
  std::uint64_t m_fixed_bytes = 0;

  // decode worker
  WorkerProcess m_worker;                  ///< DC rank 0 only
  wan::Fd m_sock;
  wire::Outbox m_out;
  wire::Inbox m_in;                        ///< DC rank 0: results
  bool m_worker_done = false;
  bool m_finished = false;
  std::string m_worker_failure;
  bool m_worker_failure_reported = false;  // a warning said so during training (service_pipeline.cpp)

  // learning the bubbles' lengths (into WaitFiller::m_budgets, the one learner)
  const std::vector<sched::Slot>* m_row = nullptr;
  /// The last unwatched bubble, until the slot after it ran (learn_from_last_bubble).
  struct LastBubble {
    bool pending = false;
    int step = 0, index = 0;
    double spent_s = 0.0;   ///< time inside fill()
    double budget_s = 0.0;  ///< the table's
  } m_last;
  /// A watched bubble whose receive had not come when its fill stopped: resolved by the fill of
  /// that receive (a wait BubbleTea filled) or by the receive's recorded end.
  struct WatchedBubble {
    bool pending = false;
    int step = 0, index = 0;
    double enter_s = 0.0;  ///< profiler time the bubble began
  } m_watch;
  void learn_watched_length();
  void record_watched_length(int index, double length_s);
  /// This rank's recorded event of slot `index` of `step` (index past the row: the next step's
  /// first), or nullptr.
  const runtime::SlotEvent* find_event(int step, int index) const;

  std::string m_summary;

  // accounting
  double m_t0 = 0.0;  ///< profiler time of start()
  bool m_started_clock = false;
  RankStats m_stats;
  double m_queue_sum = 0.0;
  std::int64_t m_queue_samples = 0;
  std::vector<double> m_step_s;
  std::map<int, RequestRecord> m_records;  ///< what this rank knows about each request
};

}  // namespace atlas::bubbletea
