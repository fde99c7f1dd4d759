// SPDX-License-Identifier: MIT
// Derived quantities of the typed Config (no parsing here).
#include "atlas/deck/config.hpp"

#include <cmath>
#include <filesystem>

namespace atlas {

int ModelCfg::stage_layers(int stage, int pp) const {
  if (!layers_per_stage.empty()) return layers_per_stage[static_cast<std::size_t>(stage)];
  return layers / pp;
}

int ModelCfg::stage_first_layer(int stage, int pp) const {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += stage_layers(s, pp);
  return first;
}

std::int64_t ModelCfg::block_parameter_count() const {
  const std::int64_t h = hidden;
  if (gpt_block()) return 12 * h * h + 13 * h;  // qkv, proj, fc, fc-proj + biases + 2 LN
  const std::int64_t qkv = std::llround(qkv_width());  // h (1 + 2 kv / heads) in floating point: 479.99.. is 480
  const std::int64_t f = ffn();
  const std::int64_t mlp_weights = (mlp == MlpKind::SwiGlu ? 3 : 2) * h * f;
  const std::int64_t mlp_biases = (mlp == MlpKind::SwiGlu ? 2 : 1) * f + h;
  return h * qkv + qkv + h * h + h + mlp_weights + mlp_biases + 4 * h;
}

std::int64_t ModelCfg::parameter_count() const {
  const std::int64_t h = hidden;
  const std::int64_t per_block = block_parameter_count();
  return static_cast<std::int64_t>(vocab) * h + static_cast<std::int64_t>(seq_len) * h +
         per_block * layers + 2 * h;
}

std::string ParallelCfg::size_mismatch(int job_ranks) const {
  // In 64 bits: this runs on unvalidated decks too, whose product may not fit an int.
  std::int64_t need = pp_size();
  need *= static_cast<std::int64_t>(dp_size) * tp_size;
  if (need == job_ranks) return {};
  std::string stages;
  for (int v : stages_per_dc) stages += (stages.empty() ? "" : (dp_across_dcs ? "|" : "+")) + std::to_string(v);
  if (dp_across_dcs) stages += " in every DC, parallel.dp_across_dcs";
  return "parallel layout needs stages(" + stages + " = " + std::to_string(pp_size()) +
         ") * dp_size(" + std::to_string(dp_size) + ") * tp_size(" + std::to_string(tp_size) +
         ") = " + std::to_string(need) + " ranks, but the job has " + std::to_string(job_ranks) +
         "\n  hint: change parallel.* or launch with " + std::to_string(need) + " ranks (srun -n " +
         std::to_string(need) + " / mpirun -np " + std::to_string(need) + ")";
}

std::string Config::run_dir() const {
  return (std::filesystem::path(run.out_dir) / run.name).string();
}

std::string Config::ckpt_dir() const {
  return ckpt.dir.empty() ? (std::filesystem::path(run_dir()) / "ckpt").string() : ckpt.dir;
}

std::int64_t Config::sequences_per_step() const {
  return static_cast<std::int64_t>(parallel.dp_size) * train.micro_batches * train.micro_batch_size;
}

std::int64_t Config::tokens_per_step() const { return sequences_per_step() * model.seq_len; }

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Atlas: return "atlas";
  }
  return "?";
}

const char* to_string(WanTransport t) {
  return t == WanTransport::Multirail ? "multirail" : "mpi";
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::Host: return "host";
    case Backend::Cuda: return "cuda";
    case Backend::Emulated: return "emulated";
  }
  return "?";
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Auto: return "auto";
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
  }
  return "?";
}

Precision effective_precision(const DeviceCfg& d) noexcept {
  if (d.precision != Precision::Auto) return d.precision;
  return d.backend == Backend::Cuda ? Precision::Bf16 : Precision::Fp32;
}

int activation_bytes(Precision p) noexcept { return p == Precision::Bf16 ? 2 : 4; }

const char* to_string(GpuKind g) {
  switch (g) {
    case GpuKind::Host: return "host";
    case GpuKind::A100: return "a100";
    case GpuKind::H100: return "h100";
    case GpuKind::H200: return "h200";
  }
  return "?";
}

}  // namespace atlas
