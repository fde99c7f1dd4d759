// SPDX-License-Identifier: MIT
// Buffer ownership and the backend factory/registry. The only place that decides which backend a
// deck gets; the CUDA build adds itself through register_backend_factory(), so no #if here.
#include "atlas/device/backend.hpp"

#include <array>
#include <utility>

#include "atlas/core/check.hpp"
#include "atlas/device/host_backend.hpp"

namespace atlas::device {

// ---- Buffer ----

Buffer::Buffer(Buffer&& other) noexcept
    : m_owner(std::exchange(other.m_owner, nullptr)),
      m_ptr(std::exchange(other.m_ptr, nullptr)),
      m_bytes(std::exchange(other.m_bytes, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    m_owner = std::exchange(other.m_owner, nullptr);
    m_ptr = std::exchange(other.m_ptr, nullptr);
    m_bytes = std::exchange(other.m_bytes, 0);
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() noexcept {
  if (m_ptr != nullptr && m_owner != nullptr) {
    m_owner->release(m_ptr, m_bytes);
    m_owner->forget(m_bytes);
  }
  m_owner = nullptr;
  m_ptr = nullptr;
  m_bytes = 0;
}

Buffer Backend::alloc(std::size_t bytes) {
  if (bytes == 0) return Buffer();
  void* ptr = allocate(bytes);
  ATLAS_ASSERT(ptr != nullptr, "backend " << describe() << " returned null for " << bytes
                                          << " bytes");
  // The high-water mark of the bytes held (a racing pair of allocations may both raise it).
  const std::size_t live = m_live_bytes.fetch_add(bytes) + bytes;
  std::size_t peak = m_peak_bytes.load();
  while (live > peak && !m_peak_bytes.compare_exchange_weak(peak, live)) {
  }
  return Buffer(this, ptr, bytes);
}

// ---- factory registry ----

namespace {
// Function-local static: safe to use from other translation units' static initialisers.
std::array<BackendFactory, 2>& registry() {
  static std::array<BackendFactory, 2> factories{};
  return factories;
}
std::size_t slot(atlas::Backend kind) { return kind == atlas::Backend::Host ? 0 : 1; }
}  // namespace

void register_backend_factory(atlas::Backend kind, BackendFactory factory) {
  ATLAS_ASSERT(kind != atlas::Backend::Host, "the host backend is built in; do not register it");
  registry()[slot(kind)] = factory;
}

bool backend_available(atlas::Backend kind) {
  return kind == atlas::Backend::Host || kind == atlas::Backend::Emulated || registry()[slot(kind)] != nullptr;
}

std::unique_ptr<Backend> make_backend(const DeviceCfg& cfg) {
  if (cfg.threads < 0) {
    throw ConfigError("device.threads = " + std::to_string(cfg.threads) +
                      " is negative\n  hint: use 0 (auto) or a positive thread count");
  }
  switch (cfg.backend) {
    case atlas::Backend::Host:
      // main applied the automatic policy before any thread started; the deck may override it.
      if (cfg.sched_batch != SchedBatch::Auto) (void)prepare_host_scheduling(cfg.sched_batch);
      return make_host_backend(cfg.threads, effective_precision(cfg));
    case atlas::Backend::Emulated:
      // No arithmetic happens (the runtime sleeps each compute slot's predicted time); one host
      // thread serves the host-memory buffers of the DP sums and a BubbleTea service. Ranks that
      // sleep need prompt wake-ups, not SCHED_BATCH's protection of computing ranks: main's
      // automatic switch is undone unless the deck asks for it.
      (void)prepare_host_scheduling(cfg.sched_batch == SchedBatch::On ? SchedBatch::On : SchedBatch::Off);
      return make_host_backend(1);
    case atlas::Backend::Cuda: {
      const BackendFactory factory = registry()[slot(cfg.backend)];
      if (factory == nullptr) {
        throw ConfigError(
            "device.backend = cuda, but this binary was built without CUDA\n"
            "  hint: rebuild with -DATLAS_ENABLE_CUDA=ON (cmake --preset cuda-release), or set "
            "device.backend = host");
      }
      return factory(cfg);
    }
  }
  throw ConfigError("device.backend has an unknown value");
}

}  // namespace atlas::device
