// SPDX-License-Identifier: MIT
// NCCL over the ranks of an MPI communicator: nccl::Comm (RAII; unique id made by rank 0 and
// broadcast over MPI; non-blocking, so set-up and every operation wait with a timeout instead of
// hanging) and nccl::Collective, the device::Collective the runtime uses for tp_comm and dp_comm
// on the CUDA backend. Internal to src/device/cuda/.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "atlas/device/collective.hpp"
#include "cuda_check.hpp"

namespace atlas::mpi {
class Comm;
}  // namespace atlas::mpi

namespace atlas::device::cuda {
class CudaBackend;
}  // namespace atlas::device::cuda

namespace atlas::device::nccl {

/// An NCCL communicator with the members and ranks of an MPI communicator, on the device that is
/// current on the calling thread. Not copyable or movable. Destroyed with ncclCommFinalize +
/// ncclCommDestroy, or ncclCommAbort after an error or when finalising does not finish in time.
class Comm {
 public:
  /// **Collective over `comm`**: rank 0 calls ncclGetUniqueId, MPI_Bcast shares it, every rank
  /// calls ncclCommInitRankConfig (non-blocking) and waits at most `timeout_s`; the ranks then
  /// agree over MPI, so either every rank has a communicator or every rank throws
  /// atlas::Error (Device) (the failing rank with NCCL's reason, the others naming it).
  Comm(const mpi::Comm& comm, double timeout_s);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&&) = delete;
  Comm& operator=(Comm&&) = delete;

  [[nodiscard]] ncclComm_t get() const noexcept { return m_comm; }
  [[nodiscard]] int size() const noexcept { return m_size; }
  [[nodiscard]] int rank() const noexcept { return m_rank; }

  /// In-place sum of `count` floats at device address `data`, issued on `stream`; returns when
  /// it has completed (so a dead peer is an error after timeout_s, not a hang). Collective over
  /// the communicator. On failure the communicator is aborted and atlas::Error (Device) thrown.
  void allreduce_sum(float* data, std::size_t count, cudaStream_t stream);
  /// The same sum, issued on `stream`; returns once NCCL has queued it (the caller watches the
  /// stream, e.g. with an event, through event_done() / wait_event()).
  void enqueue_allreduce_sum(float* data, std::size_t count, cudaStream_t stream);
  /// True once `event` has passed; throws (and aborts) when NCCL reports an asynchronous error.
  [[nodiscard]] bool event_done(cudaEvent_t event, const char* what);
  /// Polls `event` until it has passed, at most timeout_s, watching NCCL's asynchronous error.
  void wait_event(cudaEvent_t event, const char* what);

 private:
  /// Polls ncclCommGetAsyncError until the communicator is no longer busy (non-blocking mode).
  void wait_ready(const char* what);
  /// Polls the stream until its work is done, watching NCCL's asynchronous error.
  void wait_stream(cudaStream_t stream, const char* what);
  /// A stream's or event's query result: true once passed; false while pending (after checking
  /// NCCL's asynchronous error); throws (and aborts) on an error.
  [[nodiscard]] bool passed(cudaError_t query, const char* what);
  /// Polls `done` until true, at most timeout_s (then aborts and throws).
  void wait_until(const std::function<bool()>& done, const char* what);
  /// Aborts the communicator and throws atlas::Error (Device) with `msg`.
  [[noreturn]] void fail(const std::string& msg);
  void abort_quietly() noexcept;

  ncclComm_t m_comm = nullptr;
  int m_size = 0;
  int m_rank = 0;
  double m_timeout_s;
};

/// device::Collective over NCCL for buffers of one CudaBackend, on that backend's stream.
/// Keeps a reference to `backend`, which must outlive it.
class Collective final : public device::Collective {
 public:
  /// Collective over `comm` (builds an nccl::Comm). Makes the backend's device current first.
  Collective(const mpi::Comm& comm, cuda::CudaBackend& backend, double timeout_s);
  /// Collective over the group. Throws atlas::Error if `buf` is not memory of this backend or
  /// holds fewer than `count` floats, and (Device) when NCCL fails.
  void allreduce_sum(Buffer& buf, std::size_t count) override;
  /// Queues the sum on this collective's own stream, after the work already queued on the
  /// backend's stream (an event orders them), and returns at once: later kernels on the
  /// backend's stream run while NCCL sums. wait() polls for it with the same timeout.
  [[nodiscard]] std::unique_ptr<device::PendingSum> start_allreduce_sum(Buffer& buf, std::size_t count) override;
  [[nodiscard]] int size() const override { return m_comm.size(); }
  [[nodiscard]] int rank() const override { return m_comm.rank(); }
  ~Collective() override;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

 private:
  void check_buffer(const Buffer& buf, std::size_t count) const;

  cuda::CudaBackend& m_backend;
  Comm m_comm;
  cudaStream_t m_side = nullptr;  ///< overlapped sums (created on first use)
};

}  // namespace atlas::device::nccl
