// SPDX-License-Identifier: MIT
// GraphCache: runs a piece of static device work (a fixed sequence of Backend calls on fixed
// addresses, e.g. one transformer block's forward for one micro-batch arena) as a recorded graph.
// The first run of a key is eager (warm-up: workspaces grow, weight copies and GEMM plans are made,
// kernels load); the second records the work and launches the recording; later runs launch it.
// A recording the backend refuses (the work allocated, read a host value, ...) leaves the key
// eager for good, with the first reason kept for the run footer (and logged once on the rank).
// When the backend's graph epoch changes (a workspace moved), every graph is dropped and each key
// is recorded again at its next run. docs/cuda.md, "CUDA graphs".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "atlas/device/backend.hpp"

namespace atlas::device {

/// What a GraphCache did (summed over ranks for the footer).
struct GraphStats {
  long long recorded = 0;  ///< graphs recorded (a key recorded again after an epoch change counts again)
  long long launches = 0;  ///< runs as a graph launch (including the launch right after a recording)
  long long eager = 0;     ///< runs without a graph (warm-up, refused keys)
  long long refused = 0;   ///< keys whose recording the backend refused (they stay eager)
  long long dropped = 0;   ///< graphs dropped because the backend's epoch changed
  std::string first_refusal;  ///< the first refusal's reason (empty if none)
};

class GraphCache {
 public:
  /// A key names one static piece of work: the same key must always mean the same calls on the
  /// same addresses (`a`, `b`, `c`, `d`: the caller's numbers, e.g. pass, chunk, block;
  /// `memory`: the address that varies, e.g. the micro-batch arena).
  struct Key {
    int a = 0, b = 0, c = 0, d = 0;
    const void* memory = nullptr;
    bool operator==(const Key&) const = default;
  };

  /// `enabled` false: run() only calls the work (no recording; the stats count eager runs).
  /// Enabled needs backend.can_capture() (else atlas::Error Internal).
  GraphCache(Backend& backend, bool enabled);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return m_enabled; }
  /// Runs `work` (backend calls only, no host side effects: it may be called twice, once recorded
  /// and dropped, once run) for `key`, as a graph where it can. A refused recording (the work or
  /// begin_capture threw, end_capture gave no graph) runs the work eagerly: an error that is not
  /// the recording's surfaces there.
  void run(const Key& key, const std::function<void()>& work);
  [[nodiscard]] const GraphStats& stats() const noexcept { return m_stats; }

 private:
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept;
  };
  struct Entry {
    std::unique_ptr<Graph> graph;
    int runs = 0;  ///< eager runs so far (the warm-up)
    bool refused = false;
  };
  Backend& m_backend;
  bool m_enabled;
  std::uint64_t m_epoch = 0;
  std::unordered_map<Key, Entry, KeyHash> m_entries;
  GraphStats m_stats;
};

}  // namespace atlas::device
