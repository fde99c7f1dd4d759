// SPDX-License-Identifier: MIT
// BubbleTea's policy for the waits the schedule table marks fillable (sched::SlotMark::
// FillableWait): a receive whose data comes late, the WAN sums inside the AllReduce and Optimizer
// slots. It chooses which to fill (bubbletea.fill_recv_waits, fill_wan_waits), for how long (the
// one BudgetLearner) and learns each wait's real length; the work itself is fill()'s, the
// derived class's (the Service; a test's recorder). Not for bubbles: those are fill()'s.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>

#include "atlas/bubbletea/budget.hpp"
#include "atlas/deck/config.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::bubbletea {

class WaitFiller : public runtime::BubbleFiller {
 public:
  /// The deck's predictions of the WAN waits: the tied-embedding exchange (one way + its bytes,
  /// when the first and last stage sit in different DCs) and the gradient-norm sum (a round trip
  /// across the farthest pair of DCs the pipeline spans).
  WaitFiller(const Config& cfg, const topo::Layout& layout);

  /// A receive (bubbletea.fill_recv_waits): filled, watched, within BudgetLearner::receive_budget
  /// (nothing until the slot has RecentWaits::kCapacity waits). A WAN wait inside an AllReduce or
  /// Optimizer slot (bubbletea.fill_wan_waits): filled, watched, within
  /// BudgetLearner::wan_wait_budget of the deck's prediction. Either is recorded at wait_ended.
  std::pair<double, std::int64_t> fill_wait(int step, const sched::Slot& slot, int index,
                                            const std::function<bool()>& done) override;
  /// Records the wait's length for the next steps' budget: when the fill saw it done, it ended
  /// after the last "not yet" (a lower bound: a chunk may have run past it); else now.
  void wait_ended(int index) override;
  /// bubbletea.watch_recv.
  [[nodiscard]] bool watches_exchange_bubbles() const override { return m_watch_recv; }

  /// Predicted WAN waits (seconds; 0: none).
  [[nodiscard]] double embed_wait_s() const { return m_embed_wait_s; }
  [[nodiscard]] double norm_wait_s() const { return m_norm_wait_s; }

 protected:
  BudgetLearner m_budgets;  ///< the one learner: these waits and the derived class's bubbles

 private:
  [[nodiscard]] static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  bool m_fill_recv_waits, m_fill_wan_waits, m_watch_recv;
  double m_embed_wait_s = 0.0;
  double m_norm_wait_s = 0.0;
  /// The wait being filled, until wait_ended.
  struct Wait {
    bool active = false;
    int index = 0;
    double start = 0.0;         ///< fill_wait's entry
    double last_pending = 0.0;  ///< the last test that found the wait not done
    bool arrived = false;       ///< the fill saw it done
  } m_wait;
};

}  // namespace atlas::bubbletea
