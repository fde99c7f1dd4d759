// SPDX-License-Identifier: MIT
// In-situ compute costs (sim::insitu_compute): which slots ran without processor sharing, their
// medians per stage and kind, the fallback to the shortest slot, and bad input.
#include <gtest/gtest.h>

#include "atlas/core/error.hpp"
#include "atlas/sim/insitu.hpp"

namespace atlas::sim {
namespace {

using sched::SlotKind;

ComputeSpan span(int rank, int stage, SlotKind k, double start_ms, double end_ms, int step = 1) {
  return {rank, stage, step, k, start_ms * 1e-3, end_ms * 1e-3};
}

const std::vector<int> kOneHost = {0, 0, 0, 0};
const std::vector<int> kTwoHosts = {0, 0, 1, 1};

// One host, 2 cores, 4 ranks: ranks 0 and 1 are stage 0, ranks 2 and 3 stage 1.
TEST(InSitu, MediansOfTheSlotsThatRanUnshared) {
  std::vector<ComputeSpan> s = {
      // Stage 0 forwards: 4, 6 and 5 ms alone (median 5); one of 12 ms while three ranks computed.
      span(0, 0, SlotKind::Forward, 0, 4),
      span(1, 0, SlotKind::Forward, 2, 8),  // overlaps rank 0's first: 2 at once, still unshared
      span(0, 0, SlotKind::Forward, 20, 25),
      span(0, 0, SlotKind::Forward, 40, 52),
      span(2, 1, SlotKind::Backward, 41, 45),  // with rank 0's 12 ms forward and rank 3's prefill: 3 at once
      span(3, 1, SlotKind::Prefill, 42, 44, -1),  // BubbleTea's rows have step -1: they count all the same
      // Stage 1: backwards 9 and 11 alone; its forward only ever ran shared (3 at once).
      span(2, 1, SlotKind::Backward, 60, 69),
      span(3, 1, SlotKind::Backward, 80, 91),
      span(2, 1, SlotKind::Forward, 100, 107),
      span(3, 1, SlotKind::Forward, 101, 109),
      span(1, 0, SlotKind::Backward, 102, 105),
      span(0, 0, SlotKind::Backward, 120, 130),
      // An optimizer slot holds the norm's wait: not compute, it shares nothing.
      span(1, 0, SlotKind::Optimizer, 119, 131),
      // Step 0 is not measured (one-time costs), but its compute shares the cores: rank 1's
      // 50 ms forward makes stage 1's first backward shared.
      span(1, 0, SlotKind::Forward, 140, 190, 0),
      span(0, 0, SlotKind::Backward, 150, 160, 0),
      span(3, 1, SlotKind::Backward, 155, 165),
  };
  const InSituCompute r = insitu_compute(s, 2, kOneHost, 2.0);
  ASSERT_EQ(r.fwd_ms.size(), 2u);
  EXPECT_EQ(r.slots, 12);  // forward and backward slots from step 1
  EXPECT_EQ(r.fwd_samples[0], 3);
  EXPECT_NEAR(r.fwd_ms[0], 5.0, 1e-9);  // 4, 6, 5; the 12 ms one ran with 3 at once
  EXPECT_EQ(r.bwd_samples[1], 2);
  EXPECT_NEAR(r.bwd_ms[1], 10.0, 1e-9);  // 9 and 11; the 4 ms one ran shared
  // Stage 1's forwards (7 and 8 ms) each overlapped two others: none unshared, the shortest.
  EXPECT_EQ(r.fwd_samples[1], 0);
  EXPECT_NEAR(r.fwd_ms[1], 7.0, 1e-9);
  // Stage 0's backwards: 3 ms with 3 at once, 10 ms alone.
  EXPECT_EQ(r.bwd_samples[0], 1);
  EXPECT_NEAR(r.bwd_ms[0], 10.0, 1e-9);

  // Every rank on a device of its own: every slot counts.
  const InSituCompute d = insitu_compute(s, 2, {}, 0.0);
  EXPECT_EQ(d.fwd_samples[0], 4);
  EXPECT_NEAR(d.fwd_ms[0], 5.5, 1e-9);  // 4, 6, 5, 12
  EXPECT_NEAR(d.fwd_ms[1], 7.5, 1e-9);
  EXPECT_NEAR(d.bwd_ms[1], 9.5, 1e-9);  // 4, 9, 10, 11
  // Two hosts of two ranks (one core each would share; two cores each never do).
  const InSituCompute two = insitu_compute(s, 2, kTwoHosts, 2.0);
  EXPECT_EQ(two.fwd_samples[1], 2);
  EXPECT_NEAR(two.fwd_ms[1], 7.5, 1e-9);
}

// A split backward (schedule.split_backward): its B and W slots' medians add up to the backward.
TEST(InSitu, ASplitBackwardIsItsBPlusItsW) {
  const std::vector<ComputeSpan> s = {
      span(0, 0, SlotKind::Forward, 0, 4),         span(0, 0, SlotKind::BackwardInput, 10, 13),
      span(0, 0, SlotKind::BackwardInput, 20, 25), span(0, 0, SlotKind::BackwardInput, 30, 34),
      span(0, 0, SlotKind::BackwardWeight, 40, 42), span(0, 0, SlotKind::BackwardWeight, 50, 53),
  };
  const InSituCompute r = insitu_compute(s, 1, {}, 0.0);
  EXPECT_EQ(r.slots, 6);
  EXPECT_NEAR(r.bwd_ms[0], 4.0 + 2.5, 1e-9);  // B: 3, 5, 4; W: 2, 3
  EXPECT_EQ(r.bwd_samples[0], 2);
}

// --skip-steps K leaves out the first K recorded steps: of a resumed run's profile (steps 150 on)
// too, where an absolute step >= K skipped nothing.
TEST(InSitu, SkippedStepsCountFromTheFirstRecorded) {
  const std::vector<ComputeSpan> fresh = {span(0, 0, SlotKind::Forward, 0, 9, 0), span(0, 0, SlotKind::Forward, 10, 11, 1)};
  EXPECT_EQ(first_step_after(fresh, 1), 1);
  EXPECT_EQ(first_step_after(fresh, 0), 0);
  const std::vector<ComputeSpan> resumed = {span(0, 0, SlotKind::Forward, 10, 11, 151),
                                            span(0, 0, SlotKind::Forward, 0, 9, 150),
                                            span(0, 0, SlotKind::Backward, 20, 22, 151)};
  EXPECT_EQ(first_step_after(resumed, 1), 151);
  EXPECT_EQ(first_step_after(resumed, 2), 152);
  EXPECT_EQ(first_step_after({}, 3), 3);
  // The resumed run's warm-up step (150: a 9 ms forward) is left out.
  const InSituCompute c = insitu_compute(resumed, 1, {}, 0, first_step_after(resumed, 1));
  EXPECT_NEAR(c.fwd_ms.at(0), 1.0, 1e-9);
  EXPECT_NEAR(c.bwd_ms.at(0), 2.0, 1e-9);
}

TEST(InSitu, BadInputIsAClearError) {
  // A stage without a forward or backward slot (a profile that recorded nothing).
  const std::vector<ComputeSpan> only0 = {span(0, 0, SlotKind::Forward, 0, 1), span(0, 0, SlotKind::Backward, 1, 3)};
  try {
    (void)insitu_compute(only0, 2, {}, 0.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Config);
    EXPECT_NE(std::string(e.what()).find("stage 1 ran no forward or backward slot"), std::string::npos) << e.what();
  }
  // A slot of a stage the pipeline does not have.
  EXPECT_THROW((void)insitu_compute({span(0, 3, SlotKind::Forward, 0, 1)}, 2, {}, 0.0), Error);
  // A rank the host list does not know.
  EXPECT_THROW((void)insitu_compute({span(7, 0, SlotKind::Forward, 0, 1)}, 1, kOneHost, 2.0), Error);
  // Only the unmeasured step.
  EXPECT_THROW((void)insitu_compute({span(0, 0, SlotKind::Forward, 0, 1, 0), span(0, 0, SlotKind::Backward, 1, 2, 0)},
                                    1, {}, 0.0),
               Error);
}

}  // namespace
}  // namespace atlas::sim
