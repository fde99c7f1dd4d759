// SPDX-License-Identifier: MIT
// BubbleTea's policy for the table's fillable waits (see wait_filler.hpp).
#include "atlas/bubbletea/wait_filler.hpp"

#include <algorithm>

namespace atlas::bubbletea {

WaitFiller::WaitFiller(const Config& cfg, const topo::Layout& layout)
    : m_budgets(cfg.bubbletea),
      m_fill_recv_waits(cfg.bubbletea.fill_recv_waits),
      m_fill_wan_waits(cfg.bubbletea.fill_wan_waits),
      m_watch_recv(cfg.bubbletea.watch_recv) {
  const int pp = layout.pp_size();
  if (pp <= 1) return;
  const int a = layout.dc_of_stage(0), b = layout.dc_of_stage(pp - 1);
  if (a != b) {
    const double bytes = static_cast<double>(cfg.model.vocab) * cfg.model.hidden / layout.tp_size() * sizeof(float);
    m_embed_wait_s = cfg.cluster.latency(a, b) * 1e-3 + bytes * 8 / (cfg.cluster.bandwidth(a, b) * 1e9);
  }
  for (int s = 0; s < pp; ++s)
    for (int t = 0; t < pp; ++t)
      m_norm_wait_s = std::max(m_norm_wait_s, 2 * cfg.cluster.latency(layout.dc_of_stage(s), layout.dc_of_stage(t)) * 1e-3);
}

std::pair<double, std::int64_t> WaitFiller::fill_wait(int step, const sched::Slot& slot, int index,
                                                      const std::function<bool()>& done) {
  m_wait = Wait{};
  double budget = 0.0;
  if (sched::is_recv(slot.kind)) {
    if (!m_fill_recv_waits) return {0.0, 0};
    m_wait = Wait{true, index, now(), 0.0, false};
    m_wait.last_pending = m_wait.start;
    if (done()) return {0.0, 0};  // on time: a wait of ~0
    budget = m_budgets.receive_budget(index);
  } else {
    const double predicted = slot.kind == sched::SlotKind::AllReduce ? m_embed_wait_s : m_norm_wait_s;
    if (!m_fill_wan_waits || predicted <= 0) return {0.0, 0};
    budget = m_budgets.wan_wait_budget(index, predicted);
    m_wait = Wait{true, index, now(), 0.0, false};
    m_wait.last_pending = m_wait.start;
  }
  if (budget <= 0.0) return {0.0, 0};
  // Tested before every chunk and between its blocks: the data stops the chunk there.
  const std::function<bool()> watched = [this, &done] {
    if (done()) return m_wait.arrived = true;
    m_wait.last_pending = now();
    return false;
  };
  return fill(step, slot, budget, &watched);
}

void WaitFiller::wait_ended(int index) {
  if (!m_wait.active || m_wait.index != index) return;
  m_wait.active = false;
  const double end = m_wait.arrived ? m_wait.last_pending : now();
  m_budgets.record(index, end - m_wait.start);
}

}  // namespace atlas::bubbletea
