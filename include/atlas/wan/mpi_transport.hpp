// SPDX-License-Identifier: MIT
// The baseline WAN transport: MPI_Isend/MPI_Irecv over a dup of the world communicator (under
// the emulation that is Open MPI's TCP BTL between the DC namespaces). Same interface and error
// behaviour as the multirail transport, so the runtime and the benchmark can swap them.
#pragma once

#include <chrono>

#include "atlas/wan/transport.hpp"

namespace atlas::wan {

class MpiTransport final : public PeerTransport {
 public:
  /// Collective over `world` (it dups it). `recv_timeout_s`: a wait that makes no progress for
  /// this long throws (MPI itself would block forever). `peers`: world ranks allowed.
  MpiTransport(const mpi::Comm& world, double recv_timeout_s, const std::vector<int>& peers);
  ~MpiTransport() override;

  Handle isend(int peer, int tag, const void* data, std::size_t bytes) override;
  Handle irecv(int peer, int tag, void* data, std::size_t bytes) override;
  bool test(Handle& h) override;
  void wait(Handle& h) override;
  [[nodiscard]] TransportStats stats() const override;
  [[nodiscard]] const char* name() const override { return "mpi"; }

 private:
  bool check(Handle& h);
  [[nodiscard]] std::size_t index_of(int peer, const char* what) const;
  mpi::Comm m_comm;
  double m_timeout_s;
  std::vector<PeerStats> m_stats;
};

}  // namespace atlas::wan
