// SPDX-License-Identifier: MIT
// The ATLAS planner: which DCs, how many GPUs in each, and which tp/pp/dp/micro-batch size. For
// every shape that fits each GPU's memory, the DC-selection heuristic places contiguous pipeline
// stages (each stage's dp x tp GPUs in one DC) in the DCs with the most free GPUs first; plans
// are pruned by a closed-form estimate and ranked by simulated step time (sim/, i.e. sched's
// engine on the atlas table). One process, no MPI, no I/O.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::plan {

/// One candidate layout and what it is predicted to do.
struct Plan {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int micro_batch_size = 1;
  int micro_batches = 1;
  std::vector<int> stages_per_dc;     ///< per deck DC (cfg.cluster.dcs order)
  std::vector<int> dc_order;          ///< DCs holding stages, in pipeline order
  std::vector<int> layers_per_stage;  ///< in pipeline order
  int gpus = 0;                       ///< pp * dp * tp
  double mem_bytes = 0.0;             ///< peak per-GPU memory (the fullest stage)
  double estimate_ms = 0.0;           ///< closed-form step estimate (used to prune)
  bool simulated = false;
  bool fully_timed = false;           ///< step_ms from the whole atlas search (else one candidate)
  bool split_backward = false;        ///< the timed table splits the backward (B + W; schedule.split_backward)
  bool split_tried = false;           ///< split_backward = auto: the split was timed for this plan (kept where faster)
  double step_floor_ms = 0.0;         ///< no table of this plan is faster: busiest row's work, busiest WAN link's bytes
  double step_ms = 0.0;               ///< simulated step time (atlas schedule)
  double tokens_per_s = 0.0;
  double utilization = 0.0;           ///< mean (forward + backward) / step
  double bubble_fraction = 0.0;
  double cost_per_step = 0.0;         ///< sum over DCs of GPUs * price per GPU-hour * step hours
  double power_kw = 0.0;              ///< GPUs x board power x PUE (at full load), kW
  double energy_kwh_per_step = 0.0;   ///< power_kw x step hours
  double co2_kg_per_step = 0.0;       ///< sum over DCs of energy x grid carbon intensity (0 = not known)
};

struct PlanOptions {
  int simulate_top = 0;          ///< plans simulated per ranking (0 = max(3 * plan.top, 32))
  bool final_full_search = true; ///< re-time the plan.top best with the whole atlas search
  /// Told what the search is doing ("quick-timing plan 3 of 57"); may be empty. Called from any
  /// of the search's threads, one call at a time; the caller shows it (atlas plan's progress line).
  std::function<void(const std::string&)> progress;
  /// Threads that time plans at once (each plan's simulation is independent and deterministic, so
  /// the result is the same for any count); 0 = the machine's hardware threads, at most 8.
  int threads = 0;
};

struct PlanResult {
  std::vector<Plan> plans;      ///< simulated plans, fastest first
  int best = -1;                ///< index of the fastest plan
  int chosen = -1;              ///< the plan best by `objective` (within plan.deadline_s if set); else best
  bool deadline_met = true;     ///< false when no plan meets plan.deadline_s (chosen = best)
  long long shapes = 0;         ///< (tp, pp, dp, micro-batch size) shapes considered
  long long fit_memory = 0;     ///< of those, fitting every GPU's memory
  long long placed = 0;         ///< of those, placeable in the free GPUs
  int global_batch = 0;         ///< sequences per step, kept constant across plans
  bool priced = false;          ///< cluster.price_per_gpu_hour given (else cost is GPU-hours)
  std::string profile_name;
  PlanObjective objective = PlanObjective::Time;  ///< what `chosen` minimises (plan.objective resolved)
  std::vector<int> usable_gpus;  ///< per DC: free GPUs it can power (cluster.power_mw), what plans may use
  double seconds = 0.0;         ///< wall time of the search
};

/// Deck problems that matter to the planner: deck::validate of the deck with its parallel layout
/// replaced by one stage of one GPU in the DC with the most GPUs (the planner replaces the layout,
/// so a layout that does not fit the cluster is no error here). Empty = plannable.
std::vector<std::string> validate_for_planning(const Config& cfg, bool cuda_built);

/// The target global batch: the deck's dp_size * micro_batches * micro_batch_size sequences.
int global_batch(const Config& cfg);

/// ATLAS placement: `pp` stages of `gpus_per_stage` GPUs each, contiguous, filling the DCs with
/// the most free GPUs first (ties: deck order). Stage counts per DC, or nullopt if they do not fit.
std::optional<std::vector<int>> place_stages(const std::vector<int>& free_gpus, int pp, int gpus_per_stage);

/// Pipeline order of the DCs holding stages: the order with the least total one-way latency
/// along the chain (exhaustive up to 8 DCs, else the placement order or its reverse) whose first
/// and last DC may hold the data/embedding stages (cluster.may_hold_data); empty if none can.
std::vector<int> chain_order(const Config& cfg, const std::vector<int>& stages_per_dc);

/// Per DC: the free GPUs it can power, min(gpus_per_dc, floor(power_mw x 1e6 / (board_power_w x
/// pue))); the free GPUs without cluster.power_mw. ConfigError if a budget is set and the profile
/// has no board power.
std::vector<int> powered_gpus(const Config& cfg, const sched::DeviceProfile& profile);

/// The DCs whose budget powers fewer GPUs than they have free (`powered`: powered_gpus), as
/// "name (powers N of M free)", comma-separated; empty when no budget limits a DC.
std::string power_limited_dcs(const Config& cfg, const std::vector<int>& powered);

/// The GPUs plan `p` holds in each DC (deck DC order).
std::vector<int> plan_gpus_per_dc(const Plan& p);

/// The GPUs the deck's own layout (parallel.*) holds in each DC (ParallelCfg::ranks_in_dc).
std::vector<int> deck_gpus_per_dc(const Config& cfg);

/// Power drawn at full load by `gpus_per_dc` GPUs (deck DC order): GPUs x board power x PUE, kW.
double power_kw(const Config& cfg, const sched::DeviceProfile& profile, const std::vector<int>& gpus_per_dc);

/// Their emissions, kg CO2 an hour (cluster.carbon_g_per_kwh; 0 without it).
double co2_kg_per_hour(const Config& cfg, const sched::DeviceProfile& profile, const std::vector<int>& gpus_per_dc);

/// The deck's own layout (parallel.*) against cluster.power_mw: one message per DC whose ranks
/// need more power than its budget, naming the budget, what it powers and the fix; empty when
/// every DC is within its budget or none is set.
std::vector<std::string> power_overruns(const Config& cfg, const sched::DeviceProfile& profile);

/// The deck's own layout against cluster.may_hold_data: one message per DC that holds a first or
/// last stage (the data-reading and embedding stages) but is marked 0; empty when none is.
std::vector<std::string> residency_violations(const Config& cfg);

/// "what it draws" for `gpus_per_dc` GPUs at a step of `step_ms`: kW, kWh a step and for
/// run.steps, kg CO2 likewise where carbon intensities are given; empty without a board power.
std::string energy_summary(const Config& cfg, const sched::DeviceProfile& profile, const std::vector<int>& gpus_per_dc,
                           double step_ms);

/// `layers` blocks over `pp` stages as evenly as possible (extra blocks to the middle stages).
std::vector<int> split_layers(int layers, int pp);

/// Searches every plan for the deck's cluster, model and global batch under `profile`. The
/// best estimates, and the deck's own (tp, pp, dp, micro-batch size) if it fits, are simulated.
/// ConfigError with numbers and a hint when nothing fits ("no plan fits: ...").
PlanResult search(const Config& cfg, const sched::DeviceProfile& profile, const PlanOptions& opt = {});

/// The deck of a plan: the base deck with its DCs reordered to pipeline order (unused DCs last,
/// with 0 stages), parallel.*, model.layers_per_stage, train.micro_*, schedule.kind = atlas.
/// The result passes deck validation.
Config plan_config(const Config& base, const Plan& plan);

/// The what-if table (plan.top rows, the chosen plan marked).
std::string what_if_table(const PlanResult& r, const Config& cfg, int rows);

}  // namespace atlas::plan
