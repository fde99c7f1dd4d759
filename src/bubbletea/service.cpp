// SPDX-License-Identifier: MIT
// BubbleTea's prefill service (see service.hpp). Rules that keep training first:
//  - work runs only inside fill(), only when its predicted time + guard fits the rest of the
//    bubble's budget; an actual overrun is measured and reported, and corrects the cost model;
//  - nothing inside fill() waits: activations move by MPI_Isend / MPI_Improbe + MPI_Imrecv on a
//    private communicator, the KV handoff by non-blocking socket writes;
//  - memory is bounded by bubbletea.kv_cap_bytes on every rank: the DC's dispatcher (its first
//    inference rank) admits a request only when its reservation (prompt tokens x the largest
//    per-token bytes of any rank: KV cache, its handoff copy, activations in and out) fits, and
//    frees it when every rank has written the request's KV to the decode worker's socket.
//  - at most 2 x (ranks in the DC pipeline) requests are being prefilled at once (until the DC's
//    last rank has their KV), so the first rank cannot run far ahead of the others and requests
//    wait in the (reported) dispatcher queue; KV handoffs waiting for the decode worker are
//    bounded by the memory reservation only.
#include "atlas/bubbletea/service.hpp"

#include <poll.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/io/checkpoint.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::bubbletea {

namespace {

constexpr int kTagChunk = mpi::tags::kBubbleChunk;  // message tags: mpi/tags.hpp
constexpr int kTagRelease = mpi::tags::kBubbleRelease;

/// Runs `f` (which must make no collective call that another rank could skip) under mpi::agree:
/// every rank then throws the same ConfigError listing every rank's problems (a local Error is one
/// of them, "rank R: ..."), or none does. Collective over world.
template <class F>
void collective(const mpi::Comm& world, F&& f) {
  mpi::agree(world, "setting up BubbleTea", [&] {
    try {
      f();
    } catch (const Error& e) {  // a ConfigError (not an Error) passes through as it is
      throw ConfigError(fmt::format("rank {}: {}", world.rank(), e.what()));
    }
  });
}

/// Where a DC's decode worker listens: the DC's emulated address when the job runs inside the
/// WAN emulation (ATLAS_WAN_BIND_HOST, set per DC namespace by scripts/wan/run_emulated.sh), else
/// the DC's cluster.bind_hosts entry (a wildcard becomes loopback).
std::string host_of_dc(const ClusterCfg& cl, int dc) {
  if (std::optional<std::string> env = env::get("ATLAS_WAN_BIND_HOST")) return *env;
  if (cl.bind_hosts.empty()) return "127.0.0.1";
  const std::size_t i = cl.bind_hosts.size() == 1 ? 0 : static_cast<std::size_t>(dc);
  const std::string& h = cl.bind_hosts[std::min(i, cl.bind_hosts.size() - 1)];
  return h == "0.0.0.0" || h == "::" || h.empty() ? std::string("127.0.0.1") : h;
}

/// Reads this rank's inference tensors from an atlas checkpoint. Collective over `world`.
void load_checkpoint(const mpi::Comm& world, const std::string& path, InferenceModel& model) {
  const io::CheckpointContents contents = io::inspect_checkpoint(world, path);
  const InferShape& sh = model.shape();
  collective(world, [&] {
    ProblemList problems;
    const io::ModelShape& m = contents.meta.model;
    auto check = [&](const char* key, std::int64_t file, int deck) {
      if (file != deck)
        problems.add(fmt::format("bubbletea.weights '{}': model.{} is {} in the checkpoint but bubbletea.{} = {}", path,
                                 key, file, key, deck));
    };
    check("layers", m.layers, sh.layers);
    check("hidden", m.hidden, sh.hidden);
    check("heads", m.heads, sh.heads);
    check("vocab", m.vocab, sh.vocab);
    if (m.seq_len < sh.context)
      problems.add(fmt::format("bubbletea.context = {} exceeds the checkpoint's model.seq_len = {} ('{}' has no "
                               "position embedding beyond it)",
                               sh.context, m.seq_len, path));
    problems.throw_if_any();
    for (auto& p : model.params()) {
      auto it = std::find_if(contents.tensors.begin(), contents.tensors.end(),
                             [&](const io::TensorEntry& t) { return t.name == p.name; });
      if (it == contents.tensors.end()) {
        problems.add(fmt::format("bubbletea.weights '{}' holds no tensor '{}'", path, p.name));
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

// ---- report serialisation (gathered as text; doubles print round-trip exact) ----

std::string serialize(const RankStats& s) {
  return fmt::format("R {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
                     s.world_rank, s.dc, s.dc_rank, s.first_layer, s.layers, s.steps, s.wall_s, s.compute_s, s.comm_s,
                     s.idle_s, s.prefill_s, s.offered_s, s.allowed_s, s.overrun_s, s.overruns, s.fill_calls,
                     s.unplanned_fills, s.unplanned_budget_s, s.unplanned_prefill_s, s.chunks, s.pauses, s.tokens,
                     s.weight_bytes, s.peak_bytes, s.cost_per_token_ms, s.cost_fixed_ms, s.cost_scale, s.queue_mean,
                     s.queue_max, s.queue_final);
}

std::string serialize(const RequestRecord& r) {
  std::string out = fmt::format("Q {} {} {} {} {} {} {} {} {} {} {}", r.id, r.dc, r.prompt_tokens, r.max_new_tokens,
                                r.arrival_s, r.start_s, r.first_token_s, r.chunks, r.decode_wait_s, r.decode_s,
                                r.tokens.size());
  for (auto t : r.tokens) out += fmt::format(" {}", t);
  return out + "\n";
}

void parse_into(const std::string& text, std::vector<RankStats>& ranks, std::map<int, RequestRecord>& recs) {
  std::istringstream in(text);
  std::string tag;
  while (in >> tag) {
    if (tag == "R") {
      RankStats s;
      in >> s.world_rank >> s.dc >> s.dc_rank >> s.first_layer >> s.layers >> s.steps >> s.wall_s >> s.compute_s >>
          s.comm_s >> s.idle_s >> s.prefill_s >> s.offered_s >> s.allowed_s >> s.overrun_s >> s.overruns >> s.fill_calls >>
          s.unplanned_fills >> s.unplanned_budget_s >> s.unplanned_prefill_s >> s.chunks >> s.pauses >>
          s.tokens >> s.weight_bytes >> s.peak_bytes >> s.cost_per_token_ms >> s.cost_fixed_ms >> s.cost_scale >>
          s.queue_mean >> s.queue_max >> s.queue_final;
      ranks.push_back(s);
    } else {
      RequestRecord r;
      std::size_t n = 0;
      in >> r.id >> r.dc >> r.prompt_tokens >> r.max_new_tokens >> r.arrival_s >> r.start_s >> r.first_token_s >>
          r.chunks >> r.decode_wait_s >> r.decode_s >> n;
      r.tokens.resize(n);
      for (auto& t : r.tokens) in >> t;
      auto [it, fresh] = recs.emplace(r.id, r);
      if (!fresh) {  // merge what each rank knows
        RequestRecord& m = it->second;
        m.start_s = std::max(m.start_s, r.start_s);
        m.first_token_s = std::max(m.first_token_s, r.first_token_s);
        m.chunks = std::max(m.chunks, r.chunks);
        m.decode_wait_s = std::max(m.decode_wait_s, r.decode_wait_s);
        m.decode_s = std::max(m.decode_s, r.decode_s);
        if (r.tokens.size() > m.tokens.size()) m.tokens = r.tokens;
      }
    }
  }
}

}  // namespace

// ---- setup ----

Service::Service(const Config& cfg, const topo::Layout& layout, const topo::Communicators& comms,
                 const sched::ScheduleTable& table, device::Backend& backend, runtime::Profiler& profiler,
                 ServiceOptions options)
    : m_cfg(cfg),
      m_layout(layout),
      m_comms(comms),
      m_table(table),
      m_backend(backend),
      m_profiler(profiler),
      m_opt(std::move(options)) {
  const mpi::Comm& world = comms.world;
  const topo::Coord me = layout.coord(world.rank());
  const BubbleTeaCfg& bt = cfg.bubbletea;
  m_comm = comms.dc.dup();
  m_row = &table.row(me.stage, me.dp);
  m_index = m_comm.rank();
  m_size = m_comm.size();

  // ---- requests (world rank 0 reads the trace; every rank parses the same bytes) ----
  std::string trace_text;
  std::string read_error;
  if (world.rank() == 0 && !bt.trace.empty()) {
    try {
      trace_text = deck::read_text_file(bt.trace, kMaxTraceBytes, "request trace");
    } catch (const ConfigError& e) {
      read_error = "bubbletea.trace: " + e.problems().front();
    }
  }
  world.bcast_string(read_error, 0);
  if (!read_error.empty()) throw ConfigError(read_error);
  world.bcast_string(trace_text, 0);
  collective(world, [&] { m_requests = load_requests(cfg, layout.dc_count(), trace_text); });
  // DCs that hold no rank (parallel.stages_per_dc = 0) serve nothing: requests go round-robin
  // over the DCs that have ranks.
  std::vector<int> serving;
  for (int d = 0; d < layout.dc_count(); ++d)
    if (layout.ranks_in_dc(d) > 0) serving.push_back(d);
  for (auto& r : m_requests) r.dc = serving[static_cast<std::size_t>(r.id) % serving.size()];
  int longest = 1;
  for (const auto& r : m_requests) {
    longest = std::max(longest, static_cast<int>(r.prompt.size()));
    if (r.dc == me.dc) m_mine.push_back(r.id);
  }
  std::stable_sort(m_mine.begin(), m_mine.end(), [this](int a, int b) {
    return m_requests[static_cast<std::size_t>(a)].arrival_s < m_requests[static_cast<std::size_t>(b)].arrival_s;
  });

  // ---- this rank's inference layers ----
  const InferShape shape = InferShape::from(bt);
  const int max_chunk = bt.chunk_tokens > 0 ? std::min(bt.chunk_tokens, bt.context) : std::min(longest, bt.context);
  LayerRange range;
  collective(world, [&] {
    range = split_layers(bt.layers, m_size, m_index);
    m_model = std::make_unique<InferenceModel>(shape, range, backend, max_chunk);
  });
  if (bt.weights.empty() || bt.weights == "random") {
    m_model->init_random(static_cast<std::uint64_t>(cfg.run.seed), cfg.model.init_std);
  } else {
    load_checkpoint(world, bt.weights, *m_model);
  }

  // ---- memory cap: weights + scratch + one largest request must fit on every rank ----
  const auto c4 = static_cast<std::uint64_t>(bt.hidden) * sizeof(float);
  m_fixed_bytes = m_model->weight_bytes() + m_model->scratch_bytes();
  // Per prompt token: KV cache + its handoff frame (both exist while the frame is built) +
  // activations in and out.
  const std::uint64_t per_token = 2 * m_model->kv_bytes_per_token() + 2 * c4;
  collective(world, [&] {
    const std::uint64_t cap = bt.kv_cap_bytes;
    const std::string where = fmt::format("rank {} ({}, inference blocks [{}, {}))", world.rank(),
                                          layout.describe(world.rank(), cfg.cluster.dcs), range.first,
                                          range.first + range.count);
    if (m_model->weight_bytes() > cap)
      throw ConfigError(fmt::format(
          "the inference model's weights on {} alone take {} but bubbletea.kv_cap_bytes = {}\n"
          "  hint: raise bubbletea.kv_cap_bytes, or use a smaller inference model (bubbletea.hidden/layers/vocab)",
          where, units::format_bytes_human(static_cast<double>(m_model->weight_bytes())),
          units::format_bytes_human(static_cast<double>(cap))));
    const std::uint64_t need = m_fixed_bytes + per_token * static_cast<std::uint64_t>(longest);
    if (need > cap)
      throw ConfigError(fmt::format(
          "bubbletea.kv_cap_bytes = {} cannot hold one request on {}: weights {} + scratch {} + KV, handoff and "
          "activations of the longest prompt ({} tokens) {} = {}\n  hint: raise bubbletea.kv_cap_bytes or shorten the "
          "prompts",
          units::format_bytes_human(static_cast<double>(cap)), where,
          units::format_bytes_human(static_cast<double>(m_model->weight_bytes())),
          units::format_bytes_human(static_cast<double>(m_model->scratch_bytes())), longest,
          units::format_bytes_human(static_cast<double>(per_token * static_cast<std::uint64_t>(longest))),
          units::format_bytes_human(static_cast<double>(need))));
  });
  const auto per_tokens = m_comm.allgather(static_cast<unsigned long long>(per_token));
  const auto budgets = m_comm.allgather(static_cast<unsigned long long>(bt.kv_cap_bytes - m_fixed_bytes));
  m_reserve_per_token = *std::max_element(per_tokens.begin(), per_tokens.end());
  m_reserve_budget = *std::min_element(budgets.begin(), budgets.end());

  if (!profiler.enabled() && world.rank() == 0)
    log::warn("BubbleTea: profile.enabled = false, so the bubbles' real lengths cannot be learned; every bubble "
              "is filled up to the schedule table's prediction (training slows down where the real bubble is "
              "shorter)");

  // ---- cost model (measured here, on this rank's backend) ----
  m_cost = calibrate(*m_model, m_opt.calibration_repeats);

  // ---- the DC's decode worker: started by DC rank 0; every rank connects and sends weights ----
  int port = 0;
  collective(world, [&] {
    if (m_index != 0) return;
    const std::string program = m_opt.worker_program.empty() ? default_worker_program() : m_opt.worker_program;
    m_worker = WorkerProcess::spawn(program, host_of_dc(cfg.cluster, me.dc), m_opt.worker_threads, m_opt.worker_nice,
                                    m_opt.timeout_s);
    port = m_worker.port();
  });
  m_comm.bcast(std::span<int>(&port, 1), 0);
  collective(world, [&] {
    const wan::SockAddr addr = wan::resolve(host_of_dc(cfg.cluster, me.dc), port);
    bool in_progress = false;
    std::string err;
    m_sock = wan::connect_tcp(addr, in_progress, err);
    if (!m_sock.valid()) ATLAS_THROW(Comm, "cannot connect to the decode worker: " << err);
    if (in_progress) {
      pollfd p{m_sock.get(), POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(m_opt.timeout_s * 1000)) <= 0)
        ATLAS_THROW(Comm, "connecting to the decode worker at " << addr.text << " timed out");
      if (const std::string e = wan::connect_error(m_sock.get()); !e.empty())
        ATLAS_THROW(Comm, "cannot connect to the decode worker at " << addr.text << ": " << e);
    }
    wan::tune_socket(m_sock.get(), 0);
    m_out.set_fd(m_sock.get());
    wire::Hello h;
    h.dc = me.dc;
    h.dc_rank = m_index;
    h.dc_size = m_size;
    h.shape = shape;
    h.range = range;
    m_out.push(wire::Type::Hello, wire::encode(h));
    for (const auto& p : m_model->params()) {
      std::vector<float> v(p.value.floats());
      m_backend.download(v.data(), p.value.data(), v.size() * sizeof(float));
      m_out.push(wire::Type::Tensor, wire::encode_tensor(p.name, v));
    }
    m_out.push(wire::Type::WeightsDone, {});
    m_out.flush_all(m_opt.timeout_s);
    if (m_index == 0) {
      const wire::Frame f = wire::recv_frame(m_sock.get(), m_in, m_opt.timeout_s, "Ready");
      if (f.type == wire::Type::Fail)
        ATLAS_THROW(Comm, "the decode worker failed: " << std::string(f.payload.begin(), f.payload.end()));
      if (f.type != wire::Type::Ready) ATLAS_THROW(Comm, "the decode worker answered frame " << static_cast<int>(f.type));
    }
  });

  // ---- the set-up, as the run's header shows it ----
  const std::string line = fmt::format(
      "#   rank {:>4} {:<10} blocks {:>2}-{:<2} weights {:>9}  prefill cost {:.4f} ms/token + {:.3f} ms/chunk "
      "(x{:.2f})\n",
      world.rank(), cfg.cluster.dcs.size() > static_cast<std::size_t>(me.dc) ? cfg.cluster.dcs[static_cast<std::size_t>(me.dc)] : "?",
      range.first, range.first + range.count - 1, units::format_bytes_human(static_cast<double>(m_model->weight_bytes())),
      m_cost.per_token_ms, m_cost.fixed_ms, m_cost.scale);
  m_summary = fmt::format(
      "# BubbleTea: inference GPT {} blocks x {} hidden, {} heads, context {}, vocab {}, weights {}; {} requests ({}); "
      "chunks of {} tokens, guard {:.2f} ms, memory cap {} per rank; one decode worker per DC\n",
      bt.layers, bt.hidden, bt.heads, bt.context, bt.vocab, bt.weights.empty() ? "random" : bt.weights,
      m_requests.size(), bt.trace.empty() ? fmt::format("Poisson {:.1f}/s", bt.rate_per_s) : bt.trace,
      bt.chunk_tokens > 0 ? std::to_string(bt.chunk_tokens) : std::string("whole prompt"), bt.guard_ms,
      units::format_bytes_human(static_cast<double>(bt.kv_cap_bytes)));
  for (const auto& l : world.allgather_strings(line)) m_summary += l;

  // ---- accounting ----
  m_stats.world_rank = world.rank();
  m_stats.dc = me.dc;
  m_stats.dc_rank = m_index;
  m_stats.first_layer = range.first;
  m_stats.layers = range.count;
  m_stats.weight_bytes = m_model->weight_bytes();
  m_stats.peak_bytes = m_fixed_bytes;
  for (int id : m_mine) {
    const Request& r = m_requests[static_cast<std::size_t>(id)];
    RequestRecord rec;
    rec.id = r.id;
    rec.dc = r.dc;
    rec.prompt_tokens = static_cast<int>(r.prompt.size());
    rec.max_new_tokens = r.max_new_tokens;
    rec.arrival_s = r.arrival_s;
    m_records[r.id] = rec;
  }
}

Service::~Service() {
  // finish() not reached (an error unwinds the job): the worker sees its connections close and
  // exits; WorkerProcess's destructor reaps (or kills) it. Outstanding MPI requests are freed.
  // An operation still in flight may touch its buffer after MPI_Request_free, so the buffers
  // of such operations are deliberately leaked (this only happens while a failing job unwinds).
  for (auto& s : m_sends)
    if (s.req != MPI_REQUEST_NULL) {
      new std::vector<char>(std::move(s.bytes));  // NOLINT: intentional leak, see above
      MPI_Request_free(&s.req);
    }
  for (auto& r : m_recvs)
    if (r.req != MPI_REQUEST_NULL) {
      new std::vector<char>(std::move(r.bytes));  // NOLINT: intentional leak, see above
      MPI_Request_free(&r.req);
    }
  m_sock.reset();
}

void Service::start() {
  m_t0 = m_profiler.now();
  m_started_clock = true;
}

double Service::job_now() const { return m_profiler.now() - m_t0; }

int Service::prefilled_here() const {
  if (!m_model->range().has_head) return 0;
  return static_cast<int>(
      std::count_if(m_records.begin(), m_records.end(), [](const auto& kv) { return kv.second.prefilled(); }));
}

// ---- the bubble hook ----

std::pair<double, std::int64_t> Service::fill(int step, const sched::Slot& slot, double budget_s,
                                              const std::function<bool()>* ended) {
  if (m_finished) return {0.0, 0};
  if (!m_started_clock) start();
  const double t_enter = m_profiler.now();
  const double guard_ms = m_cfg.bubbletea.guard_ms;
  // A receive slot is a wait the table did not plan (bubbletea.fill_recv_waits): the runtime's
  // budget is already a learned lower bound, filled as it is (no stretch, no allowance), and the
  // bubble before it (if any) has not been measured yet.
  const bool unplanned = sched::is_recv(slot.kind);
  if (!unplanned) learn_from_last_bubble();
  // This bubble's allowance: the table's budget, or less once learned.
  double allowed_s = budget_s;
  const int index = m_row && &slot >= m_row->data() && &slot < m_row->data() + m_row->size()
                        ? static_cast<int>(&slot - m_row->data())
                        : -1;
  const bool watched = (unplanned || m_cfg.bubbletea.watch_recv) && ended != nullptr && *ended;
  // The fill of the receive right after a watched bubble that stopped before its data came
  // measures that bubble's length; anything else resolves it from the receive's recorded end.
  const bool bubble = slot.kind == sched::SlotKind::Idle || slot.kind == sched::SlotKind::Prefill;
  const bool resolves_watch = m_watch.pending && step == m_watch.step && index == m_watch.index + 1;
  if (m_watch.pending && !resolves_watch) learn_watched_length();
  if (unplanned) {
    ++m_stats.unplanned_fills;
    m_stats.unplanned_budget_s += budget_s;
  } else if (watched && bubble) {
    // The receive that ends the bubble is tested before every chunk: fill until it arrives,
    // within the table's length or, past it, a quantile of this bubble's real lengths.
    allowed_s = index >= 0 ? watched_allowance_s(index, budget_s) : budget_s;
  } else if (watched) {
    // A WAN wait inside a training slot (bubbletea.fill_wan_waits): the runtime's budget, already
    // stretched (the deck's prediction x max_stretch, or a learned lower bound when longer).
    allowed_s = budget_s;
  } else if (index >= 0 && m_profiler.enabled()) {
    auto it = m_allowance.find(index);
    if (it != m_allowance.end()) allowed_s = std::min(budget_s * m_cfg.bubbletea.max_stretch, it->second);
    m_last = LastBubble{true, step, index, 0.0, budget_s};
  }
  const double deadline = t_enter + allowed_s;
  ++m_stats.fill_calls;
  if (!unplanned) {
    m_stats.offered_s += budget_s;
    m_stats.allowed_s += watched ? budget_s : allowed_s;  // a watched bubble has no learned allowance
  }
  poll();
  if (m_index == 0) {
    admit_arrivals(job_now());
    m_queue_sum += static_cast<double>(m_waiting.size());
    ++m_queue_samples;
    m_stats.queue_max = std::max(m_stats.queue_max, static_cast<int>(m_waiting.size()));
  }
  double work = 0.0;
  std::int64_t tokens = 0;
  bool arrived = false;
  double last_pending = t_enter;  // the last test that found the receive not yet in
  // Tested before every chunk and between a chunk's blocks: training's data stops the chunk
  // there, not at its end.
  std::function<bool()> stop;
  if (watched)
    stop = [&] {
      if ((*ended)()) return arrived = true;
      last_pending = m_profiler.now();
      return false;
    };
  while (true) {
    if (stop && stop()) break;
    const double remaining_ms = (deadline - m_profiler.now()) * 1e3 - guard_ms;
    if (remaining_ms <= 0) break;
    const std::int64_t before = m_stats.tokens;
    const double t0 = m_profiler.now();
    if (!run_one(remaining_ms, stop)) break;
    const double t1 = m_profiler.now();
    work += t1 - t0;
    tokens += m_stats.tokens - before;
    if (t1 > deadline) {
      ++m_stats.overruns;
      m_stats.overrun_s += t1 - std::max(t0, deadline);
    }
    poll();
    if (arrived) break;  // seen between the blocks of that chunk (paused there)
  }
  if (m_last.pending) m_last.spent_s = m_profiler.now() - t_enter;
  if (unplanned) m_stats.unplanned_prefill_s += work;
  if (watched && bubble && index >= 0) {
    // The data came after the last "not yet" (a lower bound: a chunk may have run past it);
    // otherwise the receive's recorded end says when (the profiler's events).
    if (arrived) record_watched_length(index, last_pending - t_enter);
    else if (m_profiler.enabled()) m_watch = WatchedBubble{true, step, index, t_enter};
  } else if (resolves_watch && arrived) {
    record_watched_length(m_watch.index, last_pending - m_watch.enter_s);
    m_watch.pending = false;
  }
  return {work, tokens};
}

double Service::watched_allowance_s(int index, double budget_s) {
  if (m_watch.pending && m_watch.index == index) learn_watched_length();
  auto it = m_watch_lengths.find(index);
  // From the first real length on (a job's first steps are a bench run's large share).
  if (it == m_watch_lengths.end() || it->second.empty()) return budget_s;
  return std::clamp(it->second.quantile(m_cfg.bubbletea.stretch_quantile), budget_s,
                    budget_s * m_cfg.bubbletea.max_stretch);
}

void Service::record_watched_length(int index, double length_s) { m_watch_lengths[index].push(length_s); }

void Service::learn_watched_length() {
  m_watch.pending = false;
  // The receive returned as soon as its data was in: the bubble lasted until then.
  if (const runtime::SlotEvent* recv = find_event(m_watch.step, m_watch.index + 1))
    record_watched_length(m_watch.index, recv->end_s - m_watch.enter_s);
}

const runtime::SlotEvent* Service::find_event(int step, int index) const {
  if (index >= static_cast<int>(m_row->size())) {
    index = 0;
    ++step;
  }
  // The runtime records a slot once it ran; search newest first.
  const auto& events = m_profiler.events();
  const int me = m_comms.world.rank();
  for (std::size_t k = events.size(), scanned = 0; k-- > 0 && scanned < 4096; ++scanned) {
    const runtime::SlotEvent& e = events[k];
    if (e.step < 0 || e.world_rank != me) continue;  // BubbleTea's own chunk events
    if (e.step == step && e.slot_index == index) return &e;
    if (e.step < step) break;
  }
  return nullptr;
}

void Service::learn_from_last_bubble() {
  if (!m_last.pending) return;
  m_last.pending = false;
  // The runtime records the slot after the bubble once it ran.
  const runtime::SlotEvent* next = find_event(m_last.step, m_last.index + 1);
  if (!next) return;
  // How long the runtime waited right after the bubble: a receive's wait, an all-reduce's time
  // beyond its prediction; anything else (compute, a send, the next step) did not wait at all.
  const sched::Slot& ns = (*m_row)[static_cast<std::size_t>(next->slot_index)];  // the event found is that slot
  double wait_s = 0.0;
  if (sched::is_recv(ns.kind)) wait_s = next->end_s - next->start_s;
  else if (ns.kind == sched::SlotKind::AllReduce) wait_s = std::max(0.0, next->end_s - next->start_s - ns.duration_ms * 1e-3);
  const double guard_s = m_cfg.bubbletea.guard_ms * 1e-3;
  const double threshold_s = std::max(2e-5, 0.5 * guard_s);
  double& allowance = m_allowance.try_emplace(m_last.index, m_last.budget_s).first->second;
  if (wait_s > threshold_s) {
    // The real bubble was (time in the bubble + the wait): aim a guard short of its end; go
    // down to it at once, up only half-way (training first: a noisy long wait must not make
    // the next bubble overrun).
    const double target =
        std::clamp(m_last.spent_s + wait_s - guard_s, 0.0, m_last.budget_s * m_cfg.bubbletea.max_stretch);
    allowance = target < allowance ? target : allowance + 0.5 * (target - allowance);
  } else if (m_last.spent_s > 0.0) {
    // No wait: the real bubble ended before the prefill did (or just with it); halve (a
    // bisection: the next wait, if any, measures the real length).
    allowance = 0.5 * std::min(allowance, m_last.spent_s);
  }
}

void Service::admit_arrivals(double now_job) {
  while (m_next_arrival < m_mine.size() &&
         m_requests[static_cast<std::size_t>(m_mine[m_next_arrival])].arrival_s <= now_job)
    m_waiting.push_back(m_mine[m_next_arrival++]);
}

bool Service::run_one(double remaining_ms, const std::function<bool()>& stop) {
  if (m_running.active) {
    // A paused chunk goes on first (nothing else may run on the model before it ends): if what
    // is left of it fits.
    const int blocks = m_model->range().count;
    const double left_ms = m_cost.predict_ms(m_running.h.n, m_running.h.pos) *
                           static_cast<double>(blocks - m_running.blocks_done) / static_cast<double>(blocks);
    if (left_ms > remaining_ms) return false;
    continue_chunk(stop, m_profiler.now());
    return true;
  }
  const int chunk_tokens = m_cfg.bubbletea.chunk_tokens;
  auto header_for = [&](const Request& r, int chunk) {
    const auto p = static_cast<int>(r.prompt.size());
    const int n_chunks = static_cast<int>(chunk_sizes(p, chunk_tokens).size());
    const int pos = chunk_tokens > 0 ? chunk * chunk_tokens : 0;
    ChunkHeader h{};
    h.request = r.id;
    h.chunk = chunk;
    h.n_chunks = n_chunks;
    h.pos = pos;
    h.n = chunk_tokens > 0 ? std::min(chunk_tokens, p - pos) : p;
    h.prompt_tokens = p;
    h.max_new_tokens = r.max_new_tokens;
    h.arrival_s = r.arrival_s;
    return h;
  };
  if (m_index == 0) {
    // Requests already started come first (they hold KV), then new ones in arrival order.
    for (std::size_t i = 0; i < m_started.size(); ++i) {
      const Request& r = m_requests[static_cast<std::size_t>(m_started[i])];
      ChunkHeader h = header_for(r, m_active[r.id].next_chunk);
      if (m_cost.predict_ms(h.n, h.pos) > remaining_ms) continue;
      h.start_s = m_records[r.id].start_s;
      if (h.chunk + 1 == h.n_chunks) m_started.erase(m_started.begin() + static_cast<std::ptrdiff_t>(i));
      run_chunk(h, r.prompt.data() + h.pos, nullptr, stop);
      return true;
    }
    for (auto it = m_waiting.begin(); it != m_waiting.end(); ++it) {
      const Request& r = m_requests[static_cast<std::size_t>(*it)];
      const std::uint64_t need = m_reserve_per_token * r.prompt.size();
      if (m_reserved + need > m_reserve_budget) break;  // memory: first come, first served
      if (m_in_flight >= 2 * m_size) break;  // keep the pipeline's inner queues short
      ChunkHeader h = header_for(r, 0);
      if (m_cost.predict_ms(h.n, h.pos) > remaining_ms) continue;
      m_reserved += need;
      ++m_in_flight;
      m_waiting.erase(it);
      RequestRecord& rec = m_records[r.id];
      rec.start_s = job_now();
      h.start_s = rec.start_s;
      if (h.n_chunks > 1) m_started.push_back(r.id);
      run_chunk(h, r.prompt.data(), nullptr, stop);
      return true;
    }
    return false;
  }
  // Later ranks: chunks in arrival order; a request's chunks never overtake each other.
  std::set<std::int64_t> blocked;
  for (auto it = m_ready.begin(); it != m_ready.end(); ++it) {
    if (blocked.count(it->h.request)) continue;
    if (m_cost.predict_ms(it->h.n, it->h.pos) > remaining_ms) {
      blocked.insert(it->h.request);
      continue;
    }
    Incoming in = std::move(*it);
    m_ready.erase(it);
    run_chunk(in.h, nullptr, reinterpret_cast<const float*>(in.bytes.data() + sizeof(ChunkHeader)), stop);
    return true;
  }
  return false;
}

void Service::run_chunk(const ChunkHeader& h, const std::int32_t* tokens, const float* act_in,
                        const std::function<bool()>& stop) {
  ATLAS_ASSERT(!m_running.active, "chunk of request " << h.request << " started while request " << m_running.h.request
                                                      << "'s chunk is paused");
  const double t0 = m_profiler.now();
  auto [it, fresh] = m_active.try_emplace(h.request);
  Active& a = it->second;
  if (fresh) a.cache = m_model->make_cache(h.prompt_tokens);
  ATLAS_ASSERT(a.next_chunk == h.chunk && a.cache.len == h.pos,
               "request " << h.request << ": chunk " << h.chunk << " at position " << h.pos << " arrived out of order");
  m_model->forward_begin(a.cache, h.n, tokens, act_in);
  m_running = Running{true, h, 0, 0.0};
  continue_chunk(stop, t0);
}

void Service::continue_chunk(const std::function<bool()>& stop, double t0) {
  const ChunkHeader h = m_running.h;
  const LayerRange& range = m_model->range();
  auto it = m_active.find(h.request);
  ATLAS_ASSERT(it != m_active.end(), "paused chunk of request " << h.request << " without its KV cache");
  Active& a = it->second;
  // One block at least per call (a call is admitted only when the rest fits); stop between blocks.
  for (bool first = true; m_running.blocks_done < range.count; first = false) {
    if (!first && stop && stop()) {
      const double t1 = m_profiler.now();
      m_running.spent_s += t1 - t0;
      ++m_stats.pauses;
      record_chunk_event(h, t0, t1);
      return;
    }
    m_model->forward_block(a.cache, h.n, m_running.blocks_done++);
  }
  m_running.active = false;
  const bool last = h.chunk + 1 == h.n_chunks;
  std::vector<float> logits;
  if (range.has_head) {
    if (last) logits.resize(static_cast<std::size_t>(m_model->shape().vocab));
    m_model->forward_end(a.cache, h.n, nullptr, last ? logits.data() : nullptr);
  } else {
    PendingSend s;
    s.bytes.resize(sizeof(ChunkHeader) + static_cast<std::size_t>(h.n) * static_cast<std::size_t>(m_model->shape().hidden) *
                                             sizeof(float));
    std::memcpy(s.bytes.data(), &h, sizeof h);
    m_model->forward_end(a.cache, h.n, reinterpret_cast<float*>(s.bytes.data() + sizeof h), nullptr);
    ATLAS_MPI_CHECK(MPI_Isend(s.bytes.data(), static_cast<int>(s.bytes.size()), MPI_BYTE, m_index + 1, kTagChunk,
                              m_comm.get(), &s.req));
    m_sends.push_back(std::move(s));
    ++m_chunks_sent;
  }
  ++a.next_chunk;
  if (m_index == 0) ++m_records[h.request].chunks;
  if (last) {
    // KV handoff: this rank's layers of the request go to the decode worker; the cache is freed.
    const bool worker_ok = m_sock.valid() && m_worker_failure.empty();
    if (worker_ok) m_out.push(wire::Type::Kv, wire::encode_kv(h.request, *m_model, a.cache), h.request);
    if (range.has_head) {
      wire::FirstToken f;
      f.request = h.request;
      f.prompt_tokens = h.prompt_tokens;
      f.first_token = InferenceModel::argmax(logits);
      f.max_new_tokens = h.max_new_tokens;
      f.first_token_s = job_now();
      if (worker_ok) m_out.push(wire::Type::First, wire::encode(f));
      RequestRecord& rec = m_records[static_cast<int>(h.request)];
      rec.id = static_cast<int>(h.request);
      rec.first_token_s = f.first_token_s;
      rec.start_s = std::max(rec.start_s, h.start_s);
      rec.arrival_s = h.arrival_s;
      rec.prompt_tokens = h.prompt_tokens;
      rec.max_new_tokens = h.max_new_tokens;
      rec.tokens = {f.first_token};
    }
    track_memory();  // the cache and its handoff frame, both held at this moment
    m_active.erase(it);
    if (m_index + 1 == m_size) prefilled_here(h.request);
    if (!worker_ok) released_here(h.request);  // else once the frame is in the socket (poll)
  } else {
    track_memory();
  }
  const double t1 = m_profiler.now();
  m_cost.observe(h.n, h.pos, (m_running.spent_s + t1 - t0) * 1e3);
  ++m_stats.chunks;
  m_stats.tokens += h.n;
  record_chunk_event(h, t0, t1);
}

void Service::record_chunk_event(const ChunkHeader& h, double t0, double t1) {
  runtime::SlotEvent e;
  e.world_rank = m_comms.world.rank();
  e.step = -1;
  e.slot_index = -1;
  e.kind = static_cast<int>(sched::SlotKind::Prefill);
  e.micro = h.chunk;
  e.request = static_cast<std::int32_t>(h.request);
  e.bytes = static_cast<std::int64_t>(h.n);
  e.start_s = t0;
  e.end_s = t1;
  e.complete_s = t1;
  e.predicted_ms = m_cost.predict_ms(h.n, h.pos);
  m_profiler.record(e);
}

void Service::prefilled_here(std::int64_t request) {
  if (m_index == 0) {
    --m_in_flight;
    return;
  }
  notify_dispatcher(-request - 1);
}

void Service::released_here(std::int64_t request) {
  if (m_index == 0) {
    release(request, 0);
    return;
  }
  notify_dispatcher(request);
}

void Service::notify_dispatcher(std::int64_t message) {
  PendingSend s;
  s.bytes.resize(sizeof(std::int64_t));
  std::memcpy(s.bytes.data(), &message, sizeof(std::int64_t));
  ATLAS_MPI_CHECK(MPI_Isend(s.bytes.data(), 1, MPI_INT64_T, 0, kTagRelease, m_comm.get(), &s.req));
  m_sends.push_back(std::move(s));
  ++m_releases_sent;
}

void Service::release(std::int64_t request, int from) {
  (void)from;
  if (request < 0) {  // the last DC rank finished the request's prefill (prefilled_here)
    --m_in_flight;
    return;
  }
  if (++m_release_count[request] < m_size) return;
  m_release_count.erase(request);
  const Request& r = m_requests[static_cast<std::size_t>(request)];
  m_reserved -= m_reserve_per_token * r.prompt.size();
}

void Service::track_memory() {
  std::uint64_t b = m_fixed_bytes + m_out.pending_bytes();
  for (const auto& [id, a] : m_active) b += a.cache.bytes();
  for (const auto& s : m_sends) b += s.bytes.size();
  for (const auto& r : m_recvs) b += r.bytes.size();
  for (const auto& r : m_ready) b += r.bytes.size();
  m_stats.peak_bytes = std::max<std::uint64_t>(m_stats.peak_bytes, b);
}

void Service::poll() {
  // Sends that completed free their buffers.
  for (auto& s : m_sends) {
    int done = 0;
    ATLAS_MPI_CHECK(MPI_Test(&s.req, &done, MPI_STATUS_IGNORE));
  }
  std::erase_if(m_sends, [](const PendingSend& s) { return s.req == MPI_REQUEST_NULL; });
  // Activations from the previous rank: matched now, received without waiting, used in order.
  if (m_index > 0) {
    while (true) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      ATLAS_MPI_CHECK(MPI_Improbe(m_index - 1, kTagChunk, m_comm.get(), &flag, &msg, &st));
      if (!flag) break;
      int count = 0;
      ATLAS_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
      PendingRecv r;
      r.bytes.resize(static_cast<std::size_t>(count));
      ATLAS_MPI_CHECK(MPI_Imrecv(r.bytes.data(), count, MPI_BYTE, &msg, &r.req));
      m_recvs.push_back(std::move(r));
    }
    while (!m_recvs.empty()) {
      int done = 0;
      ATLAS_MPI_CHECK(MPI_Test(&m_recvs.front().req, &done, MPI_STATUS_IGNORE));
      if (!done) break;
      Incoming in;
      in.bytes = std::move(m_recvs.front().bytes);
      std::memcpy(&in.h, in.bytes.data(), sizeof(ChunkHeader));
      m_recvs.pop_front();
      m_ready.push_back(std::move(in));
      ++m_chunks_received;
    }
  }
  // Releases (the dispatcher): small messages, already complete when matched.
  if (m_index == 0 && m_size > 1) {
    while (true) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      ATLAS_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kTagRelease, m_comm.get(), &flag, &msg, &st));
      if (!flag) break;
      std::int64_t id = 0;
      ATLAS_MPI_CHECK(MPI_Mrecv(&id, 1, MPI_INT64_T, &msg, MPI_STATUS_IGNORE));
      ++m_releases_received;
      release(id, st.MPI_SOURCE);
    }
  }
  // The decode worker: write what it takes; DC rank 0 reads results. A failed worker is reported
  // (once) and BubbleTea keeps prefilling; training is never stopped by it.
  if (!m_sock.valid() || !m_worker_failure.empty()) return;
  try {
    m_out.flush_some();
    for (std::int64_t id : m_out.take_written()) released_here(id);
    if (m_index == 0) {
      const bool open = m_in.read_some(m_sock.get());
      while (auto f = m_in.next()) {
        if (f->type == wire::Type::Result) {
          const wire::Result res = wire::decode_result(f->payload);
          RequestRecord& rec = m_records[static_cast<int>(res.request)];
          rec.tokens = res.tokens;
          rec.decode_wait_s = res.wait_s;
          rec.decode_s = res.decode_s;
        } else if (f->type == wire::Type::Done) {
          m_worker_done = true;
        } else if (f->type == wire::Type::Fail) {
          ATLAS_THROW(Comm, "the decode worker failed: " << std::string(f->payload.begin(), f->payload.end()));
        }
      }
      if (!open && !m_worker_done) ATLAS_THROW(Comm, "the decode worker closed its connection");
    }
  } catch (const Error& e) {
    m_worker_failure = e.what();
    log::warn("BubbleTea: {}; prefills continue, their decoding is lost", m_worker_failure);
    for (std::int64_t id : m_out.drop_all()) released_here(id);
  }
}

void Service::after_step(const runtime::StepReport& rep) {
  ++m_stats.steps;
  m_stats.wall_s += rep.step_s;
  m_stats.compute_s += rep.compute_s;
  m_stats.comm_s += rep.intra_s + rep.wan_s;
  m_stats.idle_s += rep.idle_s;
  m_stats.prefill_s += rep.prefill_s;
  m_step_s.push_back(rep.step_s);
}

// ---- teardown ----

Report Service::finish() {
  ATLAS_ASSERT(!m_finished, "Service::finish called twice");
  m_finished = true;
  const mpi::Comm& world = m_comms.world;
  const double end_s = world.allreduce(job_now(), MPI_MAX);
  m_stats.queue_final = static_cast<int>(m_waiting.size());
  m_stats.queue_mean = m_queue_samples ? m_queue_sum / static_cast<double>(m_queue_samples) : 0.0;
  m_stats.cost_per_token_ms = m_cost.per_token_ms * m_cost.scale;
  m_stats.cost_fixed_ms = m_cost.fixed_ms * m_cost.scale;
  m_stats.cost_scale = m_cost.scale;

  // ---- KV handoffs still queued go out now (their reservations are released with them) ----
  poll();
  if (m_sock.valid() && m_worker_failure.empty()) {
    try {
      m_out.flush_all(m_opt.timeout_s);
    } catch (const Error& e) {
      m_worker_failure = e.what();
    }
  }
  for (std::int64_t id : m_worker_failure.empty() ? m_out.take_written() : m_out.drop_all()) released_here(id);

  // ---- drain the DC pipeline's messages (every one sent is received; the work is dropped) ----
  const auto chunks_sent = m_comm.allgather(static_cast<long long>(m_chunks_sent));
  const auto releases_sent = m_comm.allgather(static_cast<long long>(m_releases_sent));
  if (m_index > 0) {
    const long long expected = chunks_sent[static_cast<std::size_t>(m_index - 1)];
    for (auto& r : m_recvs) ATLAS_MPI_CHECK(MPI_Wait(&r.req, MPI_STATUS_IGNORE));
    m_chunks_received += static_cast<std::int64_t>(m_recvs.size());
    m_recvs.clear();
    std::vector<char> sink;
    while (m_chunks_received < expected) {
      MPI_Message msg;
      MPI_Status st;
      ATLAS_MPI_CHECK(MPI_Mprobe(m_index - 1, kTagChunk, m_comm.get(), &msg, &st));
      int count = 0;
      ATLAS_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
      sink.resize(static_cast<std::size_t>(count));
      ATLAS_MPI_CHECK(MPI_Mrecv(sink.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
      ++m_chunks_received;
    }
  }
  if (m_index == 0) {
    const long long expected = std::accumulate(releases_sent.begin(), releases_sent.end(), 0LL);
    while (m_releases_received < expected) {
      std::int64_t id = 0;
      ATLAS_MPI_CHECK(MPI_Recv(&id, 1, MPI_INT64_T, MPI_ANY_SOURCE, kTagRelease, m_comm.get(), MPI_STATUS_IGNORE));
      ++m_releases_received;
      release(id, -1);
    }
  }
  for (auto& s : m_sends) ATLAS_MPI_CHECK(MPI_Wait(&s.req, MPI_STATUS_IGNORE));
  m_sends.clear();
  m_ready.clear();
  m_active.clear();

  // ---- the decode worker finishes the requests whose KV arrived ----
  std::string worker_error;
  if (m_sock.valid() && m_worker_failure.empty()) {
    try {
      m_out.push(wire::Type::Finish, {});
      m_out.flush_all(m_opt.timeout_s);
      if (m_index == 0) {
        while (!m_worker_done) {
          const wire::Frame f = wire::recv_frame(m_sock.get(), m_in, m_opt.timeout_s, "decode results");
          if (f.type == wire::Type::Result) {
            const wire::Result res = wire::decode_result(f.payload);
            RequestRecord& rec = m_records[static_cast<int>(res.request)];
            rec.tokens = res.tokens;
            rec.decode_wait_s = res.wait_s;
            rec.decode_s = res.decode_s;
          } else if (f.type == wire::Type::Done) {
            m_worker_done = true;
          } else if (f.type == wire::Type::Fail) {
            ATLAS_THROW(Comm, "the decode worker failed: " << std::string(f.payload.begin(), f.payload.end()));
          }
        }
      }
    } catch (const Error& e) {
      worker_error = e.what();
    }
  } else {
    worker_error = m_worker_failure;
  }
  if (!worker_error.empty()) log::warn("BubbleTea: decode worker of DC {}: {}", m_stats.dc, worker_error);
  m_comm.barrier();  // every rank's Finish is written before DC rank 0 reaps the worker
  m_sock.reset();
  if (m_index == 0) {
    const int status = m_worker.wait(m_opt.timeout_s);
    if (status != 0 && worker_error.empty())
      log::warn("BubbleTea: the decode worker of DC {} exited with status {}", m_stats.dc, status);
  }

  // ---- gather the report (every rank gets it) ----
  std::string mine = serialize(m_stats);
  for (const auto& [id, rec] : m_records) mine += serialize(rec);
  const std::vector<std::string> all = world.allgather_strings(mine);
  Report rep;
  std::map<int, RequestRecord> recs;
  for (const auto& s : all) parse_into(s, rep.ranks, recs);
  std::sort(rep.ranks.begin(), rep.ranks.end(),
            [](const RankStats& a, const RankStats& b) { return a.world_rank < b.world_rank; });
  for (auto& [id, r] : recs) rep.requests.push_back(std::move(r));
  rep.steps = m_stats.steps;
  std::vector<double> steps = m_step_s;
  if (!steps.empty()) ATLAS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, steps.data(), static_cast<int>(steps.size()),
                                                    MPI_DOUBLE, MPI_MAX, world.get()));
  double sum = 0.0;
  for (double s : steps) sum += s;
  rep.wall_s = world.allreduce(m_stats.wall_s, MPI_MAX);
  rep.end_s = end_s;
  rep.mean_step_s = steps.empty() ? 0.0 : sum / static_cast<double>(steps.size());
  return rep;
}

}  // namespace atlas::bubbletea
