// SPDX-License-Identifier: MIT
// Cost model from a deck. Compute from FLOPs (or a measured per-block time), WAN from the
// deck's matrices with a per-flow cap of window / RTT per TCP connection, intra-DC from the
// deck's intra bandwidth and latency.
#include "atlas/sched/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

namespace atlas::sched {

namespace {

// Published dense BF16 peaks (NVIDIA datasheets: A100 SXM 312 TFLOP/s, H100 SXM 989, H200 SXM
// 989) times an achievable fraction of 0.45 (Megatron-LM reports 40-50% model FLOP utilisation).
// Host: a conservative 20 GFLOP/s per rank for OpenBLAS sgemm on 2 shared cores; `atlas profile`
// measures the real figure.
double profile_flops(GpuKind g) {
  switch (g) {
    case GpuKind::Host: return 20e9;
    case GpuKind::A100: return 312e12 * 0.45;
    case GpuKind::H100: return 989e12 * 0.45;
    case GpuKind::H200: return 989e12 * 0.45;
  }
  return 20e9;
}

/// Memory bandwidth for the optimizer's streaming update, bytes/s.
double profile_mem_bw(GpuKind g) {
  switch (g) {
    case GpuKind::Host: return 8e9;
    case GpuKind::A100: return 2.0e12;
    case GpuKind::H100: return 3.35e12;
    case GpuKind::H200: return 4.8e12;
  }
  return 8e9;
}

double stage_params(const ModelCfg& m, int stage, int pp) {
  const double h = m.hidden;
  double p = m.stage_layers(stage, pp) * (12.0 * h * h + 13.0 * h);
  if (stage == 0) p += (m.vocab + m.seq_len) * h;
  if (stage == pp - 1) p += 2 * h + (pp > 1 ? m.vocab * h : 0.0);
  return p;
}

}  // namespace

double device_flops(const Config& cfg) {
  if (cfg.schedule.device_tflops > 0) return cfg.schedule.device_tflops * 1e12;
  return profile_flops(cfg.plan.gpu);
}

double block_forward_flops(const ModelCfg& m, double tokens) {
  const double h = m.hidden;
  return 24.0 * tokens * h * h + 4.0 * tokens * m.seq_len * h;
}

void apply_host_sharing(CostModel& c, const Config& cfg) {
  c.ranks_per_host = cfg.cluster.ranks_per_host;
  c.cores_per_host = cfg.cluster.cores_per_host > 0 ? cfg.cluster.cores_per_host
                                                    : std::max(1u, std::thread::hardware_concurrency());
  c.wake_ms = cfg.cluster.host_wake_us / 1e3;
  c.net_ns_per_byte = cfg.cluster.host_net_ns_per_byte;
}

CostModel cost_model(const Config& cfg, const topo::Layout& layout) {
  CostModel c;
  c.pp = layout.pp_size();
  c.dp = layout.dp_size();
  c.tp = layout.tp_size();
  c.dc_count = layout.dc_count();
  for (int s = 0; s < c.pp; ++s) c.stage_dc.push_back(layout.dc_of_stage(s));
  apply_host_sharing(c, cfg);  // ranks per host, cores, the wake-up delay per message step

  const auto& m = cfg.model;
  const double tokens = static_cast<double>(cfg.train.micro_batch_size) * m.seq_len;
  const double flops = device_flops(cfg);
  const double block_flops = block_forward_flops(m, tokens);
  const double head_flops = 2.0 * tokens * m.hidden * m.vocab;  // LM head (not TP-split) + loss
  double block_ms = 0.0;
  double head_ms = 0.0;
  if (cfg.schedule.fwd_ms_per_layer > 0) {
    // A measured block time; the head is scaled from it by FLOPs.
    block_ms = cfg.schedule.fwd_ms_per_layer;
    head_ms = block_ms * head_flops / block_flops;
  } else {
    block_ms = block_flops / c.tp / flops * 1e3;
    head_ms = head_flops / flops * 1e3;
  }
  const double bytes_per_ms = cfg.cluster.intra_bandwidth_gbps * 1e9 / 8.0 / 1e3;
  c.intra_bytes_per_ms = bytes_per_ms;
  c.intra_latency_ms = cfg.cluster.intra_latency_us / 1e3;
  c.act_bytes = static_cast<std::int64_t>(tokens) * m.hidden * 4;

  for (int s = 0; s < c.pp; ++s) {
    const double fwd = m.stage_layers(s, c.pp) * block_ms + (s == c.pp - 1 ? head_ms : 0.0);
    c.fwd_ms.push_back(fwd);
    c.bwd_ms.push_back(fwd * cfg.schedule.bwd_over_fwd);
    const double grad_bytes = stage_params(m, s, c.pp) / c.tp * 4.0;
    double ar = 0.0;
    if (c.dp > 1)
      ar = 2.0 * (c.dp - 1) / c.dp * grad_bytes / bytes_per_ms +
           2.0 * (c.dp - 1) * (c.intra_latency_ms + c.wake_ms);
    c.allreduce_ms.push_back(ar);
    c.optimizer_ms.push_back(stage_params(m, s, c.pp) / c.tp * 28.0 / profile_mem_bw(cfg.plan.gpu) * 1e3);
  }

  // WAN links. One TCP flow moves at most window / RTT; a transfer striped over `rails`
  // connections moves at most rails times that.
  const int n = c.dc_count;
  const int flows = cfg.wan.transport == WanTransport::Multirail ? cfg.wan.rails : 1;
  const double window = cfg.wan.flow_window_bytes > 0 ? static_cast<double>(cfg.wan.flow_window_bytes)
                                                      : kDefaultTcpWindowBytes;
  c.links.resize(static_cast<std::size_t>(n * n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      LinkCost& l = c.links[static_cast<std::size_t>(a * n + b)];
      const bool scalar = cfg.cluster.latency_ms.size() == 1;
      l.latency_ms = a == b ? 0.0 : (scalar ? cfg.cluster.latency_ms[0] : cfg.cluster.latency(a, b));
      const bool bscalar = cfg.cluster.bandwidth_gbps.size() == 1;
      const double gbps = bscalar ? cfg.cluster.bandwidth_gbps[0] : cfg.cluster.bandwidth(a, b);
      l.capacity_bytes_per_ms = a == b ? bytes_per_ms : std::max(gbps, 1e-9) * 1e9 / 8.0 / 1e3;
      const double rtt_ms = 2.0 * l.latency_ms;
      l.flow_cap_bytes_per_ms =
          rtt_ms > 0 ? std::min(l.capacity_bytes_per_ms, flows * window / rtt_ms) : l.capacity_bytes_per_ms;
    }

  // Tied embedding: when the first and last stage sit in different DCs, their embedding
  // gradients are summed once per step over the WAN (the one gradient that crosses it): each
  // sends its half over the WAN transport as it reaches the AllReduce slot and waits for the
  // other's, one way (latency plus the bytes) after the other reached it.
  if (c.pp > 1) {
    const int first_dc = c.stage_dc.front();
    const int last_dc = c.stage_dc.back();
    const double emb_bytes = static_cast<double>(m.vocab) * m.hidden * 4.0 / c.tp;
    const LinkCost& l = c.link(first_dc, last_dc);
    c.embed_sync_ms = l.latency_ms + emb_bytes / std::min(l.capacity_bytes_per_ms, l.flow_cap_bytes_per_ms);
  }
  return c;
}

}  // namespace atlas::sched
