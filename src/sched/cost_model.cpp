// SPDX-License-Identifier: MIT
// The schedule's cost model (see cost_model.hpp): compute from the device profile, TP all-reduces
// over NVLink, DP ring all-reduce inside a DC (or over the WAN with parallel.dp_across_dcs: the runtime's ring over point-to-point), WAN
// links capped per TCP flow.
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/memory.hpp"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace atlas::sched {

namespace {

/// Forward FLOPs of a block's linears per token: 2 x their weights (24 h^2 for GPT's).
double linear_flops_per_token(const ModelCfg& m) {
  const double h = m.hidden;
  return 2.0 * h * (m.qkv_width() + h + m.mlp_up_width() + static_cast<double>(m.ffn()));
}

}  // namespace

double block_forward_flops(const ModelCfg& m, double tokens) {
  const double h = m.hidden;
  return tokens * linear_flops_per_token(m) + 4.0 * tokens * m.seq_len * h;
}

double block_weight_grad_fraction(const ModelCfg& m) {
  const double linear = linear_flops_per_token(m);   // per token
  const double attention = 4.0 * m.seq_len * static_cast<double>(m.hidden);  // per token
  return linear / (2.0 * (linear + attention));
}

double CostModel::bwd_weight_ms(int stage) const {
  const auto s = static_cast<std::size_t>(stage);
  const double share = s < weight_grad_share.size() ? weight_grad_share[s] : kDefaultWeightGradShare;
  return bwd_ms[s] * share;
}

double device_flops(const Config& cfg) {
  if (cfg.schedule.device_tflops > 0) return cfg.schedule.device_tflops * 1e12;
  const DeviceProfile p = builtin_device_profile(cfg.plan.gpu);
  return p.peak_tflops * 1e12 * p.achievable_fraction;
}

void apply_host_sharing(CostModel& c, const Config& cfg) {
  c.ranks_per_host = cfg.cluster.ranks_per_host;
  c.cores_per_host = cfg.cluster.cores_per_host > 0 ? cfg.cluster.cores_per_host
                                                    : std::max(1u, std::thread::hardware_concurrency());
  c.wake_ms = cfg.cluster.host_wake_us / 1e3;
  c.net_ns_per_byte = cfg.cluster.host_net_ns_per_byte;
}

double ring_allreduce_ms(double bytes, int n, double bytes_per_ms, double latency_ms) {
  if (n <= 1) return 0.0;
  return 2.0 * (n - 1) / n * bytes / bytes_per_ms + 2.0 * (n - 1) * latency_ms;
}

double transfer_cap_bytes_per_ms(double capacity, double one_way_latency_ms, int flows, double window_bytes) {
  const double rtt = 2.0 * one_way_latency_ms;
  if (rtt <= 0) return capacity;
  return std::min(capacity, flows * window_bytes / rtt);
}

int flows_per_transfer(const Config& cfg) {
  return cfg.wan.transport == WanTransport::Multirail ? cfg.wan.rails : 1;
}

double flow_window_bytes(const Config& cfg) {
  return cfg.wan.flow_window_bytes > 0 ? static_cast<double>(cfg.wan.flow_window_bytes)
                                       : kDefaultTcpWindowBytes;
}

namespace {

/// Ring all-gather (= reduce-scatter) of `bytes` (the gathered size) over `n` members.
double ring_allgather_ms(double bytes, int n, double bytes_per_ms, double latency_ms) {
  if (n <= 1) return 0.0;
  return (n - 1.0) / n * bytes / bytes_per_ms + (n - 1.0) * latency_ms;
}

/// Time of `m x k` by `k x n` and its two backward GEMMs (data gradient m x n -> m x k, weight
/// gradient k x m by m x n), each on the profile's efficiency curve at its own shape.
struct GemmPair {
  double fwd = 0.0;
  double bwd = 0.0;
};
GemmPair linear(const DeviceProfile& p, double m, double n, double k) {
  return {p.gemm_ms(m, n, k), p.gemm_ms(m, k, n) + p.gemm_ms(k, n, m)};
}

/// The block from its kernels (a profile without a measured table, schedule.device_tflops unset):
/// the four linears of one TP rank on the GEMM efficiency curve, the attention core (fused:
/// compute-bound at the curve's head-dimension point; unfused: two batched GEMMs and a
/// memory-bound softmax + dropout over the s x s scores), LayerNorms, bias + GELU, bias + dropout
/// + residual against memory bandwidth (split over TP with sequence parallelism), the TP
/// collectives (2 all-reduces per pass, or with sequence parallelism 2 all-gathers + 2
/// reduce-scatters: the same bytes), recomputation (full: the forward again before the
/// backward; selective: the attention core again).
BlockCost kernel_block_cost(const Config& cfg, int tp, const DeviceProfile& p) {
  const ModelCfg& m = cfg.model;
  const double b = cfg.train.micro_batch_size;
  const double s = m.seq_len;
  const double T = b * s;
  const double h = m.hidden;
  const double t = tp;
  const double d = h / std::max(m.heads, 1);
  const double ab = p.activation_bytes;
  BlockCost c;

  // Linears: QKV (column-parallel; GQA's key/value heads replicated where tp exceeds them),
  // attention projection (row-parallel), MLP up (SwiGLU: gate and up) and down.
  const double qkv_n = (1.0 + 2.0 * m.kv_share(tp)) * h / t;
  const double f = static_cast<double>(m.ffn());
  const double up_n = m.mlp_up_width() / t;
  const GemmPair qkv = linear(p, T, qkv_n, h);
  const GemmPair proj = linear(p, T, h, h / t);
  const GemmPair up = linear(p, T, up_n, h);
  const GemmPair down = linear(p, T, h, f / t);
  const double gemm_fwd = qkv.fwd + proj.fwd + up.fwd + down.fwd;
  const double gemm_bwd = qkv.bwd + proj.bwd + up.bwd + down.bwd;

  // Attention core over the rank's heads.
  const double groups = b * m.heads / t;  // (sample, head) pairs on this rank
  double attn_fwd = 0.0;
  double attn_bwd = 0.0;
  if (p.fused_attention) {
    // Causal FlashAttention: half of the 4 b s^2 h / t FLOPs; backward 5 GEMMs to forward's 2.
    const double flops = 0.5 * 4.0 * b * s * s * h / t;
    attn_fwd = flops / (p.peak_tflops * 1e12 * std::max(p.gemm_efficiency(s, s, d), 1e-6)) * 1e3;
    attn_bwd = 2.5 * attn_fwd;
  } else {
    const double scores = groups * s * s;  // elements of the s x s scores
    // Scale-mask-softmax r/w, dropout r/w + mask; backward: dropout's and softmax's (without
    // dropout: the softmax's alone, its output and gradient read, the input gradient written).
    const bool drop = m.dropout;
    attn_fwd = p.gemm_ms(s, s, d, groups) + p.gemm_ms(s, d, s, groups) +
               p.memory_ms(scores * (drop ? 4 * ab + 1 : 2 * ab));
    attn_bwd = 2 * p.gemm_ms(s, d, s, groups) + 2 * p.gemm_ms(s, s, d, groups) +
               p.memory_ms(scores * (drop ? 6 * ab + 1 : 3 * ab));
  }

  // Element-wise work: 2 LayerNorms (read + write), 2 bias-dropout-adds (2 reads, a write, a
  // 1-byte mask without model.dropout = false) on the rank's share of the residual stream; bias +
  // GELU on the MLP's ffn / t (read + write), or SwiGLU's SiLU(gate) x up (2 reads, a write).
  const double residual = T * h / (p.sequence_parallel ? t : 1.0);
  const double mask = m.dropout ? 1.0 : 0.0;
  const double act_rw = m.mlp == MlpKind::SwiGlu ? 3.0 : 2.0;
  const double elem_fwd = p.memory_ms(residual * (2 * 2 * ab + 2 * (3 * ab + mask)) + T * f / t * act_rw * ab);
  const double elem_bwd = 2.0 * elem_fwd;

  // TP collectives of the block's activations (T x h): with sequence parallelism an all-gather
  // before each of the two column-parallel linears and a reduce-scatter after each row-parallel
  // one, else two all-reduces; per pass.
  const double act = T * h * ab;
  const double bw = p.nvlink_gbs * p.nvlink_efficiency * 1e9 / 1e3;
  const double lat = p.nvlink_latency_us / 1e3;
  c.tp_comm_ms = ring_allreduce_ms(act, tp, bw, lat);
  const double comm = p.sequence_parallel ? 2.0 * 2.0 * ring_allgather_ms(act, tp, bw, lat) : 2.0 * c.tp_comm_ms;

  const double compute_fwd = gemm_fwd + attn_fwd + elem_fwd;
  double compute_bwd = gemm_bwd + attn_bwd + elem_bwd;
  c.fwd_ms = compute_fwd + comm;
  c.bwd_ms = compute_bwd + comm;
  // The zero-bubble W: each linear's weight-gradient GEMM (k x m by m x n), at its own shape.
  c.bwd_weight_ms = p.gemm_ms(h, qkv_n, T) + p.gemm_ms(h / t, h, T) + p.gemm_ms(h, up_n, T) + p.gemm_ms(f / t, h, T);
  if (p.full_recompute) c.bwd_ms += c.fwd_ms;
  else if (p.selective_recompute && !p.fused_attention) c.bwd_ms += attn_fwd;  // fused recomputes already

  // LM head (vocab-parallel) and the fp32 cross-entropy over the rank's logits.
  const GemmPair head = linear(p, T, static_cast<double>(m.vocab) / t, h);
  const double logits = T * static_cast<double>(m.vocab) / t * 4.0;
  c.head_fwd_ms = head.fwd + p.memory_ms(3 * logits);
  c.head_bwd_ms = head.bwd + p.memory_ms(2 * logits);
  c.head_bwd_weight_ms = p.gemm_ms(h, static_cast<double>(m.vocab) / t, T);
  c.flops_per_s = block_forward_flops(m, T) / t / (compute_fwd * 1e-3);
  return c;
}

}  // namespace
double window_clocked_ms(double bytes, double share_bytes_per_ms, double rtt_ms, double window_bytes) {
  if (bytes <= 0.0) return 0.0;
  // Not window-bound (no window, or a window the share takes longer to send than a round trip):
  // the share.
  if (window_bytes <= 0.0 || window_bytes / share_bytes_per_ms >= rtt_ms) return bytes / share_bytes_per_ms;
  // A window leaves as a burst; the next one only when its acknowledgements come back, a round
  // trip after the first: ceil(bytes / window) - 1 round trips, then the last window's bytes.
  const double windows = std::ceil(bytes / window_bytes);
  return (windows - 1.0) * rtt_ms + (bytes - (windows - 1.0) * window_bytes) / share_bytes_per_ms;
}

double wan_ring_allreduce_ms(const CostModel& c, double bytes, int dp, int dp_per_dc, int sharing, double window_bytes) {
  if (dp <= 1) return 0.0;
  // Replicas are numbered DC by DC (dp_per_dc each); the ring is i -> i + 1 mod dp, 2 (dp - 1)
  // steps of one piece (bytes / dp) each. A member's step posts a receive from i - 1 and a send to
  // i + 1 and ends when both are done (device::make_ring_collective). Edge i -> i + 1: inside a DC
  // the intra-DC cost; between DCs one-way latency L, the link's share (capacity / sharing), one
  // TCP flow of window_bytes.
  const double piece = bytes / dp;
  const bool rendezvous = piece > kMpiEagerLimitBytes;
  // A rendezvous piece's first fragment (the eager limit) goes with the request; the rest after
  // the receiver's go-ahead, window-clocked (window_clocked_ms).
  const double rest = rendezvous ? piece - kMpiEagerLimitBytes : piece;
  const auto n = static_cast<std::size_t>(dp);
  std::vector<double> lat(n), xfer(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int a = static_cast<int>(i) / dp_per_dc, b = static_cast<int>((i + 1) % n) / dp_per_dc;
    if (a == b) {
      lat[i] = c.intra_latency_ms;
      xfer[i] = piece / c.intra_bytes_per_ms;  // a copy: the first fragment too
    } else {
      const LinkCost& link = c.link(a, b);
      lat[i] = link.latency_ms;
      xfer[i] = window_clocked_ms(rest, link.capacity_bytes_per_ms / sharing, 2.0 * link.latency_ms, window_bytes);
    }
  }
  if (dp > kRingReplayMaxMembers) {
    // Very large rings: every step as long as its slowest edge, the latency once.
    double step = 0.0, latency = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      step = std::max(step, (rendezvous ? 2.0 * lat[i] : 0.0) + xfer[i] + c.wake_ms);
      latency = std::max(latency, lat[i]);
    }
    return 2.0 * (dp - 1) * step + latency;
  }
  // The members' steps replayed (max-plus). Member i's step starts at P_i (its previous step's
  // end); its send to i + 1 is matched at M = max(P_i + L, P_{i+1}) (the request arrives, the
  // receiver has posted), leaves by M + L + xfer (the go-ahead is back) and is in at M + 2L + xfer;
  // an eager piece leaves at once, in at max(P_i + L + xfer, P_{i+1}). A step ends when its send
  // and its receive are done, plus the wake-up delay.
  // Members drift apart along the ring (each finishes a step after the one before it), and each
  // starts its next sum when its own ended (the compute between two sums is the same on every
  // member of a ring, so it drops out): replayed from a common start (the job's first step, whose
  // sum is shorter) for kRingReplayWarmup sums, then the mean of the next kRingReplayRounds is the
  // steady length returned, the job's period.
  std::vector<double> start(n, 0.0), prev(n), send_done(n), recv_done(n), settled(n, 0.0);
  for (int round = 0; round < kRingReplayWarmup + kRingReplayRounds; ++round) {
    if (round == kRingReplayWarmup) settled = start;
    prev = start;
    for (int k = 0; k < 2 * (dp - 1); ++k) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t to = (i + 1) % n;
        if (rendezvous) {
          const double matched = std::max(prev[i] + lat[i], prev[to]);
          send_done[i] = matched + lat[i] + xfer[i];
          recv_done[to] = matched + 2.0 * lat[i] + xfer[i];
        } else {
          send_done[i] = prev[i] + xfer[i];
          recv_done[to] = std::max(prev[i] + lat[i] + xfer[i], prev[to]);
        }
      }
      for (std::size_t i = 0; i < n; ++i) prev[i] = std::max(send_done[i], recv_done[i]) + c.wake_ms;
    }
    start = prev;
  }
  // The mean sum after the warm-up, over the members (they run at one rate; a member's sums may
  // alternate in length when the ring's period does not divide a sum's steps).
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += start[i] - settled[i];
  return total / static_cast<double>(n) / kRingReplayRounds;
}

void wan_dp_allreduce(CostModel& c, const Config& cfg, const topo::Layout& layout) {
  // Each stage's and TP lane's sum runs at about the same time: pp x tp flows share a link.
  for (int s = 0; s < c.pp; ++s) {
    const auto i = static_cast<std::size_t>(s);
    c.allreduce_ms[i] = dp_sync_ms(
        wan_ring_allreduce_ms(c, c.grad_bytes[i], c.dp, layout.dp_per_dc(), c.pp * c.tp, flow_window_bytes(cfg)),
        c.fwd_ms[i] + c.bwd_ms[i], cfg.train.micro_batches, cfg.train.zero_stage);
  }
}

BlockCost block_cost(const Config& cfg, int tp, const DeviceProfile& p) {
  const ModelCfg& m = cfg.model;
  const double tokens = static_cast<double>(cfg.train.micro_batch_size) * m.seq_len;
  const double block_flops = block_forward_flops(m, tokens);  // whole block
  const double head_flops = 2.0 * tokens * m.hidden * m.vocab;
  BlockCost c;
  if (cfg.schedule.fwd_ms_per_layer > 0) {
    // A measured block time stands for everything the block does; the head scales by FLOPs.
    c.fwd_ms = cfg.schedule.fwd_ms_per_layer;
    c.bwd_ms = c.fwd_ms * cfg.schedule.bwd_ratio();
    c.head_fwd_ms = c.fwd_ms * head_flops / block_flops;
    c.head_bwd_ms = c.head_fwd_ms * cfg.schedule.bwd_ratio();
    c.flops_per_s = block_flops / tp / (c.fwd_ms * 1e-3);
    // The same FLOP fractions split the measured backward (recompute, added below, is B's).
    c.bwd_weight_ms = c.bwd_ms * block_weight_grad_fraction(m);
    c.head_bwd_weight_ms = 0.5 * c.head_bwd_ms;  // the head's dW GEMM is half its backward
    if (p.full_recompute) c.bwd_ms += c.fwd_ms;
    return c;
  }
  if (p.table.empty() && cfg.schedule.device_tflops <= 0) return kernel_block_cost(cfg, tp, p);
  // A measured table (or schedule.device_tflops): the block's forward rate by its FLOPs.
  const double rank_flops = block_flops / tp;
  double ratio = p.bwd_ratio(rank_flops);
  if (cfg.schedule.device_tflops > 0) {
    c.flops_per_s = cfg.schedule.device_tflops * 1e12;
    ratio = cfg.schedule.bwd_ratio();
  } else {
    c.flops_per_s = p.fwd_flops_per_s(rank_flops);
  }
  const double compute_fwd = rank_flops / c.flops_per_s * 1e3;
  double compute_bwd = compute_fwd * ratio;
  c.bwd_weight_ms = compute_bwd * block_weight_grad_fraction(m);  // before recompute: that is B's
  if (p.selective_recompute) compute_bwd += 4.0 * tokens * m.seq_len * m.hidden / tp / c.flops_per_s * 1e3;
  // Two all-reduces (or all-gather + reduce-scatter with sequence parallelism: the same bytes)
  // of the block's activations per pass, over the node's links.
  const double act = tokens * m.hidden * p.activation_bytes;
  c.tp_comm_ms = ring_allreduce_ms(act, tp, p.nvlink_gbs * 1e9 / 1e3, p.nvlink_latency_us / 1e3);
  c.fwd_ms = compute_fwd + 2.0 * c.tp_comm_ms;
  c.bwd_ms = compute_bwd + 2.0 * c.tp_comm_ms;
  if (p.full_recompute) c.bwd_ms += c.fwd_ms;
  c.head_fwd_ms = head_flops / tp / c.flops_per_s * 1e3;
  c.head_bwd_ms = c.head_fwd_ms * ratio;
  c.head_bwd_weight_ms = 0.5 * c.head_bwd_ms;
  return c;
}

double stage_params(const ModelCfg& m, int stage, int pp) {
  const double h = m.hidden;
  double p = m.stage_layers(stage, pp) * static_cast<double>(m.block_parameter_count());
  if (stage == 0) p += (static_cast<double>(m.vocab) + m.seq_len) * h;
  if (stage == pp - 1) p += 2 * h + (pp > 1 ? static_cast<double>(m.vocab) * h : 0.0);
  return p;
}

double stage_params_per_gpu(const ModelCfg& m, int stage, int pp, int tp) {
  const double t = tp > 0 ? tp : 1;
  double p = stage_params(m, stage, pp) / t;
  const int kv = m.kv_head_count();
  if (t > kv && m.heads > 0) {
    const double head_dim = static_cast<double>(m.hidden) / m.heads;
    p += m.stage_layers(stage, pp) * 2.0 * head_dim * (m.hidden + 1.0) * (1.0 - kv / t);  // k, v weights + biases
  }
  return p;
}

double dp_sync_ms(double allreduce_ms, double compute_ms_per_micro, int micro_batches, int zero_stage) {
  if (zero_stage < 2 || micro_batches <= 1) return allreduce_ms;
  const double reduce_scatter = 0.5 * allreduce_ms;
  return allreduce_ms + (micro_batches - 1) * std::max(0.0, reduce_scatter - compute_ms_per_micro);
}

double boundary_element_bytes(const Config& cfg, const DeviceProfile& p) {
  if (cfg.device.precision == Precision::Auto && cfg.device.backend != Backend::Cuda) return p.activation_bytes;
  return activation_bytes(effective_precision(cfg.device));
}

CostModel cost_model(const Config& cfg, const topo::Layout& layout, const DeviceProfile& p) {
  CostModel c;
  c.pp = layout.pp_size();
  c.dp = layout.dp_size();
  c.tp = layout.tp_size();
  c.dc_count = layout.dc_count();
  c.virtual_stages = cfg.schedule.virtual_stages;
  for (int s = 0; s < c.pp; ++s) c.stage_dc.push_back(layout.dc_of_stage(s));

  const ModelCfg& m = cfg.model;
  const BlockCost block = block_cost(cfg, c.tp, p);
  const double tokens = static_cast<double>(cfg.train.micro_batch_size) * m.seq_len;
  c.intra_bytes_per_ms = cfg.cluster.intra_bandwidth_gbps * 1e9 / 8.0 / 1e3;
  c.intra_latency_ms = cfg.cluster.intra_latency_us / 1e3;
  const double lane_share = p.pipeline_scatter_gather ? c.tp : 1;
  c.act_bytes = static_cast<std::int64_t>(std::ceil(tokens * m.hidden * boundary_element_bytes(cfg, p) / lane_share));
  apply_host_sharing(c, cfg);  // ranks per host, cores, the wake-up delay per message step

  for (int s = 0; s < c.pp; ++s) {
    const int layers = m.stage_layers(s, c.pp);
    const bool last = s == c.pp - 1;
    c.fwd_ms.push_back(layers * block.fwd_ms + (last ? block.head_fwd_ms : 0.0));
    c.bwd_ms.push_back(layers * block.bwd_ms + (last ? block.head_bwd_ms : 0.0));
    const double weight = layers * block.bwd_weight_ms + (last ? block.head_bwd_weight_ms : 0.0);
    c.weight_grad_share.push_back(c.bwd_ms.back() > 0 ? std::clamp(weight / c.bwd_ms.back(), 0.0, 1.0) : 0.0);
    const double params = stage_params_per_gpu(m, s, c.pp, c.tp);
    c.allreduce_ms.push_back(
        dp_sync_ms(ring_allreduce_ms(params * p.grad_bytes, c.dp, c.intra_bytes_per_ms, c.intra_latency_ms + c.wake_ms),
                   c.fwd_ms.back() + c.bwd_ms.back(), cfg.train.micro_batches, p.zero_stage));
    c.grad_bytes.push_back(params * p.grad_bytes);
    c.optimizer_ms.push_back(params * p.optimizer_share(c.dp) * p.optimizer_bytes_per_param /
                             (p.mem_bandwidth_gbs * 1e9) * 1e3);
  }

  const int n = c.dc_count;
  const int flows = flows_per_transfer(cfg);
  const double window = flow_window_bytes(cfg);
  c.links.resize(static_cast<std::size_t>(n * n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      LinkCost& l = c.links[static_cast<std::size_t>(a * n + b)];
      const bool lscalar = cfg.cluster.latency_ms.size() == 1;
      const bool bscalar = cfg.cluster.bandwidth_gbps.size() == 1;
      l.latency_ms = a == b ? 0.0 : (lscalar ? cfg.cluster.latency_ms[0] : cfg.cluster.latency(a, b));
      const double gbps = bscalar ? cfg.cluster.bandwidth_gbps[0] : cfg.cluster.bandwidth(a, b);
      l.capacity_bytes_per_ms = a == b ? c.intra_bytes_per_ms : std::max(gbps, 1e-9) * 1e9 / 8.0 / 1e3;
      l.flow_cap_bytes_per_ms = transfer_cap_bytes_per_ms(l.capacity_bytes_per_ms, l.latency_ms, flows, window);
      l.window_bytes = a == b ? 0.0 : flows * window;
    }

  if (layout.dp_across_dcs()) c.dp_per_dc = layout.dp_per_dc();
  if (layout.dp_across_dcs() && n > 1) wan_dp_allreduce(c, cfg, layout);

  // Tied embedding: the first and last stage sum their embedding gradients once per step (over
  // the WAN when they sit in different DCs: the one gradient that crosses it), as sched models it.
  if (c.pp > 1) {
    const double bytes = static_cast<double>(m.vocab) * m.hidden * p.grad_bytes / c.tp;
    const LinkCost& l = c.link(c.stage_dc.front(), c.stage_dc.back());
    c.embed_sync_ms = l.latency_ms + bytes / std::min(l.capacity_bytes_per_ms, l.flow_cap_bytes_per_ms);
  }
  apply_memory(c, cfg, p);  // memory per GPU and the device's limit (memory.hpp)
  return c;
}

CostModel cost_model(const Config& cfg, const topo::Layout& layout) {
  return cost_model(cfg, layout, device_profile(cfg));
}

}  // namespace atlas::sched
