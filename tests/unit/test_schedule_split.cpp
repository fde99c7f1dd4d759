// SPDX-License-Identifier: MIT
// The zero-bubble split of the backward (schedule.split_backward, issue 24 item 5), schedule side:
// the slot contract (one B and a later W per micro-batch, W in micro-batch order, all W before the
// AllReduce, the gradient sent after B) for every kind on every example deck, B + W = the backward,
// the W filling WAN waits on a WAN-bound deck (a lower predicted step), memory held until W, retime
// keeping the table's order, and the deck's checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "support/cost_models.hpp"
#include "support/deck_error.hpp"

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::sched {
namespace {

namespace fs = std::filesystem;

struct Deck {
  std::string name;
  Config cfg;
  CostModel cost;
};

/// Every example deck (inputs/*.deck) with `overrides`, and its cost model.
std::vector<Deck> example_decks(const std::vector<std::string>& overrides) {
  const fs::path root = fs::path(ATLAS_SOURCE_DIR);
  const fs::path here = fs::current_path();
  fs::current_path(root);  // decks name profiles and data relative to the checkout
  std::vector<Deck> out;
  for (const auto& entry : fs::directory_iterator(root / "inputs")) {
    if (entry.path().extension() != ".deck") continue;
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;  // the table does not depend on the backend
    const std::string name = entry.path().filename().string();
    Config cfg = deck::parse_and_validate(name, deck::read_text_file(entry.path().string()), overrides, shape);
    deck::read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel.stages_per_dc, cfg.parallel.dp_size, cfg.parallel.tp_size);
    CostModel cost = cost_model(cfg, layout);
    out.push_back({name, std::move(cfg), std::move(cost)});
  }
  fs::current_path(here);
  return out;
}

/// The zero-bubble slot contract (docs/schedules.md) on every row of a split table; "" when it
/// holds, else what breaks first. Also: every forward once, activations held (forward to W) at most
/// `hold` per stage when given.
std::string split_contract(const ScheduleTable& t, const std::vector<int>& hold = {}) {
  for (int s = 0; s < t.pp; ++s)
    for (int d = 0; d < t.dp; ++d) {
      const auto& row = t.row(s, d);
      const std::string at = "stage " + std::to_string(s) + " dp " + std::to_string(d) + ": ";
      std::map<int, int> fwd_at, b_at, w_at;
      int allreduce = -1, last_w_micro = -1, held = 0, most = 0;
      for (int i = 0; i < static_cast<int>(row.size()); ++i) {
        const Slot& sl = row[static_cast<std::size_t>(i)];
        if (i > 0 && std::fabs(sl.start_ms - row[static_cast<std::size_t>(i - 1)].end_ms()) > 1e-6)
          return at + "a gap or an overlap before slot " + std::to_string(i);
        switch (sl.kind) {
          case SlotKind::Backward: return at + "a Backward slot in a split row";
          case SlotKind::Forward:
            if (!fwd_at.emplace(sl.micro, i).second) return at + "forward of micro " + std::to_string(sl.micro) + " twice";
            most = std::max(most, ++held);
            break;
          case SlotKind::BackwardInput:
            if (fwd_at.count(sl.micro) == 0) return at + "B before its forward, micro " + std::to_string(sl.micro);
            if (!b_at.emplace(sl.micro, i).second) return at + "B twice, micro " + std::to_string(sl.micro);
            break;
          case SlotKind::BackwardWeight:
            if (b_at.count(sl.micro) == 0) return at + "W before its B, micro " + std::to_string(sl.micro);
            if (!w_at.emplace(sl.micro, i).second) return at + "W twice, micro " + std::to_string(sl.micro);
            if (sl.micro <= last_w_micro) return at + "W out of micro-batch order at " + std::to_string(sl.micro);
            last_w_micro = sl.micro;
            --held;
            break;
          case SlotKind::AllReduce: allreduce = i; break;
          default: break;
        }
        // The gradient goes to the previous stage right after B, never after W.
        if (sl.kind == SlotKind::BackwardInput && s > 0) {
          int j = i + 1;
          while (j < static_cast<int>(row.size()) && row[static_cast<std::size_t>(j)].kind == SlotKind::Idle) ++j;
          const Slot* next = j < static_cast<int>(row.size()) ? &row[static_cast<std::size_t>(j)] : nullptr;
          if (next == nullptr || !is_send(next->kind) || next->flow != Flow::Gradient || next->micro != sl.micro)
            return at + "B of micro " + std::to_string(sl.micro) + " not followed by its gradient's send";
        }
      }
      for (int i = 0; i < t.micro_batches; ++i) {
        if (fwd_at.count(i) == 0 || b_at.count(i) == 0 || w_at.count(i) == 0)
          return at + "micro " + std::to_string(i) + " lacks a forward, a B or a W";
        if (allreduce >= 0 && w_at[i] > allreduce) return at + "W of micro " + std::to_string(i) + " after the AllReduce";
      }
      if (allreduce < 0) return at + "no AllReduce slot";
      if (!hold.empty() && most > hold[static_cast<std::size_t>(s)])
        return at + "holds " + std::to_string(most) + " micro-batches, more than " + std::to_string(hold[static_cast<std::size_t>(s)]);
    }
  return "";
}

ScheduleOptions options(const Config& cfg, ScheduleKind k, SplitBackward split) {
  ScheduleOptions o = schedule_options(cfg, k);
  o.split = split;
  return o;
}

TEST(SplitBackward, BPlusWIsTheBackwardOnEveryExampleDeck) {
  for (const Deck& d : example_decks({})) {
    ASSERT_EQ(d.cost.weight_grad_share.size(), static_cast<std::size_t>(d.cost.pp)) << d.name;
    for (int s = 0; s < d.cost.pp; ++s) {
      const double bwd = d.cost.bwd_ms[static_cast<std::size_t>(s)];
      const double w = d.cost.bwd_weight_ms(s), b = d.cost.bwd_input_ms(s);
      EXPECT_GT(w, 0.0) << d.name << " stage " << s;
      EXPECT_GT(b, w * 0.5) << d.name << " stage " << s << ": B holds the activation gradient and the TP sums";
      EXPECT_NEAR(b + w, bwd, 1e-12 * bwd) << d.name << " stage " << s;
    }
  }
}

TEST(SplitBackward, TheWeightShareFollowsTheFlopsWithMeasuredBlockTimes) {
  // schedule.fwd_ms_per_layer: W = the dW GEMMs' share of the backward's FLOPs, 24h / (2 (24h + 4s)).
  ModelCfg m;
  m.hidden = 512;
  m.seq_len = 256;
  EXPECT_DOUBLE_EQ(block_weight_grad_fraction(m), 24.0 * 512 / (2.0 * (24.0 * 512 + 4.0 * 256)));
  Config cfg;
  cfg.model = m;
  cfg.model.heads = 8;
  cfg.model.vocab = 1000;
  cfg.schedule.fwd_ms_per_layer = 2.0;
  cfg.schedule.bwd_over_fwd = 2.0;
  DeviceProfile p = builtin_device_profile(GpuKind::H100);
  p.full_recompute = false;
  const BlockCost plain = block_cost(cfg, 1, p);
  EXPECT_DOUBLE_EQ(plain.bwd_weight_ms, 4.0 * block_weight_grad_fraction(m));
  EXPECT_DOUBLE_EQ(plain.head_bwd_weight_ms, 0.5 * plain.head_bwd_ms);
  // Full recomputation re-runs the forward before the backward: B's work, W unchanged.
  p.full_recompute = true;
  const BlockCost re = block_cost(cfg, 1, p);
  EXPECT_DOUBLE_EQ(re.bwd_ms, plain.bwd_ms + plain.fwd_ms);
  EXPECT_DOUBLE_EQ(re.bwd_weight_ms, plain.bwd_weight_ms);
}

TEST(SplitBackward, EveryKindKeepsTheSlotContractOnEveryExampleDeck) {
  int tables = 0;
  for (const Deck& d : example_decks({})) {
    if (d.cfg.schedule.virtual_stages > 1) continue;
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
      const ScheduleTable plain = build_schedule(d.cost, options(d.cfg, k, SplitBackward::Off));
      const ScheduleTable t = build_schedule(d.cost, options(d.cfg, k, SplitBackward::On));
      const std::string what = d.name + " " + to_string(k);
      ASSERT_TRUE(is_split(t)) << what;
      EXPECT_FALSE(is_split(plain)) << what;
      // gpipe and 1f1b hold their own depth (same memory); atlas its chosen hold.
      const std::vector<int> hold = k == ScheduleKind::Atlas ? t.atlas.hold : in_flight_depth(plain);
      EXPECT_EQ(split_contract(t, hold), "") << what;
      if (k != ScheduleKind::Atlas) {
        EXPECT_EQ(in_flight_depth(t), in_flight_depth(plain)) << what;
      } else {
        EXPECT_TRUE(t.atlas.split) << what;
      }
      // B + W durations are the backward's where each rank has its own device.
      if (d.cost.ranks_per_host == 0)
        for (int s = 0; s < t.pp; ++s)
          for (const Slot& sl : t.row(s, 0)) {
            if (sl.kind == SlotKind::BackwardInput) {
              EXPECT_NEAR(sl.duration_ms, d.cost.bwd_input_ms(s), 1e-9) << what;
            }
            if (sl.kind == SlotKind::BackwardWeight) {
              EXPECT_NEAR(sl.duration_ms, d.cost.bwd_weight_ms(s), 1e-9) << what;
            }
          }
      // Retiming under the same cost model keeps the table's order (its W places) and times.
      const ScheduleTable again = retime(t, d.cost);
      EXPECT_EQ(again.structure_hash(), t.structure_hash()) << what;
      EXPECT_NEAR(again.step_ms, t.step_ms, 1e-6 * t.step_ms) << what;
      EXPECT_NE(t.structure_hash(), plain.structure_hash()) << what;
      ++tables;
    }
  }
  EXPECT_GE(tables, 30);
}

TEST(SplitBackward, OffGivesTheUnsplitTablesAndAutoSplitsOnlyAtlasWhereItWins) {
  for (const Deck& d : example_decks({})) {
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
      const ScheduleTable a = build_schedule(d.cost, options(d.cfg, k, SplitBackward::Auto));
      const ScheduleTable o = build_schedule(d.cost, options(d.cfg, k, SplitBackward::Off));
      EXPECT_EQ(a.structure_hash(), o.structure_hash()) << d.name << ": auto splits atlas only";
      EXPECT_EQ(a.step_ms, o.step_ms) << d.name;
    }
    const ScheduleTable off = build_schedule(d.cost, options(d.cfg, ScheduleKind::Atlas, SplitBackward::Off));
    const ScheduleTable aut = build_schedule(d.cost, options(d.cfg, ScheduleKind::Atlas, SplitBackward::Auto));
    EXPECT_FALSE(is_split(off)) << d.name;
    EXPECT_LE(aut.step_ms, off.step_ms) << d.name;
    EXPECT_LE(memory_per_gpu(d.cost, aut).peak_bytes, memory_per_gpu(d.cost, off).peak_bytes * (1 + 1e-12)) << d.name;
    if (is_split(aut)) {
      EXPECT_LT(aut.step_ms, off.step_ms * (1 - 1e-4)) << d.name << ": kept only where it gains";
      EXPECT_EQ(split_contract(aut, aut.atlas.hold), "") << d.name;
    } else {
      EXPECT_EQ(aut.structure_hash(), off.structure_hash()) << d.name;
    }
    std::printf("# %-28s atlas off %10.3f ms  auto %10.3f ms (%s, %.3f x)\n", d.name.c_str(), off.step_ms,
                aut.step_ms, is_split(aut) ? "split" : "not split", aut.step_ms / off.step_ms);
  }
}

TEST(SplitBackward, WFillsTheWanWaitsOfAWanBoundDeck) {
  for (const Deck& d : example_decks({})) {
    if (d.name != "atlas_wan_bound.deck" && d.name != "ablation_2dc_16.deck") continue;
    for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
      const ScheduleTable off = build_schedule(d.cost, options(d.cfg, k, SplitBackward::Off));
      const ScheduleTable on = build_schedule(d.cost, options(d.cfg, k, SplitBackward::On));
      std::printf("# %s %s: predicted step %.3f ms unsplit, %.3f ms split (%.3f x); mean bubble %.1f%% -> %.1f%%\n",
                  d.name.c_str(), to_string(k), off.step_ms, on.step_ms, on.step_ms / off.step_ms,
                  100 * off.mean_bubble_fraction(), 100 * on.mean_bubble_fraction());
      EXPECT_LT(on.step_ms, off.step_ms) << d.name << " " << to_string(k);
      // Some W runs in the wait before a WAN receive (not only in the step's tail).
      int filled = 0;
      for (const auto& row : on.rows)
        for (std::size_t i = 0; i + 1 < row.size(); ++i) {
          if (row[i].kind != SlotKind::BackwardWeight) continue;
          std::size_t j = i + 1;
          while (j < row.size() && (row[j].kind == SlotKind::BackwardWeight || row[j].kind == SlotKind::Idle)) ++j;
          if (j < row.size() && row[j].kind == SlotKind::WanRecv) ++filled;
        }
      EXPECT_GT(filled, 0) << d.name << " " << to_string(k);
    }
  }
}

TEST(SplitBackward, AWHoldsItsMicroBatchsActivationsUntilItRuns) {
  // GPipe's order on 2 stages, 3 micro-batches: F0 F1 F2 B0 B1 B2 then the W's; a row that ran
  // F0 F1 B0 W0 F2 holds at most 2.
  ScheduleTable t;
  t.pp = 1;
  t.dp = 1;
  t.micro_batches = 3;
  t.rows = {{Slot{SlotKind::Forward, 0}, Slot{SlotKind::Forward, 1}, Slot{SlotKind::BackwardInput, 0},
             Slot{SlotKind::BackwardWeight, 0}, Slot{SlotKind::Forward, 2}, Slot{SlotKind::BackwardInput, 1},
             Slot{SlotKind::BackwardInput, 2}, Slot{SlotKind::BackwardWeight, 1}, Slot{SlotKind::BackwardWeight, 2}}};
  EXPECT_EQ(in_flight_depth(t), std::vector<int>{2});
  t.rows[0][3] = Slot{SlotKind::BackwardInput, 1};  // B frees nothing: W0 later
  t.rows[0][5] = Slot{SlotKind::BackwardWeight, 0};
  EXPECT_EQ(in_flight_depth(t), std::vector<int>{3});
}

TEST(SplitBackward, HandBuiltModelsSplitHalfAndHalfAndStayWithinMemory) {
  // A WAN round trip between two stages: W fills the wait for each gradient.
  const CostModel c = testing::uniform_cost_model({1, 1}, 2, 1.0, 2.0, 1000, 1e6, 1e6, 20.0);
  EXPECT_DOUBLE_EQ(c.bwd_weight_ms(0), 1.0);
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Atlas}) {
    ScheduleOptions o;
    o.kind = k;
    o.micro_batches = 8;
    const ScheduleTable off = build_schedule(c, o);
    o.split = SplitBackward::On;
    const ScheduleTable on = build_schedule(c, o);
    EXPECT_EQ(split_contract(on, k == ScheduleKind::Atlas ? on.atlas.hold : in_flight_depth(off)), "") << to_string(k);
    EXPECT_LE(on.step_ms, off.step_ms * (1 + 1e-9)) << to_string(k);
    std::printf("# 2 stages over a 20 ms WAN, %s: %.3f ms unsplit, %.3f ms split\n", to_string(k), off.step_ms,
                on.step_ms);
  }
}

// ---- model chunks ----

TEST(SplitBackward, IsRefusedWithModelChunksAndAutoDoesNotSplitThem) {
  CostModel c = testing::uniform_cost_model({2, 2}, 1, 1.0, 2.0, 1000, 1e6, 1e6, 5.0);
  c.virtual_stages = 2;
  ScheduleOptions o;
  o.kind = ScheduleKind::Atlas;
  o.micro_batches = 4;
  o.split = SplitBackward::Auto;
  EXPECT_FALSE(is_split(build_schedule(c, o)));
  o.split = SplitBackward::On;
  try {
    (void)build_schedule(c, o);
    FAIL() << "expected a config error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Config);
    EXPECT_THAT(e.what(), ::testing::AllOf(::testing::HasSubstr("schedule.split_backward = on"),
                                           ::testing::HasSubstr("schedule.virtual_stages = 2"),
                                           ::testing::HasSubstr("hint:")));
  }
}

std::string deck_error(const std::vector<std::string>& overrides) {
  return atlas::testing::two_dc_deck_error(overrides);
}

TEST(SplitBackward, TheDeckKeyAndItsChecks) {
  EXPECT_EQ(deck_error({"schedule.split_backward=on"}), "");
  EXPECT_EQ(deck_error({"schedule.split_backward=off", "schedule.virtual_stages=2"}), "");
  EXPECT_EQ(deck_error({"schedule.split_backward=auto", "schedule.virtual_stages=2"}), "");
  EXPECT_THAT(deck_error({"schedule.split_backward=on", "schedule.virtual_stages=2"}),
              ::testing::AllOf(::testing::HasSubstr("schedule.virtual_stages = 2 cannot run with schedule.split_backward = on"),
                               ::testing::HasSubstr("hint: set schedule.split_backward = auto")));
  EXPECT_THAT(deck_error({"schedule.split_backward=yes"}),
              ::testing::HasSubstr("schedule.split_backward = \"yes\": expected one of: auto, on, off"));
  deck::JobShape shape;
  shape.world_size = 4;
  const std::string text =
      "cluster.dcs = a\ncluster.gpus_per_dc = 1\nparallel.stages_per_dc = 1\nmodel.layers = 2\n"
      "model.hidden = 64\nmodel.heads = 4\nmodel.seq_len = 16\nmodel.vocab = 256\n";
  shape.world_size = 1;
  EXPECT_EQ(deck::parse_and_validate("t.deck", text, {}, shape).schedule.split_backward, SplitBackward::Auto);
}

}  // namespace
}  // namespace atlas::sched
