// SPDX-License-Identifier: MIT
// RAII MPI wrappers. MPI_ERRORS_RETURN is set on every communicator so ATLAS_MPI_CHECK can report.
#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include "atlas/core/check.hpp"
#include "atlas/core/env.hpp"
#include "atlas/core/log.hpp"

namespace atlas::detail {
void throw_mpi_error(int rc, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  std::ostringstream os;
  os << "MPI call failed: " << call << ": " << std::string(msg, static_cast<std::size_t>(len));
  throw_error(ExitCode::Comm, os.str(), file, line);
}
void throw_mpi_count(std::size_t n) {
  ATLAS_THROW(Internal, "an MPI message of " << n << " elements: MPI-3 counts are int (at most " << INT32_MAX
                                             << "); such a message must be sent in parts (an atlas bug)");
}
}  // namespace atlas::detail

namespace atlas::mpi {

namespace {
int to_mpi(ThreadLevel l) {
  switch (l) {
    case ThreadLevel::Single: return MPI_THREAD_SINGLE;
    case ThreadLevel::Funneled: return MPI_THREAD_FUNNELED;
    case ThreadLevel::Serialized: return MPI_THREAD_SERIALIZED;
    case ThreadLevel::Multiple: return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

// Open MPI's btl tcp default flags (4.1 and 5.0: send, put, inplace, need-ack, need-csum,
// hetero-rdma) less put; MCA_BTL_FLAGS_PUT is 0x2 in both. A later major version may change the
// set: it keeps its default (and tcp_protocol_note says whether put is on).
constexpr const char* kTcpFlagsVar = "OMPI_MCA_btl_tcp_flags";
constexpr const char* kTcpFlagsNoPut = "send,inplace,need-ack,need-csum,hetero-rdma";
constexpr unsigned kBtlFlagPut = 0x2;
bool g_tcp_flags_set_by_atlas = false;   // default_tcp_send_protocol set the variable
std::optional<bool> g_tcp_put;           // read once, right after MPI_Init (read_tcp_put_protocol)

/// Open MPI's btl_tcp_flags through the MPI tool interface: put on or off; nullopt where it cannot
/// be read (another MPI, no tcp component). The tool interface is opened before MPI_Init, at the
/// level atlas asks MPI for (`tool_open`: whether that worked), and closed here, right after
/// MPI_Init and before any thread of atlas's starts. Opened after MPI_Init, Open MPI registers its
/// frameworks' variables a second time (~0.24 s a rank here; ~0.01 s this way), and its
/// MPI_T_init_thread resets the process's thread level to the one it is given, so a SINGLE there
/// would turn a MULTIPLE job's locking off (and Boundary's progress thread with it).
std::optional<bool> read_tcp_put_protocol(bool tool_open, int level) {
  if (!tool_open) return std::nullopt;
  std::optional<bool> put;
  int index = 0;
  if (MPI_T_cvar_get_index("btl_tcp_flags", &index) == MPI_SUCCESS) {
    char name[256];
    char desc[256];
    int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int count = 0;
    unsigned flags = 0;
    if (MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind,
                            &scope) == MPI_SUCCESS &&
        type == MPI_UNSIGNED && MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1 && MPI_T_cvar_read(handle, &flags) == MPI_SUCCESS) put = (flags & kBtlFlagPut) != 0;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  int after = MPI_THREAD_SINGLE;
  MPI_Query_thread(&after);
  ATLAS_ASSERT(after == level, "reading btl_tcp_flags through MPI_T changed MPI's thread level from "
                                   << level << " to " << after);
  return put;
}
}  // namespace

bool Environment::launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID"})
    if (env::get(var).has_value()) return true;
  return false;
}

Environment::Environment(int& argc, char**& argv, ThreadLevel required, bool init) {
  if (init) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      default_tcp_send_protocol();
      int provided = 0;
      const bool tool_open = MPI_T_init_thread(to_mpi(required), &provided) == MPI_SUCCESS;
      ATLAS_MPI_CHECK(MPI_Init_thread(&argc, &argv, to_mpi(required), &provided));
      m_owns = true;
      g_tcp_put = read_tcp_put_protocol(tool_open, provided);  // before any thread of atlas's starts
      if (provided < to_mpi(required)) {
        ATLAS_THROW(Comm, "the MPI library provides thread level " << provided << " but atlas needs "
                                                                    << to_mpi(required)
                                                                    << "; rebuild Open MPI with threads");
      }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    ATLAS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &m_world_rank));
    ATLAS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &m_world_size));
  }
  m_host = env::host_name();
  log::init(m_world_rank, m_host);
  if (!init) return;  // one rank, no communicator (rank 0 of 1, m_verdict MPI_COMM_NULL)
  ATLAS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m_verdict));
  MPI_Comm_set_errhandler(m_verdict, MPI_ERRORS_RETURN);
  m_tag_ub = tag_upper_bound();  // queried once, here
}

Environment::~Environment() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;  // init false (or nothing to undo)
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (m_verdict != MPI_COMM_NULL && !finalized) MPI_Comm_free(&m_verdict);
  if (!m_owns) return;
  if (!finalized) MPI_Finalize();
}

std::string Environment::library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<std::size_t>(len));
  if (auto nl = s.find_first_of(",\n"); nl != std::string::npos) s.resize(nl);
  return s;
}

bool Environment::default_tcp_send_protocol() {
#if defined(OPEN_MPI) && (OMPI_MAJOR_VERSION == 4 || OMPI_MAJOR_VERSION == 5)
  // Set, even empty: the user's (or the launcher's, mpirun --mca) choice.
  g_tcp_flags_set_by_atlas = env::set_default(kTcpFlagsVar, kTcpFlagsNoPut);
  return g_tcp_flags_set_by_atlas;
#else
  return false;
#endif
}

std::optional<bool> Environment::tcp_put_protocol() { return g_tcp_put; }

std::string Environment::tcp_protocol_note() {
  if (!g_tcp_put) return "";
  const std::optional<std::string> set = env::get(kTcpFlagsVar);
  const std::string source =
      g_tcp_flags_set_by_atlas ? std::string(kTcpFlagsVar) + "=" + kTcpFlagsNoPut + ", atlas's default"
      : set                    ? std::string(kTcpFlagsVar) + "=" + *set
                               : std::string(kTcpFlagsVar) + " not set: Open MPI's default or an MCA parameter file";
  if (!*g_tcp_put)
    return "# Open MPI's TCP transport: put protocol off (" + source + ": large messages both ways at once)\n";
  return "# Open MPI's TCP transport: put protocol ON (" + source +
         "): two ranks sending each other large messages over TCP send one direction at a time (a two-member DP "
         "ring across DCs takes about twice as long); leave put out of btl_tcp_flags (docs/wan.md, \"Open MPI's put "
         "protocol\")\n";
}

void Environment::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---- Request ----

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (m_req != MPI_REQUEST_NULL) log::error("mpi::Request overwritten while still pending");
    m_req = o.m_req;
    o.m_req = MPI_REQUEST_NULL;
  }
  return *this;
}

Request::~Request() {
  if (m_req == MPI_REQUEST_NULL) return;
  // While an error unwinds the job, pending requests are expected (the error says why); only a
  // request dropped on the normal path is a bug worth a line.
  if (std::uncaught_exceptions() == 0) log::error("mpi::Request destroyed while still pending (a missing wait: a bug)");
  cancel();
}

namespace {
// Requests left to MPI so far: after the first, the others get only a short chance to settle (a
// job ending with many sends nobody takes must not wait kSettleMs for each), and one warning each
// kind is enough.
std::atomic<int> g_unsettled{0};
std::atomic<bool> g_collective_warned{false};
}  // namespace

void Request::cancel() noexcept {
  if (m_req == MPI_REQUEST_NULL) return;
  // The buffer dies with the caller's frame, so MPI must be done with it before this returns. A
  // freed request (MPI_Request_free) stays active: a receive would still match a late message and
  // write it into freed memory (often a stack slot) while the job reports its error. Cancel it and
  // wait a bounded moment for the cancel (or the completion) to land.
  if (MPI_Cancel(&m_req) != MPI_SUCCESS) {
    // A collective (Open MPI's libnbc refuses to cancel one): its buffer must outlive the job.
    if (!g_collective_warned.exchange(true))
      log::warn("an MPI request that cannot be cancelled (a collective) is left to MPI as the job ends");
    m_req = MPI_REQUEST_NULL;
    return;
  }
  const int settle_ms = g_unsettled.load() == 0 ? kSettleMs : 10;
  bool settled = true;  // an MPI error ends the request too
  try {
    settled = wait_polling_for(settle_ms / 1000.0, 1000);
  } catch (...) {
  }
  // Not settled: a send whose receiver never posts (Open MPI cannot take a send back), or a
  // receive already matched to a message that is not coming: left to MPI, the job is ending.
  if (!settled && g_unsettled.fetch_add(1) == 0)
    log::warn("an MPI request still pending {} ms after its cancel; left to MPI as the job ends (any "
              "others too, after a shorter wait)", settle_ms);
  m_req = MPI_REQUEST_NULL;
}

void Request::wait() {
  if (m_req == MPI_REQUEST_NULL) return;
  ATLAS_MPI_CHECK(MPI_Wait(&m_req, MPI_STATUS_IGNORE));
}

void Request::wait_polling(int max_sleep_us) {
  int sleep_us = 10;
  while (!test()) {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, max_sleep_us);
  }
}

bool Request::wait_polling_for(double timeout_s, int max_sleep_us) {
  const auto start = std::chrono::steady_clock::now();
  int sleep_us = 10;
  while (!test()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, max_sleep_us);
  }
  return true;
}

bool Request::test() {
  if (m_req == MPI_REQUEST_NULL) return true;
  int flag = 0;
  ATLAS_MPI_CHECK(MPI_Test(&m_req, &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

// ---- Comm ----

Comm::Comm(MPI_Comm c, bool owned) : m_comm(c), m_owned(owned) {
  if (m_comm != MPI_COMM_NULL) {
    ATLAS_MPI_CHECK(MPI_Comm_set_errhandler(m_comm, MPI_ERRORS_RETURN));
    ATLAS_MPI_CHECK(MPI_Comm_rank(m_comm, &m_rank));
    ATLAS_MPI_CHECK(MPI_Comm_size(m_comm, &m_size));
  }
}

Comm Comm::world() { return Comm(MPI_COMM_WORLD, false); }
Comm Comm::self() { return Comm(MPI_COMM_SELF, false); }

Comm::Comm(Comm&& o) noexcept
    : m_comm(o.m_comm), m_owned(o.m_owned), m_rank(o.m_rank), m_size(o.m_size) {
  o.m_comm = MPI_COMM_NULL;
  o.m_owned = false;
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    reset();
    m_comm = o.m_comm;
    m_owned = o.m_owned;
    m_rank = o.m_rank;
    m_size = o.m_size;
    o.m_comm = MPI_COMM_NULL;
    o.m_owned = false;
  }
  return *this;
}

Comm::~Comm() { reset(); }

void Comm::reset() noexcept {
  if (m_owned && m_comm != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && MPI_Comm_free(&m_comm) != MPI_SUCCESS) log::warn("MPI_Comm_free failed");
  }
  m_comm = MPI_COMM_NULL;
  m_owned = false;
}

Comm Comm::split(int color, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  ATLAS_MPI_CHECK(MPI_Comm_split(m_comm, color, key, &out));
  return Comm(out, true);
}

Comm Comm::split_shared() const {
  MPI_Comm out = MPI_COMM_NULL;
  ATLAS_MPI_CHECK(MPI_Comm_split_type(m_comm, MPI_COMM_TYPE_SHARED, m_rank, MPI_INFO_NULL, &out));
  return Comm(out, true);
}

Comm Comm::dup() const {
  MPI_Comm out = MPI_COMM_NULL;
  ATLAS_MPI_CHECK(MPI_Comm_dup(m_comm, &out));
  return Comm(out, true);
}

void Comm::barrier() const { ATLAS_MPI_CHECK(MPI_Barrier(m_comm)); }

void Comm::bcast_string(std::string& s, int root) const {
  unsigned long long n = s.size();
  ATLAS_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, m_comm));
  s.resize(n);
  // Every rank knows n: past an MPI count, every rank throws the same error (a cast sent n mod 2^32).
  if (n > 0) ATLAS_MPI_CHECK(MPI_Bcast(s.data(), ::atlas::detail::mpi_count(n), MPI_CHAR, root, m_comm));
}

bool Comm::on_one_kernel() const {
  std::string mine;
  if (std::ifstream f("/proc/sys/kernel/random/boot_id"); f) std::getline(f, mine);
  std::string root = mine;
  bcast_string(root, 0);
  return allreduce(!mine.empty() && mine == root ? 1 : 0, MPI_MIN) == 1;
}

std::vector<std::string> Comm::allgather_strings(const std::string& mine) const {
  // The lengths go as 64-bit values, so every rank sees the same total and, past an MPI count,
  // every rank throws the same error (a rank that threw alone would leave the others waiting).
  const auto mine_len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens64(static_cast<std::size_t>(m_size));
  ATLAS_MPI_CHECK(MPI_Allgather(&mine_len, 1, MPI_INT64_T, lens64.data(), 1, MPI_INT64_T, m_comm));
  std::int64_t total64 = 0;
  for (const std::int64_t l : lens64) total64 += l;
  if (total64 > INT32_MAX)
    ATLAS_THROW(Comm, "gathering " << total64 << " bytes of text from " << m_size << " ranks (this rank's "
                                   << mine_len << "): more than one MPI message holds (2^31 - 1 bytes)\n  hint: "
                                      "fewer ranks or less to report (e.g. fewer BubbleTea requests per run)");
  const int n = static_cast<int>(mine_len);
  std::vector<int> lens(lens64.begin(), lens64.end());
  std::vector<int> displs(lens.size(), 0);
  int total = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    displs[i] = total;
    total += lens[i];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  ATLAS_MPI_CHECK(MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), lens.data(), displs.data(),
                                 MPI_CHAR, m_comm));
  std::vector<std::string> out;
  out.reserve(lens.size());
  for (std::size_t i = 0; i < lens.size(); ++i)
    out.push_back(all.substr(static_cast<std::size_t>(displs[i]), static_cast<std::size_t>(lens[i])));
  return out;
}

}  // namespace atlas::mpi
