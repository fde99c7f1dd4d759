// SPDX-License-Identifier: MIT
// The service's accounting and teardown: each step's timings, then finish(): drain the DC
// pipelines, flush the KV handoffs, collect the decode results and gather the report (ranks'
// stats and requests serialised as text; doubles print round-trip exact).
#include "atlas/bubbletea/service.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/runtime/fault.hpp"

namespace atlas::bubbletea {

namespace {

std::string serialize(const RankStats& s) {
  return fmt::format("R {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
                     s.world_rank, s.dc, s.dc_rank, s.first_layer, s.layers, s.steps, s.wall_s, s.compute_s, s.comm_s,
                     s.idle_s, s.prefill_s, s.offered_s, s.allowed_s, s.overrun_s, s.overruns, s.fill_calls,
                     s.unplanned_fills, s.unplanned_budget_s, s.unplanned_prefill_s, s.starved_s, s.chunks, s.pauses, s.tokens,
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
          s.unplanned_fills >> s.unplanned_budget_s >> s.unplanned_prefill_s >> s.starved_s >> s.chunks >> s.pauses >>
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
  // It sends the results once every rank of the pipeline has sent Finish: the first rank waits for
  // them only when all did (a rank whose Finish failed made it wait bubbletea's whole timeout).
  std::string worker_error;
  bool finish_sent = false;
  if (m_sock.valid() && m_worker_failure.empty()) {
    try {
      if (runtime::fault_requested("ATLAS_FAULT_BT_FINISH", world.rank(), 0, false))
        ATLAS_THROW(Comm, "fault injection: Finish not sent");
      m_out.push(wire::Type::Finish, {});
      m_out.flush_all(m_opt.timeout_s);
      finish_sent = true;
    } catch (const Error& e) {
      worker_error = e.what();
    }
  } else {
    worker_error = m_worker_failure;
  }
  const int unsent = m_comm.allreduce(finish_sent ? 0 : 1, MPI_SUM);
  if (m_index == 0 && finish_sent && unsent > 0) {
    worker_error = fmt::format("{} other rank(s) of the pipeline could not send Finish to it (their warnings say why): "
                               "its decode results are not collected",
                               unsent);
  } else if (m_index == 0 && finish_sent) {
    try {
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
    } catch (const Error& e) {
      worker_error = e.what();
    }
  }
  // A failure seen during training was reported then; one seen in this teardown is reported here.
  if (!worker_error.empty() && !m_worker_failure_reported) log::warn("BubbleTea: decode worker of DC {}, inference pipeline {}: {}", m_stats.dc, m_pipeline, worker_error);
  m_comm.barrier();  // every rank's Finish is written before the pipeline's first rank reaps the worker
  m_sock.reset();
  if (m_index == 0) {
    const int status = m_worker.wait(m_opt.timeout_s);
    if (status != 0 && worker_error.empty())
      log::warn("BubbleTea: the decode worker of DC {}, inference pipeline {}, exited with status {}", m_stats.dc,
                m_pipeline, status);
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
