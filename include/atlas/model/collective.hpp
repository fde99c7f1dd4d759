// SPDX-License-Identifier: MIT
// model::Collective: the one communication primitive tensor parallelism needs (an in-place sum
// over the TP group), as an interface so the model does not know which transport carries it.
// MpiCollective is the host-memory implementation over an mpi::Comm (the runtime's tp_comm).
#pragma once

#include <cstddef>

#include "atlas/device/buffer.hpp"

namespace atlas::mpi {
class Comm;
}  // namespace atlas::mpi

namespace atlas::model {

/// A group of ranks that sum tensors together (the tensor-parallel group of one stage replica).
class Collective {
 public:
  virtual ~Collective() = default;
  /// In-place sum of the first `count` floats of `buf` over the group; every member ends with
  /// the same sum. Collective over the group: all members call it in the same order.
  virtual void allreduce_sum(device::Buffer& buf, std::size_t count) = 0;
  /// Members of the group.
  [[nodiscard]] virtual int size() const = 0;
  /// This rank's index in the group (its tp_rank).
  [[nodiscard]] virtual int rank() const = 0;
};

/// Collective over an MPI communicator, for buffers of a host-accessible backend. Keeps a
/// reference to `comm`, which must outlive it.
class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(const mpi::Comm& comm);
  /// Collective over the communicator. Throws atlas::Error if the buffer is not host memory or
  /// holds fewer than `count` floats.
  void allreduce_sum(device::Buffer& buf, std::size_t count) override;
  [[nodiscard]] int size() const override;
  [[nodiscard]] int rank() const override;

 private:
  const mpi::Comm& m_comm;
};

}  // namespace atlas::model
