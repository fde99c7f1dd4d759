// SPDX-License-Identifier: MIT
// What the one-process commands that read a checkpoint share: the one-process check, its stored
// deck (export, sample), its whole training model on one backend (export, eval), and the --device
// option (sample, eval).
#include <cstdio>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/deck/deck.hpp"

namespace atlas::app {

std::optional<Config> checkpoint_deck(const std::string& ckpt, const io::CheckpointContents& contents,
                                      const std::string& assumed) {
  try {
    return deck::parse(ckpt + ":/deck", contents.meta.deck, {});
  } catch (const ConfigError& e) {
    std::fprintf(stderr,
                 "WARNING: the deck stored in '%s' does not parse (written by another atlas version?): %s\n"
                 "  taking %s instead\n",
                 ckpt.c_str(), e.problems().empty() ? "" : e.problems().front().c_str(), assumed.c_str());
    return std::nullopt;
  }
}

std::unique_ptr<model::StageModel> load_whole_model(const std::string& ckpt, const io::CheckpointContents& contents,
                                                    ModelCfg mc, int micro_batch_size, device::Backend& backend) {
  const io::ModelShape& m = contents.meta.model;
  mc.layers = static_cast<int>(m.layers);
  mc.hidden = static_cast<int>(m.hidden);
  mc.heads = static_cast<int>(m.heads);
  mc.seq_len = static_cast<int>(m.seq_len);
  mc.vocab = static_cast<int>(m.vocab);
  mc.layers_per_stage.clear();
  auto sm = std::make_unique<model::StageModel>(mc, micro_batch_size, model::StageSpec{}, backend, nullptr, 0);
  std::vector<io::ReadShard> shards;
  for (auto& p : sm->params())
    shards.push_back({p.name, p.full_shape, p.shard_offset, p.shard_shape, true, p.value.f32(), nullptr, nullptr});
  io::ReadOptions ro;
  ro.expect_model = m;
  (void)io::read_checkpoint(mpi::Comm::self(), ckpt, shards, ro);
  return sm;
}

void require_one_process(const Context& ctx, const char* command) {
  if (ctx.env.world_size() != 1)
    throw UsageError(fmt::format("atlas {} runs as one process (started with {}); run it without mpirun", command,
                                 ctx.env.world_size()));
}

DeviceCfg device_option(const Args& a, const char* command) {
  const std::string name = a.option("device", "host");
  DeviceCfg dev;
  if (name == "cuda") {
    if (!cuda_built())
      throw UsageError(fmt::format("atlas {} --device cuda: this binary was built without CUDA\n  hint: build it "
                                   "with `make cuda`, or run on the host (drop --device)",
                                   command));
    dev.backend = Backend::Cuda;
  } else if (name != "host") {
    throw UsageError("--device must be host or cuda, not '" + name + "'");
  }
  dev.precision = Precision::Fp32;  // the reference numerics (atlas eval sets the run's)
  return dev;
}

}  // namespace atlas::app
