// SPDX-License-Identifier: MIT
// Boundary tensor exchange. Receives are posted at the start of a step; sends are posted when
// the schedule reaches them. WAN sends run on a sender thread so that a transfer finishing while
// this rank computes hands the link to the next pipeline at once (the token is not delayed by a
// long forward pass). The thread only ever starts a transfer when the table says the link is
// free for it: own previous transfer done, or the previous sender's token received. Intra-DC
// sends are MPI isends kept moving by a local progress thread while the rank computes.
#include "atlas/runtime/boundary.hpp"

#include <chrono>
#include <map>
#include <set>

#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"

namespace atlas::runtime {

namespace {
using Clock = std::chrono::steady_clock;
/// Polling with exponential back-off: quick to notice a completion that is about to happen, but a
/// long wait (a WAN transfer, a slow peer) costs few wake-ups. Ranks share cores on CPU runs, and
/// a tight poll loop in every rank would steal them from the ranks that compute.
class Backoff {
 public:
  explicit Backoff(int max_us) : m_max_us(max_us) {}
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(m_us));
    m_us = std::min(m_us * 2, m_max_us);
  }
  void reset() { m_us = kMinUs; }

 private:
  static constexpr int kMinUs = 10;
  int m_us = kMinUs;
  int m_max_us;
};
constexpr int kMainMaxPollUs = 200;    // the main thread: on the critical path
constexpr int kSenderMaxPollUs = 500;  // the sender thread: token hand-over latency
/// The local progress thread: a pending intra-DC send moves on within this of its receiver's
/// answer (the rendezvous handshake), at a few microseconds of CPU per poll. It polls only while
/// a send is pending (from its post until the receiver has taken the data).
constexpr int kProgressMaxPollUs = 200;
/// The hint of every wait on a peer that timed out.
constexpr const char* kPeerTimeoutHint =
    "hint: the peer may have died or hung, or be waiting itself on a rank upstream (the other ranks' errors "
    "name it); raise wan.recv_timeout_s if the link is slow";
}  // namespace

Boundary::Boundary(const topo::Layout& layout, const topo::Communicators& comms,
                   const sched::ScheduleTable& table, wan::PeerTransport* wan, Profiler& profiler,
                   std::size_t boundary_bytes, double recv_timeout_s, bool scratch)
    : m_layout(layout),
      m_comms(comms),
      m_table(table),
      m_wan(wan),
      m_profiler(profiler),
      m_bytes(boundary_bytes),
      m_timeout_s(recv_timeout_s),
      m_me(layout.coord(comms.world.rank())),
      m_micro_batches(table.micro_batches) {
  const std::size_t floats = (boundary_bytes + sizeof(float) - 1) / sizeof(float);
  const auto buffers = static_cast<std::size_t>(scratch ? 1 : 2 * m_micro_batches * table.virtual_stages);
  m_recv_bufs.assign(buffers, std::vector<float>(floats));
  m_send_bufs.assign(buffers, std::vector<float>(floats));
  for (const auto& l : table.links)
    m_link_stride = std::max(m_link_stride, static_cast<int>(l.order.size()) + 1);
  mpi::tags::check_tokens(static_cast<int>(table.links.size()), m_link_stride, m_micro_batches, mpi::tag_upper_bound());

  bool sends_over_wan = false;
  for (const auto& s : table.row(m_me.stage, m_me.dp)) {
    if (s.kind == sched::SlotKind::WanSend) sends_over_wan = true;
    if ((s.kind == sched::SlotKind::WanSend || s.kind == sched::SlotKind::WanRecv) && !m_wan)
      ATLAS_THROW(Internal, "stage " << m_me.stage << " has a WAN boundary but no WAN transport");
  }
  // With model chunks a link's order mixes stages: tokens go over the DC's ranks, and every rank
  // of the DC takes part in the dup (collective over dc_comm) whether it sends over the WAN or not.
  m_tokens_over_dc = table.virtual_stages > 1 && std::any_of(table.links.begin(), table.links.end(), [](const auto& l) {
                       return l.mode == sched::LinkMode::Ordered;
                     });
  if (m_tokens_over_dc) {
    m_dc_first_rank = layout.world_rank(layout.first_stage_of_dc(m_me.dc), 0, 0);
    m_token_comm = comms.dc.dup();
  }
  if (sends_over_wan) {
    if (!m_tokens_over_dc) m_token_comm = comms.dp.dup();
    m_sender = std::thread([this] { sender_loop(); });
  }
  const auto& row = table.row(m_me.stage, m_me.dp);
  const bool sends_locally =
      std::any_of(row.begin(), row.end(), [](const sched::Slot& s) { return s.kind == sched::SlotKind::LocalSend; });
  int thread_level = MPI_THREAD_SINGLE;
  ATLAS_MPI_CHECK(MPI_Query_thread(&thread_level));
  // Without MPI_THREAD_MULTIPLE the main thread's waits progress the sends (the stall stays).
  if (sends_locally && thread_level == MPI_THREAD_MULTIPLE) m_progress = std::thread([this] { progress_loop(); });
}

Boundary::~Boundary() {
  m_abandon = std::uncaught_exceptions() > 0;
  m_stop = true;
  m_jobs_cv.notify_all();
  {
    std::lock_guard lock(m_local_mutex);  // the progress thread checks m_stop under it
  }
  m_local_cv.notify_all();
  if (m_sender.joinable()) m_sender.join();
  if (m_progress.joinable()) m_progress.join();
  // Unwinding after an error: sends the sender thread left, and receives still posted, may go on
  // in the transport (a rail's epoll thread, MPI) until the job aborts; their buffers are kept,
  // deliberately never freed, so they never touch freed memory.
  if (m_abandon) {
    auto* kept_send = new std::vector<std::vector<float>>(std::move(m_send_bufs));
    auto* kept_recv = new std::vector<std::vector<float>>(std::move(m_recv_bufs));
    // The tied-embedding exchange's too: its receive is posted at every step's start and its
    // send may be read again by a rail's resend.
    auto* kept_exchange = new std::vector<std::vector<float>>();
    kept_exchange->push_back(std::move(m_exchange_out));
    kept_exchange->push_back(std::move(m_exchange_in));
    (void)kept_send;
    (void)kept_recv;
    (void)kept_exchange;
  }
}

float* Boundary::recv_buffer(sched::Flow flow, int micro, int chunk) {
  return m_recv_bufs[m_recv_bufs.size() == 1 ? 0 : index(flow, micro, chunk)].data();
}
float* Boundary::send_buffer(sched::Flow flow, int micro, int chunk) {
  return m_send_bufs[m_send_bufs.size() == 1 ? 0 : index(flow, micro, chunk)].data();
}

int Boundary::neighbour(int stage) const { return m_layout.world_rank(stage, m_me.dp, m_me.tp); }

void Boundary::begin_step(int step) {
  m_step = step;
  m_stats = {};
  m_recvs.clear();
  m_recvs.reserve(static_cast<std::size_t>(2 * m_micro_batches));
  for (const auto& s : m_table.row(m_me.stage, m_me.dp)) {
    if (!sched::is_recv(s.kind)) continue;
    RecvOp op{s.flow, s.micro, s.chunk, neighbour(s.peer_stage), s.kind == sched::SlotKind::WanRecv, {}, {}, false};
    void* buf = recv_buffer(s.flow, s.micro, s.chunk);
    const int tag = tag_of(s);
    if (op.wan) {
      std::lock_guard lock(m_wan_mutex);
      op.handle = m_wan->irecv(op.peer, tag, buf, m_bytes);
    } else {
      op.mpi = m_comms.pp.irecv(std::span<std::byte>(static_cast<std::byte*>(buf), m_bytes), s.peer_stage, tag);
    }
    m_recvs.push_back(std::move(op));
  }
  if (m_sender.joinable()) {
    std::lock_guard lock(m_jobs_mutex);
    m_jobs_posted = 0;
    m_jobs_completed = 0;
    m_jobs.push_back(SendJob{nullptr, -1, 0, step, nullptr, 0, 0.0});  // step marker
    m_jobs_cv.notify_one();
  }
}

Boundary::RecvOp& Boundary::recv_op(const sched::Slot& slot) {
  for (auto& r : m_recvs)
    if (r.flow == slot.flow && r.micro == slot.micro && r.chunk == slot.chunk) return r;
  ATLAS_THROW(Internal, "no receive posted for micro-batch " << slot.micro);
}

bool Boundary::test_op(RecvOp& op) {
  if (!op.done) {
    if (op.wan) {
      std::lock_guard lock(m_wan_mutex);
      op.done = m_wan->test(op.handle);
    } else {
      op.done = op.mpi.test();
    }
    poll_exchange_send();
  }
  return op.done;
}

void Boundary::wait_recv(const sched::Slot& slot) {
  RecvOp& op = recv_op(slot);
  const auto start = Clock::now();
  auto last_progress = start;
  Backoff backoff(kMainMaxPollUs);
  while (!test_op(op)) {
    if (!m_progress.joinable()) progress_local_sends();
    rethrow_thread_error();
    const double waited = std::chrono::duration<double>(Clock::now() - last_progress).count();
    if (waited > m_timeout_s) {
      const topo::Coord peer = m_layout.coord(op.peer);
      ATLAS_THROW(Comm, "step " << m_step << ": no " << (slot.flow == sched::Flow::Activation ? "activation" : "gradient")
                                << " of micro-batch " << slot.micro << " from rank " << op.peer << " (stage "
                                << peer.stage << ", dc " << peer.dc << ") after " << m_timeout_s
                                << " s over " << (op.wan ? "the WAN transport" : "MPI")
                                << "\n  " << kPeerTimeoutHint);
    }
    backoff.pause();
  }
}

bool Boundary::test_recv(const sched::Slot& slot) {
  if (test_op(recv_op(slot))) return true;
  // A filler may test for long: our rendezvous sends must not stall (the progress thread's job).
  if (!m_progress.joinable()) progress_local_sends();
  return false;
}

void Boundary::post_send(const sched::Slot& slot, int slot_index) {
  const int peer = neighbour(slot.peer_stage);
  const void* data = send_buffer(slot.flow, slot.micro, slot.chunk);
  const int tag = tag_of(slot);
  if (slot.kind == sched::SlotKind::LocalSend) {
    mpi::Request r = m_comms.pp.isend(std::span<const std::byte>(static_cast<const std::byte*>(data), m_bytes),
                                      slot.peer_stage, tag);
    {
      std::lock_guard lock(m_local_mutex);
      m_local_sends.push_back(std::move(r));
      m_local_pending = true;
    }
    m_local_cv.notify_one();
    m_stats.local_bytes_sent += static_cast<std::int64_t>(m_bytes);
    return;
  }
  std::lock_guard lock(m_jobs_mutex);
  m_jobs.push_back(SendJob{&slot, slot_index, peer, tag, data, m_bytes, m_profiler.now()});
  ++m_jobs_posted;
  m_jobs_cv.notify_one();
}

BoundaryStats Boundary::end_step() {
  finish_exchange_send();
  {
    const auto start = Clock::now();
    Backoff backoff(kMainMaxPollUs);
    while (!progress_local_sends()) {
      rethrow_thread_error();
      if (std::chrono::duration<double>(Clock::now() - start).count() > m_timeout_s)
        ATLAS_THROW(Comm, "step " << m_step << ": intra-DC boundary sends did not complete within " << m_timeout_s
                                  << " s\n  " << kPeerTimeoutHint);
      backoff.pause();
    }
    std::lock_guard lock(m_local_mutex);
    m_local_sends.clear();
  }
  // Every receive of the step was consumed by a wait_recv; check, so a table bug fails loudly.
  for (const auto& r : m_recvs) ATLAS_ASSERT(r.done, "receive of micro-batch " << r.micro << " never consumed");
  if (m_sender.joinable()) {
    const auto start = Clock::now();
    int posted = 0;
    {
      std::lock_guard lock(m_jobs_mutex);
      posted = m_jobs_posted;
    }
    Backoff backoff(kMainMaxPollUs);
    while (m_jobs_completed.load() < posted) {
      rethrow_thread_error();
      if (std::chrono::duration<double>(Clock::now() - start).count() > m_timeout_s)
        ATLAS_THROW(Comm, "step " << m_step << ": " << posted - m_jobs_completed.load() << " of " << posted
                                  << " WAN sends did not complete within " << m_timeout_s
                                  << " s (wan.recv_timeout_s), to the next or previous DC's stage of this pipeline\n  "
                                  << kPeerTimeoutHint);
      backoff.pause();
    }
    std::lock_guard lock(m_jobs_mutex);
    for (const auto& e : m_send_events) {
      m_profiler.record(e);
      m_stats.wan_bytes_sent += e.bytes;
      m_stats.wan_send_busy_s += e.complete_s - e.start_s;
    }
    m_send_events.clear();
  }
  return m_stats;
}

void Boundary::send_blocking(int stage, int tag, const void* data, std::size_t bytes) {
  if (m_layout.dc_of(stage, m_me.dp) == m_me.dc) {
    // Bounded like every wait on a peer in a step (a hung stage fails the job with its name, not
    // holds it to the wall-clock limit); on a timeout the request is cancelled (mpi::Request::cancel).
    mpi::Request r = m_comms.pp.isend(std::span<const std::byte>(static_cast<const std::byte*>(data), bytes), stage, tag);
    if (!r.wait_polling_for(m_timeout_s)) {
      r.cancel();
      ATLAS_THROW(Comm, "evaluation: the send to stage " << stage << " (same DC, tag " << tag << ") did not complete within "
                                                         << m_timeout_s << " s (wan.recv_timeout_s)\n  " << kPeerTimeoutHint);
    }
    return;
  }
  wan::Handle h;
  {
    std::lock_guard lock(m_wan_mutex);
    h = m_wan->isend(neighbour(stage), tag, data, bytes);
  }
  std::lock_guard lock(m_wan_mutex);
  m_wan->wait(h);
}

void Boundary::recv_blocking(int stage, int tag, void* data, std::size_t bytes) {
  if (m_layout.dc_of(stage, m_me.dp) == m_me.dc) {
    mpi::Request r = m_comms.pp.irecv(std::span<std::byte>(static_cast<std::byte*>(data), bytes), stage, tag);
    if (!r.wait_polling_for(m_timeout_s)) {
      r.cancel();
      ATLAS_THROW(Comm, "evaluation: nothing from stage " << stage << " (same DC, tag " << tag << ") within " << m_timeout_s
                                                          << " s (wan.recv_timeout_s)\n  " << kPeerTimeoutHint);
    }
    return;
  }
  wan::Handle h;
  {
    std::lock_guard lock(m_wan_mutex);
    h = m_wan->irecv(neighbour(stage), tag, data, bytes);
  }
  std::lock_guard lock(m_wan_mutex);
  m_wan->wait(h);
}

bool Boundary::progress_local_sends() {
  // MPI moves a large (rendezvous) message only while its sender calls into MPI: without the
  // progress thread, a rank that waits on the WAN transport must keep its pending intra-DC sends
  // going, or their receivers stall.
  std::lock_guard lock(m_local_mutex);
  bool all_done = true;
  for (auto& r : m_local_sends)
    if (r.pending() && !r.test()) all_done = false;
  if (all_done) m_local_pending = false;
  return all_done;
}

void Boundary::rethrow_thread_error() {
  std::lock_guard lock(m_error_mutex);
  if (m_sender_error) std::rethrow_exception(m_sender_error);
}

// ---- the local progress thread ----

void Boundary::progress_loop() {
  try {
    Backoff backoff(kProgressMaxPollUs);
    std::unique_lock lock(m_local_mutex);
    while (true) {
      m_local_cv.wait(lock, [this] { return m_stop || m_local_pending; });
      if (m_stop) break;
      bool all_done = true;
      for (auto& r : m_local_sends)
        if (r.pending() && !r.test()) all_done = false;
      if (all_done) {  // sleep until the next post
        m_local_pending = false;
        backoff.reset();
        continue;
      }
      lock.unlock();  // the main thread may post (or end the step) meanwhile
      backoff.pause();
      lock.lock();
    }
  } catch (...) {
    std::lock_guard lock(m_error_mutex);
    if (!m_sender_error) m_sender_error = std::current_exception();
  }
}

bool Boundary::test_wan(wan::Handle& h) {
  {
    std::lock_guard lock(m_wan_mutex);
    if (m_wan->test(h)) return true;
  }
  if (&h != &m_exchange_send) poll_exchange_send();
  // Our rendezvous sends inside the DC move only while we call MPI, and their receiver may be
  // what the WAN peer waits on (the progress thread's job when it runs).
  if (!m_progress.joinable()) progress_local_sends();
  return false;
}

void Boundary::wait_wan(wan::Handle& h, const std::function<std::string()>& what) {
  Backoff backoff(kMainMaxPollUs);
  const auto start = Clock::now();
  while (!test_wan(h)) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > m_timeout_s)
      ATLAS_THROW(Comm, "step " << m_step << ": " << what() << " within " << m_timeout_s << " s\n  "
                                << kPeerTimeoutHint);
    backoff.pause();
  }
}

void Boundary::exchange_sum(int peer, int tag, float* data, std::size_t count, bool i_am_first,
                            const WaitHook& while_waiting) {
  ATLAS_ASSERT(m_wan, "exchange_sum without a WAN transport");
  auto mismatch = [&](const char* what, int p, int t, std::size_t n) {
    ATLAS_THROW(Internal, "exchange_sum with rank " << peer << " (tag " << tag << ", " << count
                                                    << " floats) does not match the " << what << " posted ahead for rank "
                                                    << p << " (tag " << t << ", " << n << " floats)");
  };
  if (m_exchange_recv_posted &&
      (m_exchange_recv_peer != peer || m_exchange_recv_tag != tag || m_exchange_in.size() != count))
    mismatch("receive", m_exchange_recv_peer, m_exchange_recv_tag, m_exchange_in.size());
  if (m_exchange_send_posted &&
      (m_exchange_peer != peer || m_exchange_send_tag != tag || m_exchange_out.size() != count))
    mismatch("send", m_exchange_peer, m_exchange_send_tag, m_exchange_out.size());
  if (!m_exchange_recv_posted) post_exchange_recv(peer, tag, count);
  if (!m_exchange_send_posted) post_exchange_send(peer, tag, data, count);
  m_exchange_send_posted = false;
  if (while_waiting) while_waiting([this] { return exchange_arrived(); });
  // A receive that completed is empty: the wait returns at once.
  wait_wan(m_exchange_recv,
           [peer] { return "the gradient exchange with rank " + std::to_string(peer) + " did not finish"; });
  m_exchange_recv_posted = false;
  poll_exchange_send();
  const std::vector<float>& theirs = m_exchange_in;
  for (std::size_t i = 0; i < count; ++i)
    data[i] = i_am_first ? data[i] + theirs[i] : theirs[i] + data[i];
}

void Boundary::post_exchange_send(int peer, int tag, const float* data, std::size_t count) {
  ATLAS_ASSERT(m_wan, "post_exchange_send without a WAN transport");
  ATLAS_ASSERT(!m_exchange_send_posted, "a second exchange send posted before the first was used");
  finish_exchange_send();  // the previous step's (acknowledged long ago)
  // Our half goes from a copy, so the sum can be written into `data` as soon as the partner's
  // half is in: the send's completion (the partner's acknowledgement, another one-way trip)
  // is waited for in end_step, behind the optimizer, not in exchange_sum.
  m_exchange_out.assign(data, data + count);
  m_stats.wan_exchange_bytes += static_cast<std::int64_t>(count * sizeof(float));
  SlotEvent& e = m_exchange_event;
  e = SlotEvent{};
  e.world_rank = m_comms.world.rank();
  e.step = m_step;
  e.slot_index = -1;  // not a slot of the table: the profile writes it to /exchanges
  e.kind = static_cast<int>(sched::SlotKind::WanSend);
  e.peer = peer;
  e.bytes = static_cast<std::int64_t>(count * sizeof(float));
  e.start_s = m_profiler.now();
  {
    std::lock_guard lock(m_wan_mutex);
    m_exchange_send = m_wan->isend(peer, tag, m_exchange_out.data(), count * sizeof(float));
  }
  e.end_s = m_profiler.now();
  m_exchange_event_open = m_profiler.enabled();
  m_exchange_send_posted = true;
  m_exchange_peer = peer;
  m_exchange_send_tag = tag;
}

void Boundary::post_exchange_recv(int peer, int tag, std::size_t count) {
  ATLAS_ASSERT(m_wan, "post_exchange_recv without a WAN transport");
  ATLAS_ASSERT(!m_exchange_recv_posted, "a second exchange receive posted before the first was used");
  m_exchange_in.resize(count);
  {
    std::lock_guard lock(m_wan_mutex);
    m_exchange_recv = m_wan->irecv(peer, tag, m_exchange_in.data(), count * sizeof(float));
  }
  m_exchange_recv_posted = true;
  m_exchange_recv_peer = peer;
  m_exchange_recv_tag = tag;
}

bool Boundary::exchange_arrived() {
  // The transport empties a handle once it completed: testing it again says true at once.
  return m_exchange_recv_posted && test_wan(m_exchange_recv);
}

void Boundary::finish_exchange_send() {
  if (!m_wan) return;  // no WAN transport: no exchange was ever sent
  wait_wan(m_exchange_send, [this] {
    return "our half of the gradient exchange with rank " + std::to_string(m_exchange_peer) + " was not acknowledged";
  });
  if (m_exchange_event_open) record_exchange_event();
}

void Boundary::poll_exchange_send() {
  if (!m_exchange_event_open) return;
  bool done = false;
  {
    std::lock_guard lock(m_wan_mutex);
    done = m_wan->test(m_exchange_send);
  }
  if (done) record_exchange_event();
}

void Boundary::record_exchange_event() {
  // Completion as this rank first saw it: it polls the send whenever it tests or waits on a
  // transfer, so at most one compute slot late, and at the latest when end_step waits for it.
  m_exchange_event.complete_s = m_profiler.now();
  m_profiler.record(m_exchange_event);
  m_exchange_event_open = false;
}

void Boundary::send_token(int link, int pos, int to) {
  const int token = m_step;
  ATLAS_MPI_CHECK(MPI_Send(&token, 1, MPI_INT, to, token_tag(link, pos), m_token_comm.get()));
}

// ---- the sender thread ----

void Boundary::sender_loop() {
  struct InFlight {
    SendJob job;
    wan::Handle handle;
  };
  try {
    std::vector<InFlight> inflight;
    Backoff backoff(kSenderMaxPollUs);
    std::deque<SendJob> queue;                 // this step's jobs, in row order
    std::set<std::pair<int, int>> own_done;    // (link, pos) of my completed sends this step
    std::map<std::pair<int, int>, MPI_Request> tokens;  // (link, pos) of the predecessor -> recv
    std::map<std::pair<int, int>, int> token_buf;
    int step = 0;
    Clock::time_point stop_deadline{};

    auto post_token_receives = [&] {
      for (const auto& s : m_table.row(m_me.stage, m_me.dp)) {
        if (s.kind != sched::SlotKind::WanSend) continue;
        const auto& link = m_table.links[static_cast<std::size_t>(s.link)];
        if (link.mode != sched::LinkMode::Ordered) continue;
        const int pred = s.link_pos - link.slots;
        if (pred < 0) continue;
        const sched::LinkTransfer& owner = link.order[static_cast<std::size_t>(pred)];
        if (is_mine(owner)) continue;
        const auto key = std::make_pair(s.link, pred);
        MPI_Request r = MPI_REQUEST_NULL;
        ATLAS_MPI_CHECK(MPI_Irecv(&token_buf[key], 1, MPI_INT, token_rank(owner), token_tag(s.link, pred),
                                  m_token_comm.get(), &r));
        tokens[key] = r;
      }
    };

    // Token receives still pending when the thread ends (a failed step, an abandoned one) are
    // cancelled: their buffers are this function's.
    auto cancel_tokens = [&] {
      for (auto& [key, r] : tokens)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
    };

    auto may_start = [&](const SendJob& j) {
      const auto& link = m_table.links[static_cast<std::size_t>(j.slot->link)];
      if (link.mode != sched::LinkMode::Ordered) return true;
      const int pred = j.slot->link_pos - link.slots;
      if (pred < 0) return true;
      if (is_mine(link.order[static_cast<std::size_t>(pred)])) return own_done.count({j.slot->link, pred}) > 0;
      auto it = tokens.find({j.slot->link, pred});
      ATLAS_ASSERT(it != tokens.end(), "no token receive for link " << j.slot->link << " position " << pred);
      if (it->second == MPI_REQUEST_NULL) return true;
      int flag = 0;
      ATLAS_MPI_CHECK(MPI_Test(&it->second, &flag, MPI_STATUS_IGNORE));
      return flag != 0;
    };

    while (true) {
      bool busy = false;
      {
        std::unique_lock lock(m_jobs_mutex);
        if (queue.empty() && inflight.empty() && m_jobs.empty()) {
          if (m_stop) break;
          m_jobs_cv.wait_for(lock, std::chrono::milliseconds(5));
        }
        while (!m_jobs.empty()) {
          SendJob j = m_jobs.front();
          m_jobs.pop_front();
          if (j.slot == nullptr) {  // a new step
            ATLAS_ASSERT(queue.empty() && inflight.empty(), "WAN sends of the previous step still pending");
            step = j.tag;
            own_done.clear();
            for (auto& [k, r] : tokens) ATLAS_ASSERT(r == MPI_REQUEST_NULL, "token of link " << k.first << " never used");
            tokens.clear();
            token_buf.clear();
            post_token_receives();
          } else {
            queue.push_back(j);
          }
          busy = true;
        }
      }
      if (m_stop && queue.empty() && inflight.empty()) break;
      // An error is unwinding the job (a peer hung, a receive timed out): its sends may never
      // complete, and joining this thread must not hang the error's report. MpiOp / the rails
      // release what is left without waiting.
      if (m_abandon) {
        for (InFlight& f : inflight) f.handle.reset();  // left on purpose: no "missing wait" report
        break;
      }
      if (m_stop && stop_deadline == Clock::time_point{})
        stop_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m_timeout_s));
      if (m_stop && Clock::now() > stop_deadline) {
        log::error("WAN sender: {} send(s) still pending {:.0f} s after the job ended (wan.recv_timeout_s); left",
                   queue.size() + inflight.size(), m_timeout_s);
        for (InFlight& f : inflight) f.handle.reset();
        break;
      }

      // Start what the link order allows: per link, the earliest queued job only.
      std::set<int> blocked_links;
      for (auto it = queue.begin(); it != queue.end();) {
        const int link = it->slot->link;
        if (blocked_links.count(link) || !may_start(*it)) {
          blocked_links.insert(link);
          ++it;
          continue;
        }
        InFlight f{*it, {}};
        {
          std::lock_guard lock(m_wan_mutex);
          f.handle = m_wan->isend(f.job.peer, f.job.tag, f.job.data, f.job.bytes);
        }
        f.job.post_s = std::max(f.job.post_s, m_profiler.now());  // when it really started
        inflight.push_back(std::move(f));
        it = queue.erase(it);
        busy = true;
      }

      // Completions: record, pass the link on.
      for (auto it = inflight.begin(); it != inflight.end();) {
        bool done = false;
        {
          std::lock_guard lock(m_wan_mutex);
          done = m_wan->test(it->handle);
        }
        if (!done) {
          ++it;
          continue;
        }
        const auto& s = *it->job.slot;
        const auto& link = m_table.links[static_cast<std::size_t>(s.link)];
        own_done.insert({s.link, s.link_pos});
        if (link.mode == sched::LinkMode::Ordered) {
          const auto succ = static_cast<std::size_t>(s.link_pos + link.slots);
          if (succ < link.order.size() && !is_mine(link.order[succ]))
            send_token(s.link, s.link_pos, token_rank(link.order[succ]));
        }
        SlotEvent e;
        e.world_rank = m_comms.world.rank();
        e.step = step;
        e.slot_index = it->job.slot_index;
        e.kind = static_cast<int>(s.kind);
        e.micro = s.micro;
        e.peer = it->job.peer;
        e.link = s.link;
        e.bytes = static_cast<std::int64_t>(it->job.bytes);
        e.start_s = it->job.post_s;
        e.end_s = it->job.post_s;
        e.complete_s = m_profiler.now();
        e.predicted_start_ms = s.start_ms;
        e.predicted_ms = s.duration_ms;
        {
          std::lock_guard lock(m_jobs_mutex);
          m_send_events.push_back(e);
        }
        ++m_jobs_completed;
        it = inflight.erase(it);
        busy = true;
      }
      // Tokens that arrived are consumed in may_start (MPI_Test sets the request to null).
      if (busy) {
        backoff.reset();
      } else {
        backoff.pause();
      }
    }
    cancel_tokens();
  } catch (...) {
    std::lock_guard lock(m_error_mutex);
    m_sender_error = std::current_exception();
  }
}

}  // namespace atlas::runtime
