// SPDX-License-Identifier: MIT
// The cost model sizes pipeline boundary messages by device.precision (docs/precision.md): bf16
// halves them (the table's slot bytes, `atlas schedule`'s boundary line, the emulated backend's
// messages); decks without the key keep their profile's bytes (their tables stay the same).
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <thread>

#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/runtime/emulated.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/profile.hpp"
#include "atlas/sched/schedule.hpp"

namespace atlas {
namespace {

const char* kDeck =
    "cluster.dcs = east west\n"
    "cluster.gpus_per_dc = 8 8\n"
    "cluster.latency_ms = 0 20   20 0\n"
    "cluster.bandwidth_gbps = 0 1   1 0\n"
    "parallel.stages_per_dc = 1 1\n"
    "model.layers = 4\n"
    "model.hidden = 256\n"
    "model.seq_len = 64\n"
    "train.micro_batch_size = 2\n"
    "train.micro_batches = 4\n";

Config load(const std::vector<std::string>& overrides) {
  Config cfg = deck::parse("p.deck", kDeck, overrides);
  deck::read_device_profiles(cfg);
  return cfg;
}

std::int64_t table_boundary_bytes(const Config& cfg) {
  const topo::Layout layout(cfg.parallel.world_size(), cfg.parallel);
  const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
  std::int64_t bytes = 0;
  for (const auto& row : table.rows)
    for (const sched::Slot& s : row)
      if (sched::is_send(s.kind)) bytes = std::max(bytes, s.bytes);
  return bytes;
}

TEST(PrecisionCost, Bf16HalvesTheBoundaryMessagesAndAutoKeepsTheProfile) {
  const Config fp32 = load({"device.precision=fp32"});
  const Config bf16 = load({"device.precision=bf16"});
  const Config tf32 = load({"device.precision=tf32"});
  const Config host_auto = load({});
  const topo::Layout layout(fp32.parallel.world_size(), fp32.parallel);
  const std::int64_t elems = 2 * 64 * 256;
  EXPECT_EQ(sched::cost_model(fp32, layout).act_bytes, 4 * elems);
  EXPECT_EQ(sched::cost_model(tf32, layout).act_bytes, 4 * elems) << "a tf32 value travels as fp32";
  EXPECT_EQ(sched::cost_model(bf16, layout).act_bytes, 2 * elems);
  EXPECT_EQ(sched::cost_model(host_auto, layout).act_bytes, 4 * elems) << "auto on host: the host profile, fp32";
  EXPECT_EQ(table_boundary_bytes(fp32), 4 * elems);
  EXPECT_EQ(table_boundary_bytes(bf16), 2 * elems);
  // cuda with auto runs bf16 (effective_precision), so its boundaries are bf16 too.
  EXPECT_EQ(sched::cost_model(load({"device.backend=cuda"}), layout).act_bytes, 2 * elems);
  EXPECT_EQ(sched::cost_model(load({"device.backend=cuda", "device.precision=fp32"}), layout).act_bytes, 4 * elems);
  // A GPU profile assumes bf16 (2 bytes); without the key its tables stay as they were, and an
  // explicit precision overrides it.
  EXPECT_EQ(sched::cost_model(load({"plan.gpu=h100"}), layout).act_bytes, 2 * elems);
  EXPECT_EQ(sched::cost_model(load({"plan.gpu=h100", "device.precision=fp32"}), layout).act_bytes, 4 * elems);
}

TEST(PrecisionCost, EmulatedComputeSendsTheTablesBf16Messages) {
  for (const char* p : {"fp32", "bf16"}) {
    const Config cfg = load({"device.backend=emulated", std::string("device.precision=") + p});
    const topo::Layout layout(cfg.parallel.world_size(), cfg.parallel);
    const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
    const runtime::EmulatedStage e = runtime::emulated_stage(cfg, layout, table, 0);
    EXPECT_EQ(e.boundary_bytes, static_cast<std::size_t>((std::string(p) == "bf16" ? 2 : 4) * 2 * 64 * 256)) << p;
  }
}

// Emulated compute sleeps to a deadline once per slot; the default timer slack (50 us) let each
// end up to that late, and tens of slots sit on a step's critical path (issue 24, docs/emulated.md
// "Ordered links gate peer pairs too"). A sleeping thread asks for a slack of 1 ns.
TEST(EmulatedCompute, SleepsToItsDeadlineWithATimerSlackOfOneNanosecond) {
  long slack = -1;
  double slept = 0.0;
  std::thread t([&] {
    const double t0 = runtime::monotonic_s();
    runtime::emulate_compute(2e-4);
    slept = runtime::monotonic_s() - t0;
    slack = prctl(PR_GET_TIMERSLACK, 0UL, 0UL, 0UL, 0UL);
  });
  t.join();
  EXPECT_GE(slept, 2e-4);
  EXPECT_EQ(slack, 1);
}

}  // namespace
}  // namespace atlas
