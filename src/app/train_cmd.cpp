// SPDX-License-Identifier: MIT
// `atlas train DECK [key=value ...]`: the SPMD training job. Phases as in HPCG: setup,
// pre-flight validation, train loop, teardown. Wiring only; the algorithms live in their rooms.
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "atlas/app/commands.hpp"
#include "atlas/app/train_output.hpp"
#include "atlas/bubbletea/service.hpp"
#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/log.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/device/backend.hpp"
#include "atlas/runtime/trainer.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/communicators.hpp"
#include "atlas/wan/transport.hpp"

namespace atlas::app {

namespace fs = std::filesystem;

namespace {

/// World ranks in other DCs this rank exchanges boundary tensors with.
std::vector<int> wan_peers(const topo::Layout& layout, const topo::Coord& me) {
  std::vector<int> peers;
  if (me.stage > 0 && layout.crosses_dc(me.stage - 1)) peers.push_back(layout.world_rank(me.stage - 1, me.dp, me.tp));
  if (me.stage + 1 < layout.pp_size() && layout.crosses_dc(me.stage))
    peers.push_back(layout.world_rank(me.stage + 1, me.dp, me.tp));
  return peers;
}

/// Pre-flight: a verifiable payload round-trips with every WAN peer before training starts, so a
/// broken link fails now with a clear message instead of mid-step.
void preflight_wan(wan::PeerTransport& t, const std::vector<int>& peers, int me) {
  constexpr std::size_t kWords = 4096;
  constexpr int kTag = 900000;
  std::vector<std::vector<std::uint32_t>> out(peers.size()), in(peers.size());
  std::vector<wan::Handle> handles;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    out[i].resize(kWords);
    in[i].resize(kWords);
    for (std::size_t w = 0; w < kWords; ++w) out[i][w] = static_cast<std::uint32_t>(me * 2654435761u + w * 40503u + static_cast<std::uint32_t>(peers[i]));
    handles.push_back(t.irecv(peers[i], kTag, in[i].data(), kWords * 4));
    handles.push_back(t.isend(peers[i], kTag, out[i].data(), kWords * 4));
  }
  wan::wait_all(t, handles);
  for (std::size_t i = 0; i < peers.size(); ++i)
    for (std::size_t w = 0; w < kWords; ++w) {
      const auto expect = static_cast<std::uint32_t>(peers[i] * 2654435761u + w * 40503u + static_cast<std::uint32_t>(me));
      if (in[i][w] != expect)
        ATLAS_THROW(Comm, "pre-flight payload from rank " << peers[i] << " is corrupt at word " << w);
    }
}

}  // namespace

int cmd_train(Context& ctx) {
  const Args args = parse_args(ctx.args, {}, {});
  const std::string path = deck_path(args, "train");
  const mpi::Comm world = mpi::Comm::world();
  const bool root = world.rank() == 0;

  // ---- setup: deck -> layout -> communicators -> backend -> schedule -> transport -> model ----
  deck::JobShape shape;
  shape.world_size = world.size();
  shape.cuda_built = cuda_built();
  const Config cfg = deck::load(world, path, args.overrides, shape);
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  const topo::Coord me = layout.coord(comms.world.rank());

  TrainOutput out(cfg, root);
  out.header(path, layout);
  const std::string map = topo::rank_map(comms.world, layout, cfg.cluster.dcs);
  out.text(map);

  std::unique_ptr<device::Backend> backend = device::make_backend(cfg.device);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);

  // ---- pre-flight validation ----
  const auto hash = static_cast<unsigned long long>(table.structure_hash());
  if (comms.world.allreduce(hash, MPI_MAX) != comms.world.allreduce(hash, MPI_MIN))
    ATLAS_THROW(Internal, "ranks built different schedule tables (hash " << std::hex << hash
                                                                         << "); every rank must run the same binary and deck");
  out.schedule(table);

  const std::vector<int> peers = wan_peers(layout, me);
  std::unique_ptr<wan::PeerTransport> transport =
      wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, peers);
  if (!peers.empty()) preflight_wan(*transport, peers, comms.world.rank());
  comms.world.barrier();
  out.text(fmt::format("# pre-flight: schedule hash {:016x} agreed by {} ranks; {} WAN transport up ({} rails per peer)\n",
                       hash, world.size(), transport->name(), cfg.wan.rails));

  const std::size_t reserve = cfg.profile.enabled
                                  ? static_cast<std::size_t>(cfg.run.steps) * table.row(me.stage, me.dp).size() + 64
                                  : 0;
  runtime::Profiler profiler(cfg.profile.enabled, comms.world.rank(), reserve);
  runtime::Trainer trainer(cfg, layout, comms, table, transport.get(), *backend, profiler);
  int start_step = out.resume(trainer, comms);

  // ---- BubbleTea: inference prefill in the bubbles (bubbletea.enabled; collective set-up) ----
  std::unique_ptr<bubbletea::Service> bubbletea;
  if (cfg.bubbletea.enabled) {
    bubbletea = std::make_unique<bubbletea::Service>(cfg, layout, comms, table, *backend, profiler);
    trainer.set_bubble_filler(bubbletea.get());
    out.text(bubbletea->setup_summary());
  }

  // ---- train loop ----
  profiler.sync_epoch(comms.world);
  if (bubbletea) bubbletea->start();
  out.columns();
  for (int step = start_step; step < cfg.run.steps; ++step) {
    runtime::StepReport rep = trainer.train_step(step);
    if (bubbletea) bubbletea->after_step(rep);
    const bool last = step + 1 == cfg.run.steps;
    double val = std::numeric_limits<double>::quiet_NaN();
    if (last || (cfg.train.eval_every_steps > 0 && (step + 1) % cfg.train.eval_every_steps == 0))
      val = trainer.evaluate();
    out.step(rep, val, trainer.tokens_per_step());
    out.maybe_checkpoint(trainer, comms, step + 1, last);
  }

  // ---- teardown ----
  if (bubbletea) {
    trainer.set_bubble_filler(nullptr);
    const bubbletea::Report report = bubbletea->finish();
    out.text(bubbletea::format_report(report, cfg.cluster.dcs));
    if (root) bubbletea::write_json(report, (fs::path(cfg.run_dir()) / "bubbletea.json").string());
  }
  out.finish(trainer, comms, layout, table, profiler, *transport);
  return 0;
}

}  // namespace atlas::app
