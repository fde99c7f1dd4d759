// SPDX-License-Identifier: MIT
// Which collective sums a backend's buffers (see collective.hpp), and the staged MPI fallback
// for device memory. The CUDA build registers its NCCL factory here, so no #if in this file.
#include "atlas/device/collective.hpp"

#include <array>
#include <span>
#include <string>
#include <vector>

#include "atlas/core/check.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::device {

namespace {

/// Device memory summed through host memory: one download, MPI_Allreduce, one upload.
class StagedCollective final : public Collective {
 public:
  StagedCollective(const mpi::Comm& comm, Backend& backend) : m_comm(comm), m_backend(backend) {
    ATLAS_ASSERT(!comm.null(), "a staged collective needs a valid communicator");
  }

  void allreduce_sum(Buffer& buf, std::size_t count) override {
    if (count == 0) return;
    if (buf.backend() != &m_backend) {
      ATLAS_THROW(Internal, "staged allreduce_sum: the buffer belongs to "
                                << (buf.backend() ? buf.backend()->describe() : std::string("no backend"))
                                << ", not to this collective's backend " << m_backend.describe());
    }
    ATLAS_ASSERT(count <= buf.floats(),
                 "allreduce of " << count << " floats over a buffer of " << buf.floats());
    if (m_host.size() < count) m_host.resize(count);
    m_backend.download(m_host.data(), buf.data(), count * sizeof(float));
    mpi::Request sum = m_comm.iallreduce_sum(std::span<float>(m_host.data(), count));
    wait_bounded(sum);
    m_backend.upload(buf.data(), m_host.data(), count * sizeof(float));
  }
  [[nodiscard]] int size() const override { return m_comm.size(); }
  [[nodiscard]] int rank() const override { return m_comm.rank(); }

 private:
  const mpi::Comm& m_comm;
  Backend& m_backend;
  std::vector<float> m_host;  // staging, grown to the largest count seen
};

// Function-local static: safe to use from other translation units' static initialisers.
std::array<CollectiveFactory, 2>& registry() {
  static std::array<CollectiveFactory, 2> factories{};
  return factories;
}
std::size_t slot(atlas::Backend kind) { return kind == atlas::Backend::Host ? 0 : 1; }

}  // namespace

void register_collective_factory(atlas::Backend kind, CollectiveFactory factory) {
  ATLAS_ASSERT(kind != atlas::Backend::Host,
               "the host collective (MPI) is built in; do not register it");
  registry()[slot(kind)] = factory;
}

std::unique_ptr<Collective> make_staged_collective(const mpi::Comm& comm,
                                                          Backend& backend) {
  return std::make_unique<StagedCollective>(comm, backend);
}

std::unique_ptr<Collective> make_collective(const mpi::Comm& comm, Backend& backend) {
  if (backend.host_accessible()) return std::make_unique<MpiCollective>(comm);
  const CollectiveFactory factory = registry()[slot(backend.kind())];
  if (factory != nullptr) return factory(comm, backend);
  return make_staged_collective(comm, backend);
}

}  // namespace atlas::device
