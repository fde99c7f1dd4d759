// SPDX-License-Identifier: MIT
// The typed configuration every room reads. Filled only by deck::parse (from the schema); nothing
// after parsing touches deck strings. Units are in the field names, as in the deck keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace atlas {

struct RunCfg {
  std::string name;              ///< run.name: runs/NAME/ holds everything the run writes
  int steps = 0;                 ///< run.steps: optimizer steps to reach
  std::int64_t seed = 0;         ///< run.seed: model init, data order, request generator
  std::string out_dir;           ///< run.out_dir: parent of the run directory
  std::string resume;            ///< run.resume: "" | "latest" | path to a checkpoint
  std::string resume_fallback;   ///< run.resume_fallback: with latest and no checkpoint, this path
  int log_every_steps = 1;       ///< run.log_every_steps
};

struct ClusterCfg {
  std::vector<std::string> dcs;          ///< cluster.dcs: DC names
  std::vector<int> gpus_per_dc;          ///< cluster.gpus_per_dc: free GPUs (ranks) per DC
  int gpus_per_node = 8;                 ///< cluster.gpus_per_node: TP stays inside a node
  std::vector<double> latency_ms;        ///< cluster.latency_ms: n*n one-way latency, row-major
  std::vector<double> bandwidth_gbps;    ///< cluster.bandwidth_gbps: n*n link capacity, row-major
  double intra_bandwidth_gbps = 100.0;   ///< cluster.intra_bandwidth_gbps: inside a DC
  double intra_latency_us = 5.0;         ///< cluster.intra_latency_us: inside a DC
  std::vector<double> price_per_gpu_hour;  ///< cluster.price_per_gpu_hour: per DC (may be empty)
  std::vector<double> power_mw;           ///< cluster.power_mw: per DC peak-power budget, MW (empty = none)
  std::vector<double> pue;                ///< cluster.pue: power usage effectiveness, one for all DCs or per DC
  std::vector<double> carbon_g_per_kwh;   ///< cluster.carbon_g_per_kwh: grid carbon intensity per DC (may be empty)
  std::vector<int> may_hold_data;         ///< cluster.may_hold_data: 1/0 per DC, may it hold the data/embedding stages (empty = all)
  std::vector<std::string> bind_hosts;   ///< cluster.bind_hosts: WAN listen address per DC
  int ranks_per_host = 0;                ///< cluster.ranks_per_host: 0 = a device per rank
  double cores_per_host = 0.0;           ///< cluster.cores_per_host: 0 = this machine's threads
  double host_wake_us = 0.0;             ///< cluster.host_wake_us: per message, an oversubscribed host's wake-up delay
  double host_net_ns_per_byte = 0.0;     ///< cluster.host_net_ns_per_byte: host CPU per WAN byte (both ends)

  [[nodiscard]] int dc_count() const { return static_cast<int>(dcs.size()); }
  [[nodiscard]] double latency(int a, int b) const {
    return latency_ms[static_cast<std::size_t>(a * dc_count() + b)];
  }
  [[nodiscard]] double bandwidth(int a, int b) const {
    return bandwidth_gbps[static_cast<std::size_t>(a * dc_count() + b)];
  }
  /// PUE of DC `dc` (one entry = every DC's).
  [[nodiscard]] double pue_of(int dc) const {
    return pue.empty() ? 1.0 : pue.size() == 1 ? pue[0] : pue[static_cast<std::size_t>(dc)];
  }
  /// May DC `dc` hold the stages that read the training data or hold the embedding (first, last)?
  [[nodiscard]] bool may_hold_data_of(int dc) const {
    return may_hold_data.empty() || may_hold_data[static_cast<std::size_t>(dc)] != 0;
  }
};

struct ParallelCfg {
  int tp_size = 1;                  ///< parallel.tp_size: tensor-parallel ranks per stage replica
  int dp_size = 1;                  ///< parallel.dp_size: data-parallel pipelines
  std::vector<int> stages_per_dc;   ///< parallel.stages_per_dc: contiguous stages held by each DC
  /// parallel.dp_across_dcs: every DC holds whole pipelines (stages_per_dc[d] stages each, the
  /// same in every DC) and dp_size counts the replicas of all DCs together (dp_size / DCs per
  /// DC); the DP gradient sums cross the WAN (over MPI), no pipeline boundary does.
  bool dp_across_dcs = false;

  /// Pipeline stages: the sum of stages_per_dc, or with dp_across_dcs the stages of one DC's
  /// pipelines (the largest entry: validation makes them equal).
  [[nodiscard]] int pp_size() const {
    int s = 0;
    for (int v : stages_per_dc) s = dp_across_dcs ? std::max(s, v) : s + v;
    return s;
  }
  /// Ranks held by DC `dc` (stages x dp x tp, or with dp_across_dcs stages x dp / DCs x tp).
  [[nodiscard]] std::int64_t ranks_in_dc(int dc) const {
    const auto n = static_cast<std::int64_t>(stages_per_dc.size());
    const std::int64_t dp = dp_across_dcs ? dp_size / std::max<std::int64_t>(n, 1) : dp_size;
    return static_cast<std::int64_t>(stages_per_dc[static_cast<std::size_t>(dc)]) * dp * tp_size;
  }
  /// Ranks of the layout. Fits an int once the deck is validated (deck::limits::kMaxRanks).
  [[nodiscard]] int world_size() const { return pp_size() * dp_size * tp_size; }
  /// "" when a job of `job_ranks` fits this layout, else the collective error message (with hint).
  [[nodiscard]] std::string size_mismatch(int job_ranks) const;
};

/// model.mlp: the block's MLP in the cost model.
enum class MlpKind {
  Gelu,    ///< up to ffn_hidden, GELU, down (GPT; the runtime's block)
  SwiGlu,  ///< gate and up to ffn_hidden, SiLU(gate) x up, down (Llama)
};

struct ModelCfg {
  int layers = 0;                       ///< model.layers: transformer blocks
  int hidden = 0;                       ///< model.hidden: d_model
  int heads = 0;                        ///< model.heads: attention heads
  /// The cost model's block (schedule, simulate, plan; the runtime's GPT block is the default of
  /// each: MHA, a 4h GELU MLP; Korthikanti et al.'s activations count dropout masks).
  int kv_heads = 0;                     ///< model.kv_heads: key/value heads (GQA); 0 = heads
  int ffn_hidden = 0;                   ///< model.ffn_hidden: MLP width; 0 = 4 x hidden
  MlpKind mlp = MlpKind::Gelu;          ///< model.mlp
  bool dropout = true;                  ///< model.dropout: masks stored after attention and MLP
  int seq_len = 0;                      ///< model.seq_len: tokens per sample
  int vocab = 0;                        ///< model.vocab: tokenizer vocabulary size
  std::vector<int> layers_per_stage;    ///< model.layers_per_stage: empty = even split
  double init_std = 0.02;               ///< model.init_std

  /// Blocks on pipeline stage `stage` of `pp` (the deck's split, or an even one).
  [[nodiscard]] int stage_layers(int stage, int pp) const;
  /// First block index held by `stage`.
  [[nodiscard]] int stage_first_layer(int stage, int pp) const;
  /// Parameters of the whole model (embeddings tied).
  [[nodiscard]] std::int64_t parameter_count() const;
  /// Parameters of one transformer block: qkv, proj, fc, fc-proj with biases, and 2 LayerNorms
  /// (12 h^2 + 13 h for the GPT block; GQA's narrower k and v, a SwiGLU MLP's three matrices).
  [[nodiscard]] std::int64_t block_parameter_count() const;
  /// Key/value heads (kv_heads, or heads when 0).
  [[nodiscard]] int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  /// MLP width (ffn_hidden, or 4 x hidden when 0).
  [[nodiscard]] std::int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * static_cast<std::int64_t>(hidden); }
  /// Key (or value) width over query width on one of `tp` ranks: kv_heads / heads, with a key/value
  /// head replicated on each rank where tp exceeds them; exactly 1 without GQA.
  [[nodiscard]] double kv_share(int tp = 1) const {
    if (kv_heads <= 0) return 1.0;
    const double t = tp > 0 ? tp : 1;
    return std::max(kv_heads / t, 1.0) * t / (heads > 0 ? heads : 1);
  }
  /// Width of q, k and v together: hidden + 2 x kv heads x head dim (3 x hidden without GQA).
  [[nodiscard]] double qkv_width() const { return hidden * (1.0 + 2.0 * kv_share()); }
  /// The MLP's up-projection width (ffn, twice that for SwiGLU's gate and up).
  [[nodiscard]] double mlp_up_width() const { return (mlp == MlpKind::SwiGlu ? 2.0 : 1.0) * static_cast<double>(ffn()); }
  /// The cost model's block is the runtime's GPT block (MHA, a 4h GELU MLP).
  [[nodiscard]] bool gpt_block() const {
    return kv_head_count() == heads && ffn() == 4 * static_cast<std::int64_t>(hidden) && mlp == MlpKind::Gelu;
  }
};

/// train.recompute: what the backward recomputes instead of storing (the cost model's time and
/// memory; the runtime itself stores every activation).
enum class Recompute {
  Auto,       ///< the device profile's selective_recompute (selective on GPU profiles, none on the host)
  None,       ///< store every activation (Korthikanti et al. 2022: 34sbh + 5as^2b bytes per layer)
  Selective,  ///< recompute the attention core only (no s x s activations stored)
  Full,       ///< store each block's input, run its forward again before its backward
};

/// train.attention: the attention core's kernels in the cost model.
enum class AttentionKernel {
  Auto,     ///< the device profile's fused_attention
  Fused,    ///< one fused kernel (FlashAttention): compute-bound, no s x s tensor in memory
  Unfused,  ///< QK^T, softmax, dropout, AV as separate kernels (Megatron-LM 2021)
};

/// A switch whose default is the device profile's (train.sequence_parallel).
enum class ProfileSwitch { Auto, On, Off };

struct TrainCfg {
  int micro_batch_size = 1;             ///< train.micro_batch_size: samples per micro-batch
  int micro_batches = 1;                ///< train.micro_batches: per pipeline per step
  double lr = 1e-3;                     ///< train.lr: peak learning rate
  double min_lr = 1e-4;                 ///< train.min_lr: cosine floor
  int warmup_steps = 0;                 ///< train.warmup_steps
  double weight_decay = 0.1;            ///< train.weight_decay (AdamW; model::decays_by_role)
  double beta1 = 0.9;                   ///< train.beta1
  double beta2 = 0.95;                  ///< train.beta2
  double eps = 1e-8;                    ///< train.eps
  double grad_clip = 1.0;               ///< train.grad_clip: global norm; 0 disables
  std::uint64_t dp_bucket_bytes = 0;    ///< train.dp_bucket_bytes: gradient all-reduce bucket
  bool dp_overlap = true;               ///< train.dp_overlap: bucket sums start during backward
  int eval_every_steps = 0;             ///< train.eval_every_steps: 0 = never
  int eval_batches = 0;                 ///< train.eval_batches: micro-batches per evaluation
  Recompute recompute = Recompute::Auto;            ///< train.recompute (cost model only)
  AttentionKernel attention = AttentionKernel::Auto;  ///< train.attention (cost model only)
  ProfileSwitch sequence_parallel = ProfileSwitch::Auto;  ///< train.sequence_parallel (cost model only)
  /// train.zero_stage (cost model only): 0 every DP replica holds the whole optimizer state and
  /// gradients; 1 the optimizer state (Adam moments, fp32 master weights) split over the stage's DP
  /// replicas (ZeRO-1, Megatron-LM's distributed optimizer); 2 the gradients too (ZeRO-2, PyTorch
  /// FSDP without resharding the weights, as Llama 3).
  int zero_stage = 0;
};

/// data.tokenizer: how text becomes token ids.
enum class TokenizerKind {
  Byte,  ///< one token per byte (vocabulary 256)
  Gpt2,  ///< GPT-2 byte-level BPE (vocabulary 50,257; files in data.tokenizer_dir)
};

/// data.format: where the token streams come from.
enum class DataFormat {
  Text,    ///< data.corpus_dir's text, tokenized at start-up, split by data.val_fraction
  Shards,  ///< llm.c token shards (data.train_shards, data.val_shards), memory-mapped
};

struct DataCfg {
  DataFormat format = DataFormat::Text;  ///< data.format
  std::string corpus_dir;               ///< data.corpus_dir: directory of Brown corpus files
  TokenizerKind tokenizer = TokenizerKind::Byte;  ///< data.tokenizer
  std::string tokenizer_dir;            ///< data.tokenizer_dir: encoder.json + vocab.bpe (gpt2)
  double val_fraction = 0.05;           ///< data.val_fraction: tail of the token stream held out
  std::vector<std::string> train_shards;  ///< data.train_shards: glob patterns (format = shards)
  std::vector<std::string> val_shards;    ///< data.val_shards: glob patterns (format = shards)
};

enum class ScheduleKind { GPipe, OneFOneB, Atlas };
/// schedule.split_backward: the zero-bubble split of each backward into its activation-gradient
/// (BackwardInput) and weight-gradient (BackwardWeight) halves (docs/schedules.md).
enum class SplitBackward { Auto, On, Off };

struct ScheduleCfg {
  ScheduleKind kind = ScheduleKind::OneFOneB;  ///< schedule.kind
  double fwd_ms_per_layer = 0.0;  ///< schedule.fwd_ms_per_layer: 0 = estimate from FLOPs
  /// schedule.bwd_over_fwd: backward / forward time where the deck sets the forward's
  /// (fwd_ms_per_layer or device_tflops); 0 = 2 there. The device profile costs it otherwise.
  double bwd_over_fwd = 0.0;
  double device_tflops = 0.0;     ///< schedule.device_tflops: achieved FLOP/s for the estimate
  int atlas_max_stagger = 0;      ///< schedule.atlas_max_stagger: search bound (0 = auto)
  int atlas_slots = 0;            ///< schedule.atlas_slots: transfers per link at once (0 = search)
  /// schedule.virtual_stages: model chunks per pipeline stage (interleaved 1F1B; 1 = plain).
  int virtual_stages = 1;
  /// schedule.split_backward: auto = the atlas search keeps the split where it is faster at no
  /// more memory; on = every schedule kind splits; off = tables as without the split.
  SplitBackward split_backward = SplitBackward::Auto;

  /// The backward / forward ratio the deck's own forward time takes (bwd_over_fwd, 2 by default).
  [[nodiscard]] double bwd_ratio() const { return bwd_over_fwd > 0 ? bwd_over_fwd : 2.0; }
  /// Whether bwd_over_fwd is given without a forward time it could scale (then it has no effect).
  [[nodiscard]] bool bwd_over_fwd_ignored() const {
    return bwd_over_fwd > 0 && !(fwd_ms_per_layer > 0) && !(device_tflops > 0);
  }
};

enum class WanTransport { Multirail, Mpi };
enum class WanEmulation { None, Netns };
enum class WanAuth { Mac, Encrypt, Crc };

struct WanCfg {
  WanTransport transport = WanTransport::Multirail;  ///< wan.transport
  int rails = 4;                        ///< wan.rails: TCP connections per DC-pair peer
  std::uint64_t chunk_bytes = 0;        ///< wan.chunk_bytes: striping unit
  std::uint64_t max_frame_bytes = 0;    ///< wan.max_frame_bytes: bigger frames are rejected
  double recv_timeout_s = 60.0;         ///< wan.recv_timeout_s: a stalled receive fails
  double connect_timeout_s = 20.0;      ///< wan.connect_timeout_s
  WanEmulation emulate = WanEmulation::None;  ///< wan.emulate: kernel WAN emulation
  std::uint64_t flow_window_bytes = 0;  ///< wan.flow_window_bytes: per-flow TCP window cap
  WanAuth auth = WanAuth::Mac;          ///< wan.auth: protection of every frame
  std::string key_file;                 ///< wan.key_file: owner-only job key ("" = none)
  std::string tcp_congestion = "auto";  ///< wan.tcp_congestion: auto | system | an algorithm's name
  std::uint64_t warmup_bytes = 1024 * 1024;  ///< wan.warmup_bytes: Pad bytes per new rail and direction
};

/// ckpt.transfer: how checkpoint writes move tensor data through MPI-IO (io::Transfer).
enum class CkptTransfer { Auto, Collective, Independent };

struct CkptCfg {
  std::string dir;            ///< ckpt.dir: "" = runs/NAME/ckpt
  int every_steps = 0;        ///< ckpt.every_steps: 0 = only the final one
  int keep_last = 3;          ///< ckpt.keep_last
  bool final = true;          ///< ckpt.final: write one after the last step
  CkptTransfer transfer = CkptTransfer::Auto;  ///< ckpt.transfer
};

struct ProfileCfg {
  bool enabled = true;        ///< profile.enabled: record every slot to profile.h5
  bool trace_json = true;     ///< profile.trace_json: also write trace.json (Perfetto)
};

/// device.backend. Emulated: no arithmetic; each compute slot sleeps its predicted time (runtime/emulated.hpp).
enum class Backend { Host, Cuda, Emulated };

/// device.precision: the numbers of matmul inputs and activations. Fp32 is the reference; Tf32 and
/// Bf16 round every matmul input (round-to-nearest-even) with fp32 accumulation, master weights,
/// optimizer state and normalisation statistics (docs/precision.md). Auto = Bf16 on cuda, else Fp32.
enum class Precision { Auto, Fp32, Tf32, Bf16 };

/// device.sched_batch: the host backend's Linux scheduling policy.
enum class SchedBatch {
  Auto,  ///< SCHED_BATCH when more ranks share this machine than it has hardware threads
  On,    ///< always SCHED_BATCH
  Off,   ///< never (the default policy)
};

struct DeviceCfg {
  Backend backend = Backend::Host;  ///< device.backend
  int threads = 0;                  ///< device.threads: host threads per rank; 0 = auto
  SchedBatch sched_batch = SchedBatch::Auto;  ///< device.sched_batch
  Precision precision = Precision::Auto;      ///< device.precision (see effective_precision)
  double nccl_timeout_s = 300.0;    ///< device.nccl_timeout_s: an NCCL set-up or operation's limit
  bool cuda_graphs = false;         ///< device.cuda_graphs: blocks run as recorded CUDA graphs
};

/// bubbletea.pipeline: which ranks form an inference pipeline (a chain that a request's chunks
/// cross, each rank running its share of the blocks in its bubbles).
enum class InferPipeline { Dc, Replica };

struct BubbleTeaCfg {
  bool enabled = false;             ///< bubbletea.enabled
  int layers = 2;                   ///< bubbletea.layers
  int hidden = 64;                  ///< bubbletea.hidden
  int heads = 4;                    ///< bubbletea.heads
  int context = 128;                ///< bubbletea.context: longest prompt + generation
  int vocab = 256;                  ///< bubbletea.vocab
  std::string weights;              ///< bubbletea.weights: "random" or an atlas checkpoint
  std::string trace;                ///< bubbletea.trace: CSV of requests ("" = generator)
  double rate_per_s = 0.0;          ///< bubbletea.rate_per_s: Poisson arrival rate
  int requests = 0;                 ///< bubbletea.requests: generator request count
  int prompt_tokens_min = 8;        ///< bubbletea.prompt_tokens_min
  int prompt_tokens_max = 64;       ///< bubbletea.prompt_tokens_max
  int max_new_tokens = 8;           ///< bubbletea.max_new_tokens
  double guard_ms = 0.5;            ///< bubbletea.guard_ms: safety margin per admission
  bool watch_recv = true;           ///< bubbletea.watch_recv: stop a bubble when its receive arrives
  bool fill_recv_waits = true;      ///< bubbletea.fill_recv_waits: also fill receives that wait outside bubbles
  bool fill_wan_waits = true;       ///< bubbletea.fill_wan_waits: also fill the WAN waits of AllReduce/Optimizer
  double max_stretch = 3.0;         ///< bubbletea.max_stretch: a bubble is filled <= this x budget
  double stretch_quantile = 0.5;    ///< bubbletea.stretch_quantile: a watched bubble past the table
  double wan_wait_quantile = 0.5;   ///< bubbletea.wan_wait_quantile: budget of a WAN wait inside a training slot
  double recv_wait_quantile = 0.0;  ///< bubbletea.recv_wait_quantile: budget of a receive waiting outside bubbles
  std::uint64_t kv_cap_bytes = 0;   ///< bubbletea.kv_cap_bytes: KV-cache memory cap per rank
  int chunk_tokens = 0;             ///< bubbletea.chunk_tokens: chunked prefill; 0 = whole
  int max_in_flight = 0;            ///< bubbletea.max_in_flight: requests being prefilled per pipeline; 0 = 2 x its ranks
  InferPipeline pipeline = InferPipeline::Replica;  ///< bubbletea.pipeline
};

enum class GpuKind { Host, A100, H100, H200 };
/// What the planner minimises (plan.objective): auto = step time, or price when plan.deadline_s
/// is set; energy and carbon per step at each DC's PUE (and grid carbon intensity).
enum class PlanObjective { Auto, Time, Cost, Energy, Carbon };

struct PlanCfg {
  GpuKind gpu = GpuKind::Host;      ///< plan.gpu: cost profile for plan/simulate
  double deadline_s = 0.0;          ///< plan.deadline_s: cheapest plan under this step time
  PlanObjective objective = PlanObjective::Auto;  ///< plan.objective: what the chosen plan minimises
  int max_tp = 8;                   ///< plan.max_tp
  int top = 10;                     ///< plan.top: rows in the what-if table
  std::vector<std::string> profiles; ///< plan.profiles: device profile files (profiles/README.md)
};

/// One device profile file, read with the deck.
struct ProfileFile {
  std::string path;  ///< as found (messages, and its stem names the kind: profiles/device/h100.profile)
  std::string text;
};

/// Not deck keys: the device profile files a job's cost model may read. Read once when the deck
/// is loaded (deck::load: rank 0 reads and broadcasts them with the deck; deck::read_device_profiles
/// in one process), so every rank builds its schedule table from identical inputs;
/// sched::device_profile(cfg) picks and parses one without I/O.
struct DeviceProfileFiles {
  bool read = false;               ///< false: never read (sched refuses to build a cost model)
  std::vector<ProfileFile> files;  ///< plan.profiles' files if set, else profiles/device/<kind>.profile per kind found
};

/// Everything a deck can say. Filled by deck::parse; validated by deck::validate.
struct Config {
  RunCfg run;
  ClusterCfg cluster;
  ParallelCfg parallel;
  ModelCfg model;
  TrainCfg train;
  DataCfg data;
  ScheduleCfg schedule;
  WanCfg wan;
  CkptCfg ckpt;
  ProfileCfg profile;
  DeviceCfg device;
  BubbleTeaCfg bubbletea;
  PlanCfg plan;
  DeviceProfileFiles device_profiles;  ///< not a deck key: the device profiles read with the deck

  /// runs/NAME (run.out_dir / run.name).
  [[nodiscard]] std::string run_dir() const;
  /// ckpt.dir, or runs/NAME/ckpt.
  [[nodiscard]] std::string ckpt_dir() const;
  /// Sequences per optimizer step over the whole job (the global batch):
  /// parallel.dp_size x train.micro_batches x train.micro_batch_size. The one definition that
  /// training, the simulator, the planner and the benchmarks use.
  [[nodiscard]] std::int64_t sequences_per_step() const;
  /// Tokens per optimizer step over the whole job: sequences_per_step() x model.seq_len.
  [[nodiscard]] std::int64_t tokens_per_step() const;
};

const char* to_string(ScheduleKind k);
const char* to_string(WanTransport t);
const char* to_string(Backend b);
const char* to_string(GpuKind g);
const char* to_string(Precision p);

/// device.precision with Auto resolved: Bf16 on the cuda backend, Fp32 on host and emulated.
[[nodiscard]] Precision effective_precision(const DeviceCfg& d) noexcept;
/// Bytes of one activation element on the wire and in activation memory at precision `p`
/// (2 for Bf16, 4 otherwise: a Tf32 value travels as fp32).
[[nodiscard]] int activation_bytes(Precision p) noexcept;

}  // namespace atlas
