// SPDX-License-Identifier: MIT
// Intra-DC boundary sends progress while the sender computes (issue 24): two stages in one DC,
// emulated compute, GPipe order, so the last stage runs its backwards back to back and posts each
// gradient (256 KiB: above every eager limit, an MPI rendezvous) just before its next long
// backward. Each gradient must reach stage 0, already waiting for it, within that backward;
// without a progress thread it arrived only when the sender next waited in MPI (after its
// remaining backwards). The times are the profile's (one clock on one machine); about 2 s.
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "atlas/mpi/comm.hpp"
#include "atlas/runtime/profiler.hpp"
#include "atlas/sched/slot.hpp"
#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;

TEST(BoundaryProgress, GradientReachesTheWaitingStageWhileTheSenderComputes) {
  const mpi::Comm world = mpi::Comm::world();
  ASSERT_EQ(world.size(), 2) << "run with mpirun -np 2";
  // 2 stages x 3 layers at 8 ms per layer: a forward slot 24 ms, a backward about twice that.
  // Boundary tensor: micro_batch_size 2 x seq_len 64 x hidden 512 x 4 bytes = 256 KiB.
  const Config cfg = make_cfg(1, 1, {2}, 4,
                              {"device.backend=emulated", "schedule.kind=gpipe", "schedule.fwd_ms_per_layer=8",
                               "model.hidden=512", "model.seq_len=64", "ckpt.final=false",
                               "ckpt.every_steps=0", "train.eval_every_steps=0"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  auto backend = device::make_backend(cfg.device);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  const topo::Coord me = layout.coord(comms.world.rank());
  auto wan = wan::make_transport(cfg.wan, cfg.cluster, comms.world, me.dc, layout.wan_peers(me));
  Profiler profiler(true, comms.world.rank(), 1024);
  profiler.sync_epoch(comms.world);
  Trainer trainer(cfg, layout, comms, table, wan.get(), *backend, profiler);
  constexpr int kSteps = 3;
  for (int s = 0; s < kSteps; ++s) (void)trainer.train_step(s);
  const std::vector<SlotEvent> all = profiler.gather(comms.world, 0);
  if (world.rank() != 0) return;

  const int send = static_cast<int>(sched::SlotKind::LocalSend);
  const int recv = static_cast<int>(sched::SlotKind::LocalRecv);
  const int backward = static_cast<int>(sched::SlotKind::Backward);
  std::map<std::pair<int, int>, SlotEvent> posted, received;  // (step, micro) -> event
  double backward_ms = 0.0;
  for (const SlotEvent& e : all) {
    if (e.world_rank == 1 && e.kind == send) posted[{e.step, e.micro}] = e;
    if (e.world_rank == 0 && e.kind == recv) received[{e.step, e.micro}] = e;
    if (e.world_rank == 1 && e.kind == backward) backward_ms = std::max(backward_ms, e.predicted_ms);
  }
  ASSERT_GT(backward_ms, 30.0) << "the deck's backward slots are too short to show a stall";
  ASSERT_EQ(posted.size(), static_cast<std::size_t>(kSteps * 4));
  // Every gradient but a step's last is followed on the sender by another backward (the last one
  // by the all-reduce, which calls into MPI anyway). The bound: one backward slot. A stalled send
  // arrives when its sender next waits in MPI, after its remaining backwards (147-152 ms here,
  // three slots); a progressed one within a poll (0.1-1.8 ms), so a loaded machine's late
  // wake-ups keep a wide margin.
  int judged = 0;
  for (const auto& [key, s] : posted) {
    if (key.second == 3) continue;
    const auto it = received.find(key);
    ASSERT_NE(it, received.end()) << "step " << key.first << " micro " << key.second << " never received";
    const SlotEvent& r = it->second;
    if (r.start_s > s.start_s) continue;  // the receiver was not waiting yet: nothing to judge
    const double late_ms = (r.end_s - s.end_s) * 1e3;
    std::cout << "step " << key.first << " micro " << key.second << ": gradient in " << late_ms
              << " ms after its post (backward slot " << backward_ms << " ms)\n";
    EXPECT_LT(late_ms, backward_ms)
        << "step " << key.first << ": the gradient of micro-batch " << key.second << " posted at "
        << s.end_s * 1e3 << " ms arrived at " << r.end_s * 1e3 << " ms, " << late_ms
        << " ms later (a backward slot is " << backward_ms << " ms): the send did not progress while its sender computed";
    ++judged;
  }
  EXPECT_GE(judged, 3) << "too few gradients found their receiver waiting";
}

}  // namespace
}  // namespace atlas::runtime
