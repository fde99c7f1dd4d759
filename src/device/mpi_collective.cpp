// SPDX-License-Identifier: MIT
// MpiCollective: the TP/DP all-reduce over an MPI communicator, host memory only (the CUDA build
// brings its own NCCL implementation of device::Collective).
#include "atlas/device/collective.hpp"

#include <chrono>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::device {

namespace {

class DoneSum final : public PendingSum {
 public:
  bool test() override { return true; }
  void wait() override {}
  bool settle(double) noexcept override { return true; }
};

class MpiPendingSum final : public PendingSum {
 public:
  explicit MpiPendingSum(mpi::Request r) : m_req(std::move(r)) {}
  ~MpiPendingSum() override { (void)settle(kSettleS); }
  MpiPendingSum(const MpiPendingSum&) = delete;
  MpiPendingSum& operator=(const MpiPendingSum&) = delete;
  bool test() override { return !m_req.pending() || m_req.test(); }
  void wait() override {
    if (m_req.pending()) m_req.wait_polling();
  }
  bool settle(double max_s) noexcept override {
    try {
      if (test_for(max_s)) return true;
      log::error("a DP gradient all-reduce was still running {} s after an error elsewhere; abandoned "
                 "(the job aborts)", max_s);
    } catch (const std::exception& e) {
      log::error("a DP gradient all-reduce failed while unwinding after an error: {}", e.what());
    }
    m_req.abandon();
    return false;
  }

 private:
  static constexpr double kSettleS = 2.0;
  mpi::Request m_req;
};

void check_host(const Buffer& buf, std::size_t count) {
  if (buf.backend() == nullptr || !buf.backend()->host_accessible()) {
    ATLAS_THROW(Comm, "MpiCollective::allreduce_sum needs host memory, but the buffer belongs to "
                          << (buf.backend() ? buf.backend()->describe() : std::string("no backend"))
                          << "; use the device backend's own collective");
  }
  ATLAS_ASSERT(count <= buf.floats(), "allreduce of " << count << " floats over a buffer of "
                                                      << buf.floats());
}

}  // namespace

bool PendingSum::test_for(double max_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!test()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

std::unique_ptr<PendingSum> Collective::start_allreduce_sum(Buffer& buf, std::size_t count) {
  allreduce_sum(buf, count);
  return std::make_unique<DoneSum>();
}

MpiCollective::MpiCollective(const mpi::Comm& comm) : m_comm(comm) {
  ATLAS_ASSERT(!comm.null(), "MpiCollective needs a valid communicator");
}

void MpiCollective::allreduce_sum(Buffer& buf, std::size_t count) {
  if (count == 0) return;
  check_host(buf, count);
  // Non-blocking with back-off polling: a rank waiting for its TP/DP peers leaves the core to
  // ranks that compute (CPU runs share cores; Open MPI's blocking wait busy-polls).
  m_comm.iallreduce_sum(std::span<float>(buf.f32(), count)).wait_polling();
}

std::unique_ptr<PendingSum> MpiCollective::start_allreduce_sum(Buffer& buf, std::size_t count) {
  if (count == 0) return Collective::start_allreduce_sum(buf, count);  // nothing to sum: done
  check_host(buf, count);
  return std::make_unique<MpiPendingSum>(m_comm.iallreduce_sum(std::span<float>(buf.f32(), count)));
}

int MpiCollective::size() const { return m_comm.size(); }
int MpiCollective::rank() const { return m_comm.rank(); }

}  // namespace atlas::device
