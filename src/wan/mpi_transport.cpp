// SPDX-License-Identifier: MIT
// MPI baseline transport. Waits poll MPI_Test (so a stalled receive can time out with a message
// instead of hanging in MPI_Wait), spinning briefly and then sleeping in short steps.
#include "atlas/wan/mpi_transport.hpp"

#include <climits>
#include <thread>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/mpi/tags.hpp"
#include "op.hpp"

namespace atlas::wan {

namespace {

using Clock = std::chrono::steady_clock;

class MpiOp final : public detail::Op {
 public:
  MpiOp(const PeerTransport* owner, bool is_send, int peer, int tag, std::size_t bytes)
      : Op(owner, is_send, peer, tag), m_bytes(bytes), m_posted(Clock::now()) {}
  ~MpiOp() override {
    if (m_req == MPI_REQUEST_NULL) return;
    // Abandoned while pending (a bug, logged by Handle): do not leave MPI writing into freed memory.
    if (!is_send()) {
      MPI_Cancel(&m_req);
      MPI_Wait(&m_req, MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&m_req);
    }
  }
  MPI_Request m_req = MPI_REQUEST_NULL;
  std::size_t m_bytes;
  Clock::time_point m_posted;
};

}  // namespace

MpiTransport::MpiTransport(const mpi::Comm& world, double recv_timeout_s, const std::vector<int>& peers)
    : m_comm(world.dup()), m_timeout_s(recv_timeout_s) {
  for (int p : peers) {
    if (p < 0 || p >= m_comm.size())
      ATLAS_THROW(Comm, fmt::format("mpi transport: peer {} is not a world rank (0..{})", p,
                                    m_comm.size() - 1));
    PeerStats s;
    s.peer = p;
    m_stats.push_back(s);
  }
}

MpiTransport::~MpiTransport() = default;

std::size_t MpiTransport::index_of(int peer, const char* what) const {
  for (std::size_t i = 0; i < m_stats.size(); ++i)
    if (m_stats[i].peer == peer) return i;
  ATLAS_THROW(Comm, fmt::format("WAN {} rank {}: not a peer of this transport (give it to "
                                "make_transport)",
                                what, peer));
}

Handle MpiTransport::isend(int peer, int tag, const void* data, std::size_t bytes) {
  static_cast<void>(index_of(peer, "isend to"));
  if (bytes > static_cast<std::size_t>(INT_MAX))
    ATLAS_THROW(Comm, fmt::format("mpi transport: a {}-byte message exceeds the 2 GiB MPI "
                                  "count limit; use the multirail transport",
                                  bytes));
  if (tag < 0) ATLAS_THROW(Comm, "WAN isend: tag " << tag << " is negative");
  if (tag > mpi::tag_upper_bound())
    ATLAS_THROW(Comm, "WAN isend: tag " << tag << " exceeds this MPI's MPI_TAG_UB = " << mpi::tag_upper_bound()
                                       << " (mpi/tags.hpp lists every tag and its range)");
  auto op = std::make_shared<MpiOp>(this, true, peer, tag, bytes);
  ATLAS_MPI_CHECK(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, m_comm.get(), &op->m_req));
  return Handle(std::move(op));
}

Handle MpiTransport::irecv(int peer, int tag, void* data, std::size_t bytes) {
  static_cast<void>(index_of(peer, "irecv from"));
  if (bytes > static_cast<std::size_t>(INT_MAX))
    ATLAS_THROW(Comm, fmt::format("mpi transport: a {}-byte message exceeds the 2 GiB MPI "
                                  "count limit; use the multirail transport",
                                  bytes));
  if (tag < 0) ATLAS_THROW(Comm, "WAN irecv: tag " << tag << " is negative");
  if (tag > mpi::tag_upper_bound())
    ATLAS_THROW(Comm, "WAN irecv: tag " << tag << " exceeds this MPI's MPI_TAG_UB = " << mpi::tag_upper_bound()
                                       << " (mpi/tags.hpp lists every tag and its range)");
  auto op = std::make_shared<MpiOp>(this, false, peer, tag, bytes);
  ATLAS_MPI_CHECK(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, m_comm.get(), &op->m_req));
  return Handle(std::move(op));
}

bool MpiTransport::check(Handle& h) {
  auto* op = static_cast<MpiOp*>(h.op());
  if (op->owner() != this) ATLAS_THROW(Comm, "WAN test/wait: the handle belongs to another transport");
  int flag = 0;
  MPI_Status status{};
  if (const int rc = MPI_Test(&op->m_req, &flag, &status); rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    const std::string why = fmt::format("mpi transport: {} peer {} (tag {}, {} bytes) failed: {}",
                                        op->is_send() ? "send to" : "receive from", op->peer(),
                                        op->tag(), op->m_bytes, std::string(msg, static_cast<std::size_t>(len)));
    h.reset();
    ATLAS_THROW(Comm, why);
  }
  if (!flag) return false;
  PeerStats& s = m_stats[index_of(op->peer(), "test with")];
  if (!op->is_send()) {
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (static_cast<std::size_t>(count) != op->m_bytes) {
      const std::string why = fmt::format(
          "WAN message size mismatch: peer {} sent {} bytes with tag {} but the matching irecv "
          "posted {} bytes",
          op->peer(), count, op->tag(), op->m_bytes);
      h.reset();
      ATLAS_THROW(Comm, why);
    }
    s.bytes_received += op->m_bytes;
    ++s.messages_received;
  } else {
    s.bytes_sent += op->m_bytes;
    ++s.messages_sent;
  }
  h.reset();
  return true;
}

bool MpiTransport::test(Handle& h) {
  if (h.empty()) return true;
  return check(h);
}

void MpiTransport::wait(Handle& h) {
  if (h.empty()) return;
  auto* op = static_cast<MpiOp*>(h.op());
  const auto start = Clock::now();
  int spins = 0;
  while (!check(h)) {
    if (++spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited > m_timeout_s) {
      const std::string why = fmt::format(
          "mpi transport: {} peer {} (tag {}, {} bytes) did not complete within {:.1f} s "
          "(wan.recv_timeout_s)",
          op->is_send() ? "send to" : "receive from", op->peer(), op->tag(), op->m_bytes, waited);
      h.reset();  // the op's destructor cancels a receive / frees a send
      ATLAS_THROW(Comm, why);
    }
  }
}

TransportStats MpiTransport::stats() const {
  TransportStats t;
  t.peers = m_stats;
  return t;
}

}  // namespace atlas::wan
