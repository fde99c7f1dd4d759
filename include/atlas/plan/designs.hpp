// SPDX-License-Identifier: MIT
// The four designs of the paper reproduction, simulated side by side for one deck:
//   (a) DP across DCs: every DC holds whole pipelines; gradients all-reduced over the WAN (ring
//       over the DCs, one TCP flow per link; also reported at full link capacity);
//   (b) PP across DCs, 1F1B, one TCP flow per transfer, concurrent transfers share a link;
//   (c) ATLAS: multi-rail (wan.rails flows per transfer), temporal sharing (atlas schedule) and
//       the heuristic placement (place_stages + chain_order);
//   (d) (c) with BubbleTea's utilization modelled by sim::fill_bubbles.
// And the grid over latency, DC count, model and dp. All timing goes through sched's engine.
#pragma once

#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::plan {

/// A model shape by name: 7b (32 x 4096, 32 heads), 13b (40 x 5120, 40), 70b (80 x 8192, 64),
/// 175b (GPT-3: 96 x 12288, 96); seq_len 2048, vocab 50304. ConfigError for other names.
ModelCfg model_preset(const std::string& name);

struct CompareOptions {
  int prefill_tokens = 512;     ///< (d): prompt tokens of one prefill placed in a bubble
  bool atlas_full_search = true;
  bool planner = false;         ///< also (c*): the planner's fastest plan on the same DCs and batch
  int planner_simulate_top = 16;  ///< plans the planner simulates for (c*)
};

struct Comparison {
  // layout of (b) and (c)
  int tp = 1, pp = 1, dp = 1, micro_batches = 1, micro_batch_size = 1;
  std::vector<int> stages_per_dc_b;   ///< the deck's placement (b)
  std::vector<int> stages_per_dc_c;   ///< the heuristic placement (c), pipeline order
  std::vector<int> dc_order_c;
  // layout of (a)
  bool a_fits = false;                ///< false: no whole-model pipeline fits a DC's GPUs
  int stages_a = 0;                   ///< stages of one (a) pipeline (inside one DC)
  int pipelines_a = 0;                ///< (a) pipelines over all DCs
  int micro_batches_a = 0;            ///< per (a) pipeline (global batch kept)
  double wan_allreduce_ms = 0.0;      ///< (a)'s gradient all-reduce over the WAN, one flow
  double wan_allreduce_cap_ms = 0.0;  ///< the same at full link capacity
  // results
  double step_a_ms = 0.0, step_a_cap_ms = 0.0, step_b_ms = 0.0, step_c_ms = 0.0;
  double step_plan_ms = 0.0;          ///< (c*) the planner's fastest plan (0 = not run)
  double util_plan = 0.0;
  int plan_tp = 0, plan_pp = 0, plan_dp = 0, plan_gpus = 0, plan_dcs = 0;
  double util_a = 0.0, util_b = 0.0, util_c = 0.0, util_d = 0.0;
  double util_a_cap = 0.0;            ///< (a'): (a) with the WAN all-reduce at full link capacity
  double tokens_per_step = 0.0;
  int gpus = 0;
  /// Memory per GPU of (b)'s and (c)'s tables (sched::memory_per_gpu) and the device's usable
  /// memory (0 = unknown): a design that does not fit is flagged, never passed off as a time.
  double mem_b_bytes = 0.0, mem_c_bytes = 0.0, mem_limit_bytes = 0.0;
  [[nodiscard]] bool b_fits() const { return mem_limit_bytes <= 0 || mem_b_bytes <= mem_limit_bytes; }
  [[nodiscard]] bool c_fits() const { return mem_limit_bytes <= 0 || mem_c_bytes <= mem_limit_bytes; }
};

/// Simulates (a)-(d) for the deck's model, cluster, tp, pp, dp and global batch.
Comparison compare_designs(const Config& cfg, const sched::DeviceProfile& profile, const CompareOptions& opt = {});

struct GridSpec {
  std::vector<double> latencies_ms{5, 10, 20, 50, 100};  ///< one-way, every DC pair
  std::vector<int> dc_counts{2, 3, 4, 5};
  std::vector<std::string> models{"7b", "13b", "70b", "175b"};
  std::vector<int> dps{2, 4, 8, 16};
  int tp = 8;
  int micro_batches_per_stage = 4;  ///< micro-batches per pipeline = this * pp
};

struct GridRow {
  std::string model;
  int dcs = 0;
  double latency_ms = 0.0;
  int dp = 0;
  int tp = 0, pp = 0, stages_per_dc = 0, gpus = 0, micro_batches = 0;
  double global_batch_tokens = 0.0;
  Comparison c;
  double speedup_c_over_a = 0.0, speedup_c_over_a_cap = 0.0, speedup_c_over_b = 0.0;
  double speedup_plan_over_a_cap = 0.0, speedup_plan_over_b = 0.0;  ///< (c*), when run
};

/// The deck of one grid point: `n` DCs of dp * tp * k GPUs each (k = the fewest stages per DC
/// with which a whole-model pipeline of k stages fits a GPU, so (a) is possible), every pair at
/// `latency_ms` one-way and the base deck's bandwidth; pp = n * k, micro-batches = 4 * pp.
Config grid_config(const Config& base, const sched::DeviceProfile& profile, const std::string& model, int n,
                   double latency_ms, int dp, const GridSpec& spec);

/// Runs the grid. `progress` (may be null) is called after each point.
std::vector<GridRow> run_grid(const Config& base, const sched::DeviceProfile& profile, const GridSpec& spec,
                              const CompareOptions& opt, void (*progress)(const GridRow&) = nullptr);

std::string grid_csv(const std::vector<GridRow>& rows);
std::string grid_markdown(const std::vector<GridRow>& rows);

}  // namespace atlas::plan
