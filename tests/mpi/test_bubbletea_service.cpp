// SPDX-License-Identifier: MIT
// BubbleTea end to end under MPI, with the real decode worker processes:
//  - requests prefilled chunk by chunk in "bubbles" across a DC's inference pipeline, handed off
//    and decoded give exactly the tokens of a standalone run of the same model (host: bitwise);
//  - a tight memory cap makes requests wait, never exceeds the cap, still serves them all;
//  - training with BubbleTea on has bitwise the losses of training with it off (np 4: two DCs of
//    two stages), while prefills are served in its bubbles;
//  - bad input (unsorted trace, a model over the memory cap, a DC with more ranks than blocks,
//    no worker program) is the same ConfigError on every rank.
// Layouts by np: 1 -> one DC of 1 stage; 2 -> one DC of 2 stages (a 2-rank inference
// pipeline); 3 -> DCs of 1 and 2 stages; 4 -> two DCs of 2 stages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <thread>

#include "atlas/bubbletea/bench.hpp"
#include "atlas/bubbletea/service.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::bubbletea {
namespace {

namespace fs = std::filesystem;

std::string corpus_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return (fs::path(env ? env : ATLAS_SOURCE_DIR) / "data/brown").string();
}

std::vector<int> stages_for(int np) {
  switch (np) {
    case 1: return {1};
    case 2: return {2};
    case 3: return {1, 2};
    default: return {2, 2};
  }
}

/// A temporary path unique to this MPI job (rank 0's pid, shared): ctest runs the np variants of
/// this test at the same time, and they must not write each other's files.
fs::path job_temp(const mpi::Comm& world, const std::string& stem) {
  int pid = world.rank() == 0 ? static_cast<int>(::getpid()) : 0;
  world.bcast(std::span<int>(&pid, 1), 0);
  return fs::temp_directory_path() / (stem + "-" + std::to_string(pid));
}

/// Rank 0 removes `path` when the test ends (every rank has finished reading it by then: the
/// last use of each such file is collective).
struct RemovedAtEnd {
  const mpi::Comm& world;
  fs::path path;
  ~RemovedAtEnd() {
    std::error_code ec;
    if (world.rank() == 0) fs::remove_all(path, ec);
  }
};

std::string deck_text(const mpi::Comm& world) {
  const std::vector<int> spd = stages_for(world.size());
  std::string s, dcs, gpus, lat, bw;
  for (std::size_t i = 0; i < spd.size(); ++i) {
    s += std::to_string(spd[i]) + " ";
    dcs += "dc" + std::to_string(i) + " ";
    gpus += "4 ";
    for (std::size_t j = 0; j < spd.size(); ++j) {
      lat += i == j ? "0 " : "0.1 ";
      bw += i == j ? "0 " : "10 ";
    }
  }
  const std::string text =
      "run.name = bt_test\nrun.out_dir = " + (fs::temp_directory_path() / "atlas_bt_test").string() +
      "\ncluster.dcs = " + dcs + "\ncluster.gpus_per_dc = " + gpus + "\ncluster.latency_ms = " + lat +
      "\ncluster.bandwidth_gbps = " + bw + "\nparallel.stages_per_dc = " + s +
      "\nmodel.layers = 12\nmodel.hidden = 32\nmodel.heads = 4\nmodel.seq_len = 16\n"
      "train.micro_batch_size = 2\ntrain.micro_batches = 2\ntrain.warmup_steps = 1\nrun.steps = 3\n"
      "schedule.kind = gpipe\nschedule.fwd_ms_per_layer = 4\nprofile.enabled = false\ndevice.threads = 1\n"
      "wan.recv_timeout_s = 30\ndata.corpus_dir = " + corpus_dir() + "\n"
      "bubbletea.enabled = true\nbubbletea.layers = 4\nbubbletea.hidden = 32\nbubbletea.heads = 4\n"
      "bubbletea.context = 48\nbubbletea.vocab = 61\nbubbletea.rate_per_s = 0\nbubbletea.requests = 9\n"
      "bubbletea.prompt_tokens_min = 3\nbubbletea.prompt_tokens_max = 21\nbubbletea.max_new_tokens = 7\n"
      "bubbletea.chunk_tokens = 5\nbubbletea.guard_ms = 0.1\nbubbletea.kv_cap_bytes = 8M\n";
  return text;
}

Config make_cfg(const mpi::Comm& world, const std::vector<std::string>& extra = {}) {
  const std::string text = deck_text(world);
  deck::JobShape shape;
  shape.world_size = world.size();
  Config cfg = deck::parse_and_validate("bt_test", text, extra, shape);
  // As deck::load for `atlas train`: rank 0 reads the device profiles and broadcasts them, so the
  // tables below are the production table (sched::build_schedule on the deck's cost model).
  deck::read_device_profiles(world, cfg);
  return cfg;
}

ServiceOptions options() {
  ServiceOptions o;
  o.worker_program = ATLAS_DECODE_WORKER_EXE;
  o.worker_nice = 0;
  o.timeout_s = 30;
  return o;
}

/// A started Service over `world` and everything it refers to.
struct Served {
  Served(const mpi::Comm& world, const Config& c, bool profile = false)
      : cfg(c),
        layout(world.size(), cfg.parallel),
        comms(topo::Communicators::create(world, layout)),
        backend(device::make_backend(cfg.device)),
        table(sched::build_schedule(cfg, layout)),
        profiler(profile, comms.world.rank(), 0),
        svc(cfg, layout, comms, table, *backend, profiler, options()) {
    svc.start();
  }
  Config cfg;
  topo::Layout layout;
  topo::Communicators comms;
  std::unique_ptr<device::Backend> backend;
  sched::ScheduleTable table;
  runtime::Profiler profiler;
  Service svc;

  /// Warm up: the first bubbles (five unwatched `budget_s` ones, each followed by its length)
  /// admit requests and start the DC pipelines.
  void warm_up(const sched::Slot& idle, double budget_s) {
    for (int i = 0; i < 5; ++i) {
      (void)svc.fill(0, idle, budget_s, nullptr);
      std::this_thread::sleep_for(std::chrono::duration<double>(budget_s));
    }
  }
};

/// The standalone reference: the whole model on one rank, same weights, same prompt.
std::vector<std::int32_t> standalone(const Config& cfg, device::Backend& be, const Request& r) {
  const InferShape sh = InferShape::from(cfg.bubbletea);
  const int chunk = cfg.bubbletea.chunk_tokens > 0 ? cfg.bubbletea.chunk_tokens : sh.context;
  InferenceModel m(sh, LayerRange{0, sh.layers, true, true}, be, chunk);
  m.init_random(static_cast<std::uint64_t>(cfg.run.seed), cfg.model.init_std);
  return generate(m, r.prompt, cfg.bubbletea.chunk_tokens, r.max_new_tokens);
}

/// Calls fill() with `budget_s` bubbles on every rank until every request is prefilled (each
/// bubble watched with `ended` when given).
Report serve_all(const Config& cfg, const mpi::Comm& world, double budget_s, int* rounds_out = nullptr,
                 const std::function<bool()>* ended = nullptr) {
  Served served(world, cfg);
  const topo::Communicators& comms = served.comms;
  Service& svc = served.svc;
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, budget_s * 1e3};
  int rounds = 0;
  const int total = cfg.bubbletea.requests;
  while (comms.world.allreduce(svc.prefilled_here(), MPI_SUM) < total && rounds < 5000) {
    (void)svc.fill(0, idle, budget_s, ended);
    ++rounds;
  }
  if (rounds_out) *rounds_out = rounds;
  return svc.finish();
}

TEST(BubbleTeaService, TokensEqualAStandaloneRun) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world);
  int rounds = 0;
  const Report rep = serve_all(cfg, world, 0.02, &rounds);
  ASSERT_EQ(rep.requests.size(), 9U);
  EXPECT_EQ(rep.served(), 9);
  EXPECT_EQ(rep.decoded(), 9);
  EXPECT_LT(rounds, 5000);
  const topo::Layout layout(world.size(), cfg.parallel);
  const auto reqs = load_requests(cfg, layout.dc_count());
  auto be = device::make_backend(cfg.device);
  for (const auto& q : rep.requests) {
    const Request& r = reqs[static_cast<std::size_t>(q.id)];
    EXPECT_EQ(q.prompt_tokens, static_cast<int>(r.prompt.size()));
    EXPECT_EQ(q.chunks, static_cast<int>(chunk_sizes(q.prompt_tokens, 5).size())) << "request " << q.id;
    EXPECT_EQ(q.dc, q.id % layout.dc_count());
    EXPECT_GE(q.ttft_s(), 0.0);
    EXPECT_EQ(q.tokens, standalone(cfg, *be, r)) << "request " << q.id;
  }
  // Every rank of a DC ran every chunk of its DC's requests through its blocks.
  for (const auto& k : rep.ranks) {
    std::int64_t chunks = 0, tokens = 0;
    for (const auto& q : rep.requests)
      if (q.dc == k.dc) {
        chunks += q.chunks;
        tokens += q.prompt_tokens;
      }
    EXPECT_EQ(k.chunks, chunks) << "rank " << k.world_rank;
    EXPECT_EQ(k.tokens, tokens) << "rank " << k.world_rank;
    EXPECT_GT(k.cost_per_token_ms, 0.0);
  }
}

// A watched bubble whose data comes while a chunk runs stops the chunk between two blocks (the
// training slot waits for at most one block, not the whole chunk); the next bubble goes on with
// it where it stopped. Here "the data" comes at every second test: every chunk of a rank with 2+
// blocks stops at least once, and the tokens are still bitwise a standalone run's.
TEST(BubbleTeaService, ChunksStoppedBetweenBlocksGoOnWhereTheyStopped) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world);
  int tests = 0;
  const std::function<bool()> every_second = [&tests] { return ++tests % 2 == 0; };
  const Report rep = serve_all(cfg, world, 0.02, nullptr, &every_second);
  ASSERT_EQ(rep.requests.size(), 9U);
  EXPECT_EQ(rep.served(), 9);
  EXPECT_EQ(rep.decoded(), 9);
  const topo::Layout layout(world.size(), cfg.parallel);
  const auto reqs = load_requests(cfg, layout.dc_count());
  auto be = device::make_backend(cfg.device);
  for (const auto& q : rep.requests) EXPECT_EQ(q.tokens, standalone(cfg, *be, reqs[static_cast<std::size_t>(q.id)])) << "request " << q.id;
  for (const auto& k : rep.ranks) {
    if (k.layers >= 2) {
      EXPECT_GE(k.pauses, k.chunks) << "rank " << k.world_rank << ": a chunk of " << k.layers << " blocks ran whole";
    } else {
      EXPECT_EQ(k.pauses, 0) << "rank " << k.world_rank << ": one block has nothing to stop between";
    }
    EXPECT_GT(k.chunks, 0) << "rank " << k.world_rank;
  }
}

TEST(BubbleTeaService, MemoryCapMakesRequestsWaitButNeverOverflows) {
  const mpi::Comm world = mpi::Comm::world();
  // A cap with room for the largest rank's weights and scratch plus 24 prompt tokens of KV and
  // activations: about one request in flight at a time.
  const Config probe = make_cfg(world);
  const topo::Layout layout(world.size(), probe.parallel);
  auto be = device::make_backend(probe.device);
  // The largest rank: the one holding the embedding (+ head when alone).
  const int ranks = layout.ranks_in_dc(0);
  const InferShape sh = InferShape::from(probe.bubbletea);
  InferenceModel first(sh, split_layers(sh.layers, ranks, 0), *be, 5);
  const std::uint64_t per_token = 2 * first.kv_bytes_per_token() + 2 * 32 * 4;
  const std::uint64_t cap = first.weight_bytes() + first.scratch_bytes() + per_token * 24 + 4096;
  const Config cfg = make_cfg(world, {"bubbletea.kv_cap_bytes=" + std::to_string(cap)});
  const Report rep = serve_all(cfg, world, 0.02);
  EXPECT_EQ(rep.served(), 9);
  for (const auto& k : rep.ranks) {
    EXPECT_LE(k.peak_bytes, cap) << "rank " << k.world_rank;
    EXPECT_GT(k.peak_bytes, k.weight_bytes) << "rank " << k.world_rank;
  }
}

/// This process's children (the decode worker on a DC's first rank), from /proc/*/stat.
std::vector<pid_t> child_processes() {
  std::vector<pid_t> out;
  for (const auto& d : fs::directory_iterator("/proc")) {
    const std::string name = d.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(d.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const auto close = line.rfind(')');  // "pid (comm) state ppid ..."
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == ::getpid()) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// A decode worker that takes nothing (stopped: on a shared host it runs only on spare CPU, which
// a well-filled pipeline leaves little of) must not stop admission: the KV handoffs wait for it,
// bounded by the memory reservation, while the dispatcher keeps starting requests (at most
// 2 x DC ranks are being prefilled at once, not 2 x DC ranks waiting for the worker). Each
// request's KV here (400 tokens, ~800 KB over the DC's ranks) is more than a socket takes, so 32
// such handoffs cannot all vanish into the kernel's buffers (about 5 MB per socket here). Once the worker runs again every request is decoded.
TEST(BubbleTeaService, AStalledDecodeWorkerDoesNotStopAdmission) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"bubbletea.hidden=64", "bubbletea.context=512", "bubbletea.prompt_tokens_min=400",
                                      "bubbletea.prompt_tokens_max=401", "bubbletea.chunk_tokens=25",
                                      "bubbletea.requests=32", "bubbletea.kv_cap_bytes=128M"});
  Served served(world, cfg);
  const std::vector<pid_t> workers = child_processes();
  const bool dispatcher = served.layout.coord(world.rank()).stage == served.layout.first_stage_of_dc(
                                                                           served.layout.coord(world.rank()).dc);
  EXPECT_EQ(workers.size(), dispatcher ? 1U : 0U);
  struct Resumed {  // the workers run again however the test ends
    const std::vector<pid_t>& pids;
    ~Resumed() {
      for (pid_t p : pids) ::kill(p, SIGCONT);
    }
  } resumed{workers};
  for (pid_t p : workers) ASSERT_EQ(::kill(p, SIGSTOP), 0);
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, 200.0};
  const int total = cfg.bubbletea.requests;
  int prefilled = 0;
  for (int round = 0; round < 500 && prefilled < total; ++round) {
    (void)served.svc.fill(0, idle, 0.2, nullptr);
    prefilled = world.allreduce(served.svc.prefilled_here(), MPI_SUM);
  }
  EXPECT_EQ(prefilled, total) << "admission stopped while the decode worker took nothing";
  for (pid_t p : workers) ::kill(p, SIGCONT);
  const Report rep = served.svc.finish();
  EXPECT_EQ(rep.served(), total);
  EXPECT_EQ(rep.decoded(), total);
  for (const auto& k : rep.ranks) EXPECT_LE(k.peak_bytes, cfg.bubbletea.kv_cap_bytes) << "rank " << k.world_rank;
}

struct TrainRun {
  std::vector<double> losses;
  Report report;
};

TrainRun train(const Config& cfg, const mpi::Comm& world) {
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  const topo::Coord me = layout.coord(comms.world.rank());
  auto backend = device::make_backend(cfg.device);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  const std::vector<int> peers = layout.wan_peers(me);
  auto wan = wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, peers);
  runtime::Profiler profiler(false, comms.world.rank(), 0);
  runtime::Trainer trainer(cfg, layout, comms, table, wan.get(), *backend, profiler);
  std::unique_ptr<Service> svc;
  if (cfg.bubbletea.enabled) {
    svc = std::make_unique<Service>(cfg, layout, comms, table, *backend, profiler, options());
    trainer.set_bubble_filler(svc.get());
    svc->start();
  }
  TrainRun out;
  for (int s = 0; s < cfg.run.steps; ++s) {
    const runtime::StepReport r = trainer.train_step(s);
    if (svc) svc->after_step(r);
    out.losses.push_back(comms.world.allreduce(r.loss, MPI_SUM));  // rank 0's value (others 0)
  }
  if (svc) out.report = svc->finish();
  return out;
}

TEST(BubbleTeaService, TrainingLossesAreBitwiseUnchanged) {
  const mpi::Comm world = mpi::Comm::world();
  const Config on = make_cfg(world);
  const Config off = make_cfg(world, {"bubbletea.enabled=false"});
  const TrainRun a = train(off, world);
  const TrainRun b = train(on, world);
  ASSERT_EQ(a.losses.size(), 3U);
  EXPECT_EQ(a.losses, b.losses);  // bitwise
  for (double l : a.losses) EXPECT_TRUE(std::isfinite(l) && l > 0);
  // BubbleTea did work in the bubbles (one stage has none), and what it served is right.
  double prefill = 0;
  for (const auto& k : b.report.ranks) prefill += k.prefill_s;
  if (world.size() > 1) {
    EXPECT_GT(b.report.served(), 0);
    EXPECT_GT(prefill, 0.0);
  }
  const topo::Layout layout(world.size(), on.parallel);
  const auto reqs = load_requests(on, layout.dc_count());
  auto be = device::make_backend(on.device);
  for (const auto& q : b.report.requests) {
    if (q.prefilled() && static_cast<int>(q.tokens.size()) == q.max_new_tokens) {
      EXPECT_EQ(q.tokens, standalone(on, *be, reqs[static_cast<std::size_t>(q.id)])) << "request " << q.id;
    }
  }
}

// bubbletea.fill_wan_waits: the trainer hands the WAN waits inside training slots to the filler
// (the tied-embedding sum between DCs in AllReduce, the gradient-norm sum across DCs in
// Optimizer) with a test that ends them. A filler that spins on that test until it says done
// proves the test makes progress; the losses stay bitwise those of a run without a filler.
// The recorder takes BubbleTea's wait policy (bubbletea::WaitFiller: which waits, their budgets)
// and records what it is handed.
struct WaitRecorder : bubbletea::WaitFiller {
  using WaitFiller::WaitFiller;
  struct RecvFill {
    int step, index;
    double budget_s;
    /// From the fill's start to the wait's last "not yet": what WaitFiller learns as the wait's
    /// length (wait_ended), so the two agree however long the poll after it took.
    double waited_s = 0.0;
  };
  std::map<sched::SlotKind, int> watched;  ///< fill calls with a test, by slot kind
  std::vector<RecvFill> recv_fills;        ///< receives handed over (bubbletea.fill_recv_waits)
  std::vector<RecvFill> optimizer_fills;   ///< the norm sum's WAN waits handed over, with their budgets
  const std::vector<sched::Slot>* row = nullptr;  ///< this rank's row of the table
  int spins = 0;
  /// Bubbles right before the AllReduce slot handed over with a test (the partner's half of the
  /// tied-embedding exchange across the WAN): spun on until it says in, then held this long
  /// more (a chunk that runs past the arrival).
  double hold_before_all_reduce_s = 0.0;
  int watched_before_all_reduce = 0;
  /// The same for bubbles right before the Optimizer slot (the pipeline's gradient-norm sum);
  /// negative: such a bubble is left unfilled (the sum's wait then falls to the Optimizer slot).
  double hold_before_optimizer_s = 0.0;
  int watched_before_optimizer = 0;
  /// fill() calls for the bubbles that end the row (after its last training slot), by step.
  std::map<int, int> tail_fills;
  std::pair<double, std::int64_t> fill(int step, const sched::Slot& slot, double budget_s,
                                       const std::function<bool()>* ended) override {
    if (row != nullptr && &slot >= row->data() && &slot < row->data() + row->size()) {
      bool tail = true;
      for (const sched::Slot* p = &slot; p < row->data() + row->size(); ++p)
        tail = tail && sched::is_bubble(p->kind);
      if (tail) ++tail_fills[step];
    }
    if (ended == nullptr) return {0.0, 0};
    if (slot.kind == sched::SlotKind::Idle) {
      const auto i = static_cast<std::size_t>(&slot - row->data());
      if (i + 1 >= row->size()) return {0.0, 0};
      const bool before_optimizer = (*row)[i + 1].kind == sched::SlotKind::Optimizer;
      if ((*row)[i + 1].kind != sched::SlotKind::AllReduce && !before_optimizer) return {0.0, 0};
      if (before_optimizer && hold_before_optimizer_s < 0) return {0.0, 0};
      ++(before_optimizer ? watched_before_optimizer : watched_before_all_reduce);
      spin_until(*ended);
      const double hold = before_optimizer ? hold_before_optimizer_s : hold_before_all_reduce_s;
      std::this_thread::sleep_for(std::chrono::duration<double>(hold));
      return {hold, 0};
    }
    ++watched[slot.kind];
    if (sched::is_recv(slot.kind)) recv_fills.push_back({step, static_cast<int>(&slot - row->data()), budget_s});
    const auto t0 = std::chrono::steady_clock::now();
    const auto last_pending = spin_until(*ended);
    if (slot.kind == sched::SlotKind::Optimizer)
      optimizer_fills.push_back({step, static_cast<int>(&slot - row->data()), budget_s,
                                 std::chrono::duration<double>(last_pending - t0).count()});
    return {0.0, 0};
  }
  /// Polls `done` until it says true; returns when it last said "not yet" (the start if never).
  std::chrono::steady_clock::time_point spin_until(const std::function<bool()>& done) {
    const auto t0 = std::chrono::steady_clock::now();
    auto last_pending = t0;
    while (!done()) {
      last_pending = std::chrono::steady_clock::now();
      ++spins;
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
        ADD_FAILURE() << "the wait's test never said done";
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return last_pending;
  }
};

struct RecordedRun {
  RecordedRun(const Config& cfg, const topo::Layout& layout) : rec(cfg, layout) {}
  std::vector<double> losses;
  WaitRecorder rec;
  std::vector<runtime::SlotEvent> events;  ///< this rank's slots (when `profile`)
};

RecordedRun run_with_recorder(const Config& cfg, const mpi::Comm& world, bool filler, bool profile,
                              double hold_before_all_reduce_s = 0.0, double hold_before_optimizer_s = 0.0) {
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  const topo::Coord me = layout.coord(comms.world.rank());
  auto backend = device::make_backend(cfg.device);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  auto wan = wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, layout.wan_peers(me));
  runtime::Profiler profiler(profile, comms.world.rank(), 0);
  runtime::Trainer trainer(cfg, layout, comms, table, wan.get(), *backend, profiler);
  RecordedRun run(cfg, layout);
  run.rec.row = &table.row(me.stage, me.dp);
  run.rec.hold_before_all_reduce_s = hold_before_all_reduce_s;
  run.rec.hold_before_optimizer_s = hold_before_optimizer_s;
  if (filler) trainer.set_bubble_filler(&run.rec);
  for (int s = 0; s < cfg.run.steps; ++s)
    run.losses.push_back(comms.world.allreduce(trainer.train_step(s).loss, MPI_SUM));
  run.rec.row = nullptr;
  run.events = profiler.events();
  return run;
}

/// The median length (s) of this rank's slots of `kind` in `events`, one a step for `steps` steps
/// (a failure, and infinity, when there are not `steps` of them).
double median_slot_s(const std::vector<runtime::SlotEvent>& events, sched::SlotKind kind, int steps) {
  std::vector<double> s;
  for (const auto& e : events)
    if (e.step >= 0 && e.kind == static_cast<int>(kind)) s.push_back(e.end_s - e.start_s);
  EXPECT_EQ(s.size(), static_cast<std::size_t>(steps)) << "slots of kind " << static_cast<int>(kind);
  if (s.size() != static_cast<std::size_t>(steps) || s.empty()) return std::numeric_limits<double>::infinity();
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

/// Whether `row` has an Idle slot right before a slot of `kind`.
bool has_bubble_right_before(const std::vector<sched::Slot>& row, sched::SlotKind kind) {
  for (std::size_t i = 0; i + 1 < row.size(); ++i)
    if (row[i].kind == sched::SlotKind::Idle && row[i + 1].kind == kind) return true;
  return false;
}

std::pair<std::vector<double>, WaitRecorder> train_with_recorder(const Config& cfg, const mpi::Comm& world, bool filler) {
  RecordedRun run = run_with_recorder(cfg, world, filler, false);
  return {std::move(run.losses), std::move(run.rec)};
}

TEST(BubbleTeaService, WanWaitsInTrainingSlotsAreHandedToTheFiller) {
  const mpi::Comm world = mpi::Comm::world();
  const Config on = make_cfg(world);
  const topo::Layout layout(world.size(), on.parallel);
  const topo::Coord me = layout.coord(world.rank());
  const auto [plain, none] = train_with_recorder(on, world, false);
  const auto [filled, rec] = train_with_recorder(on, world, true);
  EXPECT_EQ(plain, filled);  // bitwise
  const int steps = on.run.steps;
  const bool spans = layout.dc_count() > 1;
  // Every rank's gradient-norm sum crosses the WAN when the pipeline spans DCs: once a step.
  EXPECT_EQ(rec.watched.count(sched::SlotKind::Optimizer) ? rec.watched.at(sched::SlotKind::Optimizer) : 0,
            spans ? steps : 0);
  // The tied-embedding sum crosses it on the first and last stage (in different DCs).
  const int partner = layout.embedding_partner(me);
  const bool embed_wan = partner >= 0 && layout.coord(partner).dc != me.dc;
  EXPECT_EQ(rec.watched.count(sched::SlotKind::AllReduce) ? rec.watched.at(sched::SlotKind::AllReduce) : 0,
            embed_wan ? steps : 0);
  // Off by deck: no wait is handed over.
  const auto [off_losses, off] = train_with_recorder(make_cfg(world, {"bubbletea.fill_wan_waits=false"}), world, true);
  EXPECT_EQ(off_losses, plain);
  EXPECT_EQ(off.watched.count(sched::SlotKind::Optimizer) + off.watched.count(sched::SlotKind::AllReduce), 0U);
}

// The bubble before the AllReduce slot of a stage whose tied-embedding partner sits in another DC
// (the last stage's drain) ends when the partner's half of the exchange comes: it is handed to
// the filler with that test. The step's DP sums start when the bubble begins and our half leaves
// once they are in (the test drives both), so a filler that runs past the arrival (held 0.3 s
// here) does not hold the partner up: the partner's AllReduce slot stays short. Losses bitwise
// those without a filler.
TEST(BubbleTeaService, TheBubbleBeforeAWanEmbeddingExchangeIsWatchedAndOurHalfLeavesFirst) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"run.steps=4"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Coord me = layout.coord(world.rank());
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  auto bubble_before_all_reduce = [&](const topo::Coord& c) {
    return has_bubble_right_before(table.row(c.stage, c.dp), sched::SlotKind::AllReduce);
  };
  const int partner = layout.embedding_partner(me);
  const bool embed_wan = partner >= 0 && layout.coord(partner).dc != me.dc;
  constexpr double kHold = 0.3;
  const RecordedRun plain = run_with_recorder(cfg, world, false, true);
  const RecordedRun held = run_with_recorder(cfg, world, true, true, kHold);
  EXPECT_EQ(plain.losses, held.losses);  // bitwise
  const bool mine = embed_wan && bubble_before_all_reduce(me);
  EXPECT_EQ(held.rec.watched_before_all_reduce, mine ? cfg.run.steps : 0);
  if (world.size() >= 3 && me.stage == layout.pp_size() - 1) {
    EXPECT_TRUE(mine) << "the last stage across the WAN from the first has a drain bubble before AllReduce";
  }
  if (embed_wan && bubble_before_all_reduce(layout.coord(partner))) {
    EXPECT_LT(median_slot_s(held.events, sched::SlotKind::AllReduce, cfg.run.steps), kHold / 2)
        << "this rank's AllReduce waited for its partner's held bubble: the partner's half left late";
  }
}

// A bubble right before the Optimizer slot (after the AllReduce slot: the gradients are final)
// ends when the pipeline's gradient-norm sum is in: our share goes into it when the bubble begins
// and the filler gets the sum's test. A filler that runs past the sum (held 0.3 s here) then
// holds up no other rank's Optimizer slot. Losses bitwise those without a filler.
TEST(BubbleTeaService, TheBubbleBeforeTheOptimizerIsWatchedAndOurNormShareLeavesFirst) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"run.steps=4"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Coord me = layout.coord(world.rank());
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  auto bubble_before_optimizer = [&](const topo::Coord& c) {
    return has_bubble_right_before(table.row(c.stage, c.dp), sched::SlotKind::Optimizer);
  };
  constexpr double kHold = 0.3;
  const RecordedRun plain = run_with_recorder(cfg, world, false, true);
  const RecordedRun held = run_with_recorder(cfg, world, true, true, 0.0, kHold);
  EXPECT_EQ(plain.losses, held.losses);  // bitwise
  const bool mine = bubble_before_optimizer(me);
  EXPECT_EQ(held.rec.watched_before_optimizer, mine ? cfg.run.steps : 0);
  if (layout.pp_size() == 1) GTEST_SKIP() << "one stage: no gradient-norm sum over a pipeline";
  // Some rank of the pipeline has such a bubble (else this test checks nothing).
  int any = 0;
  for (int r = 0; r < world.size(); ++r) any += bubble_before_optimizer(layout.coord(r)) ? 1 : 0;
  ASSERT_GT(any, 0) << "no row of this table has a bubble right before its Optimizer slot";
  // The norm sum completes without waiting for a held rank: every Optimizer slot stays short.
  EXPECT_LT(median_slot_s(held.events, sched::SlotKind::Optimizer, cfg.run.steps), kHold / 2)
      << "this rank's Optimizer slot waited for a rank held in its bubble: that rank's share left late";
}

// The bubbles that end a row wait for nothing but the table's step boundary when the next step
// begins with this rank's own compute (a first stage's forward) or when there is no next step:
// they are not handed to the filler (filling them only started the next step late: +4% on the
// emulated ablation_2dc_16). A row whose next step begins with a receive hands them over, except
// in the last step.
TEST(BubbleTeaService, TheBubblesThatEndTheRowAreFilledOnlyWhenTheNextStepWaitsForData) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"run.steps=3"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Coord me = layout.coord(world.rank());
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  const auto& row = table.row(me.stage, me.dp);
  std::size_t tail = row.size();
  while (tail > 0 && sched::is_bubble(row[tail - 1].kind)) --tail;
  const int tail_slots = static_cast<int>(row.size() - tail);
  const RecordedRun run = run_with_recorder(cfg, world, true, false);
  const bool waits = sched::is_recv(row.front().kind);
  for (int step = 0; step < cfg.run.steps; ++step) {
    const int calls = run.rec.tail_fills.count(step) ? run.rec.tail_fills.at(step) : 0;
    const bool filled = waits && step + 1 < cfg.run.steps;
    EXPECT_EQ(calls, filled ? tail_slots : 0) << "step " << step << ", row begins with a "
                                              << (waits ? "receive" : "compute slot");
  }
  // The first stage begins with its forward; some row ends in bubbles (else this checks little).
  if (me.stage == 0) {
    EXPECT_FALSE(waits);
  }
  int any = 0;
  for (int r = 0; r < world.size(); ++r) {
    const topo::Coord c = layout.coord(r);
    any += table.row(c.stage, c.dp).back().kind == sched::SlotKind::Idle ? 1 : 0;
  }
  if (world.size() > 1) {
    EXPECT_GT(any, 0) << "no row ends in a bubble";
  }
}

// A WAN wait inside a training slot is budgeted at the deck's prediction x max_stretch until the
// slot has a real wait, then at bubbletea.wan_wait_quantile (default: the median) of its last 8 real
// waits when that is longer: here the last stage holds its drain bubble 40 ms past the
// embedding's arrival, so the first stage's gradient-norm sum (a "0.1 ms" WAN round trip by the
// deck) waits >= 40 ms every step.
TEST(BubbleTeaService, AWanWaitInATrainingSlotLearnsItsBudgetFromItsRealWaits) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"run.steps=11"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Coord me = layout.coord(world.rank());
  constexpr double kHold = 0.04;
  const RecordedRun plain = run_with_recorder(cfg, world, false, false);
  // A bubble before the Optimizer slot would take the norm sum's wait: left unfilled here.
  const RecordedRun held = run_with_recorder(cfg, world, true, false, kHold, -1.0);
  EXPECT_EQ(plain.losses, held.losses);  // bitwise
  const int partner = layout.embedding_partner(me);
  const bool embed_wan = partner >= 0 && layout.coord(partner).dc != me.dc;
  if (layout.dc_count() < 2) {
    EXPECT_TRUE(held.rec.optimizer_fills.empty()) << "a pipeline in one DC has no WAN wait to hand over";
    return;
  }
  if (me.stage != 0 || !embed_wan) return;  // the first stage is the one held up
  // The deck's prediction: a round trip of 0.1 ms one way, stretched 3 x.
  const double predicted = 2 * 0.1e-3 * cfg.bubbletea.max_stretch;
  ASSERT_EQ(held.rec.optimizer_fills.size(), static_cast<std::size_t>(cfg.run.steps));
  const auto& fills = held.rec.optimizer_fills;
  for (std::size_t k = 0; k < fills.size(); ++k) {
    const auto& f = fills[k];
    if (k == 0) {
      EXPECT_NEAR(f.budget_s, predicted, 1e-9) << "step 0: no history yet";
      continue;
    }
    EXPECT_GT(f.budget_s, 0.75 * kHold) << "step " << f.step << ": the waits before were all >= the partner's hold";
    // The median of the (up to 8) waits before, as the filler saw them (both end at the sum's
    // last "not yet"; never the optimizer's work).
    std::vector<double> before;
    for (std::size_t j = k > 8 ? k - 8 : 0; j < k; ++j) before.push_back(fills[j].waited_s);
    std::sort(before.begin(), before.end());
    const double median = before[static_cast<std::size_t>(std::lround(0.5 * static_cast<double>(before.size() - 1)))];
    EXPECT_NEAR(f.budget_s, median, 3e-3) << "step " << f.step;
  }
}

// bubbletea.fill_recv_waits: a receive that waits although the table planned no bubble right
// before it (here every receive: the recorder leaves the Idle slots empty) is handed to the filler
// once the slot has 8 steps of history, with the shortest of those 8 waits as its budget (each
// wait measured from the slot's start to the data's arrival, so at most the slot's recorded
// length); the losses stay bitwise those of a run without a filler.
TEST(BubbleTeaService, ReceiveWaitsAreFilledWithinTheShortestRecentWait) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"run.steps=12"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Coord me = layout.coord(world.rank());
  const RecordedRun plain = run_with_recorder(cfg, world, false, true);
  const RecordedRun filled = run_with_recorder(cfg, world, true, true);
  EXPECT_EQ(plain.losses, filled.losses);  // bitwise
  if (me.stage > 0) {
    // Every step starts with the first activation still being computed upstream: a wait.
    EXPECT_FALSE(filled.rec.recv_fills.empty()) << "no receive wait was handed to the filler";
  }
  int checked = 0;
  for (const auto& f : filled.rec.recv_fills) {
    EXPECT_GE(f.step, 8) << "a receive filled before it had 8 steps of history";
    EXPECT_GT(f.budget_s, 0.0);
    if (f.step != 8) continue;
    double shortest = 1e9;
    int seen = 0;
    for (const auto& e : filled.events)
      if (e.step >= 0 && e.step < 8 && e.slot_index == f.index) {
        shortest = std::min(shortest, e.end_s - e.start_s);
        ++seen;
      }
    ASSERT_EQ(seen, 8) << "slot " << f.index;
    EXPECT_LE(f.budget_s, shortest + 1e-9) << "slot " << f.index;
    EXPECT_GT(f.budget_s, shortest - 2e-3) << "slot " << f.index;
    ++checked;
  }
  if (me.stage > 0) {
    EXPECT_GT(checked, 0);
  }
  const RecordedRun off = run_with_recorder(make_cfg(world, {"run.steps=12", "bubbletea.fill_recv_waits=false"}),
                                            world, true, false);
  EXPECT_EQ(off.losses, plain.losses);
  EXPECT_TRUE(off.rec.recv_fills.empty());
}

// An overload (a backlog far beyond what the bubbles hold) queues: the bubbles are used, each one
// ends within its budget (chunks are admitted by predicted time), and the rest is reported queued.
TEST(BubbleTeaService, OverloadQueuesAndStaysInsideTheBubbles) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"bubbletea.requests=3000", "bubbletea.guard_ms=0.3"});
  Served served(world, cfg);
  runtime::Profiler& profiler = served.profiler;
  Service& svc = served.svc;
  const double budget = 0.003;
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, budget * 1e3};
  std::vector<double> excess;
  double work = 0;
  for (int i = 0; i < 40; ++i) {
    const double t0 = profiler.now();
    work += svc.fill(0, idle, budget, nullptr).first;
    excess.push_back(profiler.now() - t0 - budget);
    const double left = t0 + budget - profiler.now();  // the rest of the bubble passes
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }
  const Report rep = svc.finish();
  std::sort(excess.begin(), excess.end());
  // Admission by predicted time: a bubble ends within its budget unless a chunk was slowed, so
  // the median excess is ~0 where every rank has a core (more ranks than cores preempt chunks,
  // and this test is not a benchmark); a filler that ignored the budget would run its whole
  // backlog (seconds) in the first bubble.
  if (world.size() <= static_cast<int>(std::thread::hardware_concurrency())) {
    EXPECT_LE(excess[excess.size() / 2], 2e-3) << "the median bubble ran past its budget";
  }
  EXPECT_LE(excess.back(), 0.5) << "a bubble ran far past its budget";
  EXPECT_GT(work, 0.0);
  EXPECT_LT(rep.served(), 3000);
  EXPECT_GT(rep.queued(), 0);
  EXPECT_EQ(rep.arrived(), 3000);  // rate 0: all arrived at t = 0
  int qfinal = 0;
  for (const auto& k : rep.ranks)
    if (k.dc_rank == 0) qfinal += k.queue_final;
  EXPECT_GT(qfinal, 0);
}

// A bubble that ends in a receive (the runtime passes `ended`): BubbleTea tests it before every
// chunk and stops at the first true; while it is false it fills the table's budget (it knows
// nothing of this bubble's real lengths: see the next test), and never further.
TEST(BubbleTeaService, AWatchedBubbleStopsWhenItsReceiveArrives) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"bubbletea.requests=3000", "bubbletea.max_stretch=3"});
  Served served(world, cfg);
  const topo::Layout& layout = served.layout;
  const topo::Communicators& comms = served.comms;
  runtime::Profiler& profiler = served.profiler;
  Service& svc = served.svc;
  const double budget = 0.01;
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, budget * 1e3};
  served.warm_up(idle, budget);

  // 1. The receive arrives after two tests: at most two chunks (of chunk_tokens = 5) run.
  int tests = 0;
  const std::function<bool()> arrives_soon = [&tests] { return ++tests > 2; };
  const std::int64_t soon_tokens = svc.fill(0, idle, budget, &arrives_soon).second;
  EXPECT_LE(tests, 3) << "tested before every chunk, stopped at the first true";
  EXPECT_GE(tests, 1);
  EXPECT_LE(soon_tokens, 2 * cfg.bubbletea.chunk_tokens);

  // 2. An arrival before the bubble: nothing runs.
  int tested = 0;
  const std::function<bool()> arrived = [&tested] { ++tested; return true; };
  const auto [none_s, none_tokens] = svc.fill(0, idle, budget, &arrived);
  EXPECT_EQ(tested, 1);
  EXPECT_EQ(none_s, 0.0);
  EXPECT_EQ(none_tokens, 0);

  // 3. It never arrives: a rank that holds its DC's whole inference model (a backlog of 3000
  // requests) fills the table's budget; no rank goes past it (plus slack for a slowed chunk).
  // (Where a DC has several ranks, at most 2 x ranks requests are in flight: this tiny model's
  // few chunks of work do not fill a bubble there.)
  int never_tests = 0;
  const std::function<bool()> never = [&never_tests] { ++never_tests; return false; };
  double most = 0.0, longest = 0.0;
  for (int i = 0; i < 40; ++i) {
    const double t0 = profiler.now();
    most = std::max(most, svc.fill(0, idle, budget, &never).first);
    longest = std::max(longest, profiler.now() - t0);
    const double left = t0 + budget - profiler.now();  // the rest of the bubble passes
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }
  EXPECT_GE(never_tests, 40);
  const bool alone = layout.ranks_in_dc(layout.coord(comms.world.rank()).dc) == 1;
  if (alone) {
    EXPECT_GT(most, budget / 2) << "the bubble was not filled while the receive had not arrived";
  }
  EXPECT_LT(longest, budget + 0.5) << "past the table's budget with no real length known";
  (void)svc.finish();
}

// bubbletea.watch_recv = false leaves bubbles unwatched, not the waits handed over with their
// test: a WAN wait inside a training slot (fill_wan_waits) stops when its sum is in, or it would
// fill its stretched budget after the data came and delay training. Its budget is counted with
// the waits outside the bubbles, not in the table's offered_s.
TEST(BubbleTeaService, AWanWaitInATrainingSlotIsWatchedWhateverWatchRecvSays) {
  const mpi::Comm world = mpi::Comm::world();
  const Config cfg = make_cfg(world, {"bubbletea.requests=3000", "bubbletea.watch_recv=false"});
  Served served(world, cfg);
  Service& svc = served.svc;
  const double budget = 0.01;
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, budget * 1e3};
  served.warm_up(idle, budget);
  const sched::Slot optimizer{sched::SlotKind::Optimizer, -1, 0.0, 1.0};
  int tests = 0;
  const std::function<bool()> arrives_soon = [&tests] { return ++tests > 2; };
  const double big = 5.0;  // a budget far longer than the test takes to say "in"
  const double t0 = served.profiler.now();
  const std::int64_t tokens = svc.fill(0, optimizer, big, &arrives_soon).second;
  const double took = served.profiler.now() - t0;
  EXPECT_GE(tests, 1) << "the wait's test was never asked";
  EXPECT_LE(tests, 3) << "tested before every chunk, stopped at the first true";
  EXPECT_LE(tokens, 2 * cfg.bubbletea.chunk_tokens);
  EXPECT_LT(took, big / 2) << "filled on after the sum was in";
  // A bubble handed a test is still unwatched under watch_recv = false: the test is not asked.
  int bubble_tests = 0;
  const std::function<bool()> counted = [&bubble_tests] { ++bubble_tests; return false; };
  (void)svc.fill(0, idle, budget, &counted);
  EXPECT_EQ(bubble_tests, 0);
  const Report rep = svc.finish();
  const RankStats& me = rep.ranks[static_cast<std::size_t>(world.rank())];
  EXPECT_EQ(me.unplanned_fills, 1);
  EXPECT_DOUBLE_EQ(me.unplanned_budget_s, big);
  EXPECT_DOUBLE_EQ(me.offered_s, 6 * budget) << "only the six bubbles are the table's offer";
}

// Past the table's length, a watched bubble is filled up to bubbletea.stretch_quantile of its real
// lengths over its last 8 steps (bubble start to the receive's recorded end), within
// [table, max_stretch x table]; with none known, up to the table's length; from the first real
// length on, the quantile of those known (a bench's 30-step run spent 8 of them at the table's).
TEST(BubbleTeaService, AWatchedBubbleLearnsItsRealLengthUpToAQuantile) {
  const mpi::Comm world = mpi::Comm::world();
  const double budget = 0.01;
  const std::vector<double> lengths = {0.012, 0.030, 0.014, 0.040, 0.013, 0.035, 0.018, 0.025, 0.008};
  struct Case {
    std::vector<std::string> keys;
    double q, stretch, want;  // want: after the 8 lengths 30 14 40 13 35 18 25 8 (the 12 left the window)
  };
  // sorted: 8 13 14 18 25 30 35 40 ms; quantile q -> sorted[round(7 q)]
  for (const Case& c : std::vector<Case>{
           {{}, 0.5, 3, 0.025},                                                          // 0.5 (default)
           {{"bubbletea.stretch_quantile=0"}, 0, 3, 0.010},                            // the shortest (8), at least the table
           {{"bubbletea.stretch_quantile=1", "bubbletea.max_stretch=5"}, 1, 5, 0.040},   // the longest
           {{"bubbletea.stretch_quantile=1"}, 1, 3, 0.030},                            // capped at 3 x
           {{"bubbletea.stretch_quantile=1", "bubbletea.max_stretch=2"}, 1, 2, 0.020},   // capped
           {{"bubbletea.stretch_quantile=0", "bubbletea.max_stretch=1"}, 0, 1, 0.010}}) {
    std::vector<std::string> keys = {"bubbletea.requests=0"};
    keys.insert(keys.end(), c.keys.begin(), c.keys.end());
    const Config cfg = make_cfg(world, keys);
    Served served(world, cfg, /*profile=*/true);
    const topo::Coord me = served.layout.coord(world.rank());
    const auto& row = served.table.row(me.stage, me.dp);
    int idx = -1;
    for (std::size_t i = 0; i + 1 < row.size() && idx < 0; ++i)
      if (row[i].kind == sched::SlotKind::Idle && sched::is_recv(row[i + 1].kind)) idx = static_cast<int>(i);
    if (world.size() > 1) {
      EXPECT_GE(idx, 0) << "every stage of a pipeline has a bubble that ends in a receive";
    }
    if (idx >= 0) {
      runtime::Profiler& profiler = served.profiler;
      const std::function<bool()> never = [] { return false; };
      for (std::size_t s = 0; s < lengths.size(); ++s) {
        // The quantile of the lengths known so far (the last 8), clamped to [table, stretch x table].
        std::vector<double> known(lengths.begin() + static_cast<std::ptrdiff_t>(s > 8 ? s - 8 : 0),
                                  lengths.begin() + static_cast<std::ptrdiff_t>(s));
        std::sort(known.begin(), known.end());
        const double expect =
            known.empty() ? budget
                          : std::clamp(known[static_cast<std::size_t>(std::lround(c.q * static_cast<double>(known.size() - 1)))],
                                       budget, c.stretch * budget);
        EXPECT_NEAR(served.svc.watched_allowance_s(idx, budget), expect, 5e-4)
            << ::testing::PrintToString(c.keys) << " after " << s << " lengths";
        const double t_before = profiler.now();
        (void)served.svc.fill(static_cast<int>(s), row[static_cast<std::size_t>(idx)], budget, &never);
        // The runtime's receive that follows returns when the data comes: lengths[s] after the bubble began.
        runtime::SlotEvent e;
        e.world_rank = world.rank();
        e.step = static_cast<int>(s);
        e.slot_index = idx + 1;
        e.kind = static_cast<int>(row[static_cast<std::size_t>(idx) + 1].kind);
        e.start_s = profiler.now();
        e.end_s = t_before + lengths[s];
        e.complete_s = e.end_s;
        profiler.record(e);
      }
      EXPECT_NEAR(served.svc.watched_allowance_s(idx, budget), c.want, 5e-4) << ::testing::PrintToString(c.keys);
    }
    (void)served.svc.finish();
  }
}

// bubbletea.weights = an atlas checkpoint: the model read from it (a longer wpe than the context,
// read as a hyperslab) serves the tokens of a standalone model with those weights, not the seed's.
TEST(BubbleTeaService, LoadsWeightsFromAnAtlasCheckpoint) {
  const mpi::Comm world = mpi::Comm::world();
  const fs::path dir = job_temp(world, "atlas_bt_ckpt");
  const RemovedAtEnd cleanup{world, dir};
  const Config probe = make_cfg(world);
  InferShape file_shape = InferShape::from(probe.bubbletea);
  file_shape.context = 64;  // the checkpoint's model.seq_len
  auto be = device::make_backend(probe.device);
  InferenceModel src(file_shape, LayerRange{0, file_shape.layers, true, true}, *be, 4);
  src.init_random(777, 0.05);
  std::vector<std::vector<float>> values;
  std::vector<io::WriteShard> shards;
  for (const auto& p : src.params()) values.emplace_back(p.value.floats());
  std::size_t i = 0;
  std::vector<float> zeros(64 * 32 * 4 * 4, 0.0F);
  for (const auto& p : src.params()) {
    be->download(values[i].data(), p.value.data(), values[i].size() * 4);
    if (world.rank() == 0)
      shards.push_back({p.name, p.shape, std::vector<std::int64_t>(p.shape.size(), 0), p.shape, true, values[i].data(),
                        zeros.data(), zeros.data()});
    ++i;
  }
  io::CheckpointMeta meta;
  meta.step = 1;
  meta.model = {file_shape.layers, file_shape.hidden, file_shape.heads, 64, file_shape.vocab};
  const io::WriteResult w = io::write_checkpoint(world, dir.string(), meta, shards);

  const Config cfg = make_cfg(world, {"bubbletea.weights=" + w.path});
  const Report rep = serve_all(cfg, world, 0.02);
  ASSERT_EQ(rep.decoded(), 9);
  const topo::Layout layout(world.size(), cfg.parallel);
  const auto reqs = load_requests(cfg, layout.dc_count());
  InferShape sh = InferShape::from(cfg.bubbletea);
  InferenceModel ref(sh, LayerRange{0, sh.layers, true, true}, *be, 5);
  ref.init_random(777, 0.05);  // same draw: the first 48 wpe rows of the 64-row tensor
  for (const auto& q : rep.requests) {
    const Request& r = reqs[static_cast<std::size_t>(q.id)];
    EXPECT_EQ(q.tokens, generate(ref, r.prompt, 5, r.max_new_tokens)) << "request " << q.id;
  }
  // A context beyond the checkpoint's positions, and a shape mismatch, are ConfigErrors.
  const auto err = [&](const std::vector<std::string>& extra) {
    try {
      const Config c = make_cfg(world, extra);
      const topo::Communicators comms = topo::Communicators::create(world, layout);
      const sched::ScheduleTable table = sched::build_schedule(c, layout);
      runtime::Profiler profiler(false, comms.world.rank(), 0);
      Service svc(c, layout, comms, table, *be, profiler, options());
      (void)svc.finish();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(err({"bubbletea.weights=" + w.path, "bubbletea.context=80"}),
              ::testing::HasSubstr("bubbletea.context = 80 exceeds the checkpoint's model.seq_len = 64"));
  EXPECT_THAT(err({"bubbletea.weights=" + w.path, "bubbletea.hidden=16"}),
              ::testing::HasSubstr("model.hidden is 32 in the checkpoint but bubbletea.hidden = 16"));
  EXPECT_THAT(err({"bubbletea.weights=" + (dir / "missing.h5").string()}), ::testing::HasSubstr("missing.h5"));
}

/// Runs the Service constructor with `cfg` and returns the ConfigError's text ("" if none).
// bubbletea.pipeline: `replica` makes one inference pipeline per DP replica inside a DC (its
// stages in order, the blocks split over them), `dc` one over all the DC's ranks. Here one DC holds
// 2 replicas of np/2 stages (np 2 and 4): the requests go round-robin over the pipelines, each
// rank runs exactly its pipeline's chunks through its share of the blocks, and every request's
// tokens equal a standalone run's.
TEST(BubbleTeaService, InferencePipelinesPerReplicaOrPerDc) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() % 2 != 0) GTEST_SKIP() << "two DP replicas need an even rank count";
  const std::string stages = world.size() == 2 ? "1" : std::to_string(world.size() / 2) + " 0";
  for (const std::string mode : {"replica", "dc"}) {
    SCOPED_TRACE("bubbletea.pipeline = " + mode);
    const Config cfg = make_cfg(world, {"parallel.stages_per_dc=" + stages, "parallel.dp_size=2",
                                        "bubbletea.pipeline=" + mode});
    const bool per_replica = mode == "replica";
    const Report rep = serve_all(cfg, world, 0.02);
    ASSERT_EQ(rep.requests.size(), 9U);
    EXPECT_EQ(rep.served(), 9);
    EXPECT_EQ(rep.decoded(), 9);
    const topo::Layout layout(world.size(), cfg.parallel);
    const auto reqs = load_requests(cfg, layout.dc_count());
    auto be = device::make_backend(cfg.device);
    for (const auto& q : rep.requests) {
      EXPECT_EQ(q.dc, 0) << "request " << q.id;
      EXPECT_EQ(q.tokens, standalone(cfg, *be, reqs[static_cast<std::size_t>(q.id)])) << "request " << q.id;
    }
    const int pipeline_ranks = per_replica ? world.size() / 2 : world.size();
    for (const auto& k : rep.ranks) {
      const topo::Coord c = layout.coord(k.world_rank);
      // Ranks are numbered stage-major, replicas inside a stage: a replica's place is its stage.
      const int place = per_replica ? c.stage : k.world_rank;
      const LayerRange want = split_layers(cfg.bubbletea.layers, pipeline_ranks, place);
      EXPECT_EQ(k.dc_rank, place) << "rank " << k.world_rank;
      EXPECT_EQ(k.first_layer, want.first) << "rank " << k.world_rank;
      EXPECT_EQ(k.layers, want.count) << "rank " << k.world_rank;
      std::int64_t chunks = 0;
      for (const auto& q : rep.requests)
        if (!per_replica || q.id % 2 == c.dp) chunks += q.chunks;
      EXPECT_EQ(k.chunks, chunks) << "rank " << k.world_rank;
    }
  }
}

// The atlas stagger (a first stage's row opening with a deliberate delay) is filled up to its
// table length every step: the runtime sleeps what is left of it, so nothing waits after it, and
// "nothing waited" must not halve its allowance as it does a bubble's (shown here on the same
// slot unmarked). Every rank is its own pipeline (one stage, dp = ranks), so each has work.
TEST(BubbleTeaService, TheStaggerIsFilledToItsLengthEveryStep) {
  const mpi::Comm world = mpi::Comm::world();
  const std::string stages = world.size() <= 2 ? "1" : "1 0";
  const Config cfg = make_cfg(world, {"parallel.stages_per_dc=" + stages,
                                      "parallel.dp_size=" + std::to_string(world.size()),
                                      "bubbletea.requests=3000", "bubbletea.guard_ms=0.5", "bubbletea.kv_cap_bytes=64M"});
  constexpr double kBubbleS = 0.02;
  constexpr int kSteps = 6;
  for (const bool stagger : {true, false}) {
    SCOPED_TRACE(stagger ? "the stagger" : "the same bubble, unmarked");
    Served served(world, cfg, true);
    const topo::Coord me = served.layout.coord(world.rank());
    std::vector<sched::Slot>& row = served.table.rows[static_cast<std::size_t>(me.stage * served.table.dp + me.dp)];
    row = {sched::Slot{sched::SlotKind::Idle, -1, 0.0, kBubbleS * 1e3}, sched::Slot{sched::SlotKind::Forward, 0, kBubbleS * 1e3, 1.0}};
    if (stagger) row[0].mark(sched::SlotMark::Stagger);
    std::vector<double> work;
    for (int step = 0; step < kSteps; ++step) {
      work.push_back(served.svc.fill(step, row[0], kBubbleS, nullptr).first);
      // The forward after it starts at once (no wait), as the runtime records it.
      runtime::SlotEvent e;
      e.world_rank = world.rank();
      e.step = step;
      e.slot_index = 1;
      e.kind = static_cast<int>(sched::SlotKind::Forward);
      e.start_s = e.end_s = served.profiler.now();
      served.profiler.record(e);
    }
    (void)served.svc.finish();
    if (stagger) {
      // Learned down, steps 1-5 get allowances of 10 + 5 + 2.5 + 1.25 + 0.6 ms (15-38 ms of work
      // measured, chunks included that ran past them); filled, about 5 x 20 ms (88-125 ms measured
      // at np 1-4 on 2 cores).
      double later = 0.0;
      for (int step = 1; step < kSteps; ++step) later += work[static_cast<std::size_t>(step)];
      EXPECT_GT(later, 3.0 * kBubbleS) << "rank " << world.rank() << ": steps 1-" << kSteps - 1 << " filled " << later * 1e3 << " ms";
    } else {
      EXPECT_LT(work.back(), 0.25 * kBubbleS) << "an unmarked bubble with no wait after it is learned down";
    }
  }
}

// A watched bubble on a later rank of a pipeline with nothing to run yet (the previous rank has
// not sent a chunk) waits for one: the chunks that come while the bubble lasts are run in it,
// not left for the next bubble.
TEST(BubbleTeaService, AWatchedBubbleWaitsForTheFirstChunkOfThePreviousRank) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 2) GTEST_SKIP() << "a two-rank pipeline (np 2)";
  const Config cfg = make_cfg(world, {"bubbletea.requests=200"});
  Served served(world, cfg);
  const sched::Slot idle{sched::SlotKind::Idle, -1, 0.0, 200.0};
  std::pair<double, std::int64_t> got{0.0, 0};
  double lasted_s = 0.0;
  if (served.svc.pipeline_index() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // nothing sent for 20 ms
    got = served.svc.fill(0, idle, 0.05, nullptr);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    const std::function<bool()> ended = [t0] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(60); };
    got = served.svc.fill(0, idle, 0.2, &ended);
    lasted_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  world.barrier();
  (void)served.svc.finish();
  if (served.svc.pipeline_index() == 1) {
    EXPECT_GT(got.second, 0) << "no chunk ran: the bubble ended when it found nothing ready";
    EXPECT_GE(lasted_s, 0.055) << "the bubble did not last until its data came";
    EXPECT_LT(lasted_s, 0.2);
  }
}

std::string setup_error(const Config& cfg, const mpi::Comm& world, ServiceOptions opt = options()) {
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  auto backend = device::make_backend(cfg.device);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  runtime::Profiler profiler(false, comms.world.rank(), 0);
  try {
    Service svc(cfg, layout, comms, table, *backend, profiler, std::move(opt));
    (void)svc.finish();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(BubbleTeaService, BadInputIsACollectiveConfigError) {
  using ::testing::HasSubstr;
  const mpi::Comm world = mpi::Comm::world();
  // A pipeline where each rank fits one longest prompt on its own, but admission's reservation
  // (the largest need per token against the smallest room) does not: one rank holds two blocks,
  // the other one block and the head's 100,000-word logits. It used to start and never admit.
  if (world.size() == 2) {
    const std::vector<std::string> one_dc = {"cluster.dcs=solo", "cluster.gpus_per_dc=4", "cluster.latency_ms=0",
                                             "cluster.bandwidth_gbps=0", "parallel.stages_per_dc=2",
                                             "bubbletea.layers=3", "bubbletea.hidden=64", "bubbletea.vocab=100000",
                                             "bubbletea.prompt_tokens_min=100", "bubbletea.prompt_tokens_max=100",
                                             "bubbletea.context=128", "bubbletea.requests=4"};
    auto with_cap = [&](const char* cap) {
      std::vector<std::string> o = one_dc;
      o.push_back(std::string("bubbletea.kv_cap_bytes=") + cap);
      return make_cfg(world, o);
    };
    EXPECT_THAT(setup_error(with_cap("26460000"), world),
                AllOf(HasSubstr("cannot admit the longest prompt (100 tokens) in the inference pipeline of ranks 0 1: "),
                      HasSubstr("nothing would ever be admitted\n  hint: set bubbletea.kv_cap_bytes to at least")));
    EXPECT_EQ(setup_error(with_cap("40000000"), world), "");
  }
  // Weights alone over the cap.
  EXPECT_THAT(setup_error(make_cfg(world, {"bubbletea.kv_cap_bytes=10K"}), world),
              HasSubstr("alone take"));
  // ... also when they would not fit in memory at all: checked on the shape before allocating
  // (this model's 32 GiB failed in the allocator with no word of BubbleTea).
  EXPECT_THAT(setup_error(make_cfg(world, {"bubbletea.hidden=8192", "bubbletea.vocab=1048576",
                                           "bubbletea.kv_cap_bytes=1G"}), world),
              HasSubstr("alone take"));
  // An unsorted trace (written by rank 0, read by rank 0, parsed everywhere).
  const fs::path trace = job_temp(world, "atlas_bt_unsorted") += ".csv";
  const RemovedAtEnd cleanup{world, trace};
  if (world.rank() == 0) {
    std::ofstream f(trace);
    f << "arrival_s,prompt,max_new_tokens\n0.5,4,2\n0.25,4,2\n";
  }
  world.barrier();
  EXPECT_THAT(setup_error(make_cfg(world, {"bubbletea.trace=" + trace.string()}), world),
              HasSubstr(trace.string() + ":3: arrival time 0.25 is earlier"));
  // A prompt longer than the context.
  if (world.rank() == 0) {
    std::ofstream f(trace);
    f << "0,45,7\n";
  }
  world.barrier();
  EXPECT_THAT(setup_error(make_cfg(world, {"bubbletea.trace=" + trace.string()}), world),
              HasSubstr(trace.string() + ":1: prompt of 45 tokens plus max_new_tokens 7 = 52 exceeds bubbletea.context = 48"));
  // A DC with more ranks than inference blocks (np >= 2 puts 2 ranks in a DC).
  if (world.size() >= 2) {
    EXPECT_THAT(setup_error(make_cfg(world, {"bubbletea.layers=1"}), world),
                HasSubstr("bubbletea.layers = 1 is fewer than the 2 ranks"));
  }
  // No decode worker program.
  ServiceOptions o = options();
  o.worker_program = "/nonexistent/atlas-decode-worker";
  EXPECT_THAT(setup_error(make_cfg(world), world, o), HasSubstr("cannot start the decode worker"));
}

// The bench runs the deck off and on in one invocation and finds the losses bitwise equal.
TEST(BubbleTeaBench, OffAndOnInOneInvocation) {
  const mpi::Comm world = mpi::Comm::world();
  const fs::path dir = job_temp(world, "atlas_bt_bench");
  const RemovedAtEnd cleanup{world, dir};
  const fs::path deck = dir / "bench.deck";
  if (world.rank() == 0) {
    fs::create_directories(dir);
    std::ofstream f(deck);
    f << deck_text(world);
  }
  world.barrier();
  ::setenv("ATLAS_DECODE_WORKER", ATLAS_DECODE_WORKER_EXE, 1);
  int argc = 0;
  char** argv = nullptr;
  mpi::Environment env(argc, argv, mpi::ThreadLevel::Multiple);  // MPI is up: this only wraps it
  const std::vector<std::string> args{deck.string(), "run.steps=4", "run.out_dir=" + dir.string(), "--repeats", "1",
                                      "--warmup", "1"};
  EXPECT_EQ(run_bubbletea_bench(env, args), 0);
  if (world.rank() == 0) {
    std::ifstream j(dir / "bt_test" / "bubbletea_bench.json");
    std::stringstream text;
    text << j.rdbuf();
    EXPECT_THAT(text.str(), ::testing::HasSubstr("\"losses_equal\":true"));
    EXPECT_THAT(text.str(), ::testing::HasSubstr("\"steps\":4"));
  }
  EXPECT_THROW((void)run_bubbletea_bench(env, {deck.string(), "--repeats", "0"}), ConfigError);
  EXPECT_THROW((void)run_bubbletea_bench(env, {deck.string(), "--warmup", "9"}), ConfigError);
}

}  // namespace
}  // namespace atlas::bubbletea
