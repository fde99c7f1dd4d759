// SPDX-License-Identifier: MIT
// The schedule table's cost model, the only one: per-stage compute time per micro-batch (from the
// deck's device profile), boundary tensor sizes, WAN links (latency, capacity, per-flow cap) and
// intra-DC costs. The runtime's table, `atlas schedule`, the simulator and the planner all build
// theirs with it. No I/O, no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {

struct LinkCost {
  double latency_ms = 0.0;          ///< one-way propagation delay
  double capacity_bytes_per_ms = 0; ///< link capacity
  double flow_cap_bytes_per_ms = 0; ///< one transfer's max rate (rails x per-TCP-flow cap)
  /// Bytes one peer pair can have on the wire at once: rails x the per-flow window (0: unknown).
  double window_bytes = 0;
};

struct CostModel {
  int pp = 1, dp = 1, tp = 1, dc_count = 1;
  std::vector<int> stage_dc;          ///< stage -> DC
  /// Model chunks per stage (schedule.virtual_stages, interleaved 1F1B): chunk c of stage s is
  /// virtual stage c * pp + s; one chunk's forward / backward is fwd_ms / bwd_ms divided by it.
  int virtual_stages = 1;
  std::vector<double> fwd_ms;         ///< per stage, one micro-batch forward (all its chunks)
  std::vector<double> bwd_ms;         ///< per stage, one micro-batch backward
  /// Per stage, the share of bwd_ms that is weight-gradient work (the zero-bubble split's W: the
  /// dW GEMMs; the rest, B, computes the activation gradient the previous stage waits for, plus
  /// any recompute and the TP all-reduces). Empty: kDefaultWeightGradShare (hand-built models).
  std::vector<double> weight_grad_share;
  std::vector<double> allreduce_ms;   ///< per stage, DP gradient all-reduce
  std::vector<double> grad_bytes;     ///< per stage, the gradient one rank sums over DP (bytes)
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
  /// parallel.dp_across_dcs: the DP replicas per DC (the world ranks are numbered DC by DC, then
  /// stage, then replica: topo::Layout::world_rank); 0 = the replicas of a stage are consecutive.
  int dp_per_dc = 0;
  /// Shared hosts with more ranks than cores: the delay from a message's arrival to its receiver
  /// running again (it waits for a core). Added to every delivery, round trip and ring step.
  /// 0 = a core or device per rank.
  double wake_ms = 0.0;
  /// Shared hosts: host CPU per byte sent between DCs (both ends together; cluster.host_net_ns_per_byte).
  double net_ns_per_byte = 0.0;
  /// Memory per GPU (sched/memory.hpp, filled by cost_model from the deck; empty in hand-built
  /// models = unknown, no limit): per stage the weights + gradients + optimizer state, the
  /// activations one in-flight micro-batch keeps, and what the stage keeps once (the last stage's
  /// logits); the device's usable bytes (0 = no limit). The atlas search keeps its in-flight depth
  /// under the limit.
  std::vector<double> state_bytes;
  std::vector<double> act_bytes_per_micro;
  std::vector<double> fixed_act_bytes;
  double memory_limit_bytes = 0.0;

  /// The zero-bubble split of stage `stage`'s backward: W = bwd_ms x weight_grad_share (the
  /// weight gradients) and B = bwd_ms - W (the activation gradient); B + W = bwd_ms.
  [[nodiscard]] double bwd_weight_ms(int stage) const;
  [[nodiscard]] double bwd_input_ms(int stage) const {
    return bwd_ms[static_cast<std::size_t>(stage)] - bwd_weight_ms(stage);
  }
  [[nodiscard]] const LinkCost& link(int src_dc, int dst_dc) const {
    return links[static_cast<std::size_t>(src_dc * dc_count + dst_dc)];
  }
  /// Time of one intra-DC boundary transfer.
  [[nodiscard]] double local_transfer_ms(std::int64_t bytes) const {
    return intra_latency_ms + static_cast<double>(bytes) / intra_bytes_per_ms;
  }
};

/// Weight-gradient share of a backward when the cost model does not say (hand-built models): a
/// transformer block's dW GEMMs are half its backward's FLOPs less the attention core's share.
inline constexpr double kDefaultWeightGradShare = 0.5;

/// Default per-TCP-flow window when the deck sets no cap: Linux's default tcp_rmem maximum.
inline constexpr double kDefaultTcpWindowBytes = 6.0 * 1024 * 1024;

/// Time of one transformer block (one micro-batch, one rank of a TP group), and the LM head.
struct BlockCost {
  double fwd_ms = 0.0;       ///< compute + the forward TP all-reduces
  double bwd_ms = 0.0;       ///< compute (+ selective recompute) + the backward TP all-reduces
  double tp_comm_ms = 0.0;   ///< one TP all-reduce of the block's activations (inside fwd/bwd)
  double head_fwd_ms = 0.0;  ///< LM head + loss of one micro-batch (vocab-parallel over TP)
  double head_bwd_ms = 0.0;
  /// Of bwd_ms and head_bwd_ms: the weight-gradient GEMMs (the zero-bubble split's W; the rest is
  /// B: activation gradients, recompute, TP all-reduces).
  double bwd_weight_ms = 0.0;
  double head_bwd_weight_ms = 0.0;
  double flops_per_s = 0.0;  ///< achieved forward FLOP/s used
};

/// Share of a block's backward compute (without recompute) that is weight-gradient GEMMs, by
/// FLOPs: the linears' dW (24 T h^2, as many as their forward) over the backward's 2 x (24 T h^2
/// + 4 T s h) (the attention core's two matmuls have no weights).
double block_weight_grad_fraction(const ModelCfg& m);

/// FLOPs of one transformer block's forward for `tokens` tokens (whole block, before TP split).
double block_forward_flops(const ModelCfg& m, double tokens);

/// Achieved FLOP/s of one rank by FLOP count alone: schedule.device_tflops, else the built-in
/// profile of plan.gpu (peak x achievable fraction). BubbleTea's prefill estimate uses it.
double device_flops(const Config& cfg);

/// Per-block cost of the deck's model at `tp`. Precedence: schedule.fwd_ms_per_layer (measured,
/// backward = schedule.bwd_over_fwd times it), then schedule.device_tflops, then the profile.
BlockCost block_cost(const Config& cfg, int tp, const DeviceProfile& profile);

/// Parameters of pipeline stage `stage` of `pp` before the TP split (blocks, plus embeddings on
/// the first stage and the final norm and untied LM head copy on the last).
double stage_params(const ModelCfg& m, int stage, int pp);

/// Parameters one of the stage's `tp` ranks holds: stage_params / tp, plus the key/value heads a
/// rank keeps a copy of where tp exceeds model.kv_heads (each rank then holds one head's k and v,
/// as vLLM and TensorRT-LLM replicate them, where an even split would give it kv_heads / tp of one;
/// Megatron-LM instead requires tp to divide the key/value heads).
double stage_params_per_gpu(const ModelCfg& m, int stage, int pp, int tp);

/// Time of a ring all-reduce of `bytes` over `n` members: 2(n-1)/n * bytes / bandwidth plus
/// 2(n-1) latencies. 0 for n <= 1.
double ring_allreduce_ms(double bytes, int n, double bytes_per_ms, double latency_ms);

/// A stage's DP gradient sync per step that its compute does not hide, ms, from `allreduce_ms`
/// (one ring all-reduce of its gradients: a reduce-scatter and an all-gather). With zero_stage 2 a
/// replica keeps only its shard of the gradients, so every micro-batch's backward ends in a
/// reduce-scatter into it (FSDP's and DeepSpeed's ZeRO-2 under gradient accumulation): m - 1 more
/// reduce-scatters a step, each overlapping the stage's next micro-batch (`compute_ms_per_micro`,
/// its forward and backward); what a reduce-scatter takes beyond that is added.
double dp_sync_ms(double allreduce_ms, double compute_ms_per_micro, int micro_batches, int zero_stage);

/// Open MPI's eager limit over TCP (btl_tcp_eager_limit): a larger message waits a round trip
/// for its receiver's acknowledgement before the rest of its bytes leave (rendezvous).
inline constexpr double kMpiEagerLimitBytes = 64.0 * 1024.0;

/// When the last byte of a `bytes` transfer has left the sender on one TCP flow with at most
/// `window_bytes` in flight, over a path of `rtt_ms` at `share_bytes_per_ms`: a window leaves as a
/// burst and the next only when its acknowledgements return, so a transfer of a few windows takes
/// whole round trips (the fluid window / RTT rate is its long-run limit). Without a window, or
/// with one the share takes a round trip or longer to send: bytes / share.
double window_clocked_ms(double bytes, double share_bytes_per_ms, double rtt_ms, double window_bytes);

/// Time of the DP sum across DCs (parallel.dp_across_dcs) as the runtime runs it
/// (device::make_ring_collective: a ring over point-to-point, as Gloo): `dp` replicas numbered DC
/// by DC, `dp_per_dc` in each, ring i -> i + 1 mod dp; 2 (dp - 1) steps of bytes / dp. Each
/// member's steps are replayed: a step ends when its send and its receive are done, plus the
/// wake-up delay; between DCs a and b a piece above kMpiEagerLimitBytes sends its first fragment
/// with a request and the rest once its receiver has posted (rendezvous: a round trip of
/// c.link(a, b)), window-clocked (window_clocked_ms) at capacity / sharing; inside a DC the
/// intra-DC transfer. Each member starts a sum when its previous one ended; after
/// kRingReplayWarmup sums from a common start the mean of the next kRingReplayRounds is returned,
/// the steady length (longer than a sum from a common start: the members drift apart along the
/// ring, and a small piece pays each edge's latency on its way round). Rings above
/// kRingReplayMaxMembers: every step as long as its slowest edge, the latency once. `sharing`: the
/// sums that cross a link at once.
inline constexpr int kRingReplayWarmup = 2;
inline constexpr int kRingReplayRounds = 4;
inline constexpr int kRingReplayMaxMembers = 512;
double wan_ring_allreduce_ms(const CostModel& c, double bytes, int dp, int dp_per_dc, int sharing, double window_bytes);

/// parallel.dp_across_dcs: sets every stage's allreduce_ms to wan_ring_allreduce_ms (pp x tp
/// sums share each link: one per stage and TP lane). Needs the links set.
void wan_dp_allreduce(CostModel& c, const Config& cfg, const topo::Layout& layout);

/// The rate of one WAN transfer on a link: min(capacity, flows * window / RTT).
double transfer_cap_bytes_per_ms(double capacity_bytes_per_ms, double one_way_latency_ms, int flows,
                                 double window_bytes);

/// TCP flows one transfer uses under the deck's wan.* keys (rails, or 1 for wan.transport = mpi).
int flows_per_transfer(const Config& cfg);
/// Per-flow window: wan.flow_window_bytes, or Linux's default tcp_rmem maximum.
double flow_window_bytes(const Config& cfg);

/// Sets ranks_per_host / cores_per_host from cluster.ranks_per_host and cluster.cores_per_host
/// (0 cores = the hardware threads of this machine), and the wake-up and network CPU costs.
void apply_host_sharing(CostModel& cost, const Config& cfg);

/// Bytes of one pipeline boundary element on the wire (docs/precision.md): activation_bytes of
/// device.precision when the deck names one (bf16 2, fp32/tf32 4), bf16 for device.precision =
/// auto on cuda (the runtime sends bf16 there), else the profile's activation_bytes (host 4; the
/// GPU profiles assume bf16, 2), so decks without the key keep their tables.
[[nodiscard]] double boundary_element_bytes(const Config& cfg, const DeviceProfile& profile);

/// The cost model of the deck's job on `layout` under `profile`: compute from the profile (plus
/// the TP all-reduces), boundary tensors, the DP ring all-reduce inside a DC, WAN links capped per
/// TCP flow, the tied-embedding sync.
CostModel cost_model(const Config& cfg, const topo::Layout& layout, const DeviceProfile& profile);

/// The deck's cost model: cost_model(cfg, layout, device_profile(cfg)). What training, `atlas
/// schedule`, `atlas simulate` and the tests build the deck's table from.
CostModel cost_model(const Config& cfg, const topo::Layout& layout);

}  // namespace atlas::sched
