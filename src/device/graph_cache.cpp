// SPDX-License-Identifier: MIT
#include "atlas/device/graph_cache.hpp"

#include <exception>
#include <utility>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"

namespace atlas::device {

GraphCache::GraphCache(Backend& backend, bool enabled) : m_backend(backend), m_enabled(enabled) {
  if (enabled && !backend.can_capture())
    ATLAS_THROW(Internal, "graphs asked of " << backend.describe() << ", which records none (device.cuda_graphs "
                                             "needs device.backend = cuda)");
  m_epoch = backend.graph_epoch();
}

GraphCache::~GraphCache() = default;

std::size_t GraphCache::KeyHash::operator()(const Key& k) const noexcept {
  std::size_t h = std::hash<const void*>{}(k.memory);
  for (const int v : {k.a, k.b, k.c, k.d}) h = h * 1000003U ^ std::hash<int>{}(v);
  return h;
}

void GraphCache::run(const Key& key, const std::function<void()>& work) {
  if (!m_enabled) {
    ++m_stats.eager;
    work();
    return;
  }
  if (const std::uint64_t epoch = m_backend.graph_epoch(); epoch != m_epoch) {
    // A workspace a graph may read moved: every graph is stale (refused keys stay refused). A key
    // that ran is recorded again at its next run: workspaces only grow, so what its warm-up made
    // is still there.
    for (auto& [k, e] : m_entries) {
      if (e.graph) ++m_stats.dropped;
      e.graph.reset();
    }
    m_epoch = epoch;
  }
  Entry& e = m_entries[key];
  if (e.graph) {
    m_backend.launch_graph(*e.graph);
    ++m_stats.launches;
    return;
  }
  if (e.refused || e.runs == 0) {
    ++e.runs;
    ++m_stats.eager;
    work();
    return;
  }
  std::string why;
  std::unique_ptr<Graph> graph;
  try {
    m_backend.begin_capture();
  } catch (const std::exception& ex) {
    why = std::string("begin_capture: ") + ex.what();
  }
  if (why.empty()) {
    try {
      work();
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    if (!why.empty()) {
      m_backend.abort_capture();
    } else {
      graph = m_backend.end_capture(&why);
      if (graph == nullptr && why.empty()) why = "the backend gave no graph";
    }
  }
  if (graph == nullptr) {
    // Nothing recorded ran: run the work eagerly (a real error surfaces there) and keep the key eager.
    e.refused = true;
    ++m_stats.refused;
    if (m_stats.first_refusal.empty()) {
      m_stats.first_refusal = why;
      log::warn("cuda graphs: a block pass's recording was refused; it runs without a graph from now on: {}", why);
    }
    ++m_stats.eager;
    work();
    return;
  }
  e.graph = std::move(graph);
  ++m_stats.recorded;
  m_backend.launch_graph(*e.graph);
  ++m_stats.launches;
}

}  // namespace atlas::device
