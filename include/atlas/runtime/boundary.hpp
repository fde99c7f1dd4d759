// SPDX-License-Identifier: MIT
// Moves this rank's pipeline boundary tensors (activations forward, their gradients backward):
// intra-DC neighbours over MPI (pp_comm), neighbours in another DC over the WAN transport. On an
// ordered WAN link (the atlas schedule) a transfer starts only after the link's previous
// transfer has finished: the ranks that share the link pass a token over intra-DC MPI in the
// table's order. Does not decide any order itself: it follows the schedule table.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::runtime {

/// Boundary traffic counters of one step (this rank).
struct BoundaryStats {
  std::int64_t wan_bytes_sent = 0;
  std::int64_t local_bytes_sent = 0;
  double wan_send_busy_s = 0.0;  ///< sum over WAN sends of post -> completion
  /// The tied-embedding gradient exchange's bytes sent over the WAN (not in wan_bytes_sent, whose
  /// sends wan_send_busy_s times: this one's completion is waited for behind the optimizer).
  std::int64_t wan_exchange_bytes = 0;
};

class Boundary {
 public:
  /// `wan` carries the cross-DC boundaries (may be null when this rank has none). Starts the
  /// WAN sender thread when this rank sends over a WAN link, and the local progress thread when
  /// it sends inside its DC (and MPI provides MPI_THREAD_MULTIPLE). Not collective.
  /// Requires MPI_THREAD_MULTIPLE when the sender thread runs (token passing on `token_comm`).
  /// `scratch`: one receive and one send buffer serve every micro-batch (emulated compute, whose
  /// tensors nobody reads: the messages keep their size, the memory does not grow with m).
  Boundary(const topo::Layout& layout, const topo::Communicators& comms,
           const sched::ScheduleTable& table, wan::PeerTransport* wan, Profiler& profiler,
           std::size_t boundary_bytes, double recv_timeout_s, bool scratch = false);
  ~Boundary();
  Boundary(const Boundary&) = delete;
  Boundary& operator=(const Boundary&) = delete;

  /// Host staging buffer of one boundary tensor this rank receives / sends in a step (`chunk`:
  /// this rank's model chunk that consumes / produced it, Slot::chunk).
  [[nodiscard]] float* recv_buffer(sched::Flow flow, int micro, int chunk = 0);
  [[nodiscard]] float* send_buffer(sched::Flow flow, int micro, int chunk = 0);

  /// Posts every receive of the step (all micro-batches), so early senders never block.
  void begin_step(int step);
  /// Blocks until the tensor of `slot` (a LocalRecv/WanRecv) is in recv_buffer(). Throws
  /// atlas::Error (Comm) naming the peer after the receive timeout.
  void wait_recv(const sched::Slot& slot);
  /// True once the tensor of `slot` has arrived (a non-blocking test; never throws a timeout).
  /// Keeps this rank's pending intra-DC sends moving while it says false.
  [[nodiscard]] bool test_recv(const sched::Slot& slot);
  /// Posts the tensor in send_buffer() for `slot` (a LocalSend/WanSend). WAN sends go to the
  /// sender thread, which honours the link order; local sends are MPI isends that the local
  /// progress thread keeps moving while this rank computes. Returns at once.
  void post_send(const sched::Slot& slot, int slot_index);
  /// Waits for every send of the step (the buffers are reused next step) and returns the stats.
  BoundaryStats end_step();

  /// Blocking exchange with the neighbour at `stage` outside the table (evaluation passes):
  /// MPI inside the DC, the WAN transport across. Call only between steps.
  void send_blocking(int stage, int tag, const void* data, std::size_t bytes);
  void recv_blocking(int stage, int tag, void* data, std::size_t bytes);
  /// Blocking sum of `count` floats with world rank `peer` (a WAN peer of the transport, e.g. the
  /// tied-embedding partner): both send, both receive, and both add `first + second` in the
  /// same order (`i_am_first` says which one this rank's data is), so the results are bitwise
  /// equal. Call only between the step's sends (from the AllReduce slot). Returns when the
  /// partner's half is in; ours completes by end_step. `while_waiting`, when set, is called once
  /// after both transfers are posted with a test that says whether the partner's half is in
  /// (BubbleTea fills the WAN wait with it).
  using WaitHook = std::function<void(const std::function<bool()>& done)>;
  void exchange_sum(int peer, int tag, float* data, std::size_t count, bool i_am_first,
                    const WaitHook& while_waiting = {});
  /// Sends our half of this step's exchange_sum(peer, tag, data, count) ahead of it (from a
  /// copy); exchange_sum then only waits for the partner's half.
  void post_exchange_send(int peer, int tag, const float* data, std::size_t count);
  /// Posts the receive of the partner's half of this step's exchange_sum(peer, tag, count) ahead
  /// of it (after begin_step), so exchange_arrived() can say when that half is in: the bubble
  /// before the AllReduce slot ends then (BubbleTea watches it). exchange_sum uses it.
  void post_exchange_recv(int peer, int tag, std::size_t count);
  /// True once the receive posted by post_exchange_recv has its data (false if none is posted).
  /// A non-blocking test; keeps this rank's pending intra-DC sends moving while it says false.
  [[nodiscard]] bool exchange_arrived();
  [[nodiscard]] bool has_wan() const noexcept { return m_wan != nullptr; }

 private:
  struct SendJob {
    const sched::Slot* slot = nullptr;
    int slot_index = 0;
    int peer = 0;   ///< world rank
    int tag = 0;
    const void* data = nullptr;
    std::size_t bytes = 0;
    double post_s = 0.0;
  };
  struct RecvOp {
    sched::Flow flow;
    int micro;
    int chunk;    ///< this rank's model chunk (Slot::chunk)
    int peer;     ///< world rank
    bool wan;
    mpi::Request mpi;
    wan::Handle handle;
    bool done = false;
  };

  [[nodiscard]] int neighbour(int stage) const;
  /// This step's receive of `slot` (throws Internal if none was posted).
  [[nodiscard]] RecvOp& recv_op(const sched::Slot& slot);
  /// Tests `op` once (under the WAN lock for a WAN receive); true once it has arrived.
  bool test_op(RecvOp& op);
  /// The tag of a send or receive slot: both ends name the boundary's lower virtual stage's chunk.
  [[nodiscard]] int tag_of(const sched::Slot& slot) const {
    return mpi::tags::boundary(slot.flow == sched::Flow::Activation ? 0 : 1, slot.micro, m_micro_batches,
                               sched::virtual_boundary(slot, m_me.stage, m_table.pp) / m_table.pp,
                               m_table.virtual_stages);
  }
  [[nodiscard]] int token_tag(int link, int pos) const { return mpi::tags::token(link, pos, m_link_stride); }
  void sender_loop();
  /// The local progress thread: while an intra-DC send is pending, MPI_Test it with back-off.
  void progress_loop();
  /// Tests every pending intra-DC send once (under m_local_mutex); true when none is pending.
  bool progress_local_sends();
  /// Rethrows an error of the sender or the progress thread on the calling (main) thread.
  void rethrow_thread_error();
  /// Waits (bounded by the timeout) until the partner acknowledged our half of the last exchange_sum.
  void finish_exchange_send();
  /// While our half's profile event is open: tests its send once and records the event if done
  /// (called from every test of a transfer on the main thread, so the completion is seen soon).
  void poll_exchange_send();
  void record_exchange_event();
  /// Tests a WAN handle once (under the WAN lock); while it is pending, progresses our intra-DC sends.
  bool test_wan(wan::Handle& h);
  /// test_wan with back-off until `h` completes; after the timeout throws Comm "step N: what() within T s".
  void wait_wan(wan::Handle& h, const std::function<std::string()>& what);
  void send_token(int link, int pos, int to);
  /// Whether transfer `x` of a link order is this rank's own.
  [[nodiscard]] bool is_mine(const sched::LinkTransfer& x) const {
    return x.src_stage == m_me.stage && x.dp == m_me.dp;
  }
  /// The rank on m_token_comm that sends transfer `x` (its DP index on dp_comm's duplicate; its
  /// rank in the DC when links carry several stages' transfers).
  [[nodiscard]] int token_rank(const sched::LinkTransfer& x) const {
    return m_tokens_over_dc ? m_layout.world_rank(x.src_stage, x.dp, m_me.tp) - m_dc_first_rank : x.dp;
  }
  [[nodiscard]] std::size_t index(sched::Flow flow, int micro, int chunk) const {
    return static_cast<std::size_t>(((flow == sched::Flow::Activation ? 0 : 1) * m_table.virtual_stages + chunk) *
                                        m_micro_batches + micro);
  }

  const topo::Layout& m_layout;
  const topo::Communicators& m_comms;
  const sched::ScheduleTable& m_table;
  wan::PeerTransport* m_wan;
  Profiler& m_profiler;
  std::size_t m_bytes;
  double m_timeout_s;
  topo::Coord m_me;
  int m_micro_batches;
  int m_step = 0;
  int m_link_stride = 1;
  std::vector<std::vector<float>> m_recv_bufs;
  std::vector<std::vector<float>> m_send_bufs;
  std::vector<RecvOp> m_recvs;
  BoundaryStats m_stats;
  // exchange_sum's half in flight until end_step (its completion is the partner's ack; empty once done).
  std::vector<float> m_exchange_out;
  // the partner's half of exchange_sum, posted ahead by post_exchange_recv (or by exchange_sum)
  std::vector<float> m_exchange_in;
  wan::Handle m_exchange_recv{};
  bool m_exchange_send_posted = false;
  int m_exchange_send_tag = -1;
  bool m_exchange_recv_posted = false;
  int m_exchange_recv_peer = -1, m_exchange_recv_tag = -1;
  wan::Handle m_exchange_send{};
  int m_exchange_peer = -1;
  /// Our half of the tied-embedding exchange as a profile event (kind WanSend, slot_index -1: not
  /// a slot of the table), recorded once its completion is seen (poll_exchange_send).
  SlotEvent m_exchange_event{};
  bool m_exchange_event_open = false;

  // ---- WAN sender thread ----
  std::mutex m_wan_mutex;  ///< serialises calls into the transport (main + sender thread)
  /// Link-order tokens between a link's senders: a dup of dp_comm (the senders of a link are the DP
  /// replicas of one stage) or, with model chunks on ordered links (a link then also carries the
  /// last stage's hand-back to the first, so several stages send on it), a dup of dc_comm.
  mpi::Comm m_token_comm;
  bool m_tokens_over_dc = false;
  int m_dc_first_rank = 0;  ///< world rank of dc_comm's rank 0 (the DC's ranks are contiguous)
  std::thread m_sender;
  std::mutex m_jobs_mutex;
  std::condition_variable m_jobs_cv;
  std::deque<SendJob> m_jobs;
  int m_jobs_posted = 0;              ///< this step
  std::atomic<int> m_jobs_completed{0};
  std::atomic<bool> m_stop{false};
  /// Set by the destructor while an error unwinds the job: the sender thread leaves its pending
  /// sends (a hung peer never completes them; the error is what the job reports).
  std::atomic<bool> m_abandon{false};
  std::exception_ptr m_sender_error;  ///< set by the sender or progress thread, rethrown on the main thread
  std::mutex m_error_mutex;

  // ---- local progress thread ----
  // MPI moves a rendezvous message (an intra-DC boundary tensor: above the eager limit) only
  // while its sender calls into MPI. A rank that computes (or sleeps, emulated) makes no MPI call,
  // so a send posted before a long slot would reach its receiver only after it: this thread
  // tests the step's pending local sends while any is pending, and sleeps on m_local_cv otherwise.
  std::thread m_progress;
  std::mutex m_local_mutex;  ///< guards m_local_sends and m_local_pending
  std::condition_variable m_local_cv;
  std::vector<mpi::Request> m_local_sends;  ///< this step's intra-DC sends (completed ones are null)
  bool m_local_pending = false;             ///< a send was posted since the last test found all done
  std::vector<SlotEvent> m_send_events;  ///< completed WAN sends (appended by the sender thread)
};

}  // namespace atlas::runtime
