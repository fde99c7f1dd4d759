// SPDX-License-Identifier: MIT
// The intra-DC collective for a backend's memory: MPI on host memory, the device's own library
// (NCCL on CUDA) when the CUDA object library registered one, and MPI staged through host memory
// otherwise. The runtime asks here for its tp_comm and dp_comm collectives; no CUDA types here.
#pragma once

#include <memory>

#include "atlas/deck/config.hpp"
#include "atlas/model/collective.hpp"

namespace atlas::mpi {
class Comm;
}  // namespace atlas::mpi

namespace atlas::device {

class Backend;

/// The collective that sums `backend`'s buffers over the ranks of `comm`:
/// - host-accessible memory: model::MpiCollective (MPI directly on the buffers);
/// - otherwise the factory registered for backend.kind() (CUDA: NCCL, or staged MPI when two
///   members share one GPU);
/// - otherwise make_staged_collective().
/// **Collective over `comm`** (a device communicator may be created): every member calls it at
/// the same point with the same kind of backend. Keeps references to `comm` and `backend`, which
/// must outlive the result. Throws atlas::Error (Device) when the device library fails.
[[nodiscard]] std::unique_ptr<model::Collective> make_collective(const mpi::Comm& comm,
                                                                 Backend& backend);

/// A collective over `comm` for any backend: download into host memory, MPI_Allreduce, upload.
/// Not collective to build; its allreduce_sum is collective over `comm`. Keeps references to
/// `comm` and `backend`.
[[nodiscard]] std::unique_ptr<model::Collective> make_staged_collective(const mpi::Comm& comm,
                                                                        Backend& backend);

/// Signature of a device collective factory (the CUDA build provides one).
using CollectiveFactory = std::unique_ptr<model::Collective> (*)(const mpi::Comm&, Backend&);

/// Registration hook, used like register_backend_factory() from a static initialiser of the
/// device's object library. A null `factory` removes the registration. Registering the host
/// kind is an error. Not thread-safe; call before main.
void register_collective_factory(atlas::Backend kind, CollectiveFactory factory);

}  // namespace atlas::device
