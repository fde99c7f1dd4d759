// SPDX-License-Identifier: MIT
// MpiCollective: the TP/DP all-reduce over an MPI communicator, host memory only (the CUDA build
// brings its own NCCL implementation of device::Collective).
#include "atlas/device/collective.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"

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

/// One ring sum (make_ring_collective): step k (0 <= k < 2 (p - 1)) sends piece (r - k) mod p to
/// the next member and receives piece (r - k - 1) mod p from the previous one, adding it in the
/// first p - 1 steps (into `m_tmp` first) and taking it as it is in the rest.
class RingSum final : public PendingSum {
 public:
  RingSum(const mpi::Comm& comm, float* data, std::size_t count, int tag)
      : m_comm(comm), m_data(data), m_count(count), m_tag(tag), m_p(comm.size()), m_r(comm.rank()),
        m_steps(2 * (m_p - 1)), m_piece(count / static_cast<std::size_t>(m_p)),
        m_tmp(count - m_piece * static_cast<std::size_t>(m_p - 1)) {
    if (m_steps > 0) post();
  }
  ~RingSum() override { (void)settle(kSettleS); }
  RingSum(const RingSum&) = delete;
  RingSum& operator=(const RingSum&) = delete;

  bool test() override {
    while (m_step < m_steps) {
      const bool got = m_recv.test();
      const bool sent = m_send.test();
      if (!got || !sent) return false;
      if (m_step < m_p - 1) {  // reduce-scatter: add the previous member's partial sum
        float* dst = m_data + offset(recv_piece());
        const std::size_t n = length(recv_piece());
        for (std::size_t i = 0; i < n; ++i) dst[i] += m_tmp[i];
      }
      if (++m_step < m_steps) post();
    }
    return true;
  }
  void wait() override { wait_polling(); }
  bool settle(double max_s) noexcept override {
    try {
      if (test_for(max_s)) return true;
      log::error("a DP ring sum was still running {} s after an error elsewhere (step {} of {}); abandoned "
                 "(the job aborts)", max_s, m_step, m_steps);
    } catch (const std::exception& e) {
      log::error("a DP ring sum failed while unwinding after an error: {}", e.what());
    }
    m_recv.abandon();
    m_send.abandon();
    m_step = m_steps;
    return false;
  }

 private:
  static constexpr double kSettleS = 2.0;
  [[nodiscard]] int piece(int k) const { return ((m_r - k) % m_p + m_p) % m_p; }
  [[nodiscard]] int send_piece() const { return piece(m_step); }
  [[nodiscard]] int recv_piece() const { return piece(m_step + 1); }
  [[nodiscard]] std::size_t offset(int k) const { return m_piece * static_cast<std::size_t>(k); }
  [[nodiscard]] std::size_t length(int k) const { return k == m_p - 1 ? m_count - offset(k) : m_piece; }
  void post() {
    const int next = (m_r + 1) % m_p, prev = (m_r + m_p - 1) % m_p;
    const int rp = recv_piece(), sp = send_piece();
    float* into = m_step < m_p - 1 ? m_tmp.data() : m_data + offset(rp);
    m_recv = m_comm.irecv(std::span<float>(into, length(rp)), prev, m_tag);
    m_send = m_comm.isend(std::span<const float>(m_data + offset(sp), length(sp)), next, m_tag);
  }

  const mpi::Comm& m_comm;
  float* m_data;
  std::size_t m_count;
  int m_tag, m_p, m_r, m_steps;
  int m_step = 0;
  std::size_t m_piece;
  std::vector<float> m_tmp;
  mpi::Request m_recv, m_send;
};

class MpiRingCollective final : public Collective {
 public:
  explicit MpiRingCollective(const mpi::Comm& comm) : m_comm(comm.dup()) {}
  void allreduce_sum(Buffer& buf, std::size_t count) override { start_allreduce_sum(buf, count)->wait(); }
  std::unique_ptr<PendingSum> start_allreduce_sum(Buffer& buf, std::size_t count) override {
    if (count == 0) return Collective::start_allreduce_sum(buf, count);
    check_host(buf, count);
    const int tag = mpi::tags::kRingSumBase + static_cast<int>(m_sums++ % mpi::tags::kRingSumTags);
    return std::make_unique<RingSum>(m_comm, buf.f32(), count, tag);
  }
  [[nodiscard]] int size() const override { return m_comm.size(); }
  [[nodiscard]] int rank() const override { return m_comm.rank(); }

 private:
  mpi::Comm m_comm;
  std::uint64_t m_sums = 0;
};

}  // namespace

std::unique_ptr<Collective> make_ring_collective(const mpi::Comm& comm) {
  ATLAS_ASSERT(!comm.null(), "make_ring_collective needs a valid communicator");
  return std::make_unique<MpiRingCollective>(comm);
}

void PendingSum::wait_polling() {
  int sleep_us = 10;
  while (!test()) {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 200);
  }
}

bool PendingSum::wait_for(double max_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int sleep_us = 10;
  while (!test()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 200);
  }
  return true;
}

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
  mpi::Request sum = m_comm.iallreduce_sum(std::span<float>(buf.f32(), count));
  wait_bounded(sum);
}

void Collective::wait_bounded(mpi::Request& sum) const {
  if (m_wait_bound_s <= 0) {
    sum.wait_polling();
    return;
  }
  if (sum.wait_polling_for(m_wait_bound_s)) return;
  sum.abandon();
  ATLAS_THROW(Comm, "a " << m_group << " sum (over " << size() << " ranks; this rank is member " << rank()
                         << ") did not complete within " << m_wait_bound_s << " s (" << m_bound_key
                         << ")\n  hint: a member may be stuck or dead (the other ranks' errors name it); raise "
                         << m_bound_key << " if its work is that slow");
}

std::unique_ptr<PendingSum> MpiCollective::start_allreduce_sum(Buffer& buf, std::size_t count) {
  if (count == 0) return Collective::start_allreduce_sum(buf, count);  // nothing to sum: done
  check_host(buf, count);
  return std::make_unique<MpiPendingSum>(m_comm.iallreduce_sum(std::span<float>(buf.f32(), count)));
}

int MpiCollective::size() const { return m_comm.size(); }
int MpiCollective::rank() const { return m_comm.rank(); }

}  // namespace atlas::device
