// SPDX-License-Identifier: MIT
// Trainer <-> checkpoint room. Host staging only for backends whose memory is not host memory.
#include "atlas/runtime/checkpointing.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "atlas/core/build_info.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/model/optimizer.hpp"
#include "atlas/mpi/agree.hpp"
#include "atlas/runtime/fault.hpp"

namespace atlas::runtime {

namespace {

/// Host views of every parameter shard for the checkpoint room (staged through host memory when
/// the backend's memory is not host-accessible).
struct HostShards {
  std::vector<std::vector<float>> value, m, v;  // staging (device backends only)
  std::vector<io::WriteShard> write;
  std::vector<io::ReadShard> read;
};

HostShards host_shards(model::StageModel& model, const topo::Coord& me, bool for_read) {
  HostShards h;
  device::Backend& be = model.backend();
  const bool direct = be.host_accessible();
  for (auto& p : model.params()) {
    // The first stage's "wte" is the one stored; the last stage's tied copy reads it back.
    if (p.tied_copy && !for_read) continue;
    const auto n = static_cast<std::size_t>(p.shard_numel());
    float* val = p.value.f32();
    float* am = p.adam_m.f32();
    float* av = p.adam_v.f32();
    if (!direct) {
      h.value.emplace_back(n);
      h.m.emplace_back(n);
      h.v.emplace_back(n);
      if (!for_read) {
        be.download(h.value.back().data(), p.value.data(), n * 4);
        be.download(h.m.back().data(), p.adam_m.data(), n * 4);
        be.download(h.v.back().data(), p.adam_v.data(), n * 4);
      }
      val = h.value.back().data();
      am = h.m.back().data();
      av = h.v.back().data();
    }
    const bool writer = me.dp == 0 && (me.tp == 0 || !p.replicated_over_tp);
    if (for_read)
      h.read.push_back({p.name, p.full_shape, p.shard_offset, p.shard_shape, writer, val, am, av});
    else
      h.write.push_back({p.name, p.full_shape, p.shard_offset, p.shard_shape, writer, val, am, av});
  }
  return h;
}

io::ModelShape shape_of(const ModelCfg& m) { return {m.layers, m.hidden, m.heads, m.seq_len, m.vocab}; }

}  // namespace

namespace {

/// The learning-rate schedule's keys compared with the checkpoint's own deck: a resume that
/// changes them (run.steps raised to train on, as the "nothing to train" hint says) moves the
/// learning rate at the resume step, which AdamW's settled moments feel as a jump. Warned, not
/// refused: extending a run is legitimate. Rank 0; a deck that no longer parses (keys of another
/// atlas version) is not compared.
void warn_if_schedule_changed(const mpi::Comm& world, const Config& cfg, const io::CheckpointMeta& meta,
                              const std::string& path) {
  if (world.rank() != 0 || meta.deck.empty()) return;
  Config old;
  try {
    old = deck::parse(path + " (its deck)", meta.deck, {});
  } catch (const ConfigError&) {
    return;
  }
  std::vector<std::string> changed;
  if (old.run.steps != cfg.run.steps) changed.push_back(fmt::format("run.steps {} -> {}", old.run.steps, cfg.run.steps));
  if (old.train.lr != cfg.train.lr) changed.push_back(fmt::format("train.lr {:g} -> {:g}", old.train.lr, cfg.train.lr));
  if (old.train.min_lr != cfg.train.min_lr)
    changed.push_back(fmt::format("train.min_lr {:g} -> {:g}", old.train.min_lr, cfg.train.min_lr));
  if (old.train.warmup_steps != cfg.train.warmup_steps)
    changed.push_back(fmt::format("train.warmup_steps {} -> {}", old.train.warmup_steps, cfg.train.warmup_steps));
  if (changed.empty()) return;
  const int step = static_cast<int>(meta.step);
  const double was = model::lr_at(step, old.train, old.run.steps);
  const double now = model::lr_at(step, cfg.train, cfg.run.steps);
  const double ratio = was > 0 ? now / was : 1.0;
  log::warn("resuming from {} at step {}: the learning-rate schedule differs from the checkpoint's deck ({}); the "
            "learning rate at step {} is {:.3g}, the checkpoint's schedule gave {:.3g}{}",
            path, step, fmt::join(changed, ", "), step, now, was,
            ratio > 1.5 || ratio < 1 / 1.5
                ? fmt::format(" ({:.1f}x: a jump that AdamW's moments, settled at the old rate, feel; set train.lr, "
                              "train.min_lr and train.warmup_steps to continue the old schedule)",
                              ratio)
                : std::string());
}

}  // namespace

Restored restore_checkpoint(Trainer& trainer, const Config& cfg, const topo::Communicators& comms) {
  if (cfg.run.resume.empty()) return {};
  if (cfg.device.backend == Backend::Emulated) {
    // Only run.resume = latest passes validation here: an emulated run keeps no checkpoint, so a
    // restart (the restart loop, a requeued Slurm job) rehearses the job again from step 0.
    if (comms.world.rank() == 0)
      log::info("run.resume = latest: device.backend = emulated writes no checkpoints; starting at step 0");
    return {};
  }
  const topo::Coord me = trainer.layout().coord(comms.world.rank());
  HostShards h = host_shards(trainer.model(), me, true);
  io::ReadOptions opt;
  opt.expect_model = shape_of(cfg.model);
  std::optional<io::Resumed> resumed =
      io::resume_checkpoint(comms.world, cfg.run.resume, cfg.ckpt_dir(), h.read, opt);
  if (!resumed && cfg.run.resume == "latest" && !cfg.run.resume_fallback.empty()) {
    // The run has no checkpoint of its own yet (a restart before its first one): it starts where
    // the caller's run.resume said, not from random weights.
    if (comms.world.rank() == 0)
      log::info("run.resume = latest: no checkpoint in '{}' yet; starting from run.resume_fallback = {}",
                cfg.ckpt_dir(), cfg.run.resume_fallback);
    resumed = io::resume_checkpoint(comms.world, cfg.run.resume_fallback, cfg.ckpt_dir(), h.read, opt);
  }
  if (!resumed) return {};
  const std::string& path = resumed->path;
  const io::CheckpointMeta& meta = resumed->meta;
  // Copy back staged shards (device backends).
  device::Backend& be = trainer.model().backend();
  if (!be.host_accessible()) {
    std::size_t k = 0;
    for (auto& p : trainer.model().params()) {
      const auto n = static_cast<std::size_t>(p.shard_numel()) * 4;
      be.upload(p.value.data(), h.value[k].data(), n);
      be.upload(p.adam_m.data(), h.m[k].data(), n);
      be.upload(p.adam_v.data(), h.v[k].data(), n);
      ++k;
    }
  }
  // Only the ranks that hold a data loader can find its saved position unusable (another
  // run.seed or corpus): the verdict is agreed, so every rank ends with the same error instead
  // of the others waiting in their next collective.
  mpi::agree(comms.world, "restoring the training state", [&] {
    if (auto it = meta.state.find("adam_t"); it != meta.state.end() && !it->second.empty())
      trainer.optimizer().set_step_count(static_cast<std::int64_t>(it->second[0]));
    // 3 words: a checkpoint written before the stream's CRC was kept (its data is not checked).
    if (auto it = meta.state.find("loader"); it != meta.state.end() && trainer.has_train_loader()) {
      if (it->second.size() != 3 && it->second.size() != 4)
        throw ConfigError(fmt::format("resuming from {}: /state/loader holds {} words; this atlas reads 3 or 4 (seed, "
                                      "samples consumed, samples per epoch, the stream's CRC32C)\n  hint: a newer "
                                      "atlas wrote it: resume with that version",
                                      path, it->second.size()));
      model::DataPosition pos{it->second[0], static_cast<std::int64_t>(it->second[1]),
                              static_cast<std::int64_t>(it->second[2]), std::nullopt};
      if (it->second.size() == 4) pos.stream_crc = static_cast<std::uint32_t>(it->second[3]);
      try {
        trainer.train_loader().restore(pos);
      } catch (const ConfigError& e) {
        std::vector<std::string> problems;
        for (const auto& p : e.problems()) problems.push_back(fmt::format("resuming from {}: {}", path, p));
        throw ConfigError(problems);
      }
    }
  });
  warn_if_schedule_changed(comms.world, cfg, meta, path);
  return {path, static_cast<int>(meta.step)};
}

io::WriteResult save_checkpoint(Trainer& trainer, const Config& cfg, const topo::Communicators& comms,
                                int steps_done) {
  const topo::Coord me = trainer.layout().coord(comms.world.rank());
  HostShards h = host_shards(trainer.model(), me, false);
  io::CheckpointMeta meta;
  meta.step = steps_done;
  meta.git_sha = build::kGitSha;
  meta.deck = deck::resolved_deck(cfg);
  meta.layout.dc_count = trainer.layout().dc_count();
  meta.layout.pp_size = trainer.layout().pp_size();
  meta.layout.dp_size = trainer.layout().dp_size();
  meta.layout.tp_size = trainer.layout().tp_size();
  for (int s : trainer.layout().stages_per_dc()) meta.layout.stages_per_dc.push_back(s);
  meta.model = shape_of(cfg.model);
  meta.state["adam_t"] = {static_cast<std::uint64_t>(trainer.optimizer().step_count())};
  if (trainer.has_train_loader()) {
    const model::DataPosition pos = trainer.train_loader().position();
    meta.state["loader"] = {pos.seed, static_cast<std::uint64_t>(pos.samples_consumed),
                            static_cast<std::uint64_t>(pos.epoch_samples), *pos.stream_crc};
  }
  io::WriteOptions opt;
  opt.keep_last = cfg.ckpt.keep_last;
  opt.transfer = io::transfer_of(cfg.ckpt.transfer);
  const int rank = comms.world.rank();
  const bool resumed = !cfg.run.resume.empty();
  opt.before_rename = [rank, steps_done, resumed](const std::string&) {
    maybe_inject_kill("ATLAS_FAULT_KILL_IN_CKPT", rank, steps_done, resumed);
  };
  return io::write_checkpoint(comms.world, cfg.ckpt_dir(), meta, h.write, opt);
}

}  // namespace atlas::runtime
