// SPDX-License-Identifier: MIT
// Shared set-up of the training tests: a tiny deck for any (tp, dp, stages per DC) and a helper
// that trains a few steps on a communicator.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <filesystem>

#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/runtime/checkpointing.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::runtime::testing {

inline std::string corpus_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return (std::filesystem::path(env ? env : ATLAS_SOURCE_DIR) / "data/brown").string();
}

inline Config make_cfg(int tp, int dp, const std::vector<int>& stages_per_dc, int micro_batches,
                const std::vector<std::string>& extra = {}) {
  std::string spd, dcs, gpus, lat, bw;
  const auto n = stages_per_dc.size();
  for (std::size_t i = 0; i < n; ++i) {
    spd += std::to_string(stages_per_dc[i]) + " ";
    dcs += "dc" + std::to_string(i) + " ";
    gpus += "16 ";
    for (std::size_t j = 0; j < n; ++j) {
      lat += i == j ? "0 " : "1 ";
      bw += i == j ? "0 " : "10 ";
    }
  }
  std::string text = "cluster.dcs = " + dcs + "\ncluster.gpus_per_dc = " + gpus + "\ncluster.latency_ms = " + lat +
                     "\ncluster.bandwidth_gbps = " + bw + "\nparallel.stages_per_dc = " + spd +
                     "\nparallel.tp_size = " + std::to_string(tp) + "\nparallel.dp_size = " + std::to_string(dp) +
                     "\nmodel.layers = 6\nmodel.hidden = 32\nmodel.heads = 4\nmodel.seq_len = 16\n"
                     "train.micro_batch_size = 2\ntrain.micro_batches = " + std::to_string(micro_batches) +
                     "\ntrain.warmup_steps = 1\ntrain.eval_batches = 1\nrun.steps = 4\nprofile.enabled = false\n"
                     "wan.recv_timeout_s = 30\ndata.corpus_dir = " + corpus_dir() + "\n";
  Config cfg = deck::parse("equivalence", text, extra);
  deck::read_device_profiles(cfg);  // what deck::load does: the table's cost model reads them
  return cfg;
}

struct Outcome {
  int first_step = 0;
  std::vector<double> losses;
  std::vector<StepReport> reports;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
  std::vector<std::pair<std::string, std::vector<float>>> params;
};

/// Everything a Trainer of `cfg` on `world` needs, built as `atlas train` builds it (the deck's
/// layout, communicators, backend, table, WAN transport), and the Trainer.
struct TrainerRig {
  TrainerRig(const Config& cfg, const mpi::Comm& world)
      : layout(world.size(), cfg.parallel),
        comms(topo::Communicators::create(world, layout)),
        me(layout.coord(comms.world.rank())),
        backend(device::make_backend(cfg.device)),
        table(sched::build_schedule(cfg, layout)),
        wan(wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, layout.wan_peers(me))),
        profiler(false, comms.world.rank(), 0),
        trainer(cfg, layout, comms, table, wan.get(), *backend, profiler) {}
  topo::Layout layout;
  topo::Communicators comms;
  topo::Coord me;
  std::unique_ptr<device::Backend> backend;
  sched::ScheduleTable table;
  std::unique_ptr<wan::PeerTransport> wan;
  Profiler profiler;
  Trainer trainer;
};

/// Trains `steps` steps of `cfg` on `world`; gradients and parameters after the first step.
/// Trains `cfg` on `world` from its run.resume point (fresh if empty) up to step `until`;
/// writes a checkpoint after step `save_after` (if >= 0). Gradients and parameters are gathered
/// after the first step run.
inline Outcome train(const Config& cfg, const mpi::Comm& world, int until, int save_after = -1) {
  TrainerRig rig(cfg, world);
  Trainer& trainer = rig.trainer;
  const topo::Communicators& comms = rig.comms;
  Outcome out;
  out.first_step = restore_checkpoint(trainer, cfg, comms).step;
  for (int s = out.first_step; s < until; ++s) {
    const StepReport r = trainer.train_step(s);
    out.losses.push_back(r.loss);
    out.reports.push_back(r);
    if (s == out.first_step) {
      out.grads = trainer.gather_full(true);
      out.params = trainer.gather_full(false);
    }
    if (s + 1 == save_after) save_checkpoint(trainer, cfg, comms, s + 1);
  }
  return out;
}

/// A fresh temporary directory name shared by all ranks of `world` (rank 0 makes it).
/// A pipeline layout across 2 DCs: dp replicas of stages_per_dc stages in each DC.
struct PipelineShape {
  int dp;
  std::vector<int> stages_per_dc;
};

/// The 2-DC layouts the pipeline tests train at: np 2, 2 stages over 2 DCs; np 4, dp 2 of them,
/// and 2 stages per DC. None at other sizes (the test skips).
inline std::vector<PipelineShape> two_dc_shapes(int np) {
  if (np == 2) return {{1, {1, 1}}};
  if (np == 4) return {{2, {1, 1}}, {1, {2, 2}}};
  return {};
}

/// "dp D stages_per_dc S0 S1": a shape's name for failure messages.
inline std::string shape_name(const PipelineShape& sh) {
  std::string s = "dp " + std::to_string(sh.dp) + " stages_per_dc";
  for (int x : sh.stages_per_dc) s += " " + std::to_string(x);
  return s;
}

inline std::string shared_temp_dir(const mpi::Comm& world, const std::string& stem) {
  std::string dir;
  if (world.rank() == 0) {
    dir = (std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world.bcast_string(dir, 0);
  return dir;
}

}  // namespace atlas::runtime::testing
