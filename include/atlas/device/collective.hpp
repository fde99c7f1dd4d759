// SPDX-License-Identifier: MIT
// device::Collective: the one communication primitive tensor and data parallelism need (an
// in-place sum over a group of ranks), as an interface so the model does not know which transport
// carries it; MpiCollective is the host-memory implementation over an mpi::Comm. And which
// collective sums a backend's memory: MPI on host memory, the device's own library (NCCL on CUDA)
// when the CUDA object library registered one, and MPI staged through host memory otherwise. The
// runtime asks here for its tp_comm and dp_comm collectives; no CUDA types here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "atlas/deck/config.hpp"
#include "atlas/device/buffer.hpp"

namespace atlas::mpi {
class Comm;
class Request;
}  // namespace atlas::mpi

namespace atlas::device {

class Backend;

/// A sum started by Collective::start_allreduce_sum. Must be waited on before its buffer is read
/// or reused. For unwinding after an error (when the peers may never join the sum), settle()
/// waits a bounded time and otherwise abandons it: the owner must then never free the buffer
/// (the job is about to abort). Destroying a running one settles it first.
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  /// Drives the sum on (MPI progresses only inside MPI calls); true once it is complete.
  virtual bool test() = 0;
  /// Blocks until complete (polling, so a waiting rank leaves its core to others).
  virtual void wait() = 0;
  /// Waits at most `max_s` seconds; true if the sum completed, false if it was abandoned (logged).
  /// Never throws.
  virtual bool settle(double max_s) noexcept = 0;
  /// wait() for at most `max_s` seconds (the same back-off): true once complete; false if it is
  /// still running then (the caller reports it and the job aborts: the buffer must stay). NCCL's
  /// sum keeps its own bound instead (device.nccl_timeout_s, which aborts the communicator: a
  /// kernel left waiting on a silent replica would block every later CUDA call).
  [[nodiscard]] virtual bool wait_for(double max_s);

 protected:
  /// Polls test() (200 us apart) for at most `max_s` seconds; true once it passed. Errors from
  /// test() propagate. For settle().
  bool test_for(double max_s);
  /// Polls test() until it passes, 10 us apart doubling up to 200 us (mpi::Request::wait_polling's
  /// back-off, for a sum made of several requests). For wait().
  void wait_polling();
};

/// A group of ranks that sum tensors together (the tensor-parallel group of one stage replica).
class Collective {
 public:
  virtual ~Collective() = default;
  /// In-place sum of the first `count` floats of `buf` over the group; every member ends with
  /// the same sum. Collective over the group: all members call it in the same order.
  virtual void allreduce_sum(Buffer& buf, std::size_t count) = 0;
  /// Starts the same sum and returns at once where the transport allows it, so the caller can
  /// compute while it runs (several may be in flight; all members start them in the same order).
  /// `buf` must stay untouched until the result is waited on. The default runs the sum now and
  /// returns it complete (a backend without a non-blocking collective still gives the right sums).
  [[nodiscard]] virtual std::unique_ptr<PendingSum> start_allreduce_sum(Buffer& buf, std::size_t count);
  /// Members of the group.
  [[nodiscard]] virtual int size() const = 0;
  /// This rank's index in the group (its tp_rank).
  [[nodiscard]] virtual int rank() const = 0;
  /// Bounds every later allreduce_sum to `timeout_s` seconds (0: unbounded, the default): a sum a
  /// member never joins (hung, dead) throws atlas::Error (Comm) naming `group`, the bound and
  /// `key` (the deck key that sets it), instead of waiting forever. The MPI collectives honour it;
  /// NCCL's keeps its own (device.nccl_timeout_s).
  void bound_waits(double timeout_s, std::string group, std::string key) {
    m_wait_bound_s = timeout_s;
    m_group = std::move(group);
    m_bound_key = std::move(key);
  }

 protected:
  /// Waits for `sum` (an MPI_Iallreduce on host memory) under bound_waits' bound; on a timeout it
  /// abandons the request (MPI keeps the buffer's address: the job is about to abort) and throws.
  void wait_bounded(mpi::Request& sum) const;

 private:
  double m_wait_bound_s = 0.0;
  std::string m_group = "collective";
  std::string m_bound_key;
};

/// Collective over an MPI communicator, for buffers of a host-accessible backend. Keeps a
/// reference to `comm`, which must outlive it.
class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(const mpi::Comm& comm);
  /// Collective over the communicator. Throws atlas::Error if the buffer is not host memory or
  /// holds fewer than `count` floats.
  void allreduce_sum(Buffer& buf, std::size_t count) override;
  /// MPI_Iallreduce on the buffer: progresses at every test() and completes in wait().
  [[nodiscard]] std::unique_ptr<PendingSum> start_allreduce_sum(Buffer& buf, std::size_t count) override;
  [[nodiscard]] int size() const override;
  [[nodiscard]] int rank() const override;

 private:
  const mpi::Comm& m_comm;
};


/// A collective over `comm` (host memory) that sums with a ring of point-to-point messages, as
/// Gloo does, instead of the MPI library's MPI_Iallreduce: a reduce-scatter then an all-gather,
/// 2 (p - 1) steps of count / p floats (the last member's piece takes the remainder), in each step
/// every member sends one piece to the next member and receives one from the previous (ring
/// order = rank order in `comm`). For DP replicas across DCs (parallel.dp_across_dcs), numbered DC
/// by DC: the ring then crosses each DC boundary with one flow per step, where Open MPI's in-place
/// sum (libnbc: a binomial reduce and broadcast of the whole buffer, whose broadcast sends it over
/// two or more WAN edges at once) ran 1.4-2x its binomial prediction. sched::wan_ring_allreduce_ms
/// is its cost. Over TCP, Open MPI's put protocol makes two members that send each other a
/// piece at once (a ring of two) go one direction at a time: atlas leaves it out by default
/// (mpi::Environment::default_tcp_send_protocol). Sums progress in test() / wait() (each
/// finished step posts the next); several may be in flight (each has its own tag). **Collective
/// over `comm`** (dups it); keeps nothing of `comm` after.
[[nodiscard]] std::unique_ptr<Collective> make_ring_collective(const mpi::Comm& comm);

/// The collective that sums `backend`'s buffers over the ranks of `comm`:
/// - host-accessible memory: MpiCollective (MPI directly on the buffers);
/// - otherwise the factory registered for backend.kind() (CUDA: NCCL, or staged MPI when two
///   members share one GPU);
/// - otherwise make_staged_collective().
/// **Collective over `comm`** (a device communicator may be created): every member calls it at
/// the same point with the same kind of backend. Keeps references to `comm` and `backend`, which
/// must outlive the result. Throws atlas::Error (Device) when the device library fails.
[[nodiscard]] std::unique_ptr<Collective> make_collective(const mpi::Comm& comm,
                                                                 Backend& backend);

/// A collective over `comm` for any backend: download into host memory, MPI_Allreduce, upload.
/// Not collective to build; its allreduce_sum is collective over `comm`. Keeps references to
/// `comm` and `backend`.
[[nodiscard]] std::unique_ptr<Collective> make_staged_collective(const mpi::Comm& comm,
                                                                        Backend& backend);

/// Signature of a device collective factory (the CUDA build provides one).
using CollectiveFactory = std::unique_ptr<Collective> (*)(const mpi::Comm&, Backend&);

/// Registration hook, used like register_backend_factory() from a static initialiser of the
/// device's object library. A null `factory` removes the registration. Registering the host
/// kind is an error. Not thread-safe; call before main.
void register_collective_factory(atlas::Backend kind, CollectiveFactory factory);

}  // namespace atlas::device
