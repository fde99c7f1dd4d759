// SPDX-License-Identifier: MIT
// NCCL communicators built from MPI communicators, the NCCL device::Collective, and the factory
// registered with device::make_collective() for the CUDA backend (NCCL when every member of the
// group has its own GPU, MPI staged through host memory when some share one).
#include "nccl_comm.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/mpi/comm.hpp"
#include "cuda_backend.hpp"
#include "cuda_backend_impl.hpp"

namespace atlas::device::nccl {

namespace {

// Finalising at teardown gets a shorter leash: it runs while an error may be unwinding.
constexpr double kFinalizeTimeoutS = 30.0;
constexpr auto kPollInterval = std::chrono::microseconds(20);

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string nccl_reason(ncclResult_t r, ncclComm_t comm) {
  std::string out = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') out += std::string(": ") + last;
  return out;
}

}  // namespace

// ---- Comm ----

Comm::Comm(const mpi::Comm& comm, double timeout_s)
    : m_size(comm.size()), m_rank(comm.rank()), m_timeout_s(timeout_s) {
  // Phase 1: rank 0 makes the unique id; the broadcast carries whether that worked, so a failure
  // there is every rank's error, not a hang.
  struct {
    int ok = 0;
    ncclUniqueId id{};
  } root;
  std::string root_problem;
  if (m_rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&root.id);
    root.ok = r == ncclSuccess ? 1 : 0;
    if (r != ncclSuccess) root_problem = nccl_reason(r, nullptr);
  }
  ATLAS_MPI_CHECK(MPI_Bcast(&root, static_cast<int>(sizeof root), MPI_BYTE, 0, comm.get()));
  if (root.ok == 0) {
    ATLAS_THROW(Device, "ncclGetUniqueId on rank 0 of a group of "
                            << m_size << " failed"
                            << (root_problem.empty() ? std::string(" (see rank 0's message)")
                                                     : ": " + root_problem)
                            << "\n  hint: NCCL_DEBUG=WARN shows why (often no usable network "
                               "interface: set NCCL_SOCKET_IFNAME)");
  }
  // Phase 2: every rank joins (non-blocking) and waits at most timeout_s.
  std::exception_ptr failure;
  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // set-up and operations return at once; we poll with a timeout
    const ncclResult_t r = ncclCommInitRankConfig(&m_comm, m_size, root.id, m_rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string reason = nccl_reason(r, m_comm);
      fail(fmt::format("ncclCommInitRankConfig (rank {} of {}) failed: {}", m_rank, m_size,
                       reason));
    }
    wait_ready("ncclCommInitRankConfig");
  } catch (...) {
    failure = std::current_exception();
  }
  // Phase 3: every rank learns whether every other rank has its communicator, so no rank goes
  // on to an all-reduce that a failed peer will never join.
  const int ok = comm.allreduce(failure ? 0 : 1, MPI_MIN);
  if (ok == 1) return;
  abort_quietly();
  if (failure) std::rethrow_exception(failure);
  ATLAS_THROW(Device, "NCCL communicator set-up over " << m_size
                                                       << " ranks failed on another rank (see its "
                                                          "message); this rank's part succeeded");
}

Comm::~Comm() {
  if (m_comm == nullptr) return;
  // Graceful: finalise (flushes outstanding work), wait a bounded time, destroy. Anything else
  // (an error, a peer that never finalises) ends in ncclCommAbort, which never blocks on peers.
  ncclResult_t r = ncclCommFinalize(m_comm);
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(m_comm, &state) != ncclSuccess) break;
    if (state == ncclSuccess) {
      (void)ncclCommDestroy(m_comm);
      m_comm = nullptr;
      return;
    }
    if (state != ncclInProgress || seconds_since(t0) > std::min(m_timeout_s, kFinalizeTimeoutS)) {
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  abort_quietly();
}

void Comm::abort_quietly() noexcept {
  if (m_comm != nullptr) (void)ncclCommAbort(m_comm);
  m_comm = nullptr;
}

void Comm::fail(const std::string& msg) {
  abort_quietly();
  ::atlas::detail::throw_error(ExitCode::Device, msg, __FILE__, __LINE__);
}

void Comm::wait_ready(const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(m_comm, &state);
    if (q != ncclSuccess) fail(fmt::format("ncclCommGetAsyncError after {} failed: {}", what, nccl_reason(q, m_comm)));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(fmt::format("{} (NCCL rank {} of {}) failed: {}", what, m_rank, m_size,
                       nccl_reason(state, m_comm)));
    }
    if (seconds_since(t0) > m_timeout_s) {
      fail(fmt::format("{} (NCCL rank {} of {}) did not finish within {} s; aborted the "
                       "communicator\n  hint: a peer rank may have died or be stuck; "
                       "NCCL_DEBUG=INFO shows the set-up, device.nccl_timeout_s sets the limit",
                       what, m_rank, m_size, m_timeout_s));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void Comm::wait_stream(cudaStream_t stream, const char* what) {
  wait_until([&] { return passed(cudaStreamQuery(stream), what); }, what);
}

bool Comm::passed(cudaError_t query, const char* what) {
  if (query == cudaSuccess) return true;
  if (query != cudaErrorNotReady) {
    abort_quietly();
    ATLAS_CUDA_CHECK(query);
  }
  ncclResult_t state = ncclSuccess;
  (void)ncclCommGetAsyncError(m_comm, &state);
  if (state != ncclSuccess && state != ncclInProgress) {
    fail(fmt::format("{} (NCCL rank {} of {}) failed while running: {}", what, m_rank, m_size,
                     nccl_reason(state, m_comm)));
  }
  return false;
}

void Comm::wait_until(const std::function<bool()>& done, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (seconds_since(t0) > m_timeout_s) {
      fail(fmt::format("{} (NCCL rank {} of {}) did not complete within {} s; aborted the "
                       "communicator\n  hint: a peer rank may have died or skipped the call; "
                       "device.nccl_timeout_s sets the limit",
                       what, m_rank, m_size, m_timeout_s));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void Comm::enqueue_allreduce_sum(float* data, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  ATLAS_ASSERT(m_comm != nullptr, "NCCL all-reduce on a communicator that was aborted");
  const ncclResult_t r =
      ncclAllReduce(data, data, count, ncclFloat32, ncclSum, m_comm, stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    fail(fmt::format("ncclAllReduce of {} floats (NCCL rank {} of {}) failed: {}", count, m_rank,
                     m_size, nccl_reason(r, m_comm)));
  }
  wait_ready("ncclAllReduce");
}

void Comm::allreduce_sum(float* data, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  enqueue_allreduce_sum(data, count, stream);
  wait_stream(stream, "ncclAllReduce");
}

bool Comm::event_done(cudaEvent_t event, const char* what) { return passed(cudaEventQuery(event), what); }

void Comm::wait_event(cudaEvent_t event, const char* what) {
  wait_until([&] { return event_done(event, what); }, what);
}

// ---- Collective ----

namespace {
cuda::CudaBackend& current(cuda::CudaBackend& backend) {
  backend.make_current();
  return backend;
}
}  // namespace

Collective::Collective(const mpi::Comm& comm, cuda::CudaBackend& backend, double timeout_s)
    : m_backend(current(backend)), m_comm(comm, timeout_s) {}

Collective::~Collective() {
  if (m_side != nullptr) (void)cudaStreamDestroy(m_side);
}

void Collective::check_buffer(const Buffer& buf, std::size_t count) const {
  if (buf.backend() != &m_backend) {
    ATLAS_THROW(Internal, "NCCL allreduce_sum: the buffer belongs to "
                              << (buf.backend() ? buf.backend()->describe() : std::string("no backend"))
                              << ", not to " << m_backend.describe());
  }
  ATLAS_ASSERT(count <= buf.floats(),
               "allreduce of " << count << " floats over a buffer of " << buf.floats());
}

void Collective::allreduce_sum(Buffer& buf, std::size_t count) {
  if (count == 0) return;
  check_buffer(buf, count);
  m_backend.weights_written(buf.data(), count * sizeof(float));  // no stale bf16 copy survives
  m_comm.allreduce_sum(buf.f32(), count, m_backend.stream());
}

namespace {

/// An event owned by one pending sum.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { ATLAS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~Event() {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

class NcclPendingSum final : public device::PendingSum {
 public:
  NcclPendingSum(Comm& comm, std::unique_ptr<Event> done) : m_comm(comm), m_done(std::move(done)) {}
  ~NcclPendingSum() override {
    if (!settle(2.0)) (void)m_done.release();  // the event stays with the abandoned sum
  }
  NcclPendingSum(const NcclPendingSum&) = delete;
  NcclPendingSum& operator=(const NcclPendingSum&) = delete;
  bool test() override {
    if (!m_finished) m_finished = m_comm.event_done(m_done->e, "overlapped ncclAllReduce");
    return m_finished;
  }
  void wait() override {
    if (m_finished) return;
    m_comm.wait_event(m_done->e, "overlapped ncclAllReduce");
    m_finished = true;
  }
  /// Bounded by device.nccl_timeout_s (wait_event aborts the communicator and throws), not by
  /// the caller's max_s: only an aborted communicator frees the GPU of the waiting kernel.
  bool wait_for(double /*max_s*/) override {
    wait();
    return true;
  }
  bool settle(double max_s) noexcept override {
    if (m_finished || m_done == nullptr) return true;
    try {
      if (test_for(max_s)) return true;
      log::error("an overlapped NCCL all-reduce was still running {} s after an error elsewhere; "
                 "abandoned (the job aborts)", max_s);
      return false;
    } catch (const std::exception& e) {
      log::error("an overlapped NCCL all-reduce failed while unwinding after an error: {}", e.what());
      return false;
    }
  }

 private:
  Comm& m_comm;
  std::unique_ptr<Event> m_done;
  bool m_finished = false;
};

}  // namespace

std::unique_ptr<device::PendingSum> Collective::start_allreduce_sum(Buffer& buf, std::size_t count) {
  if (count == 0) return device::Collective::start_allreduce_sum(buf, count);  // nothing to sum: done
  check_buffer(buf, count);
  m_backend.make_current();
  if (m_side == nullptr) ATLAS_CUDA_CHECK(cudaStreamCreateWithFlags(&m_side, cudaStreamNonBlocking));
  // The bucket was packed on the backend's stream: the side stream waits for that, then sums.
  const Event packed;
  ATLAS_CUDA_CHECK(cudaEventRecord(packed.e, m_backend.stream()));
  ATLAS_CUDA_CHECK(cudaStreamWaitEvent(m_side, packed.e, 0));
  m_backend.weights_written(buf.data(), count * sizeof(float));
  m_comm.enqueue_allreduce_sum(buf.f32(), count, m_side);
  auto done = std::make_unique<Event>();
  ATLAS_CUDA_CHECK(cudaEventRecord(done->e, m_side));
  return std::make_unique<NcclPendingSum>(m_comm, std::move(done));
}

// ---- the factory device::make_collective() uses for the CUDA backend ----

namespace {

std::unique_ptr<device::Collective> make_cuda_collective(const mpi::Comm& comm, Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  ATLAS_ASSERT(cuda != nullptr, "the CUDA collective factory got backend " << backend.describe());
  // NCCL needs one GPU per member. Several ranks on one GPU (a test node with fewer GPUs than
  // ranks) still work, summing through host memory over MPI. Every member sees the same list,
  // so every member makes the same choice.
  const std::vector<std::string> where = comm.allgather_strings(env::host_name() + " " + cuda->pci_bus_id());
  const std::set<std::string> distinct(where.begin(), where.end());
  if (distinct.size() != where.size()) {
    if (comm.rank() == 0) {
      log::warn("{} ranks of an intra-DC group share {} GPU(s): NCCL needs one GPU per rank, so "
                "this group sums through host memory over MPI instead",
                where.size(), distinct.size());
    }
    return make_staged_collective(comm, backend);
  }
  return std::make_unique<Collective>(comm, *cuda, cuda->nccl_timeout_s());
}

[[maybe_unused]] const bool kRegistered =
    (register_collective_factory(atlas::Backend::Cuda, &make_cuda_collective), true);

}  // namespace

}  // namespace atlas::device::nccl

namespace atlas::device::cuda {
bool uses_nccl(const device::Collective& collective) {
  return dynamic_cast<const nccl::Collective*>(&collective) != nullptr;
}
}  // namespace atlas::device::cuda
