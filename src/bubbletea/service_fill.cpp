// SPDX-License-Identifier: MIT
// The service's bubble hook (Service::fill): how long a bubble may be filled (the one
// BudgetLearner, fed with the bubbles' real lengths from the fills and the profiler's events),
// and the loop that runs chunks within it.
#include "atlas/bubbletea/service.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "atlas/core/check.hpp"

namespace atlas::bubbletea {

namespace {
/// Polling for work in a watched bubble with nothing to run: from 10 us, doubling to 200 us (as
/// the runtime polls its receives): quick to start a chunk that is about to come, few wake-ups
/// over a long wait on ranks that share cores.
constexpr int kMinStarvedPollUs = 10;
constexpr int kMaxStarvedPollUs = 200;
}  // namespace

std::pair<double, std::int64_t> Service::fill(int step, const sched::Slot& slot, double budget_s,
                                              const std::function<bool()>* ended) {
  if (m_finished) return {0.0, 0};
  if (!m_started_clock) start();
  const double t_enter = m_profiler.now();
  const double guard_ms = m_cfg.bubbletea.guard_ms;
  // A receive slot is a wait the table did not plan (bubbletea.fill_recv_waits): WaitFiller's
  // budget is already a learned lower bound, filled as it is (no stretch, no allowance), and the
  // bubble before it (if any) has not been measured yet.
  const bool unplanned = sched::is_recv(slot.kind);
  if (!unplanned) learn_from_last_bubble();
  // This bubble's allowance: the table's budget, or less once learned.
  double allowed_s = budget_s;
  const int index = m_row && &slot >= m_row->data() && &slot < m_row->data() + m_row->size()
                        ? static_cast<int>(&slot - m_row->data())
                        : -1;
  const bool bubble = sched::is_bubble(slot.kind);
  // A WAN wait inside a training slot (bubbletea.fill_wan_waits: the AllReduce's embedding sum,
  // the Optimizer's norm sum), handed over by WaitFiller::fill_wait like a receive.
  const bool in_slot_wait = !unplanned && !bubble;
  // bubbletea.watch_recv governs bubbles only: a wait handed over with its test (a receive, a WAN
  // wait inside a training slot) is always watched, or its fill would run to the stretched
  // budget after the data came and delay training.
  const bool watched = (!bubble || m_cfg.bubbletea.watch_recv) && ended != nullptr && *ended;
  // The fill of the receive right after a watched bubble that stopped before its data came
  // measures that bubble's length; anything else resolves it from the receive's recorded end.
  const bool resolves_watch = m_watch.pending && step == m_watch.step && index == m_watch.index + 1;
  if (m_watch.pending && !resolves_watch) learn_watched_length();
  if (unplanned || in_slot_wait) {
    // Waits outside the table's bubbles: their own account, not offered_s.
    ++m_stats.unplanned_fills;
    m_stats.unplanned_budget_s += budget_s;
  } else if (watched) {
    // The receive that ends the bubble is tested before every chunk: fill until it arrives,
    // within the table's length or, past it, a quantile of this bubble's real lengths.
    allowed_s = index >= 0 ? watched_allowance_s(index, budget_s) : budget_s;
  } else if (slot.has(sched::SlotMark::Stagger)) {
    // The atlas stagger is a deliberate delay: the runtime sleeps what is left of it after the
    // fill, so prefill up to its table length never starts the next slot late. Nothing to learn
    // (the forward after it never waits, which would halve the allowance to nothing).
    allowed_s = budget_s;
  } else if (index >= 0 && m_profiler.enabled()) {
    allowed_s = m_budgets.bubble_allowance(index, budget_s);
    m_last = LastBubble{true, step, index, 0.0, budget_s};
  }
  const double deadline = t_enter + allowed_s;
  ++m_stats.fill_calls;
  if (bubble) {
    m_stats.offered_s += budget_s;
    m_stats.allowed_s += allowed_s;  // what this bubble may fill: learned, or stretched when watched
  }
  poll();
  if (m_index == 0) {
    admit_arrivals(job_now());
    m_queue_sum += static_cast<double>(m_waiting.size());
    ++m_queue_samples;
    m_stats.queue_max = std::max(m_stats.queue_max, static_cast<int>(m_waiting.size()));
  }
  double work = 0.0;
  std::int64_t tokens = 0;
  bool arrived = false;
  double last_pending = t_enter;  // the last test that found the receive not yet in
  int wait_us = kMinStarvedPollUs;  // polling for work while starved: back-off
  // Tested before every chunk and between a chunk's blocks: training's data stops the chunk
  // there, not at its end.
  std::function<bool()> stop;
  if (watched)
    stop = [&] {
      if ((*ended)()) return arrived = true;
      last_pending = m_profiler.now();
      return false;
    };
  while (true) {
    if (stop && stop()) break;
    const double remaining_ms = (deadline - m_profiler.now()) * 1e3 - guard_ms;
    if (remaining_ms <= 0) break;
    const std::int64_t before = m_stats.tokens;
    const double t0 = m_profiler.now();
    if (!run_one(remaining_ms, stop)) {
      // Nothing runs. In a watched bubble with nothing to run at all (the pipeline's previous rank has
      // not sent its next chunk yet, or the first rank has nothing to admit), the bubble lasts
      // until training's data comes anyway: wait for work there (polled as the runtime polls its
      // receives) instead of leaving the rest of the bubble empty.
      if (!starved()) {
        // Work waited but nothing fit: a whole bubble so tells the cost model it may be too
        // pessimistic (PrefillCost::nothing_fit).
        if (work == 0.0 && !unplanned) m_cost.nothing_fit();
        break;
      }
      if (!stop) break;
      const auto waited = std::chrono::microseconds(wait_us);
      std::this_thread::sleep_for(waited);
      wait_us = std::min(2 * wait_us, kMaxStarvedPollUs);
      m_stats.starved_s += m_profiler.now() - t0;
      poll();
      if (m_index == 0) admit_arrivals(job_now());
      continue;
    }
    wait_us = kMinStarvedPollUs;
    const double t1 = m_profiler.now();
    work += t1 - t0;
    tokens += m_stats.tokens - before;
    if (t1 > deadline) {
      ++m_stats.overruns;
      m_stats.overrun_s += t1 - std::max(t0, deadline);
    }
    poll();
    if (arrived) break;  // seen between the blocks of that chunk (paused there)
  }
  // The planned bubble learn_from_last_bubble() reads next: a receive's fill (unplanned) is not it.
  if (!unplanned && m_last.pending) m_last.spent_s = m_profiler.now() - t_enter;
  if (unplanned || in_slot_wait) m_stats.unplanned_prefill_s += work;
  if (watched && bubble && index >= 0) {
    // The data came after the last "not yet" (a lower bound: a chunk may have run past it);
    // otherwise the receive's recorded end says when (the profiler's events).
    if (arrived) record_watched_length(index, last_pending - t_enter);
    else if (m_profiler.enabled()) m_watch = WatchedBubble{true, step, index, t_enter};
  } else if (resolves_watch && arrived) {
    record_watched_length(m_watch.index, last_pending - m_watch.enter_s);
    m_watch.pending = false;
  }
  return {work, tokens};
}

double Service::watched_allowance_s(int index, double budget_s) {
  if (m_watch.pending && m_watch.index == index) learn_watched_length();
  return m_budgets.watched_bubble_budget(index, budget_s);
}

void Service::record_watched_length(int index, double length_s) { m_budgets.record(index, length_s); }

void Service::learn_watched_length() {
  m_watch.pending = false;
  // The receive returned as soon as its data was in: the bubble lasted until then.
  if (const runtime::SlotEvent* recv = find_event(m_watch.step, m_watch.index + 1))
    record_watched_length(m_watch.index, recv->end_s - m_watch.enter_s);
}

const runtime::SlotEvent* Service::find_event(int step, int index) const {
  if (index >= static_cast<int>(m_row->size())) {
    index = 0;
    ++step;
  }
  // The runtime records a slot once it ran; search newest first.
  const auto& events = m_profiler.events();
  const int me = m_comms.world.rank();
  for (std::size_t k = events.size(), scanned = 0; k-- > 0 && scanned < 4096; ++scanned) {
    const runtime::SlotEvent& e = events[k];
    if (e.step < 0 || e.world_rank != me) continue;  // BubbleTea's own chunk events
    if (e.step == step && e.slot_index == index) return &e;
    if (e.step < step) break;
  }
  return nullptr;
}

void Service::learn_from_last_bubble() {
  if (!m_last.pending) return;
  m_last.pending = false;
  // The runtime records the slot after the bubble once it ran.
  const runtime::SlotEvent* next = find_event(m_last.step, m_last.index + 1);
  if (!next) return;
  // How long the runtime waited right after the bubble: a receive's wait, an all-reduce's time
  // beyond its prediction; anything else (compute, a send, the next step) did not wait at all.
  const sched::Slot& ns = (*m_row)[static_cast<std::size_t>(next->slot_index)];  // the event found is that slot
  double wait_s = 0.0;
  if (sched::is_recv(ns.kind)) wait_s = next->end_s - next->start_s;
  else if (ns.kind == sched::SlotKind::AllReduce) wait_s = std::max(0.0, next->end_s - next->start_s - ns.duration_ms * 1e-3);
  m_budgets.learn_bubble(m_last.index, m_last.budget_s, m_last.spent_s, wait_s);
}

}  // namespace atlas::bubbletea
