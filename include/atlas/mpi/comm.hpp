// SPDX-License-Identifier: MIT
// RAII MPI: Environment (init/finalize), Comm (owned communicator with MPI_ERRORS_RETURN), typed
// point-to-point and collectives. Every call is checked; failures throw atlas::Error (Comm class).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "atlas/core/error.hpp"

namespace atlas::detail {
[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line);
[[noreturn]] void throw_mpi_count(std::size_t n);
/// An element count as MPI-3's int: a larger one (a tensor part of over 2^31 floats) would wrap
/// to a short message on both sides, without an error, so it throws (Internal) instead.
inline int mpi_count(std::size_t n) {
  if (n > static_cast<std::size_t>(INT32_MAX)) throw_mpi_count(n);
  return static_cast<int>(n);
}
}  // namespace atlas::detail

#define ATLAS_MPI_CHECK(call)                                                 \
  do {                                                                        \
    if (const int atlas_rc_ = (call); atlas_rc_ != MPI_SUCCESS)               \
      ::atlas::detail::throw_mpi_error(atlas_rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace atlas::mpi {

enum class ThreadLevel { Single, Funneled, Serialized, Multiple };

/// Owns MPI_Init_thread / MPI_Finalize. Construct first in main; must outlive every Comm.
/// Throws if the MPI library provides less than the required thread level. `init` false: a
/// process of one rank that never initialises MPI (an offline command started without a
/// launcher: Open MPI's singleton start-up alone takes ~0.5 s); no Comm may be made then.
class Environment {
 public:
  Environment(int& argc, char**& argv, ThreadLevel required, bool init = true);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  [[nodiscard]] int world_rank() const noexcept { return m_world_rank; }
  [[nodiscard]] int world_size() const noexcept { return m_world_size; }
  [[nodiscard]] const std::string& host() const noexcept { return m_host; }
  /// "Open MPI v4.1.4, ..." (first line of MPI_Get_library_version).
  [[nodiscard]] static std::string library_version();
  /// Open MPI's TCP transport (btl tcp) sends a large message with its put protocol by default,
  /// and two ranks that send each other a large message at once over one TCP connection then send
  /// one direction at a time (a two-member DP ring over the WAN took twice its time: docs/wan.md,
  /// "Open MPI's put protocol"). Before MPI_Init (the constructor calls it) atlas sets
  /// OMPI_MCA_btl_tcp_flags to Open MPI's default less put, unless the variable is set (even
  /// empty; `mpirun --mca btl_tcp_flags` sets it too) or the library is not Open MPI 4 or 5. An
  /// MCA parameter file's btl_tcp_flags is overridden (the environment wins over files). Returns
  /// whether it set the variable.
  static bool default_tcp_send_protocol();
  /// Whether Open MPI's TCP transport uses its put protocol, read back through the MPI tool
  /// interface once, right after MPI_Init; nullopt where it could not be read (another MPI, no
  /// tcp component, MPI not initialised by this Environment).
  [[nodiscard]] static std::optional<bool> tcp_put_protocol();
  /// One "# ..." line for a run's header: which protocol Open MPI's TCP transport uses and where
  /// that came from ("" where tcp_put_protocol() is nullopt).
  [[nodiscard]] static std::string tcp_protocol_note();
  /// Abort the whole job (never returns).
  [[noreturn]] static void abort(int code);
  /// Whether the process was started by an MPI launcher (mpirun, mpiexec, srun): its
  /// environment names a rank (Open MPI, PMIx, PMI) or a Slurm job step.
  [[nodiscard]] static bool launched();
  /// A duplicate of world used for nothing but mpi::settle_collective_error at the top level
  /// (MPI_COMM_NULL where MPI was not initialised).
  [[nodiscard]] MPI_Comm verdict_comm() const noexcept { return m_verdict; }
  /// This MPI's MPI_TAG_UB (see mpi/tags.hpp: every tag atlas uses, and the checks against it).
  [[nodiscard]] int tag_ub() const noexcept { return m_tag_ub; }

 private:
  int m_world_rank = 0;
  int m_world_size = 1;
  std::string m_host;
  bool m_owns = false;
  MPI_Comm m_verdict = MPI_COMM_NULL;  ///< duplicate of world for settle_collective_error
  int m_tag_ub = 32767;
};

/// MPI datatype for a C++ arithmetic type.
template <class T>
MPI_Datatype datatype_of() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, int>) return MPI_INT;
  else if constexpr (std::is_same_v<T, long>) return MPI_LONG;
  else if constexpr (std::is_same_v<T, long long>) return MPI_LONG_LONG;
  else if constexpr (std::is_same_v<T, unsigned>) return MPI_UNSIGNED;
  else if constexpr (std::is_same_v<T, unsigned long>) return MPI_UNSIGNED_LONG;
  else if constexpr (std::is_same_v<T, unsigned long long>) return MPI_UNSIGNED_LONG_LONG;
  else if constexpr (std::is_same_v<T, char>) return MPI_CHAR;
  else if constexpr (std::is_same_v<T, unsigned char> || std::is_same_v<T, std::byte>) return MPI_BYTE;
  else static_assert(sizeof(T) == 0, "no MPI datatype for this type");
}

/// A non-blocking operation. Must be waited on; a destructor that meets a pending request is a
/// bug (reported through log::error, never waited on silently).
class Request {
 public:
  Request() = default;
  explicit Request(MPI_Request r) : m_req(r) {}
  Request(Request&& o) noexcept : m_req(o.m_req) { o.m_req = MPI_REQUEST_NULL; }
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();
  void wait();
  /// Waits by polling MPI_Test with an exponential back-off (10 us up to `max_sleep_us`), so a
  /// rank that waits long does not spin a core: on CPU runs several ranks share each core, and
  /// Open MPI's own blocking waits busy-poll.
  void wait_polling(int max_sleep_us = 200);
  /// wait_polling for at most `timeout_s`: true once complete; false if still pending then (the
  /// caller decides: abandon() and report, or keep waiting).
  [[nodiscard]] bool wait_polling_for(double timeout_s, int max_sleep_us = 200);
  /// True once complete (then the request is null).
  bool test();
  [[nodiscard]] bool pending() const noexcept { return m_req != MPI_REQUEST_NULL; }
  /// Forgets a request that will never complete (unwinding before MPI_Abort): neither waits nor
  /// frees it, so MPI keeps its buffer's address; the caller must not free that buffer.
  void abandon() noexcept { m_req = MPI_REQUEST_NULL; }

  /// Gives up a request (a bounded wait ran out; the job is ending): cancels it and polls it for
  /// up to kSettleMs, so a point-to-point receive cannot write into its buffer once the caller's
  /// frame is gone. One that does not settle (Open MPI cannot take back a send; a collective cannot
  /// be cancelled at all) is left to MPI with a warning: a collective's buffer must outlive the
  /// job (e.g. the Trainer's in-flight state). Once one request was left, later ones wait 10 ms,
  /// not kSettleMs. The destructor does this for a pending request.
  void cancel() noexcept;
  static constexpr int kSettleMs = 200;

 private:

  MPI_Request m_req = MPI_REQUEST_NULL;
};

/// An owned communicator. Move-only; dup() for an explicit copy. Sets MPI_ERRORS_RETURN.
class Comm {
 public:
  Comm() = default;
  /// Wraps MPI_COMM_WORLD (not freed). Sets MPI_ERRORS_RETURN on it.
  static Comm world();
  /// Wraps MPI_COMM_SELF (not freed): a one-rank job inside a bigger one (reference runs).
  static Comm self();
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  /// Split into groups of equal color, ordered by key. Collective over *this.
  /// Returns a null Comm on ranks that pass MPI_UNDEFINED.
  [[nodiscard]] Comm split(int color, int key) const;
  /// The ranks of this communicator that share memory with this one (one node: MPI_COMM_TYPE_SHARED).
  [[nodiscard]] Comm split_shared() const;
  /// Collective over *this.
  [[nodiscard]] Comm dup() const;

  [[nodiscard]] bool null() const noexcept { return m_comm == MPI_COMM_NULL; }
  [[nodiscard]] MPI_Comm get() const noexcept { return m_comm; }
  [[nodiscard]] int rank() const noexcept { return m_rank; }
  [[nodiscard]] int size() const noexcept { return m_size; }

  /// Collective over *this.
  void barrier() const;

  template <class T>
  void send(std::span<const T> data, int dest, int tag) const {
    ATLAS_MPI_CHECK(MPI_Send(data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(), dest,
                             tag, m_comm));
  }
  template <class T>
  void recv(std::span<T> data, int src, int tag) const {
    ATLAS_MPI_CHECK(MPI_Recv(data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(), src,
                             tag, m_comm, MPI_STATUS_IGNORE));
  }
  template <class T>
  [[nodiscard]] Request isend(std::span<const T> data, int dest, int tag) const {
    MPI_Request r = MPI_REQUEST_NULL;
    ATLAS_MPI_CHECK(MPI_Isend(data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(), dest,
                              tag, m_comm, &r));
    return Request(r);
  }
  template <class T>
  [[nodiscard]] Request irecv(std::span<T> data, int src, int tag) const {
    MPI_Request r = MPI_REQUEST_NULL;
    ATLAS_MPI_CHECK(MPI_Irecv(data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(), src,
                              tag, m_comm, &r));
    return Request(r);
  }
  /// In-place sum over *this. Collective.
  template <class T>
  void allreduce_sum(std::span<T> data) const {
    ATLAS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), ::atlas::detail::mpi_count(data.size()),
                                  datatype_of<T>(), MPI_SUM, m_comm));
  }
  /// Non-blocking in-place sum over *this. Collective (every rank posts it, same order).
  template <class T>
  [[nodiscard]] Request iallreduce_sum(std::span<T> data) const {
    MPI_Request r = MPI_REQUEST_NULL;
    ATLAS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(),
                                   MPI_SUM, m_comm, &r));
    return Request(r);
  }
  /// Collective. Non-blocking barrier (wait on it with Request::wait_polling not to spin a core).
  [[nodiscard]] Request ibarrier() const {
    MPI_Request r = MPI_REQUEST_NULL;
    ATLAS_MPI_CHECK(MPI_Ibarrier(m_comm, &r));
    return Request(r);
  }
  /// Collective. Returns the op-reduction of one value on every rank.
  template <class T>
  [[nodiscard]] T allreduce(T value, MPI_Op op) const {
    ATLAS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, datatype_of<T>(), op, m_comm));
    return value;
  }
  /// Collective. Broadcast from `root`.
  template <class T>
  void bcast(std::span<T> data, int root) const {
    ATLAS_MPI_CHECK(
        MPI_Bcast(data.data(), ::atlas::detail::mpi_count(data.size()), datatype_of<T>(), root, m_comm));
  }
  /// Collective. Broadcast a string of any length from `root`.
  void bcast_string(std::string& s, int root) const;
  /// Collective. Gather one string from every rank to all ranks (in rank order).
  [[nodiscard]] std::vector<std::string> allgather_strings(const std::string& mine) const;
  /// Collective. Gather one value from every rank to all ranks.
  template <class T>
  [[nodiscard]] std::vector<T> allgather(T mine) const {
    std::vector<T> out(static_cast<std::size_t>(m_size));
    ATLAS_MPI_CHECK(
        MPI_Allgather(&mine, 1, datatype_of<T>(), out.data(), 1, datatype_of<T>(), m_comm));
    return out;
  }

  /// Collective. True when every rank runs on one kernel (the same non-empty boot id,
  /// /proc/sys/kernel/random/boot_id): then their CLOCK_MONOTONIC (std::chrono::steady_clock)
  /// readings compare exactly, also across network namespaces.
  [[nodiscard]] bool on_one_kernel() const;

 private:
  Comm(MPI_Comm c, bool owned);
  void reset() noexcept;
  MPI_Comm m_comm = MPI_COMM_NULL;
  bool m_owned = false;
  int m_rank = 0;
  int m_size = 0;
};

}  // namespace atlas::mpi
