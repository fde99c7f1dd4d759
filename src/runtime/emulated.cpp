// SPDX-License-Identifier: MIT
// Emulated compute: deadline sleeps and the message sizes of one rank (runtime/emulated.hpp).
#include "atlas/runtime/emulated.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>

#include <sys/prctl.h>

#include "atlas/core/check.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::runtime {

double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void sleep_until_monotonic(double deadline_s) {
  if (!(deadline_s > 0)) return;
  // The default timer slack (50 us) lets every sleep end up to that late, and emulated compute
  // sleeps once per slot: tens of slots on a step's critical path (issue 24: forward slots of
  // 4.00 ms measured 4.05-4.12). A slack of 1 ns, per thread, asks the kernel for the deadline.
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(deadline_s);
  ts.tv_nsec = static_cast<long>((deadline_s - static_cast<double>(ts.tv_sec)) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  int rc = 0;
  while ((rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr)) == EINTR) {
  }
  ATLAS_ASSERT(rc == 0, "clock_nanosleep failed with error " << rc);
}

void emulate_compute(double seconds) {
  if (seconds > 0) sleep_until_monotonic(monotonic_s() + seconds);
}

EmulatedStage emulated_stage(const Config& cfg, const topo::Layout& layout, const sched::ScheduleTable& table,
                             int stage) {
  const sched::DeviceProfile profile = sched::device_profile(cfg);
  const sched::CostModel cost = sched::cost_model(cfg, layout, profile);
  const int pp = layout.pp_size();
  const double tp = layout.tp_size();
  EmulatedStage e;
  e.boundary_bytes = static_cast<std::size_t>(std::max<std::int64_t>(cost.act_bytes, 4));
  for (const auto& row : table.rows)
    for (const sched::Slot& s : row)
      if ((sched::is_send(s.kind) || sched::is_recv(s.kind)) && s.bytes > 0)
        e.boundary_bytes = static_cast<std::size_t>(s.bytes);
  auto floats = [](double bytes) { return static_cast<std::size_t>(std::ceil(std::max(bytes, 0.0) / sizeof(float))); };
  e.grad_floats = floats(sched::stage_params_per_gpu(cfg.model, stage, pp, tp) * profile.grad_bytes);
  e.bucket_floats = std::clamp<std::size_t>(cfg.train.dp_bucket_bytes / sizeof(float), 1, std::max<std::size_t>(1, e.grad_floats));
  if (pp > 1 && (stage == 0 || stage == pp - 1))
    e.embed_floats = floats(static_cast<double>(cfg.model.vocab) * cfg.model.hidden / tp * profile.grad_bytes);
  e.optimizer_s = cost.optimizer_ms[static_cast<std::size_t>(stage)] * 1e-3;
  return e;
}

}  // namespace atlas::runtime
