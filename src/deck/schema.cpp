// SPDX-License-Identifier: MIT
// The schema table: every deck key atlas knows, with type, default, range and help, bound to its
// Config field. Keep keys lower_snake with the unit in the name.
#include "atlas/deck/schema.hpp"

#include <algorithm>
#include <tuple>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "atlas/core/units.hpp"

namespace atlas::deck {

// ---- text helpers ----

namespace {
/// "4 4": a list quoted whole (not "1" "2", a list of quoted elements).
bool whole_list_quoted(std::string_view text, const std::string& plain) {
  return is_quoted(text) && plain.find('"') == std::string::npos;
}
}  // namespace

bool is_quoted(std::string_view text) { return text.size() >= 2 && text.front() == '"' && text.back() == '"'; }

std::string unquote(std::string_view text) {
  if (is_quoted(text)) return std::string(text.substr(1, text.size() - 2));
  return std::string(text);
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i >= text.size()) break;
    if (text[i] == '"') {
      const std::size_t close = text.find('"', i + 1);
      const std::size_t end = close == std::string_view::npos ? text.size() : close + 1;
      out.push_back(unquote(text.substr(i, end - i)));
      i = end;
    } else {
      std::size_t j = i;
      while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
      out.emplace_back(text.substr(i, j - i));
      i = j;
    }
  }
  return out;
}

namespace {

std::string fmt_num(double v) {
  // Whole numbers in full (1000000, not 1e+06): bounds read as the values a user types.
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<std::int64_t>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

bool is_integral(ValueType t) { return t == ValueType::Int || t == ValueType::IntList; }

/// A bound as the user writes it: integers in full (1000000, not 1e+06), byte counts with their
/// suffix (16G), other numbers as the shortest text.
std::string bound_text(const KeySpec& k, double v) {
  if (k.type == ValueType::Bytes && v >= 0 && v < 1.8e19)
    return units::format_bytes_exact(static_cast<std::uint64_t>(v));
  if (is_integral(k.type) && std::abs(v) < 9.2e18) return std::to_string(static_cast<std::int64_t>(v));
  return fmt_num(v);
}

std::string range_text(const KeySpec& k) {
  std::optional<std::string> lo, hi;
  if (k.min) lo = bound_text(k, *k.min);
  if (k.max) hi = bound_text(k, *k.max);
  // An integer key is bounded by its field's type too (an int holds at most 2147483647).
  if (is_integral(k.type)) {
    if (k.type_min && (!k.min || *k.min < static_cast<double>(*k.type_min))) lo = std::to_string(*k.type_min);
    if (k.type_max && (!k.max || *k.max > static_cast<double>(*k.type_max))) hi = std::to_string(*k.type_max);
  }
  if (lo && hi) return " in [" + *lo + ", " + *hi + "]";
  if (lo) return " >= " + *lo;
  if (hi) return " <= " + *hi;
  return "";
}

bool in_range(const KeySpec& k, double v) {
  return (!k.min || v >= *k.min) && (!k.max || v <= *k.max);
}

/// Integers are compared exactly against their field's type (no narrowing: 4294967300 is not 4)
/// and then against the schema's bounds.
bool int_in_range(const KeySpec& k, std::int64_t v) {
  if ((k.type_min && v < *k.type_min) || (k.type_max && v > *k.type_max)) return false;
  return in_range(k, static_cast<double>(v));
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions and adjacent
/// transpositions ("rials" -> "rails" is 1) each cost 1.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1, 0));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::size_t common_prefix(std::string_view a, std::string_view b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// ---- binding Config fields to keys ----

template <class T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, bool>) return ValueType::Bool;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return ValueType::Bytes;
  else if constexpr (std::is_integral_v<T>) return ValueType::Int;
  else if constexpr (std::is_floating_point_v<T>) return ValueType::Float;
  else if constexpr (std::is_same_v<T, std::string>) return ValueType::String;
  else if constexpr (std::is_same_v<T, std::vector<int>>) return ValueType::IntList;
  else if constexpr (std::is_same_v<T, std::vector<double>>) return ValueType::FloatList;
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return ValueType::StringList;
  else static_assert(sizeof(T) == 0, "unsupported Config field type");
}

std::string quote_if_needed(const std::string& s) {
  if (s.empty() || s.find_first_of(" \t#") != std::string::npos) return "\"" + s + "\"";
  return s;
}

template <class T>
std::string to_deck_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::uint64_t>) return units::format_bytes_exact(v);
  else if constexpr (std::is_integral_v<T>) return std::to_string(v);
  else if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back to the same double (43.49, not 43.490000000000002).
    return fmt::format("{}", v);
  } else if constexpr (std::is_same_v<T, std::string>) return quote_if_needed(v);
  else {
    std::string out;
    for (const auto& e : v) {
      if (!out.empty()) out += ' ';
      out += to_deck_text(e);
    }
    return out;
  }
}

template <class T>
void from_value(T& out, const Value& v) {
  if constexpr (std::is_same_v<T, bool>) out = v.b;
  else if constexpr (std::is_same_v<T, std::uint64_t>) out = v.bytes;
  else if constexpr (std::is_integral_v<T>) out = static_cast<T>(v.i);
  else if constexpr (std::is_floating_point_v<T>) out = v.f;
  else if constexpr (std::is_same_v<T, std::string>) out = v.s;
  else if constexpr (std::is_same_v<T, std::vector<int>>) {
    out.clear();
    for (auto x : v.il) out.push_back(static_cast<int>(x));
  } else if constexpr (std::is_same_v<T, std::vector<double>>) out = v.fl;
  else out = v.sl;
}

/// Fluent builder over one schema entry.
class Entry {
 public:
  explicit Entry(KeySpec& k) : m_k(k) {}
  Entry& def(std::string text) {
    m_k.default_text = std::move(text);
    m_k.required = false;
    return *this;
  }
  Entry& required() {
    m_k.required = true;
    return *this;
  }
  Entry& min(double v) {
    m_k.min = v;
    return *this;
  }
  Entry& max(double v) {
    m_k.max = v;
    return *this;
  }
  Entry& help(std::string h) {
    m_k.help = std::move(h);
    return *this;
  }

 private:
  KeySpec& m_k;
};

class Builder {
 public:
  explicit Builder(Schema& s) : m_s(s) {}

  template <class S, class T>
  Entry field(std::string key, S Config::*sec, T S::*member) {
    KeySpec k;
    k.key = std::move(key);
    k.type = value_type_of<T>();
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, std::uint64_t>) {
      k.type_min = std::numeric_limits<T>::min();
      k.type_max = std::numeric_limits<T>::max();
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      k.type_min = std::numeric_limits<int>::min();
      k.type_max = std::numeric_limits<int>::max();
    }
    k.set = [sec, member](Config& c, const Value& v) { from_value((c.*sec).*member, v); };
    k.get = [sec, member](const Config& c) { return to_deck_text((c.*sec).*member); };
    return Entry(m_s.add(std::move(k)));
  }

  template <class S, class E>
  Entry choice(std::string key, S Config::*sec, E S::*member,
               std::vector<std::pair<std::string, E>> names) {
    KeySpec k;
    k.key = std::move(key);
    k.type = ValueType::Enum;
    for (const auto& [n, e] : names) k.choices.push_back(n);
    k.set = [sec, member, names](Config& c, const Value& v) {
      for (const auto& [n, e] : names)
        if (n == v.s) (c.*sec).*member = e;
    };
    k.get = [sec, member, names](const Config& c) {
      for (const auto& [n, e] : names)
        if (e == (c.*sec).*member) return n;
      return std::string("?");
    };
    return Entry(m_s.add(std::move(k)));
  }

 private:
  Schema& m_s;
};

// ---- the table ----

void build(Schema& schema) {
  Builder b(schema);
  using C = Config;
  using namespace limits;  // NOLINT(google-build-using-namespace): the bounds read as words

  // [run]
  b.field("run.name", &C::run, &RunCfg::name).def("atlas")
      .help("run name; everything the run writes goes to run.out_dir/NAME/");
  b.field("run.steps", &C::run, &RunCfg::steps).def("20").min(1).max(1e9)
      .help("optimizer steps to train (a resumed run continues up to this step)");
  b.field("run.seed", &C::run, &RunCfg::seed).def("1234").min(0)
      .help("seed for model init, data order and the request generator");
  b.field("run.out_dir", &C::run, &RunCfg::out_dir).def("runs")
      .help("parent directory of run directories");
  b.field("run.resume", &C::run, &RunCfg::resume).def("\"\"")
      .help("\"\" = fresh start; latest = newest readable checkpoint in ckpt.dir; or a .h5 path");
  b.field("run.resume_fallback", &C::run, &RunCfg::resume_fallback).def("\"\"")
      .help("with run.resume = latest and no checkpoint in ckpt.dir yet: start from this .h5 instead of step "
            "0 (the restart loop and the Slurm scripts set it to the run.resume = PATH they replace, so a "
            "restarted fine-tune keeps its weights; a command-line run.resume = latest over the deck's "
            "run.resume = PATH sets it to PATH unless it is given)");
  b.field("run.log_every_steps", &C::run, &RunCfg::log_every_steps).def("1").min(1).max(1e9)
      .help("print a progress row every N steps");

  // [cluster]
  b.field("cluster.dcs", &C::cluster, &ClusterCfg::dcs).required()
      .help("names of the datacenters, e.g. east west south");
  b.field("cluster.gpus_per_dc", &C::cluster, &ClusterCfg::gpus_per_dc).required().min(0).max(kMaxGpusPerDc)
      .help("free GPUs (ranks) in each DC, one per cluster.dcs entry");
  b.field("cluster.gpus_per_node", &C::cluster, &ClusterCfg::gpus_per_node).def("8").min(1).max(1024)
      .help("GPUs per node; tensor parallelism stays inside a node");
  b.field("cluster.latency_ms", &C::cluster, &ClusterCfg::latency_ms).def("0").min(0).max(1e6)
      .help("one-way WAN latency matrix, row-major dc_count x dc_count (0 on the diagonal)");
  b.field("cluster.bandwidth_gbps", &C::cluster, &ClusterCfg::bandwidth_gbps).def("100").min(0).max(1e6)
      .help("WAN link capacity matrix in Gbit/s, row-major dc_count x dc_count (diagonal ignored)");
  b.field("cluster.intra_bandwidth_gbps", &C::cluster, &ClusterCfg::intra_bandwidth_gbps)
      .def("100").min(1e-6).max(1e6).help("bandwidth between GPUs inside a DC, Gbit/s (cost model)");
  b.field("cluster.intra_latency_us", &C::cluster, &ClusterCfg::intra_latency_us).def("5").min(0).max(1e6)
      .help("latency inside a DC, microseconds (cost model)");
  b.field("cluster.price_per_gpu_hour", &C::cluster, &ClusterCfg::price_per_gpu_hour).def("\"\"")
      .min(0).max(1e6).help("price of one GPU-hour in each DC (for the planner's cost column)");
  b.field("cluster.power_mw", &C::cluster, &ClusterCfg::power_mw).def("\"\"").min(0).max(1e6)
      .help("peak-power budget of each DC, MW (GPUs x the device profile's board_power_w x cluster.pue); "
            "the planner never uses more GPUs than it powers; empty = no budget");
  b.field("cluster.pue", &C::cluster, &ClusterCfg::pue).def("1.2").min(1).max(10)
      .help("power usage effectiveness (facility / IT power): one value for every DC, or one per DC");
  b.field("cluster.carbon_g_per_kwh", &C::cluster, &ClusterCfg::carbon_g_per_kwh).def("\"\"").min(0).max(1e5)
      .help("grid carbon intensity of each DC, gCO2/kWh (the planner's emissions column and objective); "
            "empty = not known");
  b.field("cluster.may_hold_data", &C::cluster, &ClusterCfg::may_hold_data).def("\"\"").min(0).max(1)
      .help("data residency, per DC: 1 = may hold the stages that read the training data or hold the "
            "embeddings (the first stage, and the last with the LM head), 0 = may not; empty = every DC may "
            "(atlas train refuses a layout that breaks it; atlas plan places the end stages)");
  b.field("cluster.bind_hosts", &C::cluster, &ClusterCfg::bind_hosts).def("127.0.0.1")
      .help("address the WAN transport listens on in each DC (one entry = all DCs)");
  b.field("cluster.ranks_per_host", &C::cluster, &ClusterCfg::ranks_per_host).def("0").min(0).max(kMaxGpusPerDc)
      .help("CPU runs: ranks that share one host's cores and, on the host profile, its memory (cost and memory "
            "model); 0 = a dedicated device per rank");
  b.field("cluster.cores_per_host", &C::cluster, &ClusterCfg::cores_per_host).def("0").min(0).max(1e6)
      .help("cores of each shared host (cost model); 0 = the hardware threads of this machine (in a job, "
            "world rank 0's machine, for every rank)");
  b.field("cluster.host_wake_us", &C::cluster, &ClusterCfg::host_wake_us).def("0").min(0).max(1e6)
      .help("CPU runs with more ranks than cores (cost model): per message, the delay from its "
            "arrival to its receiver running again; atlas bench fidelity measures it (0 = a core per rank)");
  b.field("cluster.host_net_ns_per_byte", &C::cluster, &ClusterCfg::host_net_ns_per_byte).def("0").min(0).max(1e6)
      .help("CPU runs (cost model): host CPU time per byte sent between DCs, sender and receiver together "
            "(TCP, and the emulated WAN's packet path); it slows compute on the hosts while a transfer "
            "runs; atlas bench fidelity measures it inside the emulated WAN (0 = free)");

  // [parallel]
  b.field("parallel.tp_size", &C::parallel, &ParallelCfg::tp_size).def("1").min(1).max(1024)
      .help("tensor-parallel ranks per stage replica (inside a node)");
  b.field("parallel.dp_size", &C::parallel, &ParallelCfg::dp_size).def("1").min(1).max(kMaxDp)
      .help("data-parallel pipelines (replicas of every stage, inside each DC)");
  b.field("parallel.stages_per_dc", &C::parallel, &ParallelCfg::stages_per_dc).required().min(0).max(kMaxStages)
      .help("pipeline stages held by each DC, contiguous, e.g. 2 1 1 (0 = DC unused); with "
            "parallel.dp_across_dcs the stages of each DC's own pipelines, the same in every DC");
  b.field("parallel.dp_across_dcs", &C::parallel, &ParallelCfg::dp_across_dcs).def("false")
      .help("data parallelism across DCs (the ablation's baseline, atlas bench ablation): every DC holds "
            "whole pipelines of parallel.stages_per_dc[d] stages (equal in every DC), parallel.dp_size "
            "counts the replicas of all DCs (a multiple of the DC count) and the DP gradient sums cross "
            "the WAN as a ring over MPI point-to-point (one TCP connection per peer, as Gloo; host memory), "
            "each of its steps at its slowest DC pair's round trip and one TCP flow's rate");

  // [model]
  b.field("model.layers", &C::model, &ModelCfg::layers).def("4").min(1).max(kMaxLayers)
      .help("transformer blocks");
  b.field("model.hidden", &C::model, &ModelCfg::hidden).def("128").min(1).max(kMaxHidden)
      .help("model width d_model");
  b.field("model.heads", &C::model, &ModelCfg::heads).def("4").min(1).max(kMaxHidden)
      .help("attention heads (divisible by parallel.tp_size)");
  b.field("model.kv_heads", &C::model, &ModelCfg::kv_heads).def("0").min(0).max(kMaxHidden)
      .help("key/value heads (grouped-query attention, dividing model.heads) in the cost model; 0 = "
            "model.heads. The runtime's block has one per head");
  b.field("model.ffn_hidden", &C::model, &ModelCfg::ffn_hidden).def("0").min(0).max(16 * kMaxHidden)
      .help("MLP width in the cost model; 0 = 4 x model.hidden, the runtime's");
  b.choice("model.mlp", &C::model, &ModelCfg::mlp, {{"gelu", MlpKind::Gelu}, {"swiglu", MlpKind::SwiGlu}})
      .def("gelu").help("MLP in the cost model: gelu (up, GELU, down: GPT and the runtime's block) or swiglu "
                        "(gate and up, SiLU(gate) x up, down: Llama)");
  b.field("model.dropout", &C::model, &ModelCfg::dropout).def("true")
      .help("dropout after attention and MLP in the cost model's memory (a 1-byte mask each, as "
            "Korthikanti et al. count them); false for models trained without (Llama). The runtime "
            "applies none");
  b.field("model.seq_len", &C::model, &ModelCfg::seq_len).def("64").min(2).max(kMaxTokens)
      .help("tokens per training sample");
  b.field("model.vocab", &C::model, &ModelCfg::vocab).def("256").min(2).max(kMaxTokens)
      .help("vocabulary size: >= 256 for data.tokenizer = byte, exactly 50257 for gpt2");
  b.field("model.layers_per_stage", &C::model, &ModelCfg::layers_per_stage).def("\"\"").min(1).max(kMaxLayers)
      .help("blocks on each pipeline stage; empty = an even split (model.layers % stages == 0)");
  b.field("model.init_std", &C::model, &ModelCfg::init_std).def("0.02").min(0)
      .help("standard deviation of the normal weight initialisation");

  // [train]
  b.field("train.micro_batch_size", &C::train, &TrainCfg::micro_batch_size).def("4").min(1).max(1e6)
      .help("samples per micro-batch");
  b.field("train.micro_batches", &C::train, &TrainCfg::micro_batches).def("8").min(1).max(kMaxMicroBatches)
      .help("micro-batches per pipeline per step (gradient accumulation)");
  b.field("train.lr", &C::train, &TrainCfg::lr).def("0.001").min(0).max(1e3).help("peak learning rate");
  b.field("train.min_lr", &C::train, &TrainCfg::min_lr).def("0.0001").min(0).max(1e3)
      .help("learning rate at the end of the cosine decay");
  b.field("train.warmup_steps", &C::train, &TrainCfg::warmup_steps).def("10").min(0).max(1e9)
      .help("linear warm-up steps");
  b.field("train.weight_decay", &C::train, &TrainCfg::weight_decay).def("0.1").min(0).max(1e3)
      .help("AdamW decoupled weight decay (weight matrices and embeddings; biases and LayerNorm "
            "parameters are exempt)");
  b.field("train.beta1", &C::train, &TrainCfg::beta1).def("0.9").min(0).max(0.999999)
      .help("AdamW beta1");
  b.field("train.beta2", &C::train, &TrainCfg::beta2).def("0.95").min(0).max(0.999999)
      .help("AdamW beta2");
  b.field("train.eps", &C::train, &TrainCfg::eps).def("1e-08").min(1e-30).max(1)
      .help("AdamW epsilon (> 0: it keeps the update finite where a gradient and its moments are 0)");
  b.field("train.grad_clip", &C::train, &TrainCfg::grad_clip).def("1").min(0).max(1e9)
      .help("clip the global gradient norm to this; 0 disables");
  b.field("train.dp_bucket_bytes", &C::train, &TrainCfg::dp_bucket_bytes).def("1M").min(1).max(4.0 * units::kGiB)
      .help("gradient all-reduce bucket size (binary suffixes K/M/G)");
  b.field("train.dp_overlap", &C::train, &TrainCfg::dp_overlap).def("true")
      .help("start each gradient bucket's DP all-reduce during the step's last backward, as soon as "
            "its layers are done (false: all buckets at the AllReduce slot)");
  b.field("train.eval_every_steps", &C::train, &TrainCfg::eval_every_steps).def("0").min(0).max(1e9)
      .help("validation loss every N steps (and at the end); 0 = only at the end");
  b.field("train.eval_batches", &C::train, &TrainCfg::eval_batches).def("4").min(1).max(kMaxMicroBatches)
      .help("micro-batches per validation pass");
  b.choice("train.recompute", &C::train, &TrainCfg::recompute,
           {{"auto", Recompute::Auto}, {"none", Recompute::None}, {"selective", Recompute::Selective},
            {"full", Recompute::Full}})
      .def("auto").help("activation recomputation in the cost model (time and memory; the host runtime "
                        "stores every activation): none, selective (the attention core, Korthikanti et al. "
                        "2022), full (each block's forward again before its backward) or auto (the device "
                        "profile's selective_recompute)");
  b.choice("train.attention", &C::train, &TrainCfg::attention,
           {{"auto", AttentionKernel::Auto}, {"fused", AttentionKernel::Fused}, {"unfused", AttentionKernel::Unfused}})
      .def("auto").help("attention kernels in the cost model: fused (FlashAttention: compute-bound, no s x s "
                        "tensor), unfused (QK^T, softmax, dropout, AV: Megatron-LM 2021) or auto (the device "
                        "profile's fused_attention)");
  b.choice("train.sequence_parallel", &C::train, &TrainCfg::sequence_parallel,
           {{"auto", ProfileSwitch::Auto}, {"on", ProfileSwitch::On}, {"off", ProfileSwitch::Off}})
      .def("auto").help("sequence parallelism in the cost model (Korthikanti et al. 2022): LayerNorm, dropout and "
                        "their activations split over TP, the TP all-reduces become all-gathers and "
                        "reduce-scatters; on, off or auto (the device profile's sequence_parallel)");

  b.field("train.zero_stage", &C::train, &TrainCfg::zero_stage).def("0").min(0).max(3)
      .help("optimizer-state sharding over a stage's DP replicas in the cost model (memory, the "
            "optimizer step's time and the DP traffic): 0 none, 1 the optimizer state (ZeRO-1, Megatron-LM's "
            "--use-distributed-optimizer; DP traffic an all-reduce's), 2 the gradients too (ZeRO-2, PyTorch "
            "FSDP without resharding the weights, as Llama 3: a reduce-scatter after every micro-batch's "
            "backward, timed where it outlasts the stage's next micro-batch); 3 (the weights too) is refused, "
            "not modelled. The runtime keeps the whole state on every rank");

  // [data]
  b.choice("data.format", &C::data, &DataCfg::format,
           {{"text", DataFormat::Text}, {"shards", DataFormat::Shards}})
      .def("text").help("text: tokenize data.corpus_dir at start-up, hold out data.val_fraction; "
                        "shards: llm.c token shards named by data.train_shards and data.val_shards "
                        "(atlas tokenize writes them; docs/formats.md)");
  b.field("data.corpus_dir", &C::data, &DataCfg::corpus_dir).def("data/brown")
      .help("directory of the Brown corpus text files (make data installs it)");
  b.choice("data.tokenizer", &C::data, &DataCfg::tokenizer,
           {{"byte", TokenizerKind::Byte}, {"gpt2", TokenizerKind::Gpt2}})
      .def("byte").help("text to token ids: byte (one token per byte, vocabulary 256) or gpt2 "
                        "(GPT-2 byte-level BPE, vocabulary 50257)");
  b.field("data.tokenizer_dir", &C::data, &DataCfg::tokenizer_dir).def("data/gpt2")
      .help("directory holding the GPT-2 encoder.json and vocab.bpe (make data installs them); "
            "used when data.tokenizer = gpt2");
  b.field("data.val_fraction", &C::data, &DataCfg::val_fraction).def("0.05").min(limits::kMinValFraction).max(limits::kMaxValFraction)
      .help("fraction of the token stream held out for validation (data.format = text)");
  b.field("data.train_shards", &C::data, &DataCfg::train_shards).def("\"\"")
      .help("data.format = shards: glob patterns of the training shards (e.g. dir/train_*.bin), "
            "read in name order, pattern by pattern");
  b.field("data.val_shards", &C::data, &DataCfg::val_shards).def("\"\"")
      .help("data.format = shards: glob patterns of the validation shards (e.g. dir/val_*.bin)");

  // [schedule]
  b.choice("schedule.kind", &C::schedule, &ScheduleCfg::kind,
           {{"gpipe", ScheduleKind::GPipe}, {"1f1b", ScheduleKind::OneFOneB},
            {"atlas", ScheduleKind::Atlas}})
      .def("1f1b").help("pipeline schedule: gpipe, 1f1b or atlas (temporal WAN sharing)");
  b.field("schedule.fwd_ms_per_layer", &C::schedule, &ScheduleCfg::fwd_ms_per_layer).def("0")
      .min(0).max(1e6).help("forward time of one block for one micro-batch, ms; 0 = estimate from FLOPs");
  b.field("schedule.bwd_over_fwd", &C::schedule, &ScheduleCfg::bwd_over_fwd).def("0").min(0).max(1e3)
      .help("backward time as a multiple of forward time, with schedule.fwd_ms_per_layer or "
            "schedule.device_tflops (0 = 2); without them the device profile costs the backward");
  b.field("schedule.device_tflops", &C::schedule, &ScheduleCfg::device_tflops).def("0").min(0).max(1e6)
      .help("achieved TFLOP/s per rank for the FLOP estimate; 0 = the plan.gpu profile");
  b.field("schedule.atlas_max_stagger", &C::schedule, &ScheduleCfg::atlas_max_stagger).def("0")
      .min(0).max(16).help("largest pipeline stagger the atlas search tries, in WAN transfer times; 0 = auto (2)");
  b.field("schedule.atlas_slots", &C::schedule, &ScheduleCfg::atlas_slots).def("0").min(0).max(kMaxMicroBatches)
      .help("atlas: transfers a WAN link carries at once (1 = strict temporal sharing); 0 = searched");
  b.field("schedule.virtual_stages", &C::schedule, &ScheduleCfg::virtual_stages).def("1").min(1).max(64)
      .help("model chunks per pipeline stage (interleaved 1F1B, Megatron-LM's virtual pipeline stages): "
            "chunk c of stage s holds the (c x stages + s)-th slice of the layers; the bubble drops "
            "v-fold for v x the boundary transfers. 1 = plain 1f1b. Needs 1f1b or atlas, more than one "
            "stage, train.micro_batches a multiple of the stages and, to run, layers per stage divisible by "
            "it (schedule and simulate also model uneven chunks, each chunk pass 1/v of its stage: at least "
            "v layers a stage, v - 1 on the first and the last; atlas plan searches v = 1 only)");
  b.choice("schedule.split_backward", &C::schedule, &ScheduleCfg::split_backward,
           {{"auto", SplitBackward::Auto}, {"on", SplitBackward::On}, {"off", SplitBackward::Off}})
      .def("auto")
      .help("zero-bubble split of each backward into its activation-gradient half (sent on at once) and its "
            "weight-gradient half, which runs later and fills waits: auto = the atlas search keeps it where "
            "the predicted step is lower at no more memory; on = every schedule kind splits; off = never. "
            "on needs schedule.virtual_stages = 1");

  // [wan]
  b.choice("wan.transport", &C::wan, &WanCfg::transport,
           {{"multirail", WanTransport::Multirail}, {"mpi", WanTransport::Mpi}})
      .def("multirail").help("cross-DC stage boundaries: multirail TCP or plain MPI (baseline)");
  b.field("wan.rails", &C::wan, &WanCfg::rails).def("4").min(1).max(limits::kMaxRails)
      .help("TCP connections per DC-pair peer");
  b.field("wan.chunk_bytes", &C::wan, &WanCfg::chunk_bytes).def("256K").min(1).max(limits::kMaxChunkBytes)
      .help("striping unit: messages are cut into chunks of this size (binary suffixes)");
  b.field("wan.max_frame_bytes", &C::wan, &WanCfg::max_frame_bytes).def("64M").min(1).max(4.0 * units::kGiB)
      .help("frames longer than this are rejected as corrupt");
  b.field("wan.recv_timeout_s", &C::wan, &WanCfg::recv_timeout_s).def("60").min(0.001).max(kMaxSeconds)
.help("a receive that makes no progress for this long fails, naming peer and rail; also the longest "
            "wait for a pipeline neighbour's tensor, the step's small sums (loss, gradient norm) and, on "
            "the host backend, a data-parallel gradient sum from the last backward to its end (a replica "
            "behind by more than this fails the job) and each tensor-parallel sum over MPI (NCCL sums "
            "keep device.nccl_timeout_s)");
  b.field("wan.connect_timeout_s", &C::wan, &WanCfg::connect_timeout_s).def("20").min(0.001).max(kMaxSeconds)
      .help("time allowed to connect and handshake every rail");
  b.choice("wan.emulate", &C::wan, &WanCfg::emulate,
           {{"none", WanEmulation::None}, {"netns", WanEmulation::Netns}})
      .def("none").help("none = plain loopback; netns = one network namespace per DC (root)");
  b.field("wan.flow_window_bytes", &C::wan, &WanCfg::flow_window_bytes).def("0").min(0).max(1.0 * units::kGiB)
      .help("emulated per-flow TCP window cap (namespace tcp_rmem/wmem); 0 = none");
  b.choice("wan.auth", &C::wan, &WanCfg::auth,
           {{"mac", WanAuth::Mac}, {"encrypt", WanAuth::Encrypt}, {"crc", WanAuth::Crc}})
      .def("mac").help("every frame's protection: mac = AES-256-GCM tag (payload in clear), encrypt "
                       "= AES-256-GCM encryption, crc = CRC32C only (accidents, not attackers)");
  b.field("wan.key_file", &C::wan, &WanCfg::key_file).def("\"\"")
      .help("job key: a file of >= 32 random bytes readable only by the job's user (chmod 600), "
            "mixed into every WAN pair secret; empty = X25519 alone (safe from passive observers)");
  b.field("wan.tcp_congestion", &C::wan, &WanCfg::tcp_congestion).def("auto")
      .help("TCP congestion control of every rail: auto = the system's unless it is bbr (which paces bursty "
            "rails at about burst/RTT), then cubic or reno; system = the namespace's default; or an "
            "algorithm's name (cubic, reno, ...), which must be available to this process");
  b.field("wan.warmup_bytes", &C::wan, &WanCfg::warmup_bytes).def("1M").min(0).max(1.0 * units::kGiB)
      .help("per new rail and direction, Pad bytes sent and acknowledged before the rail carries data "
            "(grows the fresh TCP window; at most 64 frames of min(64K, wan.chunk_bytes)); 0 = none");

  // [ckpt]
  b.field("ckpt.dir", &C::ckpt, &CkptCfg::dir).def("\"\"")
      .help("checkpoint directory; empty = run.out_dir/run.name/ckpt");
  b.field("ckpt.every_steps", &C::ckpt, &CkptCfg::every_steps).def("0").min(0).max(1e9)
      .help("write a checkpoint every N steps; 0 = only the final one");
  b.field("ckpt.keep_last", &C::ckpt, &CkptCfg::keep_last).def("3").min(1).max(1e6)
      .help("how many checkpoints to keep");
  b.field("ckpt.final", &C::ckpt, &CkptCfg::final).def("true")
      .help("write a checkpoint after the last step");
  b.choice("ckpt.transfer", &C::ckpt, &CkptCfg::transfer,
           {{"auto", CkptTransfer::Auto}, {"collective", CkptTransfer::Collective},
            {"independent", CkptTransfer::Independent}})
      .def("auto").help("MPI-IO transfers of checkpoint writes: auto = TP-strided tensors regrouped into whole "
                        "rows first, then independent (fastest on a local disk); collective = MPI-IO aggregates "
                        "(may pay off on a parallel file system); independent");

  // [profile]
  b.field("profile.enabled", &C::profile, &ProfileCfg::enabled).def("true")
      .help("record every slot every rank runs into profile.h5");
  b.field("profile.trace_json", &C::profile, &ProfileCfg::trace_json).def("true")
      .help("also write trace.json (Chrome trace format, opens in Perfetto)");

  // [device]
  b.choice("device.backend", &C::device, &DeviceCfg::backend,
           {{"host", Backend::Host}, {"cuda", Backend::Cuda}, {"emulated", Backend::Emulated}})
      .def("host").help("compute backend: host (OpenBLAS, the reference), cuda, or emulated: no arithmetic, each "
                        "forward, backward and optimizer step sleeps the time the table predicts for it while every "
                        "message (boundaries, DP all-reduce, WAN) moves at its real size; rehearses a job's "
                        "communication at scale (docs/emulated.md). No loss, no checkpoints, no evaluation");
  b.choice("device.precision", &C::device, &DeviceCfg::precision,
           {{"auto", Precision::Auto}, {"fp32", Precision::Fp32}, {"tf32", Precision::Tf32},
            {"bf16", Precision::Bf16}})
      .def("auto").help("numbers of matmul inputs: fp32 (the reference), tf32 or bf16 (inputs rounded to nearest "
                        "even, fp32 accumulation; master weights, gradients, AdamW state and LayerNorm/softmax/"
                        "cross-entropy statistics stay fp32; bf16 pipeline boundaries travel as bf16, half the "
                        "bytes). auto = bf16 on cuda, fp32 on host and emulated. The host backend emulates tf32 "
                        "and bf16 bit for bit in its matmul inputs (docs/precision.md)");
  b.field("device.threads", &C::device, &DeviceCfg::threads).def("0").min(0).max(4096)
      .help("host backend threads per rank; 0 = cores / ranks on this machine (ATLAS_HOST_RANKS if set, "
            "else the MPI node-local size)");
  b.choice("device.sched_batch", &C::device, &DeviceCfg::sched_batch,
           {{"auto", SchedBatch::Auto}, {"true", SchedBatch::On}, {"false", SchedBatch::Off}})
      .def("auto").help("host backend: run ranks under SCHED_BATCH (a rank waking from a poll does not preempt "
                        "one that computes); auto = when more ranks share this machine than it has hardware "
                        "threads");
  b.field("device.nccl_timeout_s", &C::device, &DeviceCfg::nccl_timeout_s).def("300").min(0.001).max(kMaxSeconds)
      .help("cuda backend: an NCCL set-up or operation that takes longer aborts the communicator with an "
            "error");
  b.field("device.cuda_graphs", &C::device, &DeviceCfg::cuda_graphs).def("false")
      .help("cuda backend: run each transformer block's forward, backward and weight-gradient pass as a CUDA "
            "graph, recorded on its second run for each micro-batch arena and launched from then on (one launch "
            "instead of one per kernel); needs parallel.tp_size = 1. The footer counts graphs and launches "
            "(docs/cuda.md, \"CUDA graphs\")");

  // [bubbletea]
  b.field("bubbletea.enabled", &C::bubbletea, &BubbleTeaCfg::enabled).def("false")
      .help("serve inference prefill in the pipeline's bubbles");
  b.field("bubbletea.layers", &C::bubbletea, &BubbleTeaCfg::layers).def("2").min(1).max(kMaxLayers)
      .help("inference model blocks");
  b.field("bubbletea.hidden", &C::bubbletea, &BubbleTeaCfg::hidden).def("64").min(1).max(kMaxHidden)
      .help("inference model width");
  b.field("bubbletea.heads", &C::bubbletea, &BubbleTeaCfg::heads).def("4").min(1).max(kMaxHidden)
      .help("inference model attention heads");
  b.field("bubbletea.context", &C::bubbletea, &BubbleTeaCfg::context).def("128").min(2).max(kMaxTokens)
      .help("inference context: prompt plus generated tokens");
  b.field("bubbletea.vocab", &C::bubbletea, &BubbleTeaCfg::vocab).def("256").min(2).max(kMaxTokens)
      .help("inference vocabulary size");
  b.field("bubbletea.weights", &C::bubbletea, &BubbleTeaCfg::weights).def("random")
      .help("random (seeded) or the path of an atlas checkpoint to load");
  b.field("bubbletea.trace", &C::bubbletea, &BubbleTeaCfg::trace).def("\"\"")
      .help("CSV request trace (arrival_s,prompt,max_new_tokens); empty = Poisson generator");
  b.field("bubbletea.rate_per_s", &C::bubbletea, &BubbleTeaCfg::rate_per_s).def("20").min(0).max(1e6)
      .help("Poisson request arrival rate of the generator");
  b.field("bubbletea.requests", &C::bubbletea, &BubbleTeaCfg::requests).def("64").min(0).max(limits::kMaxRequests)
      .help("requests the generator makes");
  b.field("bubbletea.prompt_tokens_min", &C::bubbletea, &BubbleTeaCfg::prompt_tokens_min)
      .def("8").min(1).max(kMaxTokens).help("shortest generated prompt, tokens");
  b.field("bubbletea.prompt_tokens_max", &C::bubbletea, &BubbleTeaCfg::prompt_tokens_max)
      .def("64").min(1).max(kMaxTokens).help("longest generated prompt, tokens");
  b.field("bubbletea.max_new_tokens", &C::bubbletea, &BubbleTeaCfg::max_new_tokens).def("8")
      .min(1).max(kMaxTokens).help("tokens the decode worker generates per request");
  b.field("bubbletea.guard_ms", &C::bubbletea, &BubbleTeaCfg::guard_ms).def("0.5").min(0).max(1e6)
      .help("safety margin added to a prefill's predicted time before admission");
  b.field("bubbletea.watch_recv", &C::bubbletea, &BubbleTeaCfg::watch_recv).def("true")
      .help("in a bubble that ends in a receive, test it before every chunk and stop when it has "
            "arrived (false: fill the table's prediction or the allowance learned from past waits)");
  b.field("bubbletea.fill_wan_waits", &C::bubbletea, &BubbleTeaCfg::fill_wan_waits).def("true")
      .help("also fill the WAN round trips inside training slots (the tied-embedding gradient sum "
            "between DCs in AllReduce, the gradient-norm sum across DCs in Optimizer), testing the "
            "sum before every chunk and stopping when it is done, within the wait the deck's WAN "
            "predicts x max_stretch or, when longer, wan_wait_quantile of that slot's real waits");
  b.field("bubbletea.fill_recv_waits", &C::bubbletea, &BubbleTeaCfg::fill_recv_waits).def("true")
      .help("also fill receives the table expected to find done but that wait (no bubble before "
            "them, or a bubble shorter than the real wait): watched, within recv_wait_quantile of "
            "that slot's waits over the last 8 steps (by default the shortest, so a receive that is "
            "sometimes on time is never filled)");
  b.field("bubbletea.max_stretch", &C::bubbletea, &BubbleTeaCfg::max_stretch).def("3").min(1).max(100)
      .help("a bubble is never filled past this times the table's prediction, whether watched "
            "(watch_recv, see stretch_quantile) or by a learned allowance (1 = never beyond the table)");
  b.field("bubbletea.stretch_quantile", &C::bubbletea, &BubbleTeaCfg::stretch_quantile).def("0.5").min(0).max(1)
      .help("a watched bubble longer than the table's: past the table, a chunk starts only if it is "
            "predicted to end within this quantile of the bubble's real lengths over its last 8 steps "
            "(0 = the shortest: training first; 1 = the longest: about until the data comes, more "
            "prefill, a chunk in flight more often when it does)");
  b.field("bubbletea.wan_wait_quantile", &C::bubbletea, &BubbleTeaCfg::wan_wait_quantile).def("0.5").min(0).max(1)
      .help("fill_wan_waits: past the deck's prediction x max_stretch, a WAN wait inside a training slot "
            "is filled within this quantile of its real waits over the last 8 steps (0 = the shortest: "
            "training first; 1 = the longest: more prefill, and both partners of the sum wait on it)");
  b.field("bubbletea.recv_wait_quantile", &C::bubbletea, &BubbleTeaCfg::recv_wait_quantile).def("0").min(0).max(1)
      .help("fill_recv_waits: a receive that waits outside the table's bubbles is filled, once it has "
            "8 steps of waits, within this quantile of them (0 = the shortest: a chunk never runs past "
            "the data unless this wait is the shortest yet; higher: more prefill, the data stops a chunk "
            "between its blocks more often)");
  b.field("bubbletea.kv_cap_bytes", &C::bubbletea, &BubbleTeaCfg::kv_cap_bytes).def("64M").min(1).max(1024.0 * units::kGiB)
      .help("KV-cache memory cap per rank (binary suffixes)");
  b.field("bubbletea.chunk_tokens", &C::bubbletea, &BubbleTeaCfg::chunk_tokens).def("0").min(0).max(kMaxTokens)
      .help("chunked prefill: tokens per chunk; 0 = whole prompts");
  b.field("bubbletea.max_in_flight", &C::bubbletea, &BubbleTeaCfg::max_in_flight).def("0").min(0).max(1000000)
      .help("requests being prefilled at once per inference pipeline (admitted, last rank not yet done); "
            "0 = 2 x the pipeline's ranks. A request stays in its pipeline while its chunks cross every "
            "rank in their bubbles, so this bounds prefill throughput when requests queue; kv_cap_bytes "
            "still bounds their memory");
  b.choice("bubbletea.pipeline", &C::bubbletea, &BubbleTeaCfg::pipeline,
           {{"replica", InferPipeline::Replica}, {"dc", InferPipeline::Dc}})
      .def("replica")
      .help("which ranks form an inference pipeline (its blocks split over them, a request's chunks "
            "crossing them in their bubbles): replica = the ranks of one DP replica inside a DC, in stage "
            "order (a later stage's bubble lies inside the earlier one's, so a rank is fed while it has a "
            "bubble; dp pipelines per DC); dc = all the DC's ranks in rank order (one pipeline per DC, "
            "fewer blocks per rank, a longer chain)");

  // [plan]
  b.choice("plan.gpu", &C::plan, &PlanCfg::gpu,
           {{"host", GpuKind::Host}, {"a100", GpuKind::A100}, {"h100", GpuKind::H100},
            {"h200", GpuKind::H200}})
      .def("host").help("device cost profile used by plan, simulate and the schedule estimate");
  b.field("plan.deadline_s", &C::plan, &PlanCfg::deadline_s).def("0").min(0).max(kMaxSeconds)
      .help("if > 0, the planner picks the cheapest plan whose step time meets this");
  b.choice("plan.objective", &C::plan, &PlanCfg::objective,
           {{"auto", PlanObjective::Auto}, {"time", PlanObjective::Time}, {"cost", PlanObjective::Cost},
            {"energy", PlanObjective::Energy}, {"carbon", PlanObjective::Carbon}})
      .def("auto").help("what the chosen plan minimises (within plan.deadline_s if set): step time, price, "
                        "energy (kWh, at cluster.pue) or emissions (cluster.carbon_g_per_kwh) per step; "
                        "auto = time, or cost with a deadline");
  b.field("plan.max_tp", &C::plan, &PlanCfg::max_tp).def("8").min(1).max(1024)
      .help("largest tensor-parallel size the planner tries");
  b.field("plan.top", &C::plan, &PlanCfg::top).def("10").min(1).max(100)
      .help("rows in the planner's what-if table");
  b.field("plan.profiles", &C::plan, &PlanCfg::profiles).def("\"\"")
      .help("device profile files for plan/simulate; empty = profiles/device/<plan.gpu>.profile");
}

}  // namespace

// ---- KeySpec ----

std::string KeySpec::expectation() const {
  switch (type) {
    case ValueType::Int: return "an integer" + range_text(*this);
    case ValueType::Float: return "a number" + range_text(*this);
    case ValueType::Bool: return "true or false";
    case ValueType::String: return "a string";
    case ValueType::Bytes:
      return "a byte count (binary suffixes K, M, G)" + range_text(*this);
    case ValueType::Enum: return "one of: " + join(choices, ", ");
    case ValueType::IntList: return "a space-separated list of integers" + range_text(*this);
    case ValueType::FloatList: return "a space-separated list of numbers" + range_text(*this);
    case ValueType::StringList: return "a space-separated list of names";
  }
  return "?";
}

std::optional<Value> KeySpec::convert(std::string_view text, std::string& why) const {
  Value v;
  why = expectation();
  const std::string plain = unquote(text);
  const bool is_list = type == ValueType::IntList || type == ValueType::FloatList ||
                       type == ValueType::StringList;
  if (is_list && plain.find_first_not_of(" \t") == std::string::npos) return v;  // empty list
  switch (type) {
    case ValueType::Int: {
      auto r = units::parse_int(plain);
      if (!r || !int_in_range(*this, *r)) return std::nullopt;
      v.i = *r;
      break;
    }
    case ValueType::Float: {
      auto r = units::parse_double(plain);
      if (!r || !in_range(*this, *r)) return std::nullopt;
      v.f = *r;
      break;
    }
    case ValueType::Bool: {
      auto r = units::parse_bool(plain);
      if (!r) return std::nullopt;
      v.b = *r;
      break;
    }
    case ValueType::String:
      // The deck has no escape for a double quote: one inside a value cannot be written back
      // (resolved.deck, a checkpoint's deck, --deck-out would not parse).
      if (plain.find('"') != std::string::npos) {
        why = "a string without double quotes (a deck value cannot hold one)";
        return std::nullopt;
      }
      v.s = plain;
      break;
    case ValueType::Bytes: {
      auto r = units::parse_bytes(plain);
      if (!r || !in_range(*this, static_cast<double>(*r))) return std::nullopt;
      v.bytes = *r;
      break;
    }
    case ValueType::Enum:
      if (std::find(choices.begin(), choices.end(), plain) == choices.end()) return std::nullopt;
      v.s = plain;
      break;
    case ValueType::IntList:
      // A list quoted whole ("4 4", as a shell passes it) is the list inside the quotes.
      for (const auto& e : split_list(whole_list_quoted(text, plain) ? std::string_view(plain) : text)) {
        auto r = units::parse_int(e);
        if (!r || !int_in_range(*this, *r)) return std::nullopt;
        v.il.push_back(*r);
      }
      break;
    case ValueType::FloatList:
      for (const auto& e : split_list(whole_list_quoted(text, plain) ? std::string_view(plain) : text)) {
        auto r = units::parse_double(e);
        if (!r || !in_range(*this, *r)) return std::nullopt;
        v.fl.push_back(*r);
      }
      break;
    case ValueType::StringList:
      v.sl = split_list(text);
      for (const auto& e : v.sl)
        if (e.find('"') != std::string::npos) {
          why = "a space-separated list of names without double quotes inside them";
          return std::nullopt;
        }
      break;
  }
  return v;
}

// ---- Schema ----

const Schema& Schema::instance() {
  static const Schema s = [] {
    Schema out;
    build(out);
    return out;
  }();
  return s;
}

KeySpec& Schema::add(KeySpec spec) {
  m_keys.push_back(std::move(spec));
  return m_keys.back();
}

const KeySpec* Schema::find(std::string_view key) const {
  for (const auto& k : m_keys)
    if (k.key == key) return &k;
  return nullptr;
}

std::vector<std::string> Schema::suggestions(std::string_view key) const {
  // (closeness, whole-key edit distance as the tie-break: "parallel.dp" -> dp_size before
  // dp_across_dcs, both containing "dp", key)
  std::vector<std::tuple<std::size_t, std::size_t, std::string>> scored;
  const std::string_view tail = key.substr(key.find('.') == std::string_view::npos ? 0 : key.find('.') + 1);
  for (const auto& k : m_keys) {
    const std::size_t whole = edit_distance(key, k.key);
    std::size_t d = whole;
    // A key in the wrong section, a shortened name ("wan.rail" -> "wan.rails") or one with the
    // same stem ("wan.rail_count" -> "wan.rails") is close too.
    const std::string ktail = k.key.substr(k.key.find('.') + 1);
    d = std::min(d, edit_distance(tail, ktail) + 1);
    if (!tail.empty() && ktail.find(tail) != std::string::npos) d = std::min<std::size_t>(d, 2);
    if (common_prefix(tail, ktail) >= 4) d = std::min<std::size_t>(d, 2);
    if (d <= std::max<std::size_t>(2, key.size() / 4)) scored.emplace_back(d, whole, k.key);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(std::get<2>(scored[i]));
  return out;
}

std::string Schema::markdown() const {
  std::ostringstream os;
  os << "# Input deck reference\n\n"
     << "Generated from the schema by `atlas schedule --help-deck-markdown`; do not edit by hand.\n\n"
     << "A deck is `section.key = value` lines (or `key = value` lines under a `[section]` "
        "header), `#` comments, space-separated lists and \"quoted strings\". `key=value` "
        "arguments after the deck path override it. Byte sizes take binary suffixes "
        "(`K` = 1024, `M`, `G`). Unknown keys, bad values and out-of-range values are errors; "
        "nothing is clamped. Every number has an upper bound far above any real job, so that "
        "`atlas schedule`, `simulate` and `plan` stay within memory and seconds; products are "
        "bounded too (at most "
     << fmt_num(limits::kMaxGlobalBatch) << " sequences per step, and a schedule table of at most "
     << fmt_num(limits::kMaxScheduleSlots)
     << " slots, estimated as 6 x train.micro_batches x stages x parallel.dp_size x schedule.virtual_stages). A deck is a "
        "regular file of at most 16 MiB.\n";
  std::string section;
  for (const auto& k : m_keys) {
    if (k.section() != section) {
      section = k.section();
      os << "\n## [" << section << "]\n\n| key | type | default | help |\n|---|---|---|---|\n";
    }
    os << "| `" << k.key << "` | " << k.expectation() << " | "
       << (k.required ? std::string("**required**") : "`" + k.default_text + "`") << " | "
       << k.help << " |\n";
  }
  return os.str();
}

std::string Schema::help_text() const {
  std::ostringstream os;
  std::string section;
  for (const auto& k : m_keys) {
    if (k.section() != section) {
      section = k.section();
      os << "\n[" << section << "]\n";
    }
    os << "  " << k.key << " = " << (k.required ? std::string("(required)") : k.default_text)
       << "\n      " << k.help << "\n      expects " << k.expectation() << "\n";
  }
  return os.str();
}

}  // namespace atlas::deck
