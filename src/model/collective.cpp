// SPDX-License-Identifier: MIT
// MpiCollective: the TP all-reduce over an MPI communicator, host memory only (the CUDA build
// brings its own NCCL implementation of model::Collective).
#include "atlas/model/collective.hpp"

#include <span>

#include "atlas/core/check.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::model {

MpiCollective::MpiCollective(const mpi::Comm& comm) : m_comm(comm) {
  ATLAS_ASSERT(!comm.null(), "MpiCollective needs a valid communicator");
}

void MpiCollective::allreduce_sum(device::Buffer& buf, std::size_t count) {
  if (count == 0) return;
  if (buf.backend() == nullptr || !buf.backend()->host_accessible()) {
    ATLAS_THROW(Comm, "MpiCollective::allreduce_sum needs host memory, but the buffer belongs to "
                          << (buf.backend() ? buf.backend()->describe() : std::string("no backend"))
                          << "; use the device backend's own collective");
  }
  ATLAS_ASSERT(count <= buf.floats(), "allreduce of " << count << " floats over a buffer of "
                                                      << buf.floats());
  // Non-blocking with back-off polling: a rank waiting for its TP/DP peers leaves the core to
  // ranks that compute (CPU runs share cores; Open MPI's blocking wait busy-polls).
  m_comm.iallreduce_sum(std::span<float>(buf.f32(), count)).wait_polling();
}

int MpiCollective::size() const { return m_comm.size(); }
int MpiCollective::rank() const { return m_comm.rank(); }

}  // namespace atlas::model
