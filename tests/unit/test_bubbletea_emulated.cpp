// SPDX-License-Identifier: MIT
// BubbleTea's cheap parts for device.backend = emulated and long queues: WaitQueue decides as
// the scan of the queue did (same request, on recorded queues), the emulated inference model
// allocates nothing and keeps the chunks' order, and the emulated decode clock.
#include "atlas/bubbletea/wait_queue.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "atlas/bubbletea/cost.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/core/error.hpp"
#include "atlas/device/host_backend.hpp"

namespace atlas::bubbletea {
namespace {

struct Req {
  int first = 0, prompt = 0;
};

/// The admission scan WaitQueue replaces (service_admission.cpp before it): in arrival order,
/// stop at the first request the memory cannot hold, skip one whose first chunk does not fit.
int scan(const std::deque<int>& waiting, const std::vector<Req>& reqs, std::uint64_t reserved, std::uint64_t budget,
         std::uint64_t per_token, double remaining_ms, const PrefillCost& cost) {
  for (int slot : waiting) {
    const Req& r = reqs[static_cast<std::size_t>(slot)];
    if (reserved + per_token * static_cast<std::uint64_t>(r.prompt) > budget) return -1;
    if (cost.predict_ms(r.first, 0) > remaining_ms) continue;
    return slot;
  }
  return -1;
}

TEST(WaitQueue, DecidesAsTheScanDidOnRecordedQueues) {
  // Prompts of 1..96 tokens, chunks of 16: first chunks of 1..16 tokens; the cost model's shape
  // (non-negative coefficients); memory for a few prompts at a time.
  PrefillCost cost;
  cost.fixed_ms = 0.3;
  cost.per_token_ms = 0.05;
  cost.per_pair_ms = 0.001;
  cost.scale = 1.3;
  const std::uint64_t per_token = 1000, budget = 200'000;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const int n = 500;
    std::vector<Req> reqs(n);
    for (auto& r : reqs) {
      r.prompt = std::uniform_int_distribution<int>(1, 96)(rng);
      r.first = std::min(16, r.prompt);
    }
    WaitQueue q(n);
    std::deque<int> ref;
    std::uint64_t reserved = 0;
    std::deque<std::pair<int, std::uint64_t>> running;
    int next = 0, admitted = 0;
    for (int step = 0; step < 3000; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 9)(rng);
      if (op < 3 && next < n) {  // arrivals
        q.push(next, reqs[static_cast<std::size_t>(next)].first, reqs[static_cast<std::size_t>(next)].prompt);
        ref.push_back(next++);
      } else if (op < 5 && !running.empty()) {  // a release frees its reservation
        reserved -= running.front().second;
        running.pop_front();
      } else {  // a decision in a bubble with this much left
        const double remaining = std::uniform_real_distribution<double>(0.0, 1.6)(rng);
        const long long max_prompt = static_cast<long long>((budget - reserved) / per_token);
        const int got = q.pick(max_prompt, [&](int t) { return cost.predict_ms(t, 0) <= remaining; });
        ASSERT_EQ(got, scan(ref, reqs, reserved, budget, per_token, remaining, cost))
            << "seed " << seed << " step " << step << " queue " << ref.size();
        if (got >= 0) {
          q.erase(got);
          ref.erase(std::find(ref.begin(), ref.end(), got));
          const std::uint64_t need = per_token * static_cast<std::uint64_t>(reqs[static_cast<std::size_t>(got)].prompt);
          reserved += need;
          running.emplace_back(got, need);
          ++admitted;
        }
      }
      ASSERT_EQ(q.size(), ref.size());
    }
    EXPECT_GT(admitted, 50) << "seed " << seed;  // the recorded queues exercise admission
  }
}

TEST(WaitQueue, MemoryStopsAtTheFirstThatDoesNotFitEvenWhenItsChunkDoesNot) {
  WaitQueue q(4);
  EXPECT_EQ(q.pick(100, [](int) { return true; }), -1);  // empty
  q.push(0, 16, 80);  // too long for the memory, and its chunk too big for the bubble
  q.push(1, 4, 4);
  q.push(2, 8, 8);
  auto fits_upto = [](int m) { return [m](int t) { return t <= m; }; };
  EXPECT_EQ(q.pick(100, fits_upto(8)), 1);  // slot 0 skipped (chunk), memory fine
  EXPECT_EQ(q.pick(50, fits_upto(8)), -1);  // slot 0 blocks by memory, first come first served
  q.erase(0);
  EXPECT_EQ(q.pick(50, fits_upto(8)), 1);
  EXPECT_EQ(q.pick(50, fits_upto(2)), -1);
  EXPECT_EQ(q.size(), 2U);
  EXPECT_THROW(q.erase(0), Error);     // not waiting
  EXPECT_THROW(q.push(1, 4, 4), Error);  // already waiting
  EXPECT_THROW(q.push(4, 4, 4), Error);  // outside
}

TEST(EmulatedInferenceModel, AllocatesNothingAndKeepsTheChunksInOrder) {
  std::unique_ptr<device::Backend> be = device::make_host_backend(1);
  const InferShape sh{8, 4096, 32, 512, 50304};  // a 1.6 B-parameter model: would be 6.4 GB of weights
  InferenceModel m(sh, split_layers(sh.layers, 2, 1), *be, 64, /*emulated=*/true);
  EXPECT_TRUE(m.emulated());
  EXPECT_EQ(m.scratch_bytes(), 0U);
  // The weights it stands for: 4 blocks of 12 C^2 + 13 C floats, ln_f and the tied head.
  const std::size_t c = 4096;
  EXPECT_EQ(m.weight_bytes(), (4 * (12 * c * c + 13 * c) + 2 * c + 50304 * c) * sizeof(float));
  m.init_random(7, 0.02);  // nothing to fill
  KvCache cache = m.make_cache(100);
  EXPECT_TRUE(cache.k.empty());
  EXPECT_EQ(cache.bytes(), m.kv_bytes_per_token() * 100);
  std::vector<float> act(64 * c, 1.0F), logits(50304, 5.0F);
  m.forward_begin(cache, 64, nullptr, act.data());
  m.skip_block(64, 0);
  EXPECT_THROW(m.skip_block(64, 0), Error);  // out of order
  m.forward_block(cache, 64, 1);  // no arithmetic either
  m.skip_block(64, 2);
  m.skip_block(64, 3);
  m.forward_end(cache, 64, nullptr, logits.data());
  EXPECT_EQ(cache.len, 64);
  EXPECT_EQ(InferenceModel::argmax(logits), 0);  // no arithmetic: every logit 0
  EXPECT_THROW(m.forward_begin(cache, 64, nullptr, act.data()), Error);  // past the cache's 100 positions
  EXPECT_THROW(m.set_param("ln_f.weight", std::vector<float>(c)), Error);
}

TEST(EmulatedDecoder, DecodesOneRequestAfterAnotherAtTheEstimatedTokenTime) {
  PrefillCost whole;
  whole.fixed_ms = 1.0;  // the head
  whole.per_token_ms = 2.0;
  whole.per_pair_ms = 0.01;
  EmulatedDecoder d(whole);
  // 4 tokens in all: 3 decode steps at positions 10, 11, 12 (one token each).
  const double step10 = 1.0 + 2.0 + 0.01 * 11, step11 = 1.0 + 2.0 + 0.01 * 12, step12 = 1.0 + 2.0 + 0.01 * 13;
  const auto a = d.submit(1.0, 10, 4);
  EXPECT_DOUBLE_EQ(a.wait_s, 0.0);
  EXPECT_DOUBLE_EQ(a.decode_s, (step10 + step11 + step12) * 1e-3);
  const auto b = d.submit(1.002, 10, 1);  // only the first token: nothing to decode, but it waits its turn
  EXPECT_DOUBLE_EQ(b.decode_s, 0.0);
  EXPECT_NEAR(b.wait_s, 1.0 + a.decode_s - 1.002, 1e-12);
  const auto c2 = d.submit(5.0, 10, 2);  // the server is free again
  EXPECT_DOUBLE_EQ(c2.wait_s, 0.0);
  EXPECT_DOUBLE_EQ(c2.decode_s, step10 * 1e-3);
}

}  // namespace
}  // namespace atlas::bubbletea
