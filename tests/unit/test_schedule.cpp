// SPDX-License-Identifier: MIT
// Schedule tables: the engine's link model, the closed-form bubble (p-1)/(m+p-1) for gpipe and
// 1f1b, the atlas invariants over a sweep of layouts (one transfer per link at a time, every
// dependency holds, never slower than 1f1b), and golden text tables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "support/cost_models.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "atlas/core/error.hpp"
#include "atlas/sched/schedule.hpp"

namespace atlas::sched {
namespace {

namespace fs = std::filesystem;

CostModel model(const std::vector<int>& stages_per_dc, int dp, double f, double b, std::int64_t bytes,
                double cap, double flow_cap, double lat) {
  return testing::uniform_cost_model(stages_per_dc, dp, f, b, bytes, cap, flow_cap, lat);
}

ScheduleTable table(const CostModel& c, ScheduleKind k, int m) {
  ScheduleOptions o;
  o.kind = k;
  o.micro_batches = m;
  return build_schedule(c, o);
}

// ---- engine ----

/// A program with one WAN link (capacity, per-flow cap, latency) and `messages` transfers of
/// `bytes` each on it; no workers yet.
EngineProgram one_link(double capacity, double flow_cap, double latency, std::size_t messages, std::int64_t bytes) {
  EngineProgram p;
  EngineChannel ch;
  ch.capacity_bytes_per_ms = capacity;
  ch.flow_cap_bytes_per_ms = flow_cap;
  ch.latency_ms = latency;
  p.channels.push_back(ch);
  p.messages.resize(messages);
  for (auto& m : p.messages) {
    m.channel = 0;
    m.bytes = bytes;
  }
  return p;
}

TEST(Engine, SharedLinkWithoutBurstsSharesFairlyEachFlowCapped) {
  EngineProgram p = one_link(100.0, 80.0, 5.0, 2, 100);
  // Two senders post at t=0, two receivers wait.
  p.workers = {{{EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 1, -1}},
               {{EngineOp::Type::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Recv, SlotKind::WanRecv, 0, 0.0, 1, -1}}};
  const auto r = run_engine(p);
  ASSERT_FALSE(r.deadlock);
  // No window stated (window_bytes = 0): the transfers are not bursts, so the two flows share the
  // link fairly, each capped: min(80, 100 / 2) = 50 bytes/ms, both done at 100 / 50 = 2 ms,
  // arriving at 7. (Served in post order, 0 would end at 1.25 ms: only bursts queue in order.)
  EXPECT_DOUBLE_EQ(p.messages[0].end_ms, 2.0);
  EXPECT_DOUBLE_EQ(p.messages[1].end_ms, 2.0);
  EXPECT_DOUBLE_EQ(p.messages[1].arrive_ms, 7.0);
  EXPECT_DOUBLE_EQ(r.ops[2][0].start_ms, 7.0);
  EXPECT_DOUBLE_EQ(r.ops[3][0].start_ms, 7.0);

  // One flow alone is capped at 80 bytes/ms.
  p.messages.resize(1);
  p.workers = {{{EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}}};
  run_engine(p);
  EXPECT_DOUBLE_EQ(p.messages[0].end_ms, 100.0 / 80.0);
}

// Window-sized transfers (EngineChannel::window_bytes): each leaves in one burst at the link's
// rate, in post order; a peer pair's next one waits until the bytes it sent before are
// acknowledged at its windows' rate (flow_cap = window / RTT).
TEST(Engine, WindowSizedTransfersLeaveInBurstsInPostOrder) {
  // Link of 100 bytes/ms, 20 ms one way; a window of 1000 bytes per pair: 1000 / 40 ms = 25
  // bytes/ms per pair. Transfers of 1000 bytes (one window): 10 ms at the link's rate.
  auto program = [](bool same_pair) {
    EngineProgram p;
    EngineChannel ch;
    ch.capacity_bytes_per_ms = 100.0;
    ch.flow_cap_bytes_per_ms = 25.0;
    ch.window_bytes = 1000.0;
    ch.latency_ms = 20.0;
    p.channels.push_back(ch);
    p.messages.resize(2);
    for (auto& m : p.messages) {
      m.channel = 0;
      m.bytes = 1000;
    }
    using T = EngineOp::Type;
    // Sender A posts message 0 at 0 ms; message 1 is posted at 5 ms, by A again (same pair: one
    // receiver takes both) or by sender B.
    if (same_pair) {
      p.workers = {{{T::Send, SlotKind::WanSend, 0, 0.0, 0, -1},
                    {T::Compute, SlotKind::Forward, 0, 5.0, -1, -1},
                    {T::Send, SlotKind::WanSend, 1, 0.0, 1, -1}},
                   {{T::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}, {T::Recv, SlotKind::WanRecv, 1, 0.0, 1, -1}}};
    } else {
      p.workers = {{{T::Send, SlotKind::WanSend, 0, 0.0, 0, -1}},
                   {{T::Compute, SlotKind::Forward, 0, 5.0, -1, -1}, {T::Send, SlotKind::WanSend, 1, 0.0, 1, -1}},
                   {{T::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}},
                   {{T::Recv, SlotKind::WanRecv, 1, 0.0, 1, -1}}};
    }
    return p;
  };
  // Two pairs: 0 alone on the link from 0 to 1000 / 100 = 10 ms, arrives at 10 + 20 = 30 ms; 1,
  // posted at 5, is served after it: 10 to 20 ms, arrives at 40. (Processor sharing, as the engine
  // had it: 0 alone until 5 ms (500 bytes), then both at 50 bytes/ms: 0 done at 15, 1 at 20.)
  EngineProgram two = program(false);
  ASSERT_FALSE(run_engine(two).deadlock);
  EXPECT_DOUBLE_EQ(two.messages[0].end_ms, 10.0);
  EXPECT_DOUBLE_EQ(two.messages[0].arrive_ms, 30.0);
  EXPECT_DOUBLE_EQ(two.messages[1].start_ms, 5.0);
  EXPECT_DOUBLE_EQ(two.messages[1].end_ms, 20.0);
  EXPECT_DOUBLE_EQ(two.messages[1].arrive_ms, 40.0);
  // One pair: its window has room again 1000 / 25 = 40 ms after message 0 started (its bytes
  // acknowledged one round trip after they left): message 1 runs from 40 to 50 ms, arrives at 70.
  EngineProgram one = program(true);
  ASSERT_FALSE(run_engine(one).deadlock);
  EXPECT_DOUBLE_EQ(one.messages[0].arrive_ms, 30.0);
  EXPECT_DOUBLE_EQ(one.messages[1].post_ms, 5.0);
  EXPECT_DOUBLE_EQ(one.messages[1].start_ms, 40.0);
  EXPECT_DOUBLE_EQ(one.messages[1].end_ms, 50.0);
  EXPECT_DOUBLE_EQ(one.messages[1].arrive_ms, 70.0);
  // A transfer larger than the window is capped at the pair's rate instead: 2000 bytes at 25.
  EngineProgram big = program(false);
  big.messages[0].bytes = 2000;
  ASSERT_FALSE(run_engine(big).deadlock);
  EXPECT_DOUBLE_EQ(big.messages[0].end_ms, 2000.0 / 25.0);
}

// Without a known window (window_bytes = 0) a peer pair's transfers go one after another; the
// pairs share the link fairly, each at most at its cap.
TEST(Engine, APeerPairsTransfersGoOneAfterAnother) {
  EngineProgram p = one_link(100.0, 60.0, 1.0, 3, 120);
  using T = EngineOp::Type;
  // Sender A posts 0 and 1 at t = 0 to one receiver; sender B posts 2 at t = 0 to another.
  p.workers = {{{T::Send, SlotKind::WanSend, 0, 0.0, 0, -1}, {T::Send, SlotKind::WanSend, 1, 0.0, 1, -1}},
               {{T::Send, SlotKind::WanSend, 0, 0.0, 2, -1}},
               {{T::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}, {T::Recv, SlotKind::WanRecv, 1, 0.0, 1, -1}},
               {{T::Recv, SlotKind::WanRecv, 0, 0.0, 2, -1}}};
  p.messages[1].micro = 1;
  ASSERT_FALSE(run_engine(p).deadlock);
  // 0 and 2 (different pairs) share the link fairly: min(60, 100 / 2) = 50 each, both done at
  // 120 / 50 = 2.4 ms; 1 waits behind 0 (its pair's connection) and starts at 2.4, alone at its
  // cap 60: done at 2.4 + 120 / 60 = 4.4 ms.
  EXPECT_DOUBLE_EQ(p.messages[0].end_ms, 2.4);
  EXPECT_DOUBLE_EQ(p.messages[1].start_ms, 2.4);
  EXPECT_NEAR(p.messages[2].end_ms, 2.4, 1e-12);
  EXPECT_NEAR(p.messages[1].end_ms, 4.4, 1e-12);
}

// An ordered link of window-sized bursts gates peer pairs too (issue 24, `bench ablation` row
// (d) measured 1.11-1.15x its prediction): the runtime admits a transfer when its turn and slot
// come, but the pair's rails put it on the wire only once their windows have room, and it holds
// its slot meanwhile. The link's served order stays the admission order (the table's).
TEST(Engine, OrderedLinkOfBurstsGatesAPeerPairsNextTransfer) {
  // Link of 100 bytes/ms, 20 ms one way, a window of 1000 bytes per pair: 25 bytes/ms per pair.
  EngineProgram p;
  EngineChannel ch;
  ch.mode = LinkMode::Ordered;
  ch.slots = 3;
  ch.capacity_bytes_per_ms = 100.0;
  ch.flow_cap_bytes_per_ms = 25.0;
  ch.window_bytes = 1000.0;
  ch.latency_ms = 20.0;
  ch.order = {0, 1, 2};
  p.channels.push_back(ch);
  p.messages.resize(3);
  for (auto& m : p.messages) {
    m.channel = 0;
    m.bytes = 1000;
  }
  p.messages[1].micro = 1;
  using T = EngineOp::Type;
  // Sender A posts 0 and 1 at t = 0 to one receiver; sender B posts 2 at t = 0 to another.
  p.workers = {{{T::Send, SlotKind::WanSend, 0, 0.0, 0, -1}, {T::Send, SlotKind::WanSend, 1, 0.0, 1, -1}},
               {{T::Send, SlotKind::WanSend, 0, 0.0, 2, -1}},
               {{T::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}, {T::Recv, SlotKind::WanRecv, 1, 0.0, 1, -1}},
               {{T::Recv, SlotKind::WanRecv, 0, 0.0, 2, -1}}};
  ASSERT_FALSE(run_engine(p).deadlock);
  // 0: a burst from 0 to 10 ms. 1 (same pair): its window has room 1000 / 25 = 40 ms after 0
  // started, so it runs 40-50 (before the gate it ran 10-20, behind 0). 2 (another pair) takes the
  // link after 0: 10-20 (it was 20-30).
  EXPECT_DOUBLE_EQ(p.messages[0].end_ms, 10.0);
  EXPECT_DOUBLE_EQ(p.messages[1].start_ms, 40.0);
  EXPECT_DOUBLE_EQ(p.messages[1].end_ms, 50.0);
  EXPECT_DOUBLE_EQ(p.messages[1].arrive_ms, 70.0);
  EXPECT_DOUBLE_EQ(p.messages[2].end_ms, 20.0);
  EXPECT_THAT(p.channels[0].served, ::testing::ElementsAre(0, 1, 2));
  // With 2 slots, 1 holds the second slot while it waits for its window: 2 is admitted only when
  // 0 ends (10 ms) and runs 10-20; 1 still starts at 40.
  p.channels[0].slots = 2;
  ASSERT_FALSE(run_engine(p).deadlock);
  EXPECT_DOUBLE_EQ(p.messages[2].start_ms, 10.0);
  EXPECT_DOUBLE_EQ(p.messages[2].end_ms, 20.0);
  EXPECT_DOUBLE_EQ(p.messages[1].start_ms, 40.0);
}

TEST(Engine, OrderedLinkServesOneAtATimeInTheGivenOrder) {
  EngineProgram p;
  EngineChannel ch;
  ch.mode = LinkMode::Ordered;
  ch.capacity_bytes_per_ms = 100.0;
  ch.flow_cap_bytes_per_ms = 100.0;
  ch.order = {1, 0};
  p.channels.push_back(ch);
  p.messages.resize(2);
  for (auto& m : p.messages) {
    m.channel = 0;
    m.bytes = 100;
  }
  p.workers = {{{EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Compute, SlotKind::Forward, 0, 3.0, -1, -1},
                {EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 1, -1}}};
  run_engine(p);
  // Message 0 is ready at 0 but must wait for message 1 (posted at 3).
  EXPECT_DOUBLE_EQ(p.messages[1].start_ms, 3.0);
  EXPECT_DOUBLE_EQ(p.messages[0].start_ms, 4.0);
  EXPECT_DOUBLE_EQ(p.messages[0].end_ms, 5.0);
}

TEST(Engine, ComputeOnASharedHostSharesItsCores) {
  EngineProgram p;
  // Three workers on one 2-core host, each op at full speed on one core: 10 ms of work each.
  // While all three run, each gets 2/3 core; the third starts 5 ms later.
  p.workers = {{{EngineOp::Type::Compute, SlotKind::Forward, 0, 10.0, -1, -1}},
               {{EngineOp::Type::Compute, SlotKind::Forward, 0, 10.0, -1, -1}},
               {{EngineOp::Type::Compute, SlotKind::Forward, 0, 10.0, -1, -1}}};
  p.worker_start_ms = {0.0, 0.0, 5.0};
  p.host_cores = {2.0};
  p.worker_host = {0, 0, 0};
  p.worker_cores = {1.0, 1.0, 1.0};
  const auto r = run_engine(p);
  ASSERT_FALSE(r.deadlock);
  // 0-5 ms: two ops at 1 core each (5 ms of work left each). From 5 ms: three at 2/3 core; the
  // first two finish after 7.5 ms more (12.5 ms), the third has 5 ms of work left then at 1 core.
  EXPECT_NEAR(r.ops[0][0].end_ms, 12.5, 1e-9);
  EXPECT_NEAR(r.ops[1][0].end_ms, 12.5, 1e-9);
  EXPECT_NEAR(r.ops[2][0].end_ms, 17.5, 1e-9);
  // Dedicated devices: every op takes its 10 ms.
  p.worker_host = {-1, -1, -1};
  const auto d = run_engine(p);
  EXPECT_NEAR(d.ops[2][0].end_ms, 15.0, 1e-9);
}

TEST(Engine, AWaitingReceiverWakesSlowlyOnlyWhileItsHostsCoresAreBusy) {
  // Two workers on a 2-core host. Worker 0 computes 10 ms and sends (intra-DC, free); worker 1
  // waits for it. A third worker on the host computes 0-20 ms (cores busy only while both run).
  EngineProgram p;
  p.messages.resize(1);
  p.messages[0].bytes = 0;
  p.intra_bytes_per_ms = 1e18;
  p.wake_ms = 3.0;       // all cores busy: the receiver waits for a time slice
  p.idle_wake_ms = 0.1;  // a core free: it runs at its next poll
  p.workers = {{{EngineOp::Type::Compute, SlotKind::Forward, 0, 10.0, -1, -1},
                {EngineOp::Type::Send, SlotKind::LocalSend, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Recv, SlotKind::LocalRecv, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Compute, SlotKind::Forward, 0, 20.0, -1, -1}}};
  p.host_cores = {2.0};
  p.worker_host = {0, 0, 0};
  p.worker_cores = {1.0, 1.0, 1.0};
  // At 10 ms worker 0 is done: only worker 2 computes, a core is free.
  auto r = run_engine(p);
  EXPECT_NEAR(r.ops[1][0].end_ms, 10.1, 1e-9);
  // Worker 2 on two threads fills both cores at 10 ms (it ran at one core before worker 0 ended).
  p.worker_cores = {1.0, 1.0, 2.0};
  r = run_engine(p);
  EXPECT_NEAR(r.ops[1][0].end_ms, 13.0, 1e-9);
  // Without a host model the delay is always wake_ms (a GPU cluster's profile).
  p.worker_host = {-1, -1, -1};
  r = run_engine(p);
  EXPECT_NEAR(r.ops[1][0].end_ms, 13.0, 1e-9);
}

TEST(Engine, AWanTransferTakesHostCoresFromCompute) {
  // One 1-core host; worker 0 sends 1000 bytes over a 100 bytes/ms link (0-10 ms) to worker 1;
  // worker 2 computes 20 ms of work. At 200 ns/byte (both ends together) the flow takes
  // 100 * 200 / 1e6 = 0.02 cores, half at each end; both ends here, so for 10 ms the compute runs
  // at 0.98 core.
  EngineProgram p = one_link(100.0, 100.0, 0.0, 1, 1000);
  p.workers = {{{EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}},
               {{EngineOp::Type::Compute, SlotKind::Forward, 0, 20.0, -1, -1}}};
  p.host_cores = {1.0};
  p.worker_host = {0, 0, 0};
  p.worker_cores = {1.0, 1.0, 1.0};
  p.net_ns_per_byte = 200.0;
  auto r = run_engine(p);
  ASSERT_FALSE(r.deadlock);
  EXPECT_NEAR(p.messages[0].end_ms, 10.0, 1e-9);  // the flow's own rate is the link's
  // 10 ms at 0.98 core = 9.8 ms of work, 10.2 ms left at 1 core: ends at 20.2 ms.
  EXPECT_NEAR(r.ops[2][0].end_ms, 20.2, 1e-9);
  // The sender on another host: only the receiving end's half is taken here.
  p.host_cores = {1.0, 1.0};
  p.worker_host = {1, 0, 0};
  r = run_engine(p);
  EXPECT_NEAR(r.ops[2][0].end_ms, 20.1, 1e-9);
  // Free network CPU: the compute takes its 20 ms.
  p.net_ns_per_byte = 0.0;
  r = run_engine(p);
  EXPECT_NEAR(r.ops[2][0].end_ms, 20.0, 1e-9);
}

// A bounded run stops as soon as the WAN links show it cannot end by the bound: worker 0 computes
// 5,000 ops of 1 ms, then sends 1e6 bytes over a 100 bytes/ms link (10 s) to worker 1. Under a
// bound of 6 s the clock alone would stop it past 6 s; the links' bound (t + unsent bytes /
// capacity + latency) stops it at its first check, after 4,096 events.
TEST(Engine, ABoundedRunStopsOnceTheLinksShowItEndsPastTheBound) {
  EngineProgram p = one_link(100.0, 100.0, 5.0, 1, 1000000);
  p.workers.resize(2);
  for (int i = 0; i < 5000; ++i) p.workers[0].push_back({EngineOp::Type::Compute, SlotKind::Forward, 0, 1.0, -1, -1});
  p.workers[0].push_back({EngineOp::Type::Send, SlotKind::WanSend, 0, 0.0, 0, -1});
  p.workers[1] = {{EngineOp::Type::Recv, SlotKind::WanRecv, 0, 0.0, 0, -1}};
  const EngineResult whole = run_engine(p);
  ASSERT_FALSE(whole.deadlock);
  EXPECT_NEAR(whole.makespan_ms, 5000.0 + 10000.0 + 5.0, 1e-6);
  EXPECT_TRUE(whole.bound_records.empty());  // no bound: nothing checked

  p.stop_after_ms = 6000.0;
  const EngineResult early = run_engine(p);
  EXPECT_TRUE(early.stopped);
  ASSERT_FALSE(early.bound_records.empty());
  const auto [lb, at] = early.bound_records.back();
  EXPECT_GT(lb, 6000.0);
  EXPECT_NEAR(at, static_cast<double>(kBoundCheckEvents), 2.0);  // its first check
  EXPECT_NEAR(lb, at + 10000.0 + 5.0, 1e-3);
  EXPECT_LT(early.events, whole.events * 9 / 10);

  // A bound the run meets: it finishes, and no record is above its makespan (a lower bound).
  p.stop_after_ms = whole.makespan_ms;
  const EngineResult met = run_engine(p);
  EXPECT_FALSE(met.stopped);
  EXPECT_EQ(met.makespan_ms, whole.makespan_ms);
  ASSERT_FALSE(met.bound_records.empty());
  for (const auto& [bound, t] : met.bound_records) EXPECT_LE(bound, met.makespan_ms) << "checked at " << t;
}

// A sync group with a delay matrix: member i ends at max over j (reach_j + delay[j][i]) + its
// duration, its slot starting at the later of its reach and that minus its longest leg; without
// one the group is a barrier.
TEST(Engine, SyncDelaysLetEachMemberWaitOnlyForItsParts) {
  EngineProgram p;
  p.workers = {{{EngineOp::Type::Compute, SlotKind::Backward, 0, 2.0, -1, -1},
                {EngineOp::Type::Sync, SlotKind::Optimizer, -1, 1.0, -1, 0}},
               {{EngineOp::Type::Compute, SlotKind::Backward, 0, 5.0, -1, -1},
                {EngineOp::Type::Sync, SlotKind::Optimizer, -1, 1.0, -1, 0}},
               {{EngineOp::Type::Compute, SlotKind::Backward, 0, 9.0, -1, -1},
                {EngineOp::Type::Sync, SlotKind::Optimizer, -1, 0.5, -1, 0}}};
  p.sync_groups = {{0, 1, 2}};
  auto r = run_engine(p);
  ASSERT_FALSE(r.deadlock);
  for (int w = 0; w < 3; ++w) EXPECT_DOUBLE_EQ(r.ops[w][1].start_ms, 9.0) << "barrier, worker " << w;
  EXPECT_DOUBLE_EQ(r.ops[2][1].end_ms, 9.5);
  // A reduce to member 0 and a broadcast back: delay[j][i] = up[j] + down[i].
  const double up[3] = {0.0, 4.0, 6.0}, down[3] = {0.0, 4.0, 1.0};
  p.sync_delay_ms = {std::vector<double>(9)};
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 3; ++i) p.sync_delay_ms[0][static_cast<std::size_t>(j * 3 + i)] = up[j] + down[i];
  r = run_engine(p);
  ASSERT_FALSE(r.deadlock);
  // reach = 2, 5, 9; member 0 has every part at max(2, 5 + 4, 9 + 6) = 15.
  EXPECT_DOUBLE_EQ(r.ops[0][1].reach_ms, 2.0);
  EXPECT_DOUBLE_EQ(r.ops[0][1].end_ms, 15.0 + 1.0);
  EXPECT_DOUBLE_EQ(r.ops[0][1].start_ms, 15.0 - 6.0);  // its longest leg in: member 2's 6 ms
  EXPECT_DOUBLE_EQ(r.ops[1][1].end_ms, 15.0 + 4.0 + 1.0);
  EXPECT_DOUBLE_EQ(r.ops[1][1].start_ms, 9.0);  // 19 - (6 + 4)
  EXPECT_DOUBLE_EQ(r.ops[2][1].end_ms, 15.0 + 1.0 + 0.5);
  EXPECT_DOUBLE_EQ(r.ops[2][1].start_ms, 9.0);  // never before its own reach
  EXPECT_DOUBLE_EQ(r.makespan_ms, 20.0);
  // A matrix of the wrong size is a bug, reported as such.
  p.sync_delay_ms = {std::vector<double>(4, 0.0)};
  EXPECT_THROW(run_engine(p), Error);
}

// The block form of a delay matrix (EngineProgram::sync_delay_block: group 0's two halves at
// scale) times the group exactly as the n x n matrix it stands for: five members in two blocks
// whose reaches differ, every op's times equal to the bit; a block id out of range is a bug.
TEST(Engine, SyncDelayBlocksTimeAsTheFullMatrix) {
  EngineProgram p;
  const double work[5] = {2.0, 7.5, 3.25, 11.0, 6.0};
  const int blk[5] = {0, 0, 1, 1, 1};
  for (int w = 0; w < 5; ++w)
    p.workers.push_back({{EngineOp::Type::Compute, SlotKind::Backward, 0, work[w], -1, -1},
                         {EngineOp::Type::Sync, SlotKind::Optimizer, -1, 0.5 + 0.25 * w, -1, 0}});
  p.sync_groups = {{0, 1, 2, 3, 4}};
  const double d[2][2] = {{0.0, 3.7}, {1.3, 0.0}};  // [from block][to block]
  p.sync_delay_ms = {std::vector<double>(25)};
  for (int j = 0; j < 5; ++j)
    for (int i = 0; i < 5; ++i) p.sync_delay_ms[0][static_cast<std::size_t>(j * 5 + i)] = d[blk[j]][blk[i]];
  const auto full = run_engine(p);
  p.sync_delay_ms = {{d[0][0], d[0][1], d[1][0], d[1][1]}};
  p.sync_delay_block = {{0, 0, 1, 1, 1}};
  const auto block = run_engine(p);
  ASSERT_FALSE(full.deadlock);
  ASSERT_FALSE(block.deadlock);
  for (int w = 0; w < 5; ++w) {
    EXPECT_EQ(block.ops[w][1].start_ms, full.ops[w][1].start_ms) << w;
    EXPECT_EQ(block.ops[w][1].end_ms, full.ops[w][1].end_ms) << w;
  }
  // Member 2 (block 1) has block 0's parts at 7.5 + 3.7 and block 1's at 11: its slot ends at
  // 11.2 + 1.0, starting at 11.2 - 3.7 but not before its reach 3.25.
  EXPECT_DOUBLE_EQ(block.ops[2][1].end_ms, 11.2 + 1.0);
  EXPECT_DOUBLE_EQ(block.ops[2][1].start_ms, 11.2 - 3.7);
  EXPECT_EQ(block.makespan_ms, full.makespan_ms);
  p.sync_delay_block = {{0, 0, 1, 2, 1}};
  EXPECT_THROW(run_engine(p), Error);
}

TEST(Engine, ReportsDeadlockInsteadOfHanging) {
  EngineProgram p;
  p.messages.resize(2);
  p.workers = {{{EngineOp::Type::Recv, SlotKind::LocalRecv, 0, 0.0, 0, -1},
                {EngineOp::Type::Send, SlotKind::LocalSend, 0, 0.0, 1, -1}},
               {{EngineOp::Type::Recv, SlotKind::LocalRecv, 0, 0.0, 1, -1},
                {EngineOp::Type::Send, SlotKind::LocalSend, 0, 0.0, 0, -1}}};
  const auto r = run_engine(p);
  EXPECT_TRUE(r.deadlock);
  EXPECT_THAT(r.deadlock_reason, ::testing::HasSubstr("waiting for message"));
}

// ---- closed form ----

TEST(Schedule, BubbleMatchesClosedFormWithFreeCommunication) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m) {
        // Free WAN: infinite rate, zero latency. Stages split over two DCs when p > 1.
        const std::vector<int> spd = p == 1 ? std::vector<int>{1} : std::vector<int>{p / 2, p - p / 2};
        const CostModel c = model(spd, 1, 1.0, 2.0, 1024, 1e18, 1e18, 0.0);
        const ScheduleTable t = table(c, k, m);
        const double expect = static_cast<double>(p - 1) / (m + p - 1);
        EXPECT_NEAR(t.step_ms, (m + p - 1) * 3.0, 1e-9) << to_string(k) << " p=" << p << " m=" << m;
        for (int s = 0; s < p; ++s)
          EXPECT_NEAR(t.bubble_fraction(s, 0), expect, 1e-9) << to_string(k) << " p=" << p << " m=" << m << " s=" << s;
      }
  }
}

// ---- invariants over a sweep ----

void check_invariants(const ScheduleTable& t, const std::string& what) {
  constexpr double kEps = 1e-6;
  // Each row: every F(m) and B(m) exactly once, slots in time order, no overlap.
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      const auto& row = t.row(s, d);
      std::vector<int> fwd(static_cast<std::size_t>(t.micro_batches), 0), bwd = fwd;
      std::vector<double> fwd_end(static_cast<std::size_t>(t.micro_batches), -1);
      double cursor = 0.0;
      for (const auto& sl : row) {
        ASSERT_GE(sl.start_ms, cursor - kEps) << what << " row " << s << "," << d;
        cursor = sl.end_ms();
        if (sl.kind == SlotKind::Forward) {
          ++fwd[static_cast<std::size_t>(sl.micro)];
          fwd_end[static_cast<std::size_t>(sl.micro)] = sl.end_ms();
        }
        if (sl.kind == SlotKind::Backward) {
          ++bwd[static_cast<std::size_t>(sl.micro)];
          ASSERT_GE(fwd_end[static_cast<std::size_t>(sl.micro)], 0.0) << what << ": backward before forward";
          ASSERT_GE(sl.start_ms, fwd_end[static_cast<std::size_t>(sl.micro)] - kEps);
        }
        if (is_recv(sl.kind) && sl.link >= 0) {
          // The consumed tensor has arrived.
          const auto& x = t.links[static_cast<std::size_t>(sl.link)].order[static_cast<std::size_t>(sl.link_pos)];
          ASSERT_EQ(x.micro, sl.micro);
          ASSERT_EQ(x.dst_stage, s);
          ASSERT_GE(sl.start_ms, x.arrive_ms - kEps) << what;
        }
        if (is_send(sl.kind) && sl.link >= 0) {
          const auto& x = t.links[static_cast<std::size_t>(sl.link)].order[static_cast<std::size_t>(sl.link_pos)];
          ASSERT_EQ(x.src_stage, s);
          ASSERT_EQ(x.dp, d);
          ASSERT_LE(sl.start_ms, x.start_ms + kEps);  // posted before it starts on the link
        }
      }
      for (int m = 0; m < t.micro_batches; ++m) {
        ASSERT_EQ(fwd[static_cast<std::size_t>(m)], 1) << what;
        ASSERT_EQ(bwd[static_cast<std::size_t>(m)], 1) << what;
      }
      ASSERT_NEAR(cursor, t.step_ms, kEps);
    }
  // Links: in atlas, at most `slots` transfers at once, served in table order.
  for (const auto& l : t.links) {
    ASSERT_EQ(l.order.size(), static_cast<std::size_t>(2 * t.dp * t.micro_batches) / 2)
        << what << ": one transfer per (pipeline, micro-batch) per direction";
    if (t.kind != ScheduleKind::Atlas) continue;
    for (std::size_t k = 1; k < l.order.size(); ++k)
      ASSERT_GE(l.order[k].start_ms, l.order[k - 1].start_ms - kEps) << what;
    for (std::size_t k = static_cast<std::size_t>(l.slots); k < l.order.size(); ++k)
      ASSERT_GE(l.order[k].start_ms, l.order[k - static_cast<std::size_t>(l.slots)].end_ms - kEps)
          << what << ": more than " << l.slots << " transfers on a link at once";
  }
}

TEST(Schedule, AtlasInvariantsAndNeverSlowerThan1F1BOverASweep) {
  int cases = 0;
  for (int dcs = 2; dcs <= 4; ++dcs)
    for (int stages : {2, 3, 4, 6, 8}) {
      if (stages < dcs) continue;
      std::vector<int> spd(static_cast<std::size_t>(dcs), stages / dcs);
      for (int i = 0; i < stages % dcs; ++i) ++spd[static_cast<std::size_t>(i)];
      for (int dp : {1, 2, 4, 8})
        for (int m : {1, 2, 4, 8, 16, 32}) {
          // Transfer ~ compute (the regime atlas is for); one sweep point caps each flow.
          const bool capped = (dp + m) % 3 == 0;
          const CostModel c = model(spd, dp, 1.0, 2.0, 1000, 1000.0, capped ? 400.0 : 1000.0, 0.5);
          const std::string what = "dcs=" + std::to_string(dcs) + " stages=" + std::to_string(stages) +
                                   " dp=" + std::to_string(dp) + " m=" + std::to_string(m);
          ScheduleOptions o;
          o.micro_batches = m;
          o.full_search = true;
          o.kind = ScheduleKind::Atlas;
          const ScheduleTable a = build_schedule(c, o);
          o.kind = ScheduleKind::OneFOneB;
          const ScheduleTable b = build_schedule(c, o);
          check_invariants(a, what + " atlas");
          check_invariants(b, what + " 1f1b");
          EXPECT_LE(a.step_ms, b.step_ms * (1 + 1e-9)) << what;
          EXPECT_NEAR(a.atlas.baseline_1f1b_ms, b.step_ms, 1e-9);
          ++cases;
        }
    }
  EXPECT_GT(cases, 200);
}

TEST(Schedule, AtlasBeatsConcurrentSharingWhenTheWanIsTheBottleneck) {
  // 3 DCs, dp 4: four pipelines share each link, each peer pair's windows a quarter of it (a
  // transfer takes four forwards), 20 ms one way. (With the link served in post order, a pair
  // capped at the whole link and 5 ms, as before, 1f1b's concurrent sharing is already what atlas
  // finds: 208 ms both.)
  const CostModel c = model({1, 1, 1}, 4, 4.0, 8.0, 40000, 10000.0, 2500.0, 20.0);
  const double atlas = table(c, ScheduleKind::Atlas, 6).step_ms;
  const double onef = table(c, ScheduleKind::OneFOneB, 6).step_ms;
  EXPECT_LT(atlas, 0.8 * onef) << "atlas " << atlas << " ms vs 1f1b " << onef << " ms";
}

TEST(Schedule, StructureHashIgnoresTimesButNotOrder) {
  const CostModel c = model({2, 2}, 2, 1.0, 2.0, 1000, 1000.0, 1000.0, 0.5);
  CostModel slower = c;
  slower.fwd_ms.assign(slower.fwd_ms.size(), 1.5);
  EXPECT_EQ(table(c, ScheduleKind::GPipe, 4).structure_hash(), table(slower, ScheduleKind::GPipe, 4).structure_hash());
  EXPECT_NE(table(c, ScheduleKind::GPipe, 4).structure_hash(), table(c, ScheduleKind::OneFOneB, 4).structure_hash());
}

// ---- golden tables ----

fs::path golden_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return (env ? fs::path(env) : fs::path(ATLAS_SOURCE_DIR)) / "tests/golden";
}

void check_golden(const std::string& name, const std::string& actual) {
  const fs::path p = golden_dir() / (name + ".sched.expected");
  if (std::getenv("ATLAS_REGENERATE_GOLDEN")) {
    std::ofstream(p) << actual;
    GTEST_SKIP() << "regenerated " << p;
  }
  std::ifstream in(p);
  ASSERT_TRUE(in) << p << " missing: run with ATLAS_REGENERATE_GOLDEN=1 and review the diff";
  std::ostringstream os;
  os << in.rdbuf();
  EXPECT_EQ(os.str(), actual) << "golden " << p << " differs; if intended, regenerate with "
                                 "ATLAS_REGENERATE_GOLDEN=1 and review the diff";
}

std::string render(const ScheduleTable& t) {
  return gantt(t, {"east", "west", "south"}, 72) + summary(t, {"east", "west", "south"});
}

TEST(Schedule, GoldenGPipeFourStagesTwoDcs) {
  check_golden("gpipe_4stage_2dc_m4", render(table(model({2, 2}, 1, 1.0, 2.0, 1000, 1000.0, 1000.0, 0.5), ScheduleKind::GPipe, 4)));
}
TEST(Schedule, Golden1F1BFourStagesTwoDcs) {
  check_golden("1f1b_4stage_2dc_m4", render(table(model({2, 2}, 1, 1.0, 2.0, 1000, 1000.0, 1000.0, 0.5), ScheduleKind::OneFOneB, 4)));
}
TEST(Schedule, GoldenAtlasThreeDcsDp2) {
  check_golden("atlas_3dc_dp2_m4", render(table(model({1, 1, 1}, 2, 2.0, 4.0, 2000, 1000.0, 1000.0, 1.0), ScheduleKind::Atlas, 4)));
}

}  // namespace
}  // namespace atlas::sched

namespace atlas::sched {
namespace {

TEST(TableMismatch, NamesEachHashWithItsRanksAndSaysNothingWhenAllAgree) {
  EXPECT_EQ(table_mismatch({}), "");
  EXPECT_EQ(table_mismatch({7, 7, 7}), "");
  const std::string m = table_mismatch({7, 7, 7, 7, 9, 7, 9, 5});
  EXPECT_THAT(m, ::testing::HasSubstr("the ranks built 3 different schedule tables ("
                                      "hash 0000000000000007 on ranks 0-3, 5; "
                                      "hash 0000000000000009 on ranks 4, 6; "
                                      "hash 0000000000000005 on rank 7)"));
  EXPECT_THAT(m, ::testing::HasSubstr("hint: every rank must run the same binary and deck"));
}

TEST(DeckMismatch, NamesEachDeckHashWithItsRanks) {
  EXPECT_EQ(deck_mismatch({3, 3}), "");
  const std::string m = deck_mismatch({text_hash("a = 1\n"), text_hash("a = 1\n"), text_hash("a = 2\n")});
  EXPECT_THAT(m, ::testing::HasSubstr(fmt::format("the ranks resolved 2 different decks (hash {:016x} on ranks 0-1; "
                                                  "hash {:016x} on rank 2)",
                                                  text_hash("a = 1\n"), text_hash("a = 2\n"))));
  EXPECT_THAT(m, ::testing::HasSubstr("hint: give every rank the same deck and key=value overrides"));
  EXPECT_EQ(text_hash(""), 1469598103934665603ULL);  // FNV-1a's offset basis
  EXPECT_NE(text_hash("a"), text_hash("b"));
}

}  // namespace
}  // namespace atlas::sched
