// SPDX-License-Identifier: MIT
// BubbleTea's requests and bubble map: trace parsing (every error names FILE:LINE), the seeded
// Poisson generator, the shipped example trace, and the predicted Prefill slots of a schedule
// table (inside the bubbles only, training slots untouched).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "atlas/bubbletea/cost.hpp"
#include "atlas/bubbletea/requests.hpp"
#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

namespace atlas::bubbletea {
namespace {

std::string source_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return env ? env : ATLAS_SOURCE_DIR;
}

std::vector<std::string> problems_of(const std::string& text, int vocab = 256, int context = 64) {
  try {
    (void)parse_trace("t.csv", text, vocab, context, 4, 1);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

TEST(Trace, ParsesCountsTextsAndDefaults) {
  const auto reqs = parse_trace("t.csv",
                                "arrival_s,prompt,max_new_tokens\n"
                                "# a comment\n"
                                "0.0, 12, 3\n"
                                "\n"
                                "0.5,\"Hi, \"\"you\"\"\",\n"
                                "0.5,7\n",
                                256, 64, 4, 1);
  ASSERT_EQ(reqs.size(), 3U);
  EXPECT_EQ(reqs[0].prompt.size(), 12U);
  EXPECT_EQ(reqs[0].max_new_tokens, 3);
  EXPECT_EQ(reqs[1].id, 1);
  EXPECT_DOUBLE_EQ(reqs[1].arrival_s, 0.5);
  const std::string text = "Hi, \"you\"";
  ASSERT_EQ(reqs[1].prompt.size(), text.size());
  for (std::size_t i = 0; i < text.size(); ++i) EXPECT_EQ(reqs[1].prompt[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(reqs[1].max_new_tokens, 4);  // empty field: the default
  EXPECT_EQ(reqs[2].prompt.size(), 7U);
  for (auto t : reqs[0].prompt) EXPECT_TRUE(t >= 0 && t < 256);
  // Synthetic prompts are a function of (seed, id): parsing again gives the same tokens.
  EXPECT_EQ(parse_trace("t.csv", "0,12\n", 256, 64, 4, 1)[0].prompt, reqs[0].prompt);
}

TEST(Trace, EveryProblemNamesFileAndLine) {
  using ::testing::HasSubstr;
  auto p = problems_of("1.0,4\n0.5,4\n");
  ASSERT_EQ(p.size(), 1U);
  EXPECT_THAT(p[0], HasSubstr("t.csv:2: arrival time 0.5 is earlier than the previous request's 1"));
  p = problems_of("-1,4\n");
  ASSERT_EQ(p.size(), 1U);
  EXPECT_THAT(p[0], HasSubstr("t.csv:1: arrival time -1 is negative"));
  p = problems_of("0,60,8\n");
  ASSERT_EQ(p.size(), 1U);
  EXPECT_THAT(p[0], HasSubstr("t.csv:1: prompt of 60 tokens plus max_new_tokens 8 = 68 exceeds bubbletea.context = 64"));
  p = problems_of("0,100\n");
  EXPECT_THAT(p.at(0), HasSubstr("t.csv:1: prompt of 100 tokens is outside [1, bubbletea.context = 64]"));
  p = problems_of("x,4\n0,abc\n0,4,0\n0\n0,\"open\n0,\"\"\n");
  ASSERT_EQ(p.size(), 6U);
  EXPECT_THAT(p[0], HasSubstr("t.csv:1: arrival time 'x' is not a number"));
  EXPECT_THAT(p[1], HasSubstr("t.csv:2: prompt 'abc' is neither a token count nor a quoted text"));
  EXPECT_THAT(p[2], HasSubstr("t.csv:3: max_new_tokens '0' is not an integer"));
  EXPECT_THAT(p[3], HasSubstr("t.csv:4: expected 'arrival_s,prompt,max_new_tokens'"));
  EXPECT_THAT(p[4], HasSubstr("t.csv:5: unterminated"));
  EXPECT_THAT(p[5], HasSubstr("t.csv:6: the prompt text is empty"));
  p = problems_of("0,\"hello\"\n", 64);
  EXPECT_THAT(p.at(0), HasSubstr("t.csv:1: a text prompt needs the byte tokenizer's 256 symbols"));
  p = problems_of("# nothing\n");
  EXPECT_THAT(p.at(0), HasSubstr("holds no request"));
}

// A file that is not a trace (or a trace in another format) lists at most kMaxTraceProblems
// problems and says it stopped, instead of one line per line of a large file.
TEST(Trace, StopsAfterTwentyProblemsAndBoundsTheRequestCount) {
  using ::testing::HasSubstr;
  std::string junk;
  for (int i = 0; i < 5000; ++i) junk += "x\ty\n";
  const auto p = problems_of(junk);
  ASSERT_EQ(p.size(), kMaxTraceProblems + 1);
  EXPECT_THAT(p.back(), HasSubstr("t.csv:21: stopped reading after 20 problems; fix those and run again"));
  std::string many;
  many.reserve(8 * (kMaxTraceRequests + 2));
  for (std::size_t i = 0; i <= kMaxTraceRequests; ++i) many += "0,1,1\n";
  const auto q = problems_of(many, 256, 8);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_THAT(q[0], HasSubstr("t.csv:1000001: more than 1000000 requests"));
}

// Every rank holds every prompt: a trace whose prompts pass the cap (kMaxPromptTokens, 1 GiB) is
// refused at the line that passes it, before its prompt is built (a small cap here).
TEST(Trace, PromptTokensInAllAreBounded) {
  using ::testing::HasSubstr;
  const auto ok = parse_trace("t.csv", "0,40\n1,60\n", 256, 64, 4, 1, 100);
  EXPECT_EQ(ok.size(), 2u);
  try {
    (void)parse_trace("t.csv", "0,40\n1,60\n2,1\n", 256, 64, 4, 1, 100);
    FAIL() << "101 prompt tokens passed a cap of 100";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("t.csv:3: the prompts up to here hold 101 tokens, more than 100"));
  }
}

TEST(Generator, SeededPoissonArrivalsAndLengths) {
  BubbleTeaCfg cfg;
  cfg.requests = 2000;
  cfg.rate_per_s = 50;
  cfg.prompt_tokens_min = 5;
  cfg.prompt_tokens_max = 9;
  cfg.vocab = 300;
  const auto a = generate_requests(cfg, 7);
  const auto b = generate_requests(cfg, 7);
  ASSERT_EQ(a.size(), 2000U);
  double last = 0;
  int lo = 100, hi = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_GE(a[i].arrival_s, last);
    last = a[i].arrival_s;
    lo = std::min(lo, static_cast<int>(a[i].prompt.size()));
    hi = std::max(hi, static_cast<int>(a[i].prompt.size()));
  }
  EXPECT_EQ(lo, 5);
  EXPECT_EQ(hi, 9);
  // Mean inter-arrival 1/50 s: 2000 arrivals span ~40 s (5 sigma of an exponential sum ~ 4.5 s).
  EXPECT_NEAR(last, 40.0, 4.5);
  cfg.rate_per_s = 0;
  for (const auto& r : generate_requests(cfg, 7)) EXPECT_EQ(r.arrival_s, 0.0);
  EXPECT_NE(generate_requests(cfg, 8)[0].prompt, a[0].prompt);
}

TEST(Trace, ShippedExampleTracesParse) {
  const auto dir = std::filesystem::path(source_dir()) / "inputs/traces";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".csv") continue;
    const std::string text = deck::read_text_file(e.path().string());
    const auto reqs = parse_trace(e.path().string(), text, 256, 128, 8, 1);
    EXPECT_GT(reqs.size(), 0U) << e.path();
    ++files;
  }
  EXPECT_GE(files, 1);
}

// predict_service (atlas simulate's request stream): FIFO through the Prefill slots, a request's
// first token at the end of the slot that runs its last chunk, by hand for 3 requests of 2 chunks.
TEST(ServicePrediction, FifoThroughThePrefillSlots) {
  Config cfg;
  cfg.bubbletea.requests = 3;
  cfg.bubbletea.rate_per_s = 0;  // all arrive at t = 0
  cfg.bubbletea.prompt_tokens_min = 20;
  cfg.bubbletea.prompt_tokens_max = 20;
  cfg.bubbletea.chunk_tokens = 16;  // 2 chunks each
  cfg.bubbletea.context = 128;
  cfg.bubbletea.vocab = 256;
  cfg.bubbletea.max_new_tokens = 4;
  const topo::Layout layout({1}, 1, 1);
  sched::ScheduleTable t;
  t.pp = t.dp = t.tp = 1;
  t.stage_dc = {0};
  t.step_ms = 10.0;
  auto slot = [](sched::SlotKind k, double start, double dur) {
    sched::Slot s;
    s.kind = k;
    s.start_ms = start;
    s.duration_ms = dur;
    s.tokens = k == sched::SlotKind::Prefill ? 16 : 0;
    return s;
  };
  t.rows = {{slot(sched::SlotKind::Prefill, 0, 1), slot(sched::SlotKind::Forward, 1, 4),
             slot(sched::SlotKind::Prefill, 5, 1), slot(sched::SlotKind::Backward, 6, 4)}};
  const ServicePrediction all = predict_service(cfg, layout, t, 3);
  EXPECT_EQ(all.arrived, 3);
  EXPECT_EQ(all.served, 3);
  EXPECT_DOUBLE_EQ(all.tokens_per_s, 60 / 0.030);
  EXPECT_DOUBLE_EQ(all.ttft_p50_ms, 16.0);  // TTFTs 6, 16, 26 ms
  EXPECT_DOUBLE_EQ(all.ttft_p99_ms, 26.0);
  const ServicePrediction two = predict_service(cfg, layout, t, 2);
  EXPECT_EQ(two.arrived, 3);
  EXPECT_EQ(two.served, 2);
  // From a trace: a request that arrives after a slot's start waits for the next slot.
  const auto trace = std::filesystem::temp_directory_path() / ("atlas_service_" + std::to_string(::getpid()) + ".csv");
  {
    std::ofstream f(trace);
    f << "arrival_s,prompt,max_new_tokens\n0.0,10,4\n0.0012,10,4\n";
  }
  cfg.bubbletea.trace = trace.string();
  const ServicePrediction late = predict_service(cfg, layout, t, 1);
  std::filesystem::remove(trace);
  EXPECT_EQ(late.served, 2);
  EXPECT_DOUBLE_EQ(late.ttft_p50_ms, 6.0 - 1.2);  // TTFTs 1 (slot [0, 1]) and 4.8 (slot [5, 6])
  EXPECT_DOUBLE_EQ(late.ttft_p99_ms, 6.0 - 1.2);
}

TEST(Placement, PrefillSlotsFillOnlyTheBubbles) {
  sched::CostModel c;
  c.pp = 2;
  c.dp = 1;
  c.tp = 1;
  c.dc_count = 1;
  c.stage_dc = {0, 0};
  c.fwd_ms = {1.0, 1.0};
  c.bwd_ms = {2.0, 2.0};
  c.allreduce_ms = {0.0, 0.0};
  c.optimizer_ms = {0.1, 0.1};
  c.act_bytes = 1000;
  c.links = {sched::LinkCost{}};
  sched::ScheduleOptions opt;
  opt.kind = ScheduleKind::GPipe;
  opt.micro_batches = 4;
  const sched::ScheduleTable t = sched::build_schedule(c, opt);
  sched::PrefillPlan plan;
  plan.chunk_ms = {0.7, 0.7};
  plan.chunk_tokens = 16;
  plan.guard_ms = 0.1;
  const sched::ScheduleTable p = sched::place_prefill(t, plan);
  EXPECT_EQ(p.structure_hash() == t.structure_hash(), false);  // Prefill slots are structure
  EXPECT_DOUBLE_EQ(p.step_ms, t.step_ms);
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    // Training slots identical and in the same order.
    std::vector<sched::Slot> train_a, train_b;
    for (const auto& s : t.rows[r])
      if (s.kind != sched::SlotKind::Idle) train_a.push_back(s);
    for (const auto& s : p.rows[r])
      if (s.kind != sched::SlotKind::Idle && s.kind != sched::SlotKind::Prefill) train_b.push_back(s);
    ASSERT_EQ(train_a.size(), train_b.size());
    for (std::size_t i = 0; i < train_a.size(); ++i) {
      EXPECT_EQ(train_a[i].kind, train_b[i].kind);
      EXPECT_DOUBLE_EQ(train_a[i].start_ms, train_b[i].start_ms);
    }
    // Every Prefill slot lies inside one of the original bubbles, guard respected.
    int prefills = 0;
    for (const auto& s : p.rows[r]) {
      if (s.kind != sched::SlotKind::Prefill) continue;
      ++prefills;
      EXPECT_DOUBLE_EQ(s.duration_ms, 0.7);
      EXPECT_EQ(s.tokens, 16);
      bool inside = false;
      for (const auto& b : t.rows[r])
        if (b.kind == sched::SlotKind::Idle && s.start_ms >= b.start_ms - 1e-9 && s.end_ms() + 0.1 <= b.end_ms() + 1e-9)
          inside = true;
      EXPECT_TRUE(inside) << "row " << r << " prefill at " << s.start_ms;
    }
    // GPipe, 2 stages, 4 micro-batches: each row has ~3 ms of bubbles -> several chunks.
    EXPECT_GE(prefills, 2) << "row " << r;
    EXPECT_LT(p.bubble_fraction(static_cast<int>(r), 0), t.bubble_fraction(static_cast<int>(r), 0));
  }
  // Demand-limited: one chunk per row per step at most.
  plan.max_tokens_per_row = 16;
  const sched::ScheduleTable q = sched::place_prefill(t, plan);
  for (const auto& row : q.rows)
    EXPECT_EQ(std::count_if(row.begin(), row.end(), [](const auto& s) { return s.kind == sched::SlotKind::Prefill; }), 1);
  // The Gantt chart draws them.
  EXPECT_NE(sched::gantt(p, {"east"}, 60).find('~'), std::string::npos);
}

}  // namespace
}  // namespace atlas::bubbletea
