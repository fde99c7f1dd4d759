// SPDX-License-Identifier: MIT
// RAII owners of CUDA objects: streams, events, the cuBLAS handle, small internal device arrays
// and pinned host staging. Move-only; destructors never throw (a failure while tearing down
// after an earlier error must not hide that error). Internal to src/device/cuda/.
#pragma once

#include <cstddef>
#include <utility>

#include "atlas/core/byte_meter.hpp"
#include "cuda_check.hpp"

namespace atlas::device::cuda {

/// Every byte of device memory the CUDA backend holds (its Buffers and its own scratch: bf16
/// weight and operand copies, workspaces) and the most held at once: the footer's peak memory
/// (CudaBackend::peak_bytes), comparable with PyTorch's torch.cuda.max_memory_allocated (neither
/// counts the CUDA context nor the libraries' own allocations). Process-wide.
inline ByteMeter& device_bytes() noexcept {
  static ByteMeter meter;
  return meter;
}

/// A non-blocking stream (does not synchronise with the legacy default stream).
class Stream {
 public:
  Stream() { ATLAS_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking)); }
  ~Stream() {
    if (m_stream != nullptr) (void)cudaStreamDestroy(m_stream);
  }
  Stream(Stream&& o) noexcept : m_stream(std::exchange(o.m_stream, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(m_stream, o.m_stream);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  [[nodiscard]] cudaStream_t get() const noexcept { return m_stream; }
  /// Blocks the calling thread until every call issued on the stream has finished.
  void synchronize() const { ATLAS_CUDA_CHECK(cudaStreamSynchronize(m_stream)); }

 private:
  cudaStream_t m_stream = nullptr;
};

/// A CUDA event (timing enabled unless `timing` is false).
class Event {
 public:
  explicit Event(bool timing = true) {
    ATLAS_CUDA_CHECK(
        cudaEventCreateWithFlags(&m_event, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (m_event != nullptr) (void)cudaEventDestroy(m_event);
  }
  Event(Event&& o) noexcept : m_event(std::exchange(o.m_event, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(m_event, o.m_event);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  [[nodiscard]] cudaEvent_t get() const noexcept { return m_event; }
  void record(cudaStream_t stream) { ATLAS_CUDA_CHECK(cudaEventRecord(m_event, stream)); }
  void synchronize() const { ATLAS_CUDA_CHECK(cudaEventSynchronize(m_event)); }
  /// Milliseconds from `start` to this event (both recorded and complete).
  [[nodiscard]] float ms_since(const Event& start) const {
    float ms = 0.0F;
    ATLAS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.m_event, m_event));
    return ms;
  }

 private:
  cudaEvent_t m_event = nullptr;
};

/// A cuBLAS handle bound to one stream. TF32 stays off (CUBLAS_DEFAULT_MATH): fp32 GEMMs then
/// agree with the host backend to fp32 rounding, which the equivalence tests rely on.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    ATLAS_CUBLAS_CHECK(cublasCreate(&m_handle));
    try {
      ATLAS_CUBLAS_CHECK(cublasSetStream(m_handle, stream));
      ATLAS_CUBLAS_CHECK(cublasSetMathMode(m_handle, CUBLAS_DEFAULT_MATH));
      ATLAS_CUBLAS_CHECK(cublasSetPointerMode(m_handle, CUBLAS_POINTER_MODE_HOST));
    } catch (...) {
      (void)cublasDestroy(m_handle);
      throw;
    }
  }
  ~CublasHandle() {
    if (m_handle != nullptr) (void)cublasDestroy(m_handle);
  }
  CublasHandle(CublasHandle&& o) noexcept : m_handle(std::exchange(o.m_handle, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept {
    std::swap(m_handle, o.m_handle);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  [[nodiscard]] cublasHandle_t get() const noexcept { return m_handle; }

 private:
  cublasHandle_t m_handle = nullptr;
};

/// `count` elements of T in device memory (uninitialised), for the backend's own scratch.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) : m_count(count) {
    if (count > 0) {
      ATLAS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m_ptr), count * sizeof(T)));
      device_bytes().add(count * sizeof(T));
    }
  }
  ~DeviceArray() {
    if (m_ptr != nullptr) {
      (void)cudaFree(m_ptr);
      device_bytes().sub(m_count * sizeof(T));
    }
  }
  DeviceArray(DeviceArray&& o) noexcept
      : m_ptr(std::exchange(o.m_ptr, nullptr)), m_count(std::exchange(o.m_count, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(m_ptr, o.m_ptr);
    std::swap(m_count, o.m_count);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  [[nodiscard]] T* get() const noexcept { return m_ptr; }
  [[nodiscard]] std::size_t size() const noexcept { return m_count; }

 private:
  T* m_ptr = nullptr;
  std::size_t m_count = 0;
};

/// `count` elements of T in page-locked host memory (fast, truly asynchronous readbacks).
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  explicit PinnedArray(std::size_t count) : m_count(count) {
    if (count > 0) ATLAS_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m_ptr), count * sizeof(T)));
  }
  ~PinnedArray() {
    if (m_ptr != nullptr) (void)cudaFreeHost(m_ptr);
  }
  PinnedArray(PinnedArray&& o) noexcept
      : m_ptr(std::exchange(o.m_ptr, nullptr)), m_count(std::exchange(o.m_count, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(m_ptr, o.m_ptr);
    std::swap(m_count, o.m_count);
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;

  [[nodiscard]] T* get() const noexcept { return m_ptr; }
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return m_ptr[i]; }

 private:
  T* m_ptr = nullptr;
  std::size_t m_count = 0;
};

}  // namespace atlas::device::cuda
