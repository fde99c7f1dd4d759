// SPDX-License-Identifier: MIT
// The schedule table's cost model: per-stage compute time per micro-batch, boundary tensor
// sizes, WAN links (latency, capacity, per-flow cap) and intra-DC costs. Built from a deck (and
// a device profile); the simulator can build a richer one. No I/O, no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {

struct LinkCost {
  double latency_ms = 0.0;          ///< one-way propagation delay
  double capacity_bytes_per_ms = 0; ///< link capacity
  double flow_cap_bytes_per_ms = 0; ///< one transfer's max rate (rails x per-TCP-flow cap)
};

struct CostModel {
  int pp = 1, dp = 1, tp = 1, dc_count = 1;
  std::vector<int> stage_dc;          ///< stage -> DC
  std::vector<double> fwd_ms;         ///< per stage, one micro-batch forward
  std::vector<double> bwd_ms;         ///< per stage, one micro-batch backward
  std::vector<double> allreduce_ms;   ///< per stage, DP gradient all-reduce
  /// Tied embedding (pp > 1): the first and last stage send each other their embedding gradient
  /// in the AllReduce slot; this is one way (latency + bytes), the wake-up added by the program.
  /// Each waits for the other's half only: the later one finds it there.
  double embed_sync_ms = 0.0;
  std::vector<double> optimizer_ms;   ///< per stage
  std::int64_t act_bytes = 0;         ///< boundary tensor per TP lane (activation = gradient size)
  std::vector<LinkCost> links;        ///< dc_count x dc_count, row-major (src, dst)
  double intra_latency_ms = 0.005;
  double intra_bytes_per_ms = 12.5e6; ///< 100 Gbit/s
  /// Shared hosts (CPU backend): world ranks [k*ranks_per_host, (k+1)*ranks_per_host) share the
  /// `cores_per_host` cores of host k, and their compute slows down when more ranks compute at
  /// once than there are cores. 0 = every rank has a dedicated device (GPUs).
  int ranks_per_host = 0;
  double cores_per_host = 0.0;
  /// Shared hosts with more ranks than cores: the delay from a message's arrival to its receiver
  /// running again (it waits for a core). Added to every delivery, round trip and ring step.
  /// 0 = a core or device per rank.
  double wake_ms = 0.0;
  /// Shared hosts: host CPU per byte sent between DCs (both ends together; cluster.host_net_ns_per_byte).
  double net_ns_per_byte = 0.0;

  [[nodiscard]] const LinkCost& link(int src_dc, int dst_dc) const {
    return links[static_cast<std::size_t>(src_dc * dc_count + dst_dc)];
  }
  /// Time of one intra-DC boundary transfer.
  [[nodiscard]] double local_transfer_ms(std::int64_t bytes) const {
    return intra_latency_ms + static_cast<double>(bytes) / intra_bytes_per_ms;
  }
};

/// Default per-TCP-flow window when the deck sets no cap: Linux's default tcp_rmem maximum.
inline constexpr double kDefaultTcpWindowBytes = 6.0 * 1024 * 1024;

/// Achieved FLOP/s of one rank for the FLOP estimate (plan.gpu profile, or the deck override).
double device_flops(const Config& cfg);

/// FLOPs of one transformer block's forward for `tokens` tokens (whole block, before TP split).
double block_forward_flops(const ModelCfg& m, double tokens);

/// Builds the cost model of the deck's job.
CostModel cost_model(const Config& cfg, const topo::Layout& layout);

/// Sets ranks_per_host / cores_per_host from cluster.ranks_per_host and cluster.cores_per_host
/// (0 cores = the hardware threads of this machine). Every cost-model builder calls it.
void apply_host_sharing(CostModel& cost, const Config& cfg);

}  // namespace atlas::sched
