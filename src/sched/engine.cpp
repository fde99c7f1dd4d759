// SPDX-License-Identifier: MIT
// Discrete-event timing of pipeline programs. Events are processed in (time, phase, sequence)
// order; link dispatch decisions run in a later phase than everything else at the same instant,
// so transfers posted at one instant compete fairly for an ordered link.
#include "atlas/sched/engine.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>
#include <queue>
#include <sstream>
#include <tuple>

#include "atlas/core/check.hpp"

namespace atlas::sched {

namespace {

enum class Ev : std::uint8_t { Resume, Arrive, Wake, FlowDone, Dispatch, HostDone, Release, PairGate };

/// An event. Events run in (t, phase, sequence) order: `key` = phase << 62 | sequence << 3 | type
/// (the sequence is unique, so the key orders as (phase, sequence) did), 24 bytes.
struct Event {
  double t;
  std::uint64_t key;
  int a;
  int b;
  Ev type() const { return static_cast<Ev>(key & 7U); }
  bool before(const Event& o) const { return t < o.t || (t == o.t && key < o.key); }
};

/// Pending events as a 4-ary min-heap (half the levels of a binary heap, and a node's children
/// share cache lines). The order is total, so events pop in the order of any priority queue.
class EventQueue {
 public:
  bool empty() const { return m_heap.empty(); }
  const Event& top() const { return m_heap.front(); }
  void push(const Event& e) {
    std::size_t i = m_heap.size();
    m_heap.push_back(e);
    while (i > 0) {
      const std::size_t parent = (i - 1) / 4;
      if (!e.before(m_heap[parent])) break;
      m_heap[i] = m_heap[parent];
      i = parent;
    }
    m_heap[i] = e;
  }
  void pop() {
    const Event last = m_heap.back();
    m_heap.pop_back();
    const std::size_t n = m_heap.size();
    if (n == 0) return;
    std::size_t i = 0;
    for (;;) {
      const std::size_t first = 4 * i + 1;
      if (first >= n) break;
      std::size_t least = first;
      for (std::size_t j = first + 1, end = std::min(first + 4, n); j < end; ++j)
        if (m_heap[j].before(m_heap[least])) least = j;
      if (!m_heap[least].before(last)) break;
      m_heap[i] = m_heap[least];
      i = least;
    }
    m_heap[i] = last;
  }

 private:
  std::vector<Event> m_heap;
};

/// One shared host: the compute ops running on it, as fluid flows of core-milliseconds.
struct HostState {
  std::vector<int> active;     // worker ids
  double last_update = 0.0;
  int version = 0;
};

/// OrderedFifo's service key of a waiting transfer: earliest posted first, then the tie-break's
/// flow priority, pipeline, micro-batch, message id (unique: a total order).
struct WaitKey {
  double post_ms;
  int pri;
  int pipeline;
  int micro;
  int msg;
  bool operator>(const WaitKey& o) const {
    return std::tie(post_ms, pri, pipeline, micro, msg) > std::tie(o.post_ms, o.pri, o.pipeline, o.micro, o.msg);
  }
};

/// Transfers posted at one instant and still waiting, per flow (OrderedFifo: posts come in time
/// order, so a link's groups form a queue).
struct PostGroup {
  double post_ms = 0.0;
  int activations = 0;
  int gradients = 0;
};

struct LinkState {
  // The active flows (on the wire) in start order from `head` (a finished prefix is skipped, and
  // erased in bulk): their message ids and, side by side, their remaining bytes. A link of bursts
  // serves them in that order (docs/schedules.md, "The engine"): the flow at position i (from head)
  // gets rate_at(i) = min(cap, what the flows before it leave of the capacity), so only the first
  // `served()` flows drain, and an update touches those only. Any other link shares fairly (`fair`).
  std::vector<int> active;
  std::vector<double> remaining;
  std::size_t head = 0;
  // Whether every active flow has the size `bytes` (every boundary transfer of a program has).
  // Then the remainders are non-decreasing in start order: each began at `bytes`, at or above
  // every older one's remainder, and since its rate is never above an older one's it takes
  // subtractions no larger (x, d -> fl(x - d) is monotone). So the flows that finish at an event
  // are a prefix, and the first flow finishes first: flow_done looks at those only, and gets what
  // the scan of all would have.
  bool uniform = true;
  std::int64_t bytes = 0;
  // Per position: `full` flows at the per-flow cap `cap`, then one at `partial` (the capacity
  // they leave; 0: none), the rest wait (rate 0).
  double cap = 0.0;
  double partial = 0.0;
  std::size_t full = 1;
  bool burst = false;  // window-sized transfers (EngineChannel::window_bytes): cap = capacity, pairs gated
  std::size_t active_count() const { return active.size() - head; }
  bool idle() const { return head == active.size(); }
  // Fair sharing (a link whose transfers do not all fit the pair's windows, or with no window
  // stated): every active flow gets min(cap, capacity / n), as concurrent TCP flows that pace
  // each other share a bottleneck; only window-sized bursts sit in the link's queue in order.
  bool fair = false;
  double capacity = 0.0;
  double rate_at(std::size_t pos) const {
    if (fair) return std::min(cap, capacity / static_cast<double>(std::max<std::size_t>(1, active_count())));
    return pos < full ? cap : (pos == full ? partial : 0.0);
  }
  std::size_t served() const { return fair ? active_count() : std::min(active_count(), full + (partial > 0.0 ? 1 : 0)); }
  // Posted, not admitted yet, as a min-heap on WaitKey (the service order: Shared admits every
  // waiting transfer at the dispatch of its instant, in this order; OrderedFifo up to its slots),
  // and for OrderedFifo the same transfers grouped by post instant (to tell whether a tie-break
  // decided a choice).
  std::priority_queue<WaitKey, std::vector<WaitKey>, std::greater<>> waiting;
  std::deque<PostGroup> groups;
  std::size_t next_order = 0; // Ordered: next position in `order`
  int holding = 0;            // ordered: finished transfers whose slot is not handed over yet
  int queued = 0;             // admitted, waiting behind an earlier transfer of their peer pair
  double last_update = 0.0;
  int version = 0;
  bool dispatch_pending = false;
};

class Engine {
 public:
  explicit Engine(EngineProgram& p) : m_p(p) {
    const std::size_t nw = p.workers.size();
    m_pc.assign(nw, 0);
    for (std::size_t w = 0; w < nw; ++w) m_workers_done += p.workers[w].empty() ? 1 : 0;
    if (m_workers_done == nw) m_result.pcs_done_ms = 0.0;
    m_blocked_msg.assign(nw, -1);
    m_blocked_sync.assign(nw, -1);
    m_defer_next.assign(nw, 0);
    m_running_deferred.assign(nw, -1);
    m_result.ops.resize(nw);
    for (std::size_t w = 0; w < nw; ++w) m_result.ops[w].resize(p.workers[w].size());
    m_links.resize(p.channels.size());
    m_arrived.assign(p.messages.size(), false);
    m_posted.assign(p.messages.size(), false);
    m_sync_count.assign(p.sync_groups.size(), 0);
    m_receiver.assign(p.messages.size(), -1);
    m_sender.assign(p.messages.size(), -1);
    m_hosts.resize(p.host_cores.size());
    m_net_cores.assign(p.host_cores.size(), 0.0);
    m_net_on = p.net_ns_per_byte > 0.0 && !p.host_cores.empty();
    m_work_left.assign(nw, 0.0);
    for (std::size_t w = 0; w < nw; ++w) {
      m_defer_next[w] = next_deferred(w, 0);
      for (const auto& op : p.workers[w])
        if (op.type == EngineOp::Type::Recv) m_receiver[static_cast<std::size_t>(op.message)] = static_cast<int>(w);
        else if (op.type == EngineOp::Type::Send) m_sender[static_cast<std::size_t>(op.message)] = static_cast<int>(w);
    }
    for (auto& m : p.messages) m.post_ms = m.start_ms = m.end_ms = m.arrive_ms = -1.0;
    for (auto& c : p.channels) c.served.clear();
    // Each link's largest transfer (one pass over the messages).
    std::vector<std::int64_t> largest(p.channels.size(), 0);
    for (const auto& m : p.messages)
      if (m.channel >= 0 && static_cast<std::size_t>(m.channel) < largest.size()) {
        auto& l = largest[static_cast<std::size_t>(m.channel)];
        l = std::max(l, m.bytes);
      }
    // Per link: how its capacity goes to the flows in start order (LinkState::rate_at).
    for (std::size_t c = 0; c < p.channels.size(); ++c) {
      const auto& ch = p.channels[c];
      auto& ls = m_links[c];
      const double cap = ch.capacity_bytes_per_ms;
      ls.cap = std::min(ch.flow_cap_bytes_per_ms, cap);
      // Window-sized transfers leave in bursts: each at the link's rate, in its turn (every
      // transfer of the link within its window).
      ls.burst = ch.window_bytes > 0.0 && !(static_cast<double>(largest[c]) > ch.window_bytes);
      if (ls.burst) ls.cap = cap;
      ls.fair = !ls.burst;
      ls.capacity = cap;
      const double n = std::floor(cap / ls.cap);
      ls.full = n >= 1e9 ? std::size_t{1000000000} : std::max<std::size_t>(1, static_cast<std::size_t>(n));
      ls.partial = cap - static_cast<double>(ls.full) * ls.cap;
      if (!(ls.partial > 1e-9 * cap)) ls.partial = 0.0;
    }
    // Peer pairs (sender, receiver): one per (sender worker, receiver worker) of a WAN message.
    // Numbered in order of first appearance, through a hash of the two worker ids (a tree map of
    // every WAN message was a visible share of each engine run's set-up at 100k GPUs).
    m_pair.assign(p.messages.size(), -1);
    std::unordered_map<std::uint64_t, int> pairs;
    for (std::size_t i = 0; i < p.messages.size(); ++i)
      if (p.messages[i].channel >= 0) {
        const std::uint64_t key = static_cast<std::uint64_t>(static_cast<std::uint32_t>(m_sender[i])) << 32 |
                                  static_cast<std::uint32_t>(m_receiver[i]);
        m_pair[i] = pairs.emplace(key, static_cast<int>(pairs.size())).first->second;
      }
    m_pair_busy.assign(pairs.size(), 0);
    m_unsent.assign(p.channels.size(), 0.0);  // only transfers some worker receives bound its end
    for (std::size_t i = 0; i < p.messages.size(); ++i)
      if (p.messages[i].channel >= 0 && m_receiver[i] >= 0)
        m_unsent[static_cast<std::size_t>(p.messages[i].channel)] += static_cast<double>(p.messages[i].bytes);
    m_pair_gate.assign(pairs.size(), 0.0);
    m_pair_queue.resize(pairs.size());
    m_pair_head.assign(pairs.size(), 0);
  }

  EngineResult run() {
    for (std::size_t w = 0; w < m_p.workers.size(); ++w) {
      const double t0 = w < m_p.worker_start_ms.size() ? m_p.worker_start_ms[w] : 0.0;
      push(t0, 0, Ev::Resume, static_cast<int>(w), 0);
    }
    // Every op, message and flow change makes a bounded number of events; a runaway count is a
    // bug (e.g. a flow that never progresses) and must fail loudly, not spin.
    std::size_t ops = 0;
    for (const auto& w : m_p.workers) ops += w.size();
    const std::uint64_t limit = 64 * (ops + m_p.messages.size() * (m_p.channels.size() + 4)) + 1000000;
    ATLAS_ASSERT(limit < (std::uint64_t{1} << 59), "schedule engine: a program of " << ops << " ops is too large to time");
    const bool bounded = std::isfinite(m_p.stop_after_ms);
    std::uint64_t pops = 0, checked = 0;
    double record = -std::numeric_limits<double>::infinity();
    while (!m_pq.empty()) {
      ATLAS_ASSERT(m_seq < limit, "schedule engine made " << m_seq << " events for " << ops
                                                          << " ops: timing does not converge");
      const Event e = m_pq.top();
      // A bounded run stops once the links show it ends past the bound (EngineProgram::
      // stop_after_ms): checked before an instant's first event, so a run under a lower bound
      // stops at a record's instant with the same events run (EngineResult::bound_records).
      if (bounded && e.t > m_now && pops - checked >= kBoundCheckEvents) {
        checked = pops;
        const double lb = links_bound(e.t);
        if (lb > record) {
          record = lb;
          m_result.bound_records.emplace_back(lb, e.t);
        }
        if (lb > m_p.stop_after_ms) {
          m_result.stopped = true;
          m_result.events = m_seq;
          return std::move(m_result);
        }
      }
      ++pops;
      m_pq.pop();
      const Ev type = e.type();
      m_now = e.t;
      if (m_now > m_p.stop_after_ms && !m_past_bound) {
        m_past_bound = true;  // checked once: an unfinished worker ends after now, past the bound
        for (std::size_t w = 0; w < m_pc.size(); ++w)
          if (m_pc[w] < m_p.workers[w].size()) {
            m_result.stopped = true;
            m_result.events = m_seq;
            return std::move(m_result);
          }
      }
      switch (type) {
        case Ev::Resume: advance(e.a); break;
        case Ev::Arrive: arrive(e.a); break;
        case Ev::Wake: wake(e.a); break;
        case Ev::FlowDone:
          net_before();
          flow_done(e.a, e.b);
          net_after();
          break;
        case Ev::Dispatch:
          net_before();
          dispatch(e.a);
          net_after();
          break;
        case Ev::HostDone: host_done(e.a, e.b); break;
        case Ev::PairGate:
          net_before();
          pair_gate(e.a, e.b);
          net_after();
          break;
        case Ev::Release:
          net_before();
          --m_links[static_cast<std::size_t>(e.a)].holding;
          dispatch(e.a);
          net_after();
          break;
      }
    }
    finish();
    m_result.events = m_seq;
    return std::move(m_result);
  }

 private:
  void push(double t, int phase, Ev type, int a, int b) {
    m_pq.push(Event{t, static_cast<std::uint64_t>(phase) << 62 | m_seq++ << 3 | static_cast<std::uint64_t>(type), a, b});
  }

  /// At instant t: the makespan is at least, on every WAN link, t + the bytes not yet on its
  /// wire at its capacity + its latency (those bytes arrive at a worker still to pass its
  /// receive, so the run's last op ends no earlier). A hair under, for the engine's rounding.
  double links_bound(double t) const {
    double lb = t;
    for (std::size_t c = 0; c < m_unsent.size(); ++c)
      if (m_unsent[c] > 0.0)
        lb = std::max(lb, t + m_unsent[c] / m_p.channels[c].capacity_bytes_per_ms + m_p.channels[c].latency_ms);
    return lb * (1.0 - 1e-9);
  }

  // ---- workers ----

  /// Moves worker w to its next op; the clock at which the last worker passed its last op is
  /// EngineResult::pcs_done_ms (what a stop bound tests: run()).
  void bump(std::size_t w) {
    if (++m_pc[w] == m_p.workers[w].size() && ++m_workers_done == m_pc.size()) m_result.pcs_done_ms = m_now;
  }

  /// The first deferred op of worker w at or after index `from` (the list's size: none).
  std::size_t next_deferred(std::size_t w, std::size_t from) const {
    const auto& ops = m_p.workers[w];
    while (from < ops.size() && !ops[from].deferred) ++from;
    return from;
  }

  /// Worker w's next op is a receive whose message has not arrived: runs its oldest pending
  /// deferred op (EngineOp::deferred) instead, if any, and says whether it did. Always, even where
  /// the message may come before the op ends: every W runs before the step's AllReduce anyway, so
  /// a wait it fills is time the row does not spend at its end, and it delays the receive by at
  /// most one W (on the example decks this beat running it only when it ends before the message's
  /// earliest arrival, and only when the arrival is not known yet: docs/schedules.md).
  bool run_deferred(int w) {
    const auto ww = static_cast<std::size_t>(w);
    auto& ops = m_p.workers[ww];
    const std::size_t i = m_defer_next[ww];
    if (i >= ops.size()) return false;
    const EngineOp& op = ops[i];
    if (op.after >= 0 && m_pc[ww] <= static_cast<std::size_t>(op.after)) return false;  // not pending yet
    m_defer_next[ww] = next_deferred(ww, i + 1);
    OpTime& ot = m_result.ops[ww][i];
    const int host = ww < m_p.worker_host.size() ? m_p.worker_host[ww] : -1;
    if (host >= 0 && op.duration_ms > 0.0) {
      ot.reach_ms = ot.start_ms = m_now;
      ot.ran_before = static_cast<int>(m_pc[ww]);
      host_update(host);
      m_work_left[ww] = op.duration_ms * m_p.worker_cores[ww];
      m_hosts[static_cast<std::size_t>(host)].active.push_back(w);
      m_running_deferred[ww] = static_cast<int>(i);
      host_reschedule(host);
      return true;  // host_done resumes the worker
    }
    ot = {m_now, m_now, m_now + op.duration_ms, static_cast<int>(m_pc[ww])};
    push(ot.end_ms, 0, Ev::Resume, w, 0);
    return true;
  }

  void advance(int w) {
    auto& ops = m_p.workers[static_cast<std::size_t>(w)];
    auto& pc = m_pc[static_cast<std::size_t>(w)];
    auto& times = m_result.ops[static_cast<std::size_t>(w)];
    while (pc < ops.size()) {
      const EngineOp& op = ops[pc];
      OpTime& ot = times[pc];
      if (op.deferred) {
        if (pc < m_defer_next[static_cast<std::size_t>(w)]) {  // it ran early (run_deferred)
          bump(static_cast<std::size_t>(w));
          continue;
        }
        m_defer_next[static_cast<std::size_t>(w)] = next_deferred(static_cast<std::size_t>(w), pc + 1);
      }
      switch (op.type) {
        case EngineOp::Type::Compute: {
          const int host = static_cast<std::size_t>(w) < m_p.worker_host.size() ? m_p.worker_host[static_cast<std::size_t>(w)] : -1;
          if (host >= 0 && op.duration_ms > 0.0) {
            // On a shared host the op is work (core-ms) drained at the share it gets.
            ot.reach_ms = ot.start_ms = m_now;
            host_update(host);
            m_work_left[static_cast<std::size_t>(w)] = op.duration_ms * m_p.worker_cores[static_cast<std::size_t>(w)];
            m_hosts[static_cast<std::size_t>(host)].active.push_back(w);
            host_reschedule(host);
            return;  // host_done resumes the worker
          }
          ot = {m_now, m_now, m_now + op.duration_ms};
          bump(static_cast<std::size_t>(w));
          if (op.duration_ms > 0.0) {
            push(ot.end_ms, 0, Ev::Resume, w, 0);
            return;
          }
          break;
        }
        case EngineOp::Type::Send:
          ot = {m_now, m_now, m_now};
          post(op.message);
          bump(static_cast<std::size_t>(w));
          break;
        case EngineOp::Type::Recv:
          if (m_arrived[static_cast<std::size_t>(op.message)]) {
            ot = {m_now, m_now, m_now};
            bump(static_cast<std::size_t>(w));
            break;
          }
          if (m_defer_next[static_cast<std::size_t>(w)] < ops.size() && run_deferred(w)) return;
          ot.reach_ms = m_now;
          m_blocked_msg[static_cast<std::size_t>(w)] = op.message;
          return;
        case EngineOp::Type::Sync: {
          ot.reach_ms = m_now;
          const auto g = static_cast<std::size_t>(op.sync_group);
          auto& members = m_p.sync_groups[g];
          if (++m_sync_count[g] < static_cast<int>(members.size())) {
            m_blocked_sync[static_cast<std::size_t>(w)] = op.sync_group;
            return;
          }
          // Last to arrive (events run in time order, so now is the latest reach). Without a
          // delay matrix everyone starts now; with one each member ends when it has every
          // member's part. Each then runs its own part of the collective (durations may differ,
          // e.g. when two stages of different sizes meet in one group).
          const std::size_t gd = g < m_p.sync_delay_of.size() && m_p.sync_delay_of[g] >= 0 &&
                                         static_cast<std::size_t>(m_p.sync_delay_of[g]) < m_p.sync_delay_ms.size()
                                     ? static_cast<std::size_t>(m_p.sync_delay_of[g])
                                     : g;
          const std::vector<double>* delay =
              gd < m_p.sync_delay_ms.size() && !m_p.sync_delay_ms[gd].empty() ? &m_p.sync_delay_ms[gd] : nullptr;
          const std::size_t n = members.size();
          const std::vector<int>* block =
              delay != nullptr && gd < m_p.sync_delay_block.size() && !m_p.sync_delay_block[gd].empty()
                  ? &m_p.sync_delay_block[gd]
                  : nullptr;
          // Block form: the group's k blocks; a member's "reach" is then its block's latest reach
          // (max over j of fl(reach_j + d) is fl(max reach_j + d): the same times).
          std::size_t k = n;
          if (block != nullptr) {
            k = static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(delay->size()))));
            ATLAS_ASSERT(block->size() == n && k * k == delay->size(),
                         "engine: sync group " << g << " has " << block->size() << " block ids for " << n
                                               << " members and a block matrix of " << delay->size() << " entries");
          }
          ATLAS_ASSERT(delay == nullptr || block != nullptr || delay->size() == n * n,
                       "engine: sync group " << g << " has a delay matrix of " << delay->size() << " entries for "
                                             << n << " members");
          // Each member's (block: each block's latest) reach, read before any member's pc moves
          // on (delay matrices only); a block with no member stays at -infinity and is skipped.
          std::vector<double> reach;
          if (delay != nullptr) {
            reach.assign(block != nullptr ? k : 0, -std::numeric_limits<double>::infinity());
            for (std::size_t j = 0; j < n; ++j) {
              const auto jw = static_cast<std::size_t>(members[j]);
              const double r = m_result.ops[jw][m_pc[jw]].reach_ms;
              if (block == nullptr) {
                reach.push_back(r);
              } else {
                const auto b = static_cast<std::size_t>((*block)[j]);
                ATLAS_ASSERT(b < k, "engine: sync group " << g << " member " << j << " in block " << b << " of " << k);
                reach[b] = std::max(reach[b], r);
              }
            }
          }
          double mine_end = m_now;
          for (std::size_t i = 0; i < n; ++i) {
            const auto mw = static_cast<std::size_t>(members[i]);
            auto& mop = m_result.ops[mw][m_pc[mw]];
            const double d = m_p.workers[mw][m_pc[mw]].duration_ms;
            if (delay == nullptr) {
              mop.start_ms = m_now;
              mop.end_ms = m_now + d;
            } else {
              double ready = m_now, leg = 0.0;
              const std::size_t col = block != nullptr ? static_cast<std::size_t>((*block)[i]) : i;
              for (std::size_t j = 0; j < k; ++j) {
                if (block != nullptr && reach[j] == -std::numeric_limits<double>::infinity()) continue;
                ready = std::max(ready, reach[j] + (*delay)[j * k + col]);
                leg = std::max(leg, (*delay)[j * k + col]);
              }
              // The slot holds the collective's own communication (its longest leg into this
              // member); the rest of the wait, for members that came later, is a bubble before it.
              mop.start_ms = std::max(mop.reach_ms, ready - leg);
              mop.end_ms = ready + d;
            }
            m_blocked_sync[mw] = -1;
            bump(mw);
            if (members[i] != w) push(mop.end_ms, 0, Ev::Resume, members[i], 0);
            else mine_end = mop.end_ms;
          }
          if (mine_end > m_now) {
            push(mine_end, 0, Ev::Resume, w, 0);
            return;
          }
          break;
        }
      }
    }
  }

  void arrive(int msg) {
    m_arrived[static_cast<std::size_t>(msg)] = true;
    const int r = m_receiver[static_cast<std::size_t>(msg)];
    if (r < 0) return;
    const auto w = static_cast<std::size_t>(r);
    if (m_blocked_msg[w] != msg) return;  // not waiting yet: its Recv will find it arrived
    // A receiver that waits runs again wake_ms later (on an oversubscribed host it waits for a
    // core); one that reaches its Recv after the arrival finds the data at once. On a shared host
    // with a core free it runs after its poll's sleep instead.
    const bool wan = m_p.messages[static_cast<std::size_t>(msg)].channel >= 0;
    double delay = wan ? m_p.wan_wake_ms : m_p.wake_ms;
    const int host = w < m_p.worker_host.size() ? m_p.worker_host[w] : -1;
    if (host >= 0 && delay > 0.0 && !host_full(host))
      delay = std::min(delay, (wan ? 3.0 : 1.0) * m_p.idle_wake_ms);
    if (delay > 0.0) {
      push(m_now + delay, 0, Ev::Wake, msg, 0);
      return;
    }
    wake(msg);
  }

  void wake(int msg) {
    const auto w = static_cast<std::size_t>(m_receiver[static_cast<std::size_t>(msg)]);
    const int r = static_cast<int>(w);
    ATLAS_ASSERT(m_blocked_msg[w] == msg, "engine: wake of a receiver that does not wait for message " << msg);
    m_blocked_msg[w] = -1;
    auto& ot = m_result.ops[w][m_pc[w]];
    ot.start_ms = ot.end_ms = m_now;
    bump(w);
    advance(r);
  }

  // ---- shared hosts ----

  /// Whether the compute ops running on host h use all its cores.
  bool host_full(int h) const {
    double used = 0.0;
    for (int w : m_hosts[static_cast<std::size_t>(h)].active) used += m_p.worker_cores[static_cast<std::size_t>(w)];
    return used >= m_p.host_cores[static_cast<std::size_t>(h)] - 1e-9;
  }

  /// Rate (cores) of each active op: max-min fair share of the host's cores, each op capped at
  /// its own full speed (water-filling over the caps).
  std::vector<double> host_rates(int h) const {
    const auto& hs = m_hosts[static_cast<std::size_t>(h)];
    std::vector<std::pair<double, std::size_t>> caps;
    for (std::size_t i = 0; i < hs.active.size(); ++i)
      caps.emplace_back(m_p.worker_cores[static_cast<std::size_t>(hs.active[i])], i);
    std::sort(caps.begin(), caps.end());
    std::vector<double> rate(hs.active.size(), 0.0);
    const double cores = m_p.host_cores[static_cast<std::size_t>(h)];
    double left = cores - std::min(m_net_cores[static_cast<std::size_t>(h)], 0.9 * cores);
    for (std::size_t k = 0; k < caps.size(); ++k) {
      const double share = left / static_cast<double>(caps.size() - k);
      const double r = std::min(caps[k].first, share);
      rate[caps[k].second] = r;
      left -= r;
    }
    return rate;
  }

  void host_update(int h) {
    auto& hs = m_hosts[static_cast<std::size_t>(h)];
    const double dt = m_now - hs.last_update;
    if (dt > 0.0) {
      const auto rate = host_rates(h);
      for (std::size_t i = 0; i < hs.active.size(); ++i)
        m_work_left[static_cast<std::size_t>(hs.active[i])] -= rate[i] * dt;
    }
    hs.last_update = m_now;
  }

  void host_reschedule(int h) {
    auto& hs = m_hosts[static_cast<std::size_t>(h)];
    ++hs.version;
    if (hs.active.empty()) return;
    const auto rate = host_rates(h);
    double next = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < hs.active.size(); ++i)
      next = std::min(next, std::max(0.0, m_work_left[static_cast<std::size_t>(hs.active[i])]) / rate[i]);
    push(m_now + next, 0, Ev::HostDone, h, hs.version);
  }

  void host_done(int h, int version) {
    auto& hs = m_hosts[static_cast<std::size_t>(h)];
    if (version != hs.version) return;
    host_update(h);
    const auto rate = host_rates(h);
    std::vector<int> still, done;
    for (std::size_t i = 0; i < hs.active.size(); ++i) {
      const int w = hs.active[i];
      const double left = m_work_left[static_cast<std::size_t>(w)];
      if (left <= 1e-9 || left / rate[i] <= 1e-12 * std::max(1.0, m_now)) done.push_back(w);
      else still.push_back(w);
    }
    hs.active.swap(still);
    host_reschedule(h);
    for (int w : done) {
      const auto ww = static_cast<std::size_t>(w);
      if (m_running_deferred[ww] >= 0) {  // a deferred op that ran early: the pc stays
        m_result.ops[ww][static_cast<std::size_t>(m_running_deferred[ww])].end_ms = m_now;
        m_running_deferred[ww] = -1;
        push(m_now, 0, Ev::Resume, w, 0);
        continue;
      }
      m_result.ops[ww][m_pc[ww]].end_ms = m_now;
      bump(ww);
      push(m_now, 0, Ev::Resume, w, 0);
    }
  }

  // ---- host CPU taken by WAN transfers (EngineProgram::net_ns_per_byte) ----

  int host_of(int worker) const {
    return worker >= 0 && static_cast<std::size_t>(worker) < m_p.worker_host.size()
               ? m_p.worker_host[static_cast<std::size_t>(worker)]
               : -1;
  }

  /// Before the WAN flows change: the compute ops drain at the old shares up to now.
  void net_before() {
    if (!m_net_on) return;
    for (std::size_t h = 0; h < m_hosts.size(); ++h) host_update(static_cast<int>(h));
  }

  /// After they changed: each host's cores taken by the flows now running, and new finish times
  /// for the compute ops of the hosts whose share changed.
  void net_after() {
    if (!m_net_on) return;
    std::vector<double> taken(m_hosts.size(), 0.0);
    for (std::size_t c = 0; c < m_links.size(); ++c) {
      const auto& ls = m_links[c];
      for (std::size_t i = 0, n = ls.served(); i < n; ++i) {
        const double cores = ls.rate_at(i) * m_p.net_ns_per_byte / 1e6;
        const auto m = static_cast<std::size_t>(ls.active[ls.head + i]);
        for (int h : {host_of(m_sender[m]), host_of(m_receiver[m])})
          if (h >= 0) taken[static_cast<std::size_t>(h)] += 0.5 * cores;
      }
    }
    for (std::size_t h = 0; h < m_hosts.size(); ++h) {
      if (taken[h] == m_net_cores[h]) continue;
      m_net_cores[h] = taken[h];
      host_reschedule(static_cast<int>(h));
    }
  }

  // ---- messages and links ----

  void post(int msg) {
    auto& m = m_p.messages[static_cast<std::size_t>(msg)];
    m.post_ms = m_now;
    m_posted[static_cast<std::size_t>(msg)] = true;
    if (m.channel < 0) {
      const double tx = static_cast<double>(m.bytes) / m_p.intra_bytes_per_ms;
      m.start_ms = m_now;
      m.end_ms = m_now + tx;
      m.arrive_ms = m.end_ms + m_p.intra_latency_ms;
      push(m.arrive_ms, 0, Ev::Arrive, msg, 0);
      return;
    }
    const auto c = static_cast<std::size_t>(m.channel);
    auto& ch = m_p.channels[c];
    auto& ls = m_links[c];
    if (ch.mode != LinkMode::Ordered) {
      // Shared: every transfer posted at this instant is admitted at its dispatch, in pipeline
      // order (so the order in which posts of one instant reach the link does not depend on the
      // order of their events); OrderedFifo: by its tie-break, up to its slots.
      int pri = 0;
      if (ch.mode == LinkMode::OrderedFifo && ch.tie_break == TieBreak::GradientsFirst) pri = m.flow == Flow::Gradient ? 0 : 1;
      if (ch.mode == LinkMode::OrderedFifo && ch.tie_break == TieBreak::ActivationsFirst) pri = m.flow == Flow::Activation ? 0 : 1;
      ls.waiting.push(WaitKey{m.post_ms, pri, m.pipeline, m.micro, msg});
      if (ch.mode == LinkMode::OrderedFifo) {
        if (ls.groups.empty() || ls.groups.back().post_ms != m.post_ms) ls.groups.push_back(PostGroup{m.post_ms, 0, 0});
        ++(m.flow == Flow::Gradient ? ls.groups.back().gradients : ls.groups.back().activations);
      }
    }
    if (!ls.dispatch_pending) {
      ls.dispatch_pending = true;
      push(m_now, 1, Ev::Dispatch, static_cast<int>(c), 0);
    }
  }

  /// A transfer takes its place on link c (Shared: at its post's dispatch; Ordered, OrderedFifo:
  /// when its slot comes). With EngineChannel::per_pair it goes on the wire after the transfers of
  /// its peer pair admitted before it (pair_try).
  void admit(int c, int msg) {
    auto& ch = m_p.channels[static_cast<std::size_t>(c)];
    // Ordered links of bursts gate pairs too: the runtime starts a transfer when its turn and
    // slot come (the table's order, recorded here), and the pair's rails put it on the wire once
    // their windows have room; it holds its slot meanwhile (LinkState::queued).
    const bool gated = ch.mode == LinkMode::Shared || m_links[static_cast<std::size_t>(c)].burst;
    if (!ch.per_pair || !gated) {
      start_flow(c, msg);
      return;
    }
    if (ch.mode != LinkMode::Shared) ch.served.push_back(msg);
    const auto pr = static_cast<std::size_t>(m_pair[static_cast<std::size_t>(msg)]);
    m_pair_queue[pr].push_back(msg);
    ++m_links[static_cast<std::size_t>(c)].queued;
    pair_try(c, static_cast<int>(pr));
  }

  /// Starts the next admitted transfer of peer pair pr on link c if its connection lets it: with
  /// bursts (LinkState::burst) once the pair's window has room, i.e. the bytes of its transfers
  /// started before, at flow_cap (rails x window / RTT), have been acknowledged; else once the
  /// pair's previous transfer ended.
  void pair_try(int c, int pr) {
    const auto p = static_cast<std::size_t>(pr);
    auto& q = m_pair_queue[p];
    auto& h = m_pair_head[p];
    auto& ls = m_links[static_cast<std::size_t>(c)];
    if (h == q.size()) return;
    if (ls.burst) {
      if (m_now < m_pair_gate[p]) {
        if (!m_pair_busy[p]) {
          m_pair_busy[p] = 1;  // a gate event is pending
          push(m_pair_gate[p], 0, Ev::PairGate, c, pr);
        }
        return;
      }
    } else if (m_pair_busy[p]) {
      return;
    }
    const int msg = q[h++];
    if (h == q.size()) {
      q.clear();
      h = 0;
    }
    --ls.queued;
    const auto& ch = m_p.channels[static_cast<std::size_t>(c)];
    start_flow(c, msg, ch.mode == LinkMode::Shared);
    if (ls.burst) {
      m_pair_gate[p] = m_now + static_cast<double>(m_p.messages[static_cast<std::size_t>(msg)].bytes) / ch.flow_cap_bytes_per_ms;
      if (h != 0) {
        m_pair_busy[p] = 1;
        push(m_pair_gate[p], 0, Ev::PairGate, c, pr);
      }
    } else {
      m_pair_busy[p] = 1;
    }
  }

  void pair_gate(int c, int pr) {
    m_pair_busy[static_cast<std::size_t>(pr)] = 0;
    update(c);
    pair_try(c, pr);
    reschedule(c);
  }

  /// A transfer of link c ended: without bursts the next one of its peer pair starts (per_pair).
  void pair_next(int c, int msg) {
    const auto& ch = m_p.channels[static_cast<std::size_t>(c)];
    if (!ch.per_pair || ch.mode != LinkMode::Shared || m_links[static_cast<std::size_t>(c)].burst) return;
    const int pr = m_pair[static_cast<std::size_t>(msg)];
    m_pair_busy[static_cast<std::size_t>(pr)] = 0;
    pair_try(c, pr);
  }

  /// record: the link's served order takes it now (false: it took it at its admission).
  void start_flow(int c, int msg, bool record = true) {
    auto& m = m_p.messages[static_cast<std::size_t>(msg)];
    m.start_ms = m_now;
    if (m_receiver[static_cast<std::size_t>(msg)] >= 0) m_unsent[static_cast<std::size_t>(c)] -= static_cast<double>(m.bytes);
    if (record) m_p.channels[static_cast<std::size_t>(c)].served.push_back(msg);
    auto& started = m_links[static_cast<std::size_t>(c)];
    if (started.idle()) {
      started.active.clear();
      started.remaining.clear();
      started.head = 0;
      started.uniform = true;
      started.bytes = m.bytes;
    } else if (m.bytes != started.bytes) {
      started.uniform = false;
    }
    started.active.push_back(msg);
    started.remaining.push_back(static_cast<double>(m.bytes));
  }

  /// Drains the served flows of link c up to now, each at its position's rate.
  void update(int c) {
    auto& ls = m_links[static_cast<std::size_t>(c)];
    const double dt = m_now - ls.last_update;
    if (dt > 0.0 && !ls.idle()) {
      double* rem = ls.remaining.data() + ls.head;
      const std::size_t n = ls.served();
      const double full = ls.cap * dt;
      if (ls.fair) {
        const double drained = ls.rate_at(0) * dt;
        for (std::size_t i = 0; i < n; ++i) rem[i] -= drained;
      } else {
        for (std::size_t i = 0; i < n; ++i) rem[i] -= i < ls.full ? full : ls.partial * dt;
      }
    }
    ls.last_update = m_now;
  }

  /// The next completion on link c: the first flow's with uniform sizes (LinkState::uniform),
  /// else the earliest of the served flows'.
  void reschedule(int c) {
    auto& ls = m_links[static_cast<std::size_t>(c)];
    ++ls.version;
    if (ls.idle()) return;
    double next = std::max(0.0, ls.remaining[ls.head]) / ls.rate_at(0);
    if (!ls.uniform || m_p.reference)
      for (std::size_t i = 1, n = ls.served(); i < n; ++i)
        next = std::min(next, std::max(0.0, ls.remaining[ls.head + i]) / ls.rate_at(i));
    push(m_now + next, 0, Ev::FlowDone, c, ls.version);
  }

  void flow_done(int c, int version) {
    auto& ls = m_links[static_cast<std::size_t>(c)];
    if (version != ls.version) return;
    update(c);
    const auto& ch = m_p.channels[static_cast<std::size_t>(c)];
    // A flow whose remainder is rounding noise, or would finish within the clock's resolution at
    // its rate (r, by its position before this event), is complete (otherwise the event would
    // repeat at the same instant forever). With uniform sizes the finished flows are a prefix
    // (LinkState::uniform): a flow further back has no less left and no more rate.
    auto finished = [&](double rem, std::int64_t bytes, double r) {
      return rem <= 1e-9 * static_cast<double>(bytes) + 1e-9 || (r > 0.0 && rem / r <= 1e-12 * std::max(1.0, m_now));
    };
    std::vector<int>& done = m_done;
    done.clear();
    const std::size_t n = ls.active.size();
    if (ls.uniform && !m_p.reference) {
      std::size_t a = ls.head;
      for (; a < n && finished(ls.remaining[a], ls.bytes, ls.rate_at(a - ls.head)); ++a) done.push_back(ls.active[a]);
      ls.head = a;
    } else {
      std::size_t kept = ls.head;
      for (std::size_t a = ls.head; a < n; ++a) {
        const int msg = ls.active[a];
        const double rem = ls.remaining[a];
        if (finished(rem, m_p.messages[static_cast<std::size_t>(msg)].bytes, ls.rate_at(a - ls.head))) {
          done.push_back(msg);
        } else {
          ls.active[kept] = msg;
          ls.remaining[kept++] = rem;
        }
      }
      ls.active.resize(kept);
      ls.remaining.resize(kept);
    }
    for (int msg : done) {
      auto& m = m_p.messages[static_cast<std::size_t>(msg)];
      m.end_ms = m_now;
      m.arrive_ms = m_now + ch.latency_ms;
      push(m.arrive_ms, 0, Ev::Arrive, msg, 0);
      if (ch.mode != LinkMode::Shared && ch.handover_ms > 0.0) {
        // The next transfer may start once the sender has learnt this one completed.
        ++ls.holding;
        push(m_now + ch.handover_ms, 0, Ev::Release, c, 0);
      }
    }
    if (ls.head >= 4096 && 2 * ls.head >= ls.active.size()) {  // the skipped prefix, in bulk
      const auto h = static_cast<std::ptrdiff_t>(ls.head);
      ls.active.erase(ls.active.begin(), ls.active.begin() + h);
      ls.remaining.erase(ls.remaining.begin(), ls.remaining.begin() + h);
      ls.head = 0;
    }
    for (int msg : done) pair_next(c, msg);
    try_start(c);
    reschedule(c);
  }

  void dispatch(int c) {
    auto& ls = m_links[static_cast<std::size_t>(c)];
    ls.dispatch_pending = false;
    update(c);
    try_start(c);
    reschedule(c);
  }

  void try_start(int c) {
    auto& ch = m_p.channels[static_cast<std::size_t>(c)];
    auto& ls = m_links[static_cast<std::size_t>(c)];
    if (ch.mode == LinkMode::Shared) {
      while (!ls.waiting.empty()) {
        const int msg = ls.waiting.top().msg;
        ls.waiting.pop();
        admit(c, msg);
      }
    } else if (ch.mode == LinkMode::Ordered) {
      while (static_cast<int>(ls.active_count()) + ls.holding + ls.queued < ch.slots && ls.next_order < ch.order.size() &&
             m_posted[static_cast<std::size_t>(ch.order[ls.next_order])]) {
        admit(c, ch.order[ls.next_order++]);
      }
    } else if (ch.mode == LinkMode::OrderedFifo) {
      while (static_cast<int>(ls.active_count()) + ls.holding + ls.queued < ch.slots && !ls.waiting.empty()) {
        const int msg = ls.waiting.top().msg;
        ls.waiting.pop();
        // The earliest waiting transfers are the front group (posts come in time order).
        PostGroup& g = ls.groups.front();
        ATLAS_ASSERT(g.post_ms == m_p.messages[static_cast<std::size_t>(msg)].post_ms,
                     "engine: link " << c << " served a transfer out of its post order");
        if (g.activations > 0 && g.gradients > 0 && !m_result.tie_break_used) {
          m_result.tie_break_used = true;
          m_result.tie_break_first_ms = m_now;
        }
        --(m_p.messages[static_cast<std::size_t>(msg)].flow == Flow::Gradient ? g.gradients : g.activations);
        if (g.activations == 0 && g.gradients == 0) ls.groups.pop_front();
        admit(c, msg);
      }
    }
  }

  void finish() {
    std::ostringstream why;
    int stuck = 0;
    for (std::size_t w = 0; w < m_pc.size(); ++w) {
      const auto& ops = m_p.workers[w];
      for (const auto& t : m_result.ops[w]) m_result.makespan_ms = std::max(m_result.makespan_ms, t.end_ms);
      if (m_pc[w] >= ops.size()) continue;
      if (stuck++ < 8) {
        why << "worker " << w << " stuck at op " << m_pc[w] << " (" << to_string(ops[m_pc[w]].kind);
        if (m_blocked_msg[w] >= 0) why << ", waiting for message " << m_blocked_msg[w];
        if (m_blocked_sync[w] >= 0) why << ", waiting in sync group " << m_blocked_sync[w];
        why << "); ";
      }
    }
    if (stuck > 0) {
      m_result.deadlock = true;
      why << stuck << " workers cannot finish";
      m_result.deadlock_reason = why.str();
    }
  }

  EngineProgram& m_p;
  EngineResult m_result;
  EventQueue m_pq;
  std::uint64_t m_seq = 0;
  double m_now = 0.0;
  bool m_past_bound = false;
  std::size_t m_workers_done = 0;  // workers past their last op (bump)
  std::vector<std::size_t> m_pc;
  std::vector<int> m_blocked_msg;
  std::vector<int> m_blocked_sync;
  std::vector<std::size_t> m_defer_next;  // per worker: its oldest deferred op not run yet
  std::vector<int> m_running_deferred;     // per worker: the deferred op running early (host path), -1
  std::vector<LinkState> m_links;
  std::vector<bool> m_arrived;
  std::vector<bool> m_posted;
  std::vector<int> m_sync_count;
  std::vector<int> m_receiver;  // message -> the worker that receives it
  std::vector<int> m_sender;    // message -> the worker that sends it
  std::vector<int> m_pair;      // WAN message -> its peer pair (sender, receiver), else -1
  std::vector<char> m_pair_busy;               // per pair: a transfer on its link (bursts: a gate pending)
  std::vector<double> m_pair_gate;             // per pair (bursts): when its window has room again
  std::vector<std::vector<int>> m_pair_queue;  // per pair: admitted transfers waiting behind it
  std::vector<std::size_t> m_pair_head;        // per pair: the next of m_pair_queue to start
  std::vector<int> m_done;      // flow_done's finished transfers (kept: no allocation per event)
  std::vector<double> m_net_cores;  // per host: cores the running WAN flows take
  std::vector<double> m_unsent;     // per link: bytes of its transfers not on the wire yet (links_bound)
  bool m_net_on = false;
  std::vector<HostState> m_hosts;
  std::vector<double> m_work_left;  // core-ms left of each worker's running compute op
};

}  // namespace

EngineResult run_engine(EngineProgram& program) {
  for (const auto& ch : program.channels) {
    ATLAS_ASSERT(ch.capacity_bytes_per_ms > 0 && ch.flow_cap_bytes_per_ms > 0,
                 "link with non-positive capacity");
    ATLAS_ASSERT(ch.slots >= 1, "ordered link with no slots");
  }
  for (std::size_t w = 0; w < program.worker_host.size(); ++w) {
    const int h = program.worker_host[w];
    ATLAS_ASSERT(h < static_cast<int>(program.host_cores.size()), "worker on an unknown host");
    if (h >= 0) {
      ATLAS_ASSERT(program.host_cores[static_cast<std::size_t>(h)] > 0, "host with no cores");
      ATLAS_ASSERT(w < program.worker_cores.size() && program.worker_cores[w] > 0, "worker without cores");
    }
  }
  return Engine(program).run();
}

}  // namespace atlas::sched
