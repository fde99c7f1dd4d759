// SPDX-License-Identifier: MIT
// Slot recording, gathering and the Chrome trace writer.
#include "atlas/runtime/profiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <span>
#include <vector>

namespace atlas::runtime {

Profiler::Profiler(bool enabled, int world_rank, std::size_t reserve_events)
    : m_enabled(enabled), m_world_rank(world_rank), m_t0(std::chrono::steady_clock::now()) {
  if (m_enabled) m_events.reserve(reserve_events);
}

void Profiler::sync_epoch(const mpi::Comm& world) {
  world.barrier();
  m_t0 = std::chrono::steady_clock::now();
  // One kernel (its boot id) means one CLOCK_MONOTONIC: then every rank takes rank 0's t0, exactly.
  // The barrier alone leaves the ranks apart by its release skew, which in the emulated WAN is up
  // to a one-way latency (a receive would seem to end before its send began).
  if (!world.on_one_kernel()) return;
  std::vector<std::int64_t> t0{m_t0.time_since_epoch().count()};
  world.bcast(std::span<std::int64_t>(t0), 0);
  m_t0 = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(t0[0]));
}

std::vector<SlotEvent> Profiler::gather(const mpi::Comm& world, int root) const {
  static_assert(std::is_trivially_copyable_v<SlotEvent>);
  const int mine = static_cast<int>(m_events.size() * sizeof(SlotEvent));
  std::vector<int> sizes(static_cast<std::size_t>(world.size()));
  ATLAS_MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, world.get()));
  std::vector<int> displs(sizes.size(), 0);
  long long total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += sizes[i];
  }
  std::vector<SlotEvent> all;
  if (world.rank() == root) all.resize(static_cast<std::size_t>(total) / sizeof(SlotEvent));
  ATLAS_MPI_CHECK(MPI_Gatherv(m_events.data(), mine, MPI_BYTE, all.data(), sizes.data(),
                              displs.data(), MPI_BYTE, root, world.get()));
  (void)m_world_rank;
  return all;
}

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

std::string chrome_trace_json(const std::vector<SlotEvent>& events, const TraceLabels& labels) {
  constexpr int kLinkPid = 1000;
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const std::string& e) {
    if (!first) out += ",\n";
    out += e;
    first = false;
  };
  for (std::size_t dc = 0; dc < labels.dc_names.size(); ++dc)
    add(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"DC {}"}}}})", dc,
                    escape(labels.dc_names[dc])));
  for (std::size_t r = 0; r < labels.rank_names.size(); ++r)
    add(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})",
                    labels.rank_dc[r], r, escape(labels.rank_names[r])));
  // WAN link tracks: each transfer from its start to its completion. Transfers that overlap on
  // one link (shared links, or ordered links with several slots) go to extra lanes of that link,
  // so events on one track never overlap (the trace format needs them nested or disjoint).
  struct LinkEvent {
    const SlotEvent* e;
    int link;
    int lane;
  };
  // A tied-embedding exchange goes on the link between its ranks' DCs: the table's, else a track
  // of its own (first and last stage in DCs no pipeline boundary joins).
  std::vector<std::string> link_names = labels.link_names;
  std::vector<std::pair<int, int>> link_dcs;
  const bool dcs_known = labels.link_src_dc.size() == labels.link_names.size() &&
                         labels.link_dst_dc.size() == labels.link_names.size();
  if (dcs_known)
    for (std::size_t l = 0; l < link_names.size(); ++l) link_dcs.emplace_back(labels.link_src_dc[l], labels.link_dst_dc[l]);
  auto dc_of = [&](int rank) {
    return rank >= 0 && static_cast<std::size_t>(rank) < labels.rank_dc.size() ? labels.rank_dc[static_cast<std::size_t>(rank)]
                                                                              : -1;
  };
  auto exchange_link = [&](const SlotEvent& e) {
    const std::pair<int, int> dcs{dc_of(e.world_rank), dc_of(e.peer)};
    if (!dcs_known || dcs.first < 0 || dcs.second < 0 ||
        static_cast<std::size_t>(std::max(dcs.first, dcs.second)) >= labels.dc_names.size())
      return -1;
    const auto it = std::find(link_dcs.begin(), link_dcs.end(), dcs);
    if (it != link_dcs.end()) return static_cast<int>(it - link_dcs.begin());
    link_dcs.push_back(dcs);
    link_names.push_back("WAN " + labels.dc_names[static_cast<std::size_t>(dcs.first)] + ">" +
                         labels.dc_names[static_cast<std::size_t>(dcs.second)] + " (embedding exchange)");
    return static_cast<int>(link_names.size()) - 1;
  };
  std::vector<LinkEvent> link_events;
  for (const auto& e : events) {
    if (static_cast<sched::SlotKind>(e.kind) != sched::SlotKind::WanSend) continue;
    const int link = is_exchange_event(e) ? exchange_link(e) : e.link;
    if (link >= 0 && static_cast<std::size_t>(link) < link_names.size()) link_events.push_back({&e, link, 0});
  }
  std::sort(link_events.begin(), link_events.end(),
            [](const LinkEvent& a, const LinkEvent& b) { return a.e->start_s < b.e->start_s; });
  std::vector<std::vector<double>> lane_end(link_names.size());
  for (auto& le : link_events) {
    auto& lanes = lane_end[static_cast<std::size_t>(le.link)];
    std::size_t lane = 0;
    while (lane < lanes.size() && lanes[lane] > le.e->start_s) ++lane;
    if (lane == lanes.size()) lanes.push_back(0.0);
    lanes[lane] = std::max(le.e->complete_s, le.e->start_s);
    le.lane = static_cast<int>(lane);
  }
  constexpr int kLanesPerLink = 1000;
  if (!link_names.empty())
    add(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"WAN links"}}}})", kLinkPid));
  for (std::size_t l = 0; l < link_names.size(); ++l)
    for (std::size_t lane = 0; lane < std::max<std::size_t>(1, lane_end[l].size()); ++lane)
      add(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}{}"}}}})", kLinkPid,
                      l * kLanesPerLink + lane, escape(link_names[l]),
                      lane == 0 ? std::string() : fmt::format(" ({})", lane + 1)));
  for (const auto& e : events) {
    const auto kind = static_cast<sched::SlotKind>(e.kind);
    const int pid = static_cast<std::size_t>(e.world_rank) < labels.rank_dc.size()
                        ? labels.rank_dc[static_cast<std::size_t>(e.world_rank)]
                        : 0;
    std::string name = is_exchange_event(e) ? std::string("embedding exchange") : std::string(sched::to_string(kind));
    if (e.micro >= 0) name += fmt::format(" m{}", e.micro);
    const double ts = e.start_s * 1e6;
    const double dur = std::max(0.0, (e.end_s - e.start_s) * 1e6);
    add(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},)"
                    R"("args":{{"step":{},"slot":{},"micro":{},"bytes":{},"peer":{},"predicted_start_ms":{:.3f},"predicted_ms":{:.3f}}}}})",
                    name, sched::to_string(kind), ts, dur, pid, e.world_rank, e.step, e.slot_index, e.micro,
                    e.bytes, e.peer, e.predicted_start_ms, e.predicted_ms));
  }
  for (const auto& le : link_events) {
    const SlotEvent& e = *le.e;
    const std::string what = is_exchange_event(e) ? std::string("embedding") : fmt::format("m{}", e.micro);
    add(fmt::format(R"({{"name":"{} r{}->r{}","cat":"wan","ph":"X","ts":{:.3f},"dur":{:.3f},"pid":{},"tid":{},)"
                    R"("args":{{"bytes":{},"step":{}}}}})",
                    what, e.world_rank, e.peer, e.start_s * 1e6, std::max(0.0, (e.complete_s - e.start_s) * 1e6),
                    kLinkPid, le.link * kLanesPerLink + le.lane, e.bytes, e.step));
  }
  out += "\n]}\n";
  return out;
}

}  // namespace atlas::runtime
