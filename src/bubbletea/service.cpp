// SPDX-License-Identifier: MIT
// BubbleTea's prefill service (see service.hpp): its set-up (requests, inference layers, memory
// cap, cost model, decode worker) here; the bubble hook and its budgets in service_fill.cpp,
// admission and chunks in service_admission.cpp, the DC pipeline's messages and the worker's
// socket in service_pipeline.cpp, accounting and teardown in service_report.cpp. Rules that keep
// training first:
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
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

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

}  // namespace

// ---- setup ----

Service::Service(const Config& cfg, const topo::Layout& layout, const topo::Communicators& comms,
                 const sched::ScheduleTable& table, device::Backend& backend, runtime::Profiler& profiler,
                 ServiceOptions options)
    : WaitFiller(cfg, layout),
      m_cfg(cfg),
      m_layout(layout),
      m_comms(comms),
      m_table(table),
      m_backend(backend),
      m_profiler(profiler),
      m_opt(std::move(options)) {
  const mpi::Comm& world = comms.world;
  const topo::Coord me = layout.coord(world.rank());
  const BubbleTeaCfg& bt = cfg.bubbletea;
  m_emulated = cfg.device.backend == Backend::Emulated;
  // This rank's inference pipeline (bubbletea.pipeline): per DC, one over all its ranks or one per
  // DP replica; the place in it follows world rank order.
  const PipelinePlace place = pipeline_place(bt.pipeline, layout, world.rank());
  m_comm = world.split(place.pipeline, world.rank());
  m_row = &table.row(me.stage, me.dp);
  m_index = m_comm.rank();
  m_size = m_comm.size();
  m_pipeline = place.pipeline;
  ATLAS_ASSERT(m_index == place.index && m_size == place.size,
               "inference pipeline " << place.pipeline << ": place " << m_index << " of " << m_size
                                     << " in the communicator, " << place.index << " of " << place.size
                                     << " by the layout");

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
  // Requests are dealt round-robin over the pipelines (serving_pipelines: alternating DCs).
  const std::vector<PipelinePlace> serving = serving_pipelines(bt.pipeline, layout);
  int longest = 1;
  for (auto& r : m_requests) {
    const PipelinePlace& p = serving[static_cast<std::size_t>(r.id) % serving.size()];
    r.dc = p.dc;
    longest = std::max(longest, static_cast<int>(r.prompt.size()));
    if (p.pipeline == place.pipeline) m_mine.push_back(r.id);
  }
  std::stable_sort(m_mine.begin(), m_mine.end(), [this](int a, int b) {
    return m_requests[static_cast<std::size_t>(a)].arrival_s < m_requests[static_cast<std::size_t>(b)].arrival_s;
  });
  m_waiting = WaitQueue(static_cast<int>(m_mine.size()));

  // ---- this rank's inference layers ----
  const InferShape shape = InferShape::from(bt);
  const int max_chunk = bt.chunk_tokens > 0 ? std::min(bt.chunk_tokens, bt.context) : std::min(longest, bt.context);
  LayerRange range;
  const auto where_of = [&] {
    return fmt::format("rank {} ({}, inference blocks [{}, {}))", world.rank(), layout.describe(world.rank(), cfg.cluster.dcs),
                       range.first, range.first + range.count);
  };
  const auto weights_over_cap = [&](std::uint64_t weights) {
    return ConfigError(fmt::format(
        "the inference model's weights on {} alone take {} but bubbletea.kv_cap_bytes = {}\n"
        "  hint: raise bubbletea.kv_cap_bytes, or use a smaller inference model (bubbletea.hidden/layers/vocab)",
        where_of(), units::format_bytes_human(static_cast<double>(weights)),
        units::format_bytes_human(static_cast<double>(bt.kv_cap_bytes))));
  };
  collective(world, [&] {
    range = split_layers(bt.layers, m_size, m_index);
    // The weights are checked against the cap on the model's shape before any is allocated: a
    // model far over it fails with this message, not with the allocator's.
    const InferenceModel sized(shape, range, backend, max_chunk, /*emulated=*/true);
    if (sized.weight_bytes() > bt.kv_cap_bytes) throw weights_over_cap(sized.weight_bytes());
    m_model = std::make_unique<InferenceModel>(shape, range, backend, max_chunk, m_emulated);
  });
  if (m_emulated) {
    // device.backend = emulated: the model is its shape (no values); bubbletea.weights is not read.
  } else if (bt.weights.empty() || bt.weights == "random") {
    m_model->init_random(static_cast<std::uint64_t>(cfg.run.seed), cfg.model.init_std);
  } else {
    load_weights(world, bt.weights, *m_model, "bubbletea.weights");
  }

  // ---- memory cap: weights + scratch + one largest request must fit on every rank ----
  const auto c4 = static_cast<std::uint64_t>(bt.hidden) * sizeof(float);
  m_fixed_bytes = m_model->weight_bytes() + m_model->scratch_bytes();
  // Per prompt token: KV cache + its handoff frame (both exist while the frame is built) +
  // activations in and out.
  const std::uint64_t per_token = 2 * m_model->kv_bytes_per_token() + 2 * c4;
  collective(world, [&] {
    const std::uint64_t cap = bt.kv_cap_bytes;
    const std::string where = where_of();
    if (m_model->weight_bytes() > cap) throw weights_over_cap(m_model->weight_bytes());
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
  // The pipeline's rank with the largest need per token and the one with the least room.
  const auto most_token =
      static_cast<std::size_t>(std::max_element(per_tokens.begin(), per_tokens.end()) - per_tokens.begin());
  const auto least_room =
      static_cast<std::size_t>(std::min_element(budgets.begin(), budgets.end()) - budgets.begin());
  m_reserve_per_token = per_tokens[most_token];
  m_reserve_budget = budgets[least_room];
  // Admission reserves the pipeline's largest need per token against its smallest room, so the
  // longest prompt must fit that too: each rank fitting its own (above) is not enough where one
  // rank holds more blocks and another more fixed bytes (the head's logits). A prompt that never
  // fits would stay at the head of the first-come-first-served queue, and nothing would run.
  const std::uint64_t reserve_need = m_reserve_per_token * static_cast<std::uint64_t>(longest);
  const auto world_ranks = m_comm.allgather(static_cast<unsigned long long>(world.rank()));
  collective(world, [&] {
    if (reserve_need <= m_reserve_budget) return;
    const std::uint64_t cap_needed = bt.kv_cap_bytes - m_reserve_budget + reserve_need;
    throw ConfigError(fmt::format(
        "bubbletea.kv_cap_bytes = {} cannot admit the longest prompt ({} tokens) in the inference pipeline of ranks {}: "
        "a request reserves its KV, handoff and activations on every rank of the pipeline at the largest need per "
        "token ({} a token, on rank {}), {}, against the smallest room left by weights and scratch ({}, on rank "
        "{}); nothing would ever be admitted\n  hint: set bubbletea.kv_cap_bytes to at least {} ({} bytes), or "
        "shorten the prompts",
        units::format_bytes_human(static_cast<double>(bt.kv_cap_bytes)), longest, fmt::join(world_ranks, " "),
        units::format_bytes_human(static_cast<double>(m_reserve_per_token)), world_ranks[most_token],
        units::format_bytes_human(static_cast<double>(reserve_need)),
        units::format_bytes_human(static_cast<double>(m_reserve_budget)), world_ranks[least_room],
        units::format_bytes_human(static_cast<double>(cap_needed)), cap_needed));
  });

  if (!profiler.enabled() && world.rank() == 0)
    log::warn("BubbleTea: profile.enabled = false, so the bubbles' real lengths cannot be learned; every bubble "
              "is filled up to the schedule table's prediction (training slows down where the real bubble is "
              "shorter)");

  // ---- cost model (measured here, on this rank's backend; emulated: the FLOP estimate) ----
  if (m_emulated) {
    // Nothing to measure: a chunk takes what the FLOP estimate at the training cost model's rate
    // says (the same cost `atlas schedule` places Prefill slots with), so the deck's inference
    // model (bubbletea.layers/hidden/vocab) sets the work, whatever its size.
    m_cost = estimate_cost(cfg, range.count, range.has_head);
    m_cost.scale = m_cost.calibrated_scale = 1.0;
    if (range.has_head) m_decoder = EmulatedDecoder(estimate_cost(cfg, bt.layers, true));
  } else {
    m_cost = calibrate(*m_model, m_opt.calibration_repeats);
  }

  // ---- the pipeline's decode worker: started by its first rank; every rank connects and sends weights ----
  // (emulated: none; the pipeline's last rank times each decode on m_decoder, a clock, not a process)
  int port = 0;
  if (!m_emulated) collective(world, [&] {
    if (m_index != 0) return;
    const std::string program = m_opt.worker_program.empty() ? default_worker_program() : m_opt.worker_program;
    m_worker = WorkerProcess::spawn(program, host_of_dc(cfg.cluster, me.dc), m_opt.worker_threads, m_opt.worker_nice,
                                    m_opt.timeout_s);
    port = m_worker.port();
  });
  if (!m_emulated) m_comm.bcast(std::span<int>(&port, 1), 0);
  if (!m_emulated) collective(world, [&] {
    const wan::SockAddr addr = wan::resolve(host_of_dc(cfg.cluster, me.dc), port);
    bool in_progress = false;
    std::string err;
    m_sock = wan::connect_tcp(addr, in_progress, err);
    if (!m_sock.valid()) ATLAS_THROW(Comm, "cannot connect to the decode worker: " << err);
    if (in_progress) {
      pollfd p{m_sock.get(), POLLOUT, 0};
      int ready = -1;
      // A signal (a stop request) interrupts the wait; the rest of the time is waited for again.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(m_opt.timeout_s);
      do {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
      } while (ready < 0 && errno == EINTR);
      if (ready <= 0)
        ATLAS_THROW(Comm, "connecting to the decode worker at " << addr.text << " timed out");
      if (const std::string e = wan::connect_error(m_sock.get()); !e.empty())
        ATLAS_THROW(Comm, "cannot connect to the decode worker at " << addr.text << ": " << e);
    }
    wan::tune_socket(m_sock.get(), 0);
    m_out.set_fd(m_sock.get(), addr.text);
    m_in.set_peer(addr.text);
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
      "chunks of {} tokens, guard {:.2f} ms, memory cap {} per rank; {}\n",
      bt.layers, bt.hidden, bt.heads, bt.context, bt.vocab,
      m_emulated ? std::string("none (emulated)") : bt.weights.empty() ? std::string("random") : bt.weights,
      m_requests.size(), bt.trace.empty() ? fmt::format("Poisson {:.1f}/s", bt.rate_per_s) : bt.trace,
      bt.chunk_tokens > 0 ? std::to_string(bt.chunk_tokens) : std::string("whole prompt"), bt.guard_ms,
      units::format_bytes_human(static_cast<double>(bt.kv_cap_bytes)),
      m_emulated ? "emulated compute: prefill sleeps the FLOP estimate, decode is timed, not run"
                 : "one decode worker per inference pipeline (bubbletea.pipeline)");
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

}  // namespace atlas::bubbletea
