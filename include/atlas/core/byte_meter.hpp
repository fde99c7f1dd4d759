// SPDX-License-Identifier: MIT
// Bytes held and their high-water mark, thread-safe: a backend's Buffers (Backend::alloc) and the
// CUDA backend's every device byte (cuda::device_bytes) count with it.
#pragma once

#include <atomic>
#include <cstddef>

namespace atlas {

class ByteMeter {
 public:
  /// `bytes` more held; the mark rises to the new total (a racing pair may both raise it).
  void add(std::size_t bytes) noexcept {
    const std::size_t now = m_held.fetch_add(bytes) + bytes;
    std::size_t peak = m_peak.load();
    while (now > peak && !m_peak.compare_exchange_weak(peak, now)) {
    }
  }
  /// `bytes` no longer held.
  void sub(std::size_t bytes) noexcept { m_held.fetch_sub(bytes); }
  [[nodiscard]] std::size_t held() const noexcept { return m_held.load(); }
  /// The most held at once so far.
  [[nodiscard]] std::size_t peak() const noexcept { return m_peak.load(); }

 private:
  std::atomic<std::size_t> m_held{0};
  std::atomic<std::size_t> m_peak{0};
};

}  // namespace atlas
