// SPDX-License-Identifier: MIT
// Cost profiles: a device profile (compute rate, memory, intra-node links, optionally a table of
// measured per-block times), the input of the schedule's cost model, and a WAN profile (regions
// with an RTT and bandwidth matrix) for plan/simulate. Text format documented in
// profiles/README.md. Parsing and formatting only: the files are read by deck/profiles.hpp (the
// deck's device profiles) and sim/profile.hpp (--wan files).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "atlas/deck/config.hpp"

namespace atlas::sched {

/// One measured transformer block: forward and backward time of one micro-batch on one rank.
struct BlockPoint {
  int hidden = 0;
  int heads = 0;
  int seq_len = 0;
  int micro_batch_size = 0;
  int tp = 1;
  double fwd_ms = 0.0;
  double bwd_ms = 0.0;
  bool operator==(const BlockPoint&) const = default;
};

/// A device cost profile. Rates are per rank (per GPU, or per host rank).
struct DeviceProfile {
  std::string name;                    ///< host | a100 | h100 | h200 | any label
  std::string description;
  std::string path;                    ///< file it was read from ("" = built in)
  double peak_tflops = 0.0;            ///< dense peak of the training dtype, TFLOP/s
  double peak_tflops_tf32 = 0.0;       ///< dense TF32 tensor-core peak, TFLOP/s (0: not given; MFU only)
  double peak_tflops_fp32 = 0.0;       ///< fp32 (no tensor cores) peak, TFLOP/s (0: not given; MFU only)
  double achievable_fraction = 0.0;    ///< fraction of the peak a transformer block reaches
  double memory_gib = 0.0;             ///< device memory, GiB
  double usable_memory_fraction = 0.9; ///< what the planner may fill (context, fragmentation)
  double mem_bandwidth_gbs = 0.0;      ///< device memory bandwidth, GB/s (optimizer update)
  double nvlink_gbs = 0.0;             ///< per-GPU bandwidth to node peers, GB/s (TP all-reduce)
  double nvlink_latency_us = 0.0;      ///< per step of a TP ring
  double nvlink_efficiency = 1.0;      ///< fraction of nvlink_gbs a large NCCL collective reaches (bus bandwidth)
  double bwd_over_fwd = 2.0;           ///< backward time / forward time (no measured table)
  double activation_bytes = 2.0;       ///< bytes per stored activation / boundary element
  double grad_bytes = 4.0;             ///< bytes per gradient element in the DP all-reduce
  double state_bytes_per_param = 16.0; ///< weights + grads + Adam moments (+ fp32 master)
  double optimizer_bytes_per_param = 28.0;  ///< memory traffic of one AdamW update
  double board_power_w = 0.0;          ///< board power at full load, W (energy, power budgets; 0 = unknown)
  bool pipeline_scatter_gather = false; ///< each TP lane sends 1/tp of a boundary tensor
  bool sequence_parallel = false;      ///< activations outside attention/MLP split over TP too
  bool selective_recompute = false;    ///< attention scores recomputed in backward, not stored
  /// Every block's forward run again before its backward (train.recompute = full; not a file key:
  /// device_profile() sets it and selective_recompute from the deck).
  bool full_recompute = false;
  /// Attention core as one fused kernel (FlashAttention): compute-bound, no s x s tensor in device
  /// memory. false: Megatron-LM 2021's unfused QK^T, softmax, dropout, AV (memory-bound softmax).
  bool fused_attention = false;
  /// Optimizer-state sharding over a stage's DP replicas (train.zero_stage; not a file key:
  /// device_profile() sets it from the deck): 0 none, 1 the optimizer state, 2 the gradients too.
  int zero_stage = 0;
  /// GEMM efficiency curve: achieved fraction of peak_tflops against the smallest of a GEMM's
  /// (m, n, k), interpolated in log(dimension) and clamped at the ends. Empty: achievable_fraction.
  std::vector<double> gemm_min_dim;
  std::vector<double> gemm_fraction;
  int measured_threads = 0;            ///< BLAS threads of the measured table (0 = n/a)
  std::vector<BlockPoint> table;       ///< measured blocks (may be empty)
  std::vector<std::pair<std::string, std::string>> sources;  ///< (key, where the number is from)

  /// Achieved forward FLOP/s of one rank for a block of `fwd_flops` FLOPs (per rank). With a
  /// measured table: the table's rate interpolated in log(FLOPs) (clamped at the ends);
  /// otherwise peak * achievable_fraction.
  [[nodiscard]] double fwd_flops_per_s(double fwd_flops) const;
  /// Backward time / forward time at `fwd_flops` (measured ratio, else bwd_over_fwd).
  [[nodiscard]] double bwd_ratio(double fwd_flops) const;
  /// Achieved fraction of peak of one GEMM of shape (m, n, k) (the curve at min(m, n, k)).
  [[nodiscard]] double gemm_efficiency(double m, double n, double k) const;
  /// Time in ms of `batch` GEMMs (m x k) * (k x n) of `activation_bytes` elements: the slower of
  /// FLOPs at peak x gemm_efficiency and the bytes of A, B and C against mem_bandwidth_gbs.
  [[nodiscard]] double gemm_ms(double m, double n, double k, double batch = 1.0) const;
  /// Time in ms of memory-bound work moving `bytes` through device memory.
  [[nodiscard]] double memory_ms(double bytes) const;
  /// Bytes one GPU holds for `params` parameters of its stage shard: the compute copy of the
  /// weights (activation_bytes each), the gradients (grad_bytes) and the optimizer state (the rest
  /// of state_bytes_per_param: Adam moments and fp32 master weights), the last (zero_stage 1) or
  /// the last two (zero_stage 2) split over the stage's `dp` replicas.
  [[nodiscard]] double state_bytes(double params, int dp) const;
  /// The share of a stage's parameters whose optimizer step one GPU runs: 1 / dp with
  /// zero_stage >= 1 (each replica updates its shard, then the weights are gathered), else 1.
  [[nodiscard]] double optimizer_share(int dp) const;
  /// Bytes the planner may fill on one device.
  [[nodiscard]] double usable_bytes() const;
  bool operator==(const DeviceProfile&) const = default;
};

/// A WAN profile: regions and measured round-trip times (and assumed capacities) between them.
struct WanProfile {
  std::string name;
  std::string path;
  std::string date;                      ///< when the numbers were measured
  std::vector<std::string> regions;
  std::vector<double> rtt_ms;            ///< n*n, row-major, round trip
  std::vector<double> bandwidth_gbps;    ///< n*n, row-major (or one value for every pair)
  std::vector<std::pair<std::string, std::string>> sources;

  [[nodiscard]] int index(const std::string& region) const;  ///< -1 if absent
  /// Deck overrides (cluster.latency_ms = one-way = rtt/2, cluster.bandwidth_gbps) for `dcs`,
  /// each a region of this profile; ConfigError naming the unknown DC and the known regions.
  [[nodiscard]] std::vector<std::string> deck_overrides(const std::vector<std::string>& dcs) const;
};

/// Parses a device profile's text; ConfigError naming file:line for every problem.
DeviceProfile parse_device_profile(const std::string& file_name, const std::string& text);
/// Parses a WAN profile's text (square non-negative matrices, zero diagonal); ConfigError.
WanProfile parse_wan_profile(const std::string& file_name, const std::string& text);

/// Writes a device profile in the documented format (parse_device_profile reads it back).
std::string format_device_profile(const DeviceProfile& p);

/// The built-in profile of a GPU kind: the same numbers as profiles/device/<kind>.profile, so a
/// binary run outside the source tree still works (a unit test checks they agree).
DeviceProfile builtin_device_profile(GpuKind gpu);

/// The device profile of a deck's cost model, from the files read with the deck
/// (cfg.device_profiles, see deck/profiles.hpp): the first file of plan.profiles whose name is
/// plan.gpu (ConfigError if none is); else the profiles/device/<plan.gpu>.profile found; else the
/// built-in one. Internal error if the files were never read. No I/O.
DeviceProfile device_profile(const Config& cfg);

/// The GPU kind a CUDA device's name names ("... NVIDIA H200 ..." -> H200; A100, H100, H200,
/// case-insensitive), or nullopt.
[[nodiscard]] std::optional<GpuKind> gpu_kind_of_device(std::string_view device_name);

/// device_profile's choice for a device.backend = cuda deck that leaves plan.gpu = host (the h100
/// profile, as run_costing with no device name; the host profile would price a GPU step ~1000x
/// too long), said in a line for schedule, simulate and plan; "" for any other deck. Either way
/// led by ignored_costing_keys_note.
[[nodiscard]] std::string offline_costing_note(const Config& cfg);

/// A warning for costing keys the deck gives that have no effect (schedule.bwd_over_fwd without
/// a forward time to scale), with the fix; "" when there are none.
[[nodiscard]] std::string ignored_costing_keys_note(const Config& cfg);

/// Which device profile costs a run's table, and a line saying so.
struct RunCosting {
  GpuKind gpu = GpuKind::Host;
  std::string note;  ///< "# table costed with ...\n", with how to measure a profile
};
/// The costing of a run on `device_name` (the backend's describe(); "" when not known): plan.gpu,
/// except for a device.backend = cuda deck that leaves plan.gpu = host (whose profile prices a
/// GPU step ~1000x too long): the GPU the name names, else h100 (said in the note). Pure.
[[nodiscard]] RunCosting run_costing(const Config& cfg, std::string_view device_name);

}  // namespace atlas::sched
