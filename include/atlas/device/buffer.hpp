// SPDX-License-Identifier: MIT
// device::Buffer: one owned allocation in a backend's memory (host RAM for the host backend, GPU
// memory for CUDA). RAII and move-only. Its pointers are *device addresses*: only the owning
// Backend may dereference them; everyone else passes them (plus offsets) to Backend calls.
#pragma once

#include <cstddef>
#include <cstdint>

namespace atlas::device {

class Backend;

/// The bits of one bf16 value (8-bit exponent, 7-bit mantissa; the high half of an fp32): the
/// element type of activations stored in bf16 (docs/precision.md, "Storage"). Device memory
/// holds these; include/atlas/device/rounding.hpp converts on the host.
using Bf16Bits = std::uint16_t;

/// An owned, 64-byte aligned, zero-filled allocation made by Backend::alloc(). Move-only.
/// The owning Backend must outlive every Buffer it allocated.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  /// Size in bytes (as requested from alloc()).
  [[nodiscard]] std::size_t bytes() const noexcept { return m_bytes; }
  /// Size in 4-byte elements (float or int32).
  [[nodiscard]] std::size_t floats() const noexcept { return m_bytes / sizeof(float); }
  [[nodiscard]] bool empty() const noexcept { return m_ptr == nullptr; }
  /// The backend that owns this memory (nullptr for an empty Buffer).
  [[nodiscard]] Backend* backend() const noexcept { return m_owner; }

  /// Device address of the first byte. Dereference only if backend()->host_accessible().
  [[nodiscard]] void* data() noexcept { return m_ptr; }
  [[nodiscard]] const void* data() const noexcept { return m_ptr; }
  /// Typed device addresses (pointer arithmetic is fine; dereferencing is the backend's job).
  [[nodiscard]] float* f32() noexcept { return static_cast<float*>(m_ptr); }
  [[nodiscard]] const float* f32() const noexcept { return static_cast<const float*>(m_ptr); }
  [[nodiscard]] std::int32_t* i32() noexcept { return static_cast<std::int32_t*>(m_ptr); }
  [[nodiscard]] const std::int32_t* i32() const noexcept {
    return static_cast<const std::int32_t*>(m_ptr);
  }
  [[nodiscard]] Bf16Bits* bf16() noexcept { return static_cast<Bf16Bits*>(m_ptr); }
  [[nodiscard]] const Bf16Bits* bf16() const noexcept { return static_cast<const Bf16Bits*>(m_ptr); }

 private:
  friend class Backend;
  Buffer(Backend* owner, void* ptr, std::size_t bytes) noexcept
      : m_owner(owner), m_ptr(ptr), m_bytes(bytes) {}
  void reset() noexcept;

  Backend* m_owner = nullptr;
  void* m_ptr = nullptr;
  std::size_t m_bytes = 0;
};

}  // namespace atlas::device
