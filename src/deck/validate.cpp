// SPDX-License-Identifier: MIT
// Cross-field validation: every problem is collected, none is clamped or silently fixed.
#include <cstdint>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/schema.hpp"

namespace atlas::deck {

namespace {

std::string str(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void check_cluster(const Config& c, std::vector<std::string>& out) {
  const auto& cl = c.cluster;
  const int n = cl.dc_count();
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  if (n == 0) {
    out.push_back("cluster.dcs is empty: name at least one datacenter");
    return;
  }
  if (n > limits::kMaxDcs) {
    out.push_back("cluster.dcs names " + std::to_string(n) + " datacenters, more than " +
                  str(limits::kMaxDcs) + "\n  hint: list the DCs the job may use");
    return;
  }
  std::set<std::string> names;
  for (const std::string& dc : cl.dcs)
    if (dc.empty() || dc.find_first_of(" \t") != std::string::npos) {
      out.push_back("cluster.dcs: DC name '" + dc + "' is " + (dc.empty() ? "empty" : "more than one word") +
                    ": a DC is named by one word\n  hint: list the names unquoted, e.g. cluster.dcs = east west");
      break;
    } else if (!names.insert(dc).second) {
      out.push_back("cluster.dcs names '" + dc + "' twice: names must be unique\n  hint: one name per datacenter");
      break;
    }
  if (cl.gpus_per_dc.size() != static_cast<std::size_t>(n))
    out.push_back("cluster.gpus_per_dc has " + std::to_string(cl.gpus_per_dc.size()) +
                  " entries but cluster.dcs names " + std::to_string(n) + " DCs\n  hint: give one GPU count per DC");
  std::int64_t total_gpus = 0;
  for (int g : cl.gpus_per_dc) total_gpus += g;
  if (!cl.gpus_per_dc.empty() && total_gpus == 0)
    out.push_back("cluster.gpus_per_dc: every DC has zero GPUs; at least one DC needs GPUs");
  auto check_matrix = [&](const std::vector<double>& m, const char* key, bool positive, bool zero_diagonal) {
    if (n == 1 && m.size() == 1) return;  // a 1x1 matrix (or the scalar default) is fine
    if (m.size() == 1 && nn > 1) {
      out.push_back(std::string(key) + " is one value (the deck's, or its 1-DC default when the deck does not set it), "
                    "but " + std::to_string(n) + " DCs need a square " + std::to_string(n) + "x" + std::to_string(n) +
                    " matrix (" + std::to_string(nn) + " entries, row-major)\n  hint: set " + key +
                    ": row i lists DC i's values to every DC j");
      return;
    }
    if (m.size() != nn) {
      out.push_back(std::string(key) + " has " + std::to_string(m.size()) + " entries, but " +
                    std::to_string(n) + " DCs need a square " + std::to_string(n) + "x" +
                    std::to_string(n) + " matrix (" + std::to_string(nn) +
                    " entries, row-major)\n  hint: row i lists DC i's values to every DC j");
      return;
    }
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        const double v = m[static_cast<std::size_t>(a * n + b)];
        if (a != b && positive && !(v > 0))
          out.push_back(std::string(key) + " entry (" + cl.dcs[static_cast<std::size_t>(a)] + ", " +
                        cl.dcs[static_cast<std::size_t>(b)] + ") is " + str(v) +
                        ": links between DCs need a positive bandwidth");
        // A DC's entry to itself is no WAN link: a value there was ignored without a word.
        if (a == b && zero_diagonal && v != 0)
          out.push_back(std::string(key) + " entry (" + cl.dcs[static_cast<std::size_t>(a)] + ", " +
                        cl.dcs[static_cast<std::size_t>(a)] + ") is " + str(v) +
                        ": the diagonal is a DC to itself, not a WAN link, and must be 0\n  hint: set it to 0; "
                        "the latency inside a DC is cluster.intra_latency_us");
      }
  };
  check_matrix(cl.latency_ms, "cluster.latency_ms", false, true);
  check_matrix(cl.bandwidth_gbps, "cluster.bandwidth_gbps", true, false);
  if (!cl.price_per_gpu_hour.empty() && cl.price_per_gpu_hour.size() != static_cast<std::size_t>(n))
    out.push_back("cluster.price_per_gpu_hour has " + std::to_string(cl.price_per_gpu_hour.size()) +
                  " entries; give none or one per DC (" + std::to_string(n) + ")");
  auto per_dc = [&](std::size_t size, const char* key) {
    if (size != 0 && size != static_cast<std::size_t>(n))
      out.push_back(std::string(key) + " has " + std::to_string(size) + " entries; give none or one per DC (" +
                    std::to_string(n) + ")");
  };
  per_dc(cl.power_mw.size(), "cluster.power_mw");
  per_dc(cl.carbon_g_per_kwh.size(), "cluster.carbon_g_per_kwh");
  per_dc(cl.may_hold_data.size(), "cluster.may_hold_data");
  if (cl.pue.size() > 1 && cl.pue.size() != static_cast<std::size_t>(n))
    out.push_back("cluster.pue has " + std::to_string(cl.pue.size()) + " entries; give one (for every DC) or one per DC (" +
                  std::to_string(n) + ")");
  if (cl.bind_hosts.size() != 1 && cl.bind_hosts.size() != static_cast<std::size_t>(n))
    out.push_back("cluster.bind_hosts has " + std::to_string(cl.bind_hosts.size()) +
                  " entries; give one (for every DC) or one per DC (" + std::to_string(n) + ")");
}

void check_parallel(const Config& c, const JobShape& shape, std::vector<std::string>& out) {
  const auto& p = c.parallel;
  const int n = c.cluster.dc_count();
  if (n > limits::kMaxDcs) return;  // reported by check_cluster
  if (p.stages_per_dc.size() != static_cast<std::size_t>(n)) {
    out.push_back("parallel.stages_per_dc has " + std::to_string(p.stages_per_dc.size()) +
                  " entries but cluster.dcs names " + std::to_string(n) +
                  " DCs\n  hint: one stage count per DC, 0 for a DC the job does not use");
    return;
  }
  if (p.pp_size() == 0) {
    out.push_back("parallel.stages_per_dc places no stage in any DC: the pipeline needs at least one");
    return;
  }
  if (p.dp_across_dcs) {
    for (int dc = 0; dc < n; ++dc)
      if (p.stages_per_dc[static_cast<std::size_t>(dc)] != p.stages_per_dc[0]) {
        out.push_back("parallel.dp_across_dcs = true: parallel.stages_per_dc must give every DC the same "
                      "stage count (each DC holds whole pipelines), but DC '" +
                      c.cluster.dcs[static_cast<std::size_t>(dc)] + "' has " +
                      std::to_string(p.stages_per_dc[static_cast<std::size_t>(dc)]) + " and DC '" +
                      c.cluster.dcs[0] + "' " + std::to_string(p.stages_per_dc[0]) +
                      "\n  hint: e.g. parallel.stages_per_dc = " + std::to_string(p.pp_size()));
        return;
      }
    if (c.bubbletea.enabled)
      out.push_back("parallel.dp_across_dcs = true with bubbletea.enabled = true: BubbleTea fills the bubbles of a "
                    "pipeline that crosses DCs, and here none does\n  hint: set bubbletea.enabled = false (atlas "
                    "bench ablation runs row (a) without it)");
    if (p.dp_size % n != 0) {
      out.push_back("parallel.dp_across_dcs = true: parallel.dp_size = " + std::to_string(p.dp_size) +
                    " must be a multiple of the " + std::to_string(n) +
                    " DCs (each holds dp_size / DCs replicas)\n  hint: parallel.dp_size = " +
                    std::to_string(n * std::max(1, p.dp_size / n)));
      return;
    }
  }
  if (p.tp_size > c.cluster.gpus_per_node)
    out.push_back("parallel.tp_size = " + std::to_string(p.tp_size) + " exceeds cluster.gpus_per_node = " +
                  std::to_string(c.cluster.gpus_per_node) +
                  ": tensor parallelism must stay inside a node");
  if (c.cluster.gpus_per_dc.size() == static_cast<std::size_t>(n)) {
    for (int dc = 0; dc < n; ++dc) {
      const std::int64_t need = p.ranks_in_dc(dc);
      const int have = c.cluster.gpus_per_dc[static_cast<std::size_t>(dc)];
      if (need > have)
        out.push_back("DC '" + c.cluster.dcs[static_cast<std::size_t>(dc)] + "' holds " +
                      std::to_string(p.stages_per_dc[static_cast<std::size_t>(dc)]) +
                      " stages x dp " + std::to_string(p.dp_across_dcs ? p.dp_size / n : p.dp_size) + " x tp " +
                      std::to_string(p.tp_size) + " = " + std::to_string(need) +
                      " GPUs but cluster.gpus_per_dc gives it " + std::to_string(have) +
                      "\n  hint: move stages to another DC or lower dp/tp (atlas plan suggests a layout)");
    }
  }
  if (shape.world_size > 0) {
    if (auto m = p.size_mismatch(shape.world_size); !m.empty()) out.push_back(m);
  }
}

void check_model(const Config& c, std::vector<std::string>& out) {
  const auto& m = c.model;
  // Stages are counted only when the layout is consistent (checked by check_parallel).
  const bool layout_ok = c.cluster.dc_count() <= limits::kMaxDcs &&
                         c.parallel.stages_per_dc.size() == static_cast<std::size_t>(c.cluster.dc_count());
  const int pp = layout_ok ? c.parallel.pp_size() : 0;
  const int tp = c.parallel.tp_size;
  // Every division below needs a positive divisor: a rejected value keeps its (positive)
  // default, and the schema's minimums keep these >= 1, but a division never trusts that.
  // The embedding must hold every id the tokenizer makes (model.vocab may pad beyond it for
  // byte; GPT-2's checkpoints and reference ids fix it at exactly 50257 for gpt2).
  if (c.data.tokenizer == TokenizerKind::Gpt2 && m.vocab != 50257)
    out.push_back("model.vocab = " + std::to_string(m.vocab) +
                  " does not match data.tokenizer = gpt2, whose vocabulary is 50257 tokens\n"
                  "  hint: set model.vocab = 50257 (or data.tokenizer = byte)");
  if (c.data.tokenizer == TokenizerKind::Byte && m.vocab < 256)
    out.push_back("model.vocab = " + std::to_string(m.vocab) +
                  " is smaller than data.tokenizer = byte's 256 symbols\n"
                  "  hint: set model.vocab = 256 (or larger)");
  if (m.heads > 0 && m.hidden % m.heads != 0)
    out.push_back("model.hidden = " + std::to_string(m.hidden) + " is not divisible by model.heads = " +
                  std::to_string(m.heads) + "\n  hint: pick hidden = heads * head_dim");
  if (tp > 0 && m.heads > 0 && m.heads % tp != 0)
    out.push_back("model.heads = " + std::to_string(m.heads) + " is not divisible by parallel.tp_size = " +
                  std::to_string(tp) + ": tensor parallelism splits whole heads across ranks\n"
                  "  hint: choose heads as a multiple of tp_size");
  if (m.kv_heads > 0 && m.heads > 0 && m.heads % m.kv_heads != 0)
    out.push_back("model.kv_heads = " + std::to_string(m.kv_heads) + " does not divide model.heads = " +
                  std::to_string(m.heads) + ": each key/value head serves a whole group of query heads\n"
                  "  hint: a divisor of model.heads (0 = one per head)");
  // Tensor parallelism splits the key/value heads too, or replicates one on each of tp / kv ranks.
  if (m.kv_heads > 0 && tp > 0 && m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    out.push_back("model.kv_heads = " + std::to_string(m.kv_heads) + " neither divides into nor divides "
                  "parallel.tp_size = " + std::to_string(tp) + ": each TP rank holds whole key/value heads, or "
                  "one head replicated on tp / kv_heads ranks\n  hint: a multiple or a divisor of parallel.tp_size");
  if (pp <= 0) return;
  if (m.layers_per_stage.empty()) {
    if (m.layers % pp != 0)
      out.push_back("model.layers = " + std::to_string(m.layers) + " does not divide into " +
                    std::to_string(pp) + " pipeline stages\n  hint: set model.layers to a multiple of " +
                    std::to_string(pp) + " or list model.layers_per_stage explicitly");
  } else {
    std::int64_t sum = 0;
    for (int v : m.layers_per_stage) sum += v;
    if (m.layers_per_stage.size() != static_cast<std::size_t>(pp) || sum != m.layers)
      out.push_back("model.layers_per_stage lists " + std::to_string(m.layers_per_stage.size()) +
                    " stages summing to " + std::to_string(sum) + " blocks, but the layout has " +
                    std::to_string(pp) + " stages and model.layers = " + std::to_string(m.layers) +
                    "\n  hint: one entry per stage, summing to model.layers");
  }
}

/// schedule.virtual_stages (interleaved 1F1B) needs what Megatron-LM's interleaved schedule
/// needs: a 1F1B-based schedule, more than one stage, every stage's layers in v equal chunks and
/// the micro-batches in whole groups of pp. A deck that is only modelled (schedule, simulate,
/// plan: shape.world_size < 0) may split a stage's layers unevenly, as Llama 3's runs did (the
/// first stage's first chunk only the embedding, the last stage's last chunk only the head): the
/// cost model charges every chunk pass 1 / v of the stage's time and activations, so each stage
/// needs at least v layers, the first and the last v - 1.
void check_virtual_stages(const Config& c, const JobShape& shape, std::vector<std::string>& out) {
  const int v = c.schedule.virtual_stages;
  if (v <= 1) return;
  const std::string key = "schedule.virtual_stages = " + std::to_string(v);
  if (c.schedule.split_backward == SplitBackward::On)
    out.push_back(key + " cannot run with schedule.split_backward = on: the zero-bubble split of the backward "
                  "is built for one model chunk per stage\n"
                  "  hint: set schedule.split_backward = auto (no split with chunks) or off, or "
                  "schedule.virtual_stages = 1");
  if (c.schedule.kind == ScheduleKind::GPipe)
    out.push_back(key + " needs an interleaved 1F1B schedule, but schedule.kind = gpipe\n"
                  "  hint: set schedule.kind = 1f1b (or atlas), or schedule.virtual_stages = 1");
  const bool layout_ok = c.cluster.dc_count() <= limits::kMaxDcs &&
                         c.parallel.stages_per_dc.size() == static_cast<std::size_t>(c.cluster.dc_count());
  if (!layout_ok) return;
  const int pp = c.parallel.pp_size();
  if (pp < 2) {
    out.push_back(key + " needs more than one pipeline stage, but the layout has " + std::to_string(pp) +
                  "\n  hint: set schedule.virtual_stages = 1, or spread the layers over more stages "
                  "(parallel.stages_per_dc)");
    return;
  }
  const bool launched = shape.world_size >= 0;
  for (int s = 0; s < pp; ++s) {
    const bool listed = c.model.layers_per_stage.size() == static_cast<std::size_t>(pp);
    if (!listed && !c.model.layers_per_stage.empty()) return;  // check_model reports the list
    const int layers = listed ? c.model.layers_per_stage[static_cast<std::size_t>(s)] : c.model.layers / pp;
    const int least = s == 0 || s == pp - 1 ? v - 1 : v;
    if (launched && layers % v != 0) {
      out.push_back(key + ": stage " + std::to_string(s) + " holds " + std::to_string(layers) +
                    " layers, which do not split into " + std::to_string(v) + " equal chunks (the runtime "
                    "builds equal ones; simulate and plan model uneven chunks)\n"
                    "  hint: make every stage's layers (model.layers / stages, or model.layers_per_stage) a "
                    "multiple of schedule.virtual_stages, or lower it");
      break;
    }
    if (!launched && layers < least) {
      out.push_back(key + ": stage " + std::to_string(s) + " holds " + std::to_string(layers) +
                    " layers, fewer than its " + std::to_string(v) + " model chunks can hold (at least " +
                    std::to_string(least) + (least == v ? "" : ": the embedding or the head may fill one chunk") +
                    ")\n  hint: lower schedule.virtual_stages, or give the stage more layers "
                    "(model.layers_per_stage)");
      break;
    }
  }
  if (c.train.micro_batches % pp != 0)
    out.push_back(key + " needs train.micro_batches (" + std::to_string(c.train.micro_batches) +
                  ") to be a multiple of the " + std::to_string(pp) + " pipeline stages (as Megatron-LM's "
                  "interleaved schedule does)\n  hint: set train.micro_batches = " +
                  std::to_string((c.train.micro_batches + pp - 1) / pp * pp) + ", or schedule.virtual_stages = 1");
}

void check_data(const Config& c, std::vector<std::string>& out) {
  const bool shards = c.data.format == DataFormat::Shards;
  for (const auto& [key, list] : {std::pair{"data.train_shards", &c.data.train_shards},
                                  std::pair{"data.val_shards", &c.data.val_shards}}) {
    if (shards && list->empty())
      out.push_back(std::string("data.format = shards needs ") + key +
                    " (glob patterns of token shards)\n  hint: write shards with `atlas tokenize "
                    "TEXT... --out DIR` and set " + key + " = DIR/" +
                    (key[5] == 't' ? "train" : "val") + "_*.bin");
    if (!shards && !list->empty())
      out.push_back(std::string(key) + " is set but data.format = text reads data.corpus_dir\n"
                    "  hint: set data.format = shards to train from the shards");
  }
}

void check_misc(const Config& c, const JobShape& shape, std::vector<std::string>& out) {
  // run.out_dir/NAME is the run's own directory: an empty name wrote into run.out_dir itself
  // (runs then shared one ckpt/ and run.resume = latest took another run's checkpoint), an
  // absolute one or one with '..' left run.out_dir.
  if (const std::string& name = c.run.name;
      name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    out.push_back("run.name = \"" + name + "\" is not a directory name: the run writes to run.out_dir/NAME/\n"
                  "  hint: a name without '/' (and not . or ..), e.g. run.name = gpt2_bpe; run.out_dir says where");
  if (c.train.min_lr > c.train.lr)
    out.push_back("train.min_lr = " + str(c.train.min_lr) + " is above train.lr = " + str(c.train.lr));
  if (c.train.zero_stage == 3)
    out.push_back("train.zero_stage = 3 (the weights sharded too, gathered again for every micro-batch's forward "
                  "and backward) is not modelled\n  hint: train.zero_stage = 2 holds the same optimizer state "
                  "and gradients per GPU; only the weights' bf16 copy stays whole");
  if (c.ckpt.every_steps > c.run.steps)
    out.push_back("ckpt.every_steps = " + std::to_string(c.ckpt.every_steps) + " exceeds run.steps = " +
                  std::to_string(c.run.steps) + ": no periodic checkpoint would be written\n"
                  "  hint: lower ckpt.every_steps or set it to 0 (final checkpoint only)");
  if (c.wan.chunk_bytes > c.wan.max_frame_bytes)
    out.push_back("wan.chunk_bytes exceeds wan.max_frame_bytes: every frame would be rejected");
  if (const std::string& cc = c.wan.tcp_congestion;
      cc.empty() || cc.size() > 15 || cc.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    out.push_back("wan.tcp_congestion = \"" + cc + "\" is not a TCP congestion control name\n"
                  "  hint: auto, system, or an algorithm of this kernel (sysctl net.ipv4.tcp_available_congestion_control)");
  // The runtime builds the GPT block; other blocks are the cost model's (schedule, simulate, plan).
  if (shape.world_size >= 0)
    if (std::string why = runtime_block_mismatch(c); !why.empty()) out.push_back(std::move(why));
  // Only a launched job runs its backend: schedule, simulate and plan (world_size -1) model a
  if (c.run.resume_fallback == "latest")
    out.push_back("run.resume_fallback = latest: it names the checkpoint file to start from when run.resume = latest "
                  "finds none\n  hint: give a .h5 path, or leave it empty");
  // CUDA deck on any build (a login node without CUDA plans the GPU run).
  if (c.device.backend == Backend::Cuda && !shape.cuda_built && shape.world_size >= 0)
    out.push_back("device.backend = cuda, but this binary was built without CUDA\n"
                  "  hint: rebuild with the cuda-release preset (make cuda)");
  if (c.device.cuda_graphs && c.device.backend != Backend::Cuda)
    out.push_back(std::string("device.cuda_graphs = true needs device.backend = cuda (it is ") +
                  to_string(c.device.backend) + "): only the CUDA backend records graphs\n"
                  "  hint: set device.cuda_graphs = false, or device.backend = cuda");
  if (c.device.cuda_graphs && c.parallel.tp_size > 1)
    out.push_back("device.cuda_graphs = true with parallel.tp_size = " + std::to_string(c.parallel.tp_size) +
                  ": a block's TP sums (NCCL) are not recorded in its graph\n"
                  "  hint: set device.cuda_graphs = false, or parallel.tp_size = 1");
  if (c.device.backend == Backend::Emulated) {
    // Emulated compute holds no parameters and computes no loss: nothing to save, restore or evaluate.
    const char* why = "device.backend = emulated computes no parameters and no loss";
    if (c.ckpt.every_steps > 0 || c.ckpt.final)
      out.push_back(std::string(why) + ", so it has no checkpoint to write (ckpt.every_steps = " +
                    std::to_string(c.ckpt.every_steps) + ", ckpt.final = " + (c.ckpt.final ? "true" : "false") +
                    ")\n  hint: set ckpt.every_steps = 0 and ckpt.final = false, or use device.backend = host");
    // run.resume = latest finds nothing to resume (no emulated run writes a checkpoint) and starts
    // at step 0: what the restart loop and a requeued Slurm job pass to every restart.
    if (!c.run.resume.empty() && c.run.resume != "latest")
      out.push_back(std::string(why) + ", so it cannot resume from a checkpoint (run.resume = " + c.run.resume +
                    ")\n  hint: remove run.resume, or use device.backend = host");
    if (!c.run.resume_fallback.empty())
      out.push_back(std::string(why) + ", so it cannot start from a checkpoint (run.resume_fallback = " +
                    c.run.resume_fallback + ")\n  hint: remove run.resume_fallback, or use device.backend = host");
    if (c.train.eval_every_steps > 0)
      out.push_back(std::string(why) + ", so it cannot evaluate (train.eval_every_steps = " +
                    std::to_string(c.train.eval_every_steps) + ")\n  hint: set train.eval_every_steps = 0");
  }
  const auto& bt = c.bubbletea;
  if (bt.enabled) {
    if (bt.heads > 0 && bt.hidden % bt.heads != 0)
      out.push_back("bubbletea.hidden = " + std::to_string(bt.hidden) +
                    " is not divisible by bubbletea.heads = " + std::to_string(bt.heads));
    // A trace (bubbletea.trace) brings its own requests: the generator's keys are not used, and
    // the trace's reader checks every request against bubbletea.context.
    const bool generated = bt.trace.empty();
    if (generated && bt.prompt_tokens_min > bt.prompt_tokens_max)
      out.push_back("bubbletea.prompt_tokens_min is above bubbletea.prompt_tokens_max");
    // Every rank holds every request's prompt (4 bytes a token): limits::kMaxPromptTokens (1 GiB)
    // at most, as it bounds a trace's.
    if (const double most = static_cast<double>(bt.requests) * bt.prompt_tokens_max;
        generated && most > limits::kMaxPromptTokens)
      out.push_back("bubbletea.requests (" + std::to_string(bt.requests) + ") x bubbletea.prompt_tokens_max (" +
                    std::to_string(bt.prompt_tokens_max) + ") = " + str(most) + " prompt tokens, more than " +
                    str(limits::kMaxPromptTokens) + " (1 GiB on every rank, which holds every prompt)\n"
                    "  hint: fewer bubbletea.requests or a lower bubbletea.prompt_tokens_max");
    const std::int64_t longest = static_cast<std::int64_t>(bt.prompt_tokens_max) + bt.max_new_tokens;
    if (generated && longest > bt.context)
      out.push_back("bubbletea.prompt_tokens_max + bubbletea.max_new_tokens = " +
                    std::to_string(longest) +
                    " exceeds bubbletea.context = " + std::to_string(bt.context) +
                    "\n  hint: raise bubbletea.context or shorten the prompts");
  }
}

/// Products of keys that size memory and loops: each key is bounded by the schema, their product
/// is bounded here, before anything allocates a table of that size.
void check_sizes(const Config& c, std::vector<std::string>& out) {
  const auto& p = c.parallel;
  const auto& t = c.train;
  const double batch = static_cast<double>(c.sequences_per_step());
  if (batch > limits::kMaxGlobalBatch)
    out.push_back("parallel.dp_size (" + std::to_string(p.dp_size) + ") x train.micro_batches (" +
                  std::to_string(t.micro_batches) + ") x train.micro_batch_size (" +
                  std::to_string(t.micro_batch_size) + ") = " + str(batch) +
                  " sequences per step, more than " + str(limits::kMaxGlobalBatch) +
                  "\n  hint: lower train.micro_batches or train.micro_batch_size");
  // One micro-batch's activations between two stages (and every layer's): past 1 TiB no device
  // holds them, and the byte counts the cost model keeps in 64 bits would wrap on the way.
  const double boundary = static_cast<double>(c.model.seq_len) * t.micro_batch_size * c.model.hidden * 4.0;
  if (boundary > limits::kMaxBoundaryBytes)
    out.push_back("model.seq_len (" + std::to_string(c.model.seq_len) + ") x train.micro_batch_size (" +
                  std::to_string(t.micro_batch_size) + ") x model.hidden (" + std::to_string(c.model.hidden) +
                  ") x 4 bytes = " + str(boundary) + " bytes of activations per micro-batch at a stage boundary, more "
                  "than " + str(limits::kMaxBoundaryBytes) + " (1 TiB)\n  hint: lower train.micro_batch_size or "
                  "model.seq_len");
  const int n = c.cluster.dc_count();
  if (n > limits::kMaxDcs || p.stages_per_dc.size() != static_cast<std::size_t>(n)) return;
  const int pp = p.pp_size();
  const double ranks = static_cast<double>(pp) * p.dp_size * p.tp_size;
  if (ranks > limits::kMaxRanks)
    out.push_back("parallel.stages_per_dc (" + std::to_string(pp) + (pp == 1 ? " stage" : " stages") + ") x parallel.dp_size (" +
                  std::to_string(p.dp_size) + ") x parallel.tp_size (" + std::to_string(p.tp_size) + ") = " +
                  str(ranks) + " ranks, more than " + str(limits::kMaxRanks) +
                  "\n  hint: lower parallel.dp_size or parallel.tp_size");
  const double slots = 6.0 * t.micro_batches * pp * p.dp_size * c.schedule.virtual_stages;
  if (slots > limits::kMaxScheduleSlots) {
    const int v = c.schedule.virtual_stages;
    // Only the factors that can come down, the one that keeps the global batch first.
    std::vector<std::string> fixes;
    if (t.micro_batches > 1) fixes.emplace_back("lower train.micro_batches (a larger train.micro_batch_size keeps the global batch)");
    if (v > 1) fixes.emplace_back("lower schedule.virtual_stages");
    if (p.dp_size > 1) fixes.emplace_back("fewer DP pipelines (parallel.dp_size)");
    if (pp > 1) fixes.emplace_back("fewer stages (parallel.stages_per_dc)");
    const std::string hint = either(fixes);
    out.push_back("train.micro_batches (" + std::to_string(t.micro_batches) + ") x parallel.stages_per_dc (" +
                  std::to_string(pp) + (pp == 1 ? " stage" : " stages") + ") x parallel.dp_size (" + std::to_string(p.dp_size) + ")" +
                  (v > 1 ? " x schedule.virtual_stages (" + std::to_string(v) + ")" : std::string()) +
                  " make a schedule table of about " + str(slots) + " slots (6 per micro-batch, stage" +
                  (v > 1 ? ", model chunk" : "") + " and pipeline), more than " + str(limits::kMaxScheduleSlots) +
                  "\n  hint: " + hint);
  }
}

}  // namespace

std::string runtime_block_mismatch(const Config& c) {
  const ModelCfg& m = c.model;
  if (m.gpt_block()) return {};
  std::vector<std::string> keys;
  if (m.kv_head_count() != m.heads) keys.push_back("model.kv_heads = " + std::to_string(m.kv_heads));
  if (m.ffn() != 4 * static_cast<std::int64_t>(m.hidden))
    keys.push_back("model.ffn_hidden = " + std::to_string(m.ffn_hidden));
  if (m.mlp != MlpKind::Gelu) keys.emplace_back("model.mlp = swiglu");
  std::string listed;
  for (std::size_t i = 0; i < keys.size(); ++i)
    listed += (i == 0 ? "" : (i + 1 == keys.size() ? " and " : ", ")) + keys[i];
  return listed + (keys.size() == 1 ? " describes" : " describe") +
         " a block the runtime does not build (its GPT block has one key/value head per head and a 4 x hidden "
         "GELU MLP); atlas schedule, simulate and plan model it\n"
         "  hint: remove " + (keys.size() == 1 ? "that key" : "those keys") +
         " to run the deck, or use it with atlas simulate / plan";
}

std::vector<std::string> validate(const Config& cfg, const JobShape& shape) {
  std::vector<std::string> out;
  check_cluster(cfg, out);
  check_parallel(cfg, shape, out);
  check_model(cfg, out);
  check_virtual_stages(cfg, shape, out);
  check_data(cfg, out);
  check_misc(cfg, shape, out);
  check_sizes(cfg, out);
  return out;
}

}  // namespace atlas::deck
