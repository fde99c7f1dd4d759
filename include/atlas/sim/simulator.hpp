// SPDX-License-Identifier: MIT
// The datacenter-scale simulator: it times the *same* schedule table the runtime walks (built by
// sched from the deck) under the simulator's cost model (device profile, WAN per-flow caps,
// collective models), through sched's discrete-event engine, and measures the result: step
// time, per-replica busy/idle, bubbles, WAN utilization, tokens/s. One process, no MPI.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::sim {

using sched::DeviceProfile;

/// Use of one WAN link (one direction of a DC pair) during one step.
struct LinkUse {
  int src_dc = 0;
  int dst_dc = 0;
  double bytes = 0.0;            ///< bytes carried per step
  double busy_ms = 0.0;          ///< time with at least one transfer on the link
  double utilization = 0.0;      ///< bytes / (capacity * step): fraction of capacity used
  double busy_fraction = 0.0;    ///< busy_ms / step
};

/// Busy/idle of one pipeline stage, over its DP replicas (the TP ranks of a replica share a row).
struct StageUse {
  int stage = 0;
  int dc = 0;
  double compute_ms = 0.0;       ///< forward + backward, mean over the replicas
  double other_ms = 0.0;         ///< DP all-reduce + optimizer, mean
  double idle_min_ms = 0.0;
  double idle_max_ms = 0.0;
  double bubble_fraction = 0.0;  ///< mean idle / step
};

struct SimResult {
  sched::ScheduleTable table;    ///< the timed table (schedule.kind), JSON via sched::to_json
  sched::CostModel cost;         ///< the cost model it was timed with
  double step_ms = 0.0;
  double tokens_per_step = 0.0;  ///< dp * micro_batches * micro_batch_size * seq_len
  double tokens_per_s = 0.0;
  int gpus = 0;                  ///< pp * dp * tp
  double bubble_fraction = 0.0;  ///< mean idle / step over the rows
  double compute_utilization = 0.0;  ///< mean (forward + backward) / step over the rows
  std::vector<StageUse> stages;
  std::vector<LinkUse> links;
  double max_link_utilization = 0.0;
  std::string profile_name;      ///< the device profile used ("" if a cost model was given)
};

/// Measures a timed table (rows and links) under `cost`. `tokens_per_step` sets tokens/s.
SimResult measure(const sched::ScheduleTable& table, const sched::CostModel& cost, double tokens_per_step);

/// Which table the deck's simulation times.
enum class TableSource : std::uint8_t {
  Deck,    ///< the runtime's table (sched::build_schedule(cfg, layout)), re-timed: fidelity mode
  Search,  ///< a table built by sched from the simulator's own costs (best case at scale)
};

struct SimOptions {
  TableSource source = TableSource::Deck;
  bool atlas_full_search = true;  ///< Search mode: the whole atlas candidate search
  /// Multiplies every compute cost (forward, backward, optimizer) of the profile: a what-if for a
  /// slower or faster device, or the calibration of a prediction against a run's measured compute.
  double compute_scale = 1.0;
  /// Per stage (empty, or one per stage): forward and backward costs measured elsewhere, e.g. in
  /// situ (sim::insitu_compute), in place of the profile's; the stage's optimizer cost scales by
  /// the same ratio as its forward + backward. Applied before compute_scale.
  std::vector<double> stage_fwd_ms;
  std::vector<double> stage_bwd_ms;
};

/// Simulates one step of the deck's job under its device profile (sched::device_profile).
SimResult simulate(const Config& cfg, const SimOptions& opt = {});
/// Same, with an explicit profile.
SimResult simulate(const Config& cfg, const DeviceProfile& profile, const SimOptions& opt);
/// The deck's table (the runtime's, built from `deck`) timed with the costs of `machine`: the same
/// deck as it really runs somewhere else (machine_config), for `atlas bench fidelity`.
SimResult simulate_on(const Config& deck, const Config& machine, const SimOptions& opt = {});
/// Same, with an explicit profile for the machine.
SimResult simulate_on(const Config& deck, const Config& machine, const DeviceProfile& profile,
                      const SimOptions& opt = {});
/// Builds and times a table straight from a cost model (tests, planner, designs). With
/// atlas_baseline false an atlas table is built without timing 1F1B for comparison
/// (AtlasChoice::baseline_1f1b_ms stays 0; the planner, which never shows it, saves that run).
SimResult simulate(const sched::CostModel& cost, ScheduleKind kind, int micro_batches,
                   double tokens_per_step, bool atlas_full_search = true, bool atlas_baseline = true,
                   const std::shared_ptr<sched::SearchRuns>& atlas_runs = nullptr);

/// What the simulator predicts for a deck; the fidelity bench compares it with a real run.
struct Prediction {
  double step_ms = 0.0;
  double bubble_fraction = 0.0;      ///< mean idle / step
  double compute_utilization = 0.0;  ///< mean (forward + backward) / step
  double tokens_per_s = 0.0;
  double max_link_utilization = 0.0; ///< busiest WAN link, bytes / (capacity * step)
  double wan_bytes_per_step = 0.0;   ///< all WAN links together
  std::uint64_t structure_hash = 0;  ///< of the table (equals the runtime's table's hash)
  std::string profile_name;
};

/// The simulator half of `atlas bench fidelity`: the deck's own table re-timed by the simulator.
Prediction predict(const Config& cfg);
/// The prediction of a SimResult (simulate, simulate_on).
Prediction prediction(const SimResult& r);

/// Where a deck's job really runs when it is not what the deck describes: `atlas bench fidelity`
/// runs every example deck on one CPU host, inside the emulated WAN or on loopback.
struct RunMachine {
  bool loopback_wan = false;  ///< DCs joined by loopback: 0 ms latency, the intra-DC bandwidth
  bool host_backend = false;  ///< CPU ranks: compute from the host profile (plan.gpu = host), not
                              ///< the deck's schedule.fwd_ms_per_layer / device_tflops
  int ranks_per_host = 0;     ///< > 0: this many ranks share one host's cores
  double cores_per_host = 0;  ///< those cores (0 = this machine's hardware threads)
  double wake_ms = 0;         ///< a waiting receiver's wake-up delay there (runtime::probe_wake_delay)
  double net_ns_per_byte = 0; ///< host CPU per WAN byte there (runtime::probe_net_cpu)
};
/// The deck with its cluster, device and compute keys replaced by the machine's (for simulate_on).
Config machine_config(const Config& deck, const RunMachine& machine);

/// BubbleTea's utilization at scale, modelled: every Idle slot of the table is filled with whole
/// prefills of `prefill_tokens` tokens that fit in it after `guard_ms`; a prefill on stage s takes
/// fwd_ms[s] * prefill_tokens / tokens_per_micro_batch. With `fill_wan_waits` (the runtime's
/// bubbletea.fill_wan_waits) also the gradient-norm round trip inside each Optimizer slot when
/// the pipeline spans DCs (the slot minus the optimizer's own time). This is the utilization with
/// enough inference load, ignoring the prefills' own pipeline dependencies (an upper bound on
/// what BubbleTea can admit).
struct FillResult {
  double utilization = 0.0;        ///< mean (forward + backward + prefill) / step
  double prefill_ms = 0.0;         ///< prefill time per step, summed over rows
  long long prefills = 0;          ///< prefills per step, summed over rows
};
FillResult fill_bubbles(const sched::ScheduleTable& table, const sched::CostModel& cost,
                        double tokens_per_micro_batch, int prefill_tokens, double guard_ms,
                        bool fill_wan_waits = false);

/// Text report: step time, tokens/s, per-stage busy/idle, WAN links.
std::string report(const SimResult& r, const std::vector<std::string>& dc_names);

}  // namespace atlas::sim
