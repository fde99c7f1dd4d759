// SPDX-License-Identifier: MIT
// BubbleTea's inference model: the same initialisation as the training model (tensor by tensor),
// attention over the KV cache against the training model's loss, pipeline-split prefill and the
// KV handoff bitwise equal to the standalone model, chunked against whole-prompt prefill, the
// cost model, generate_with's sliding window and stop token (atlas sample), and the error paths
// (prompt beyond the context, a layer split without blocks).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "atlas/bubbletea/cost.hpp"
#include "atlas/bubbletea/model.hpp"
#include "atlas/bubbletea/wire.hpp"
#include "atlas/core/error.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::bubbletea {
namespace {

InferShape small_shape() { return InferShape{4, 16, 4, 48, 37}; }

std::vector<std::int32_t> ids(int n, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  const std::uint64_t key = model::rng::key(seed, "prompt");
  for (int i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(model::rng::bits(key, static_cast<std::uint64_t>(i)) % vocab);
  return out;
}

std::vector<float> host_of(device::Backend& be, const device::Buffer& b, std::size_t floats) {
  std::vector<float> v(floats);
  be.download(v.data(), b.data(), floats * sizeof(float));
  return v;
}

class InferModel : public ::testing::Test {
 protected:
  std::unique_ptr<device::Backend> be = device::make_host_backend(1);
  static constexpr std::uint64_t kSeed = 99;
  std::unique_ptr<InferenceModel> whole(int max_chunk) {
    const InferShape sh = small_shape();
    auto m = std::make_unique<InferenceModel>(sh, LayerRange{0, sh.layers, true, true}, *be, max_chunk);
    m->init_random(kSeed, 0.02);
    return m;
  }
};

TEST(InferSplit, LayersAreContiguousAndCoverTheModel) {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    int next = 0;
    for (int i = 0; i < ranks; ++i) {
      const LayerRange r = split_layers(7, ranks, i);
      EXPECT_EQ(r.first, next);
      EXPECT_GE(r.count, 7 / ranks);
      EXPECT_LE(r.count, 7 / ranks + 1);
      EXPECT_EQ(r.has_embedding, i == 0);
      EXPECT_EQ(r.has_head, i == ranks - 1);
      next += r.count;
    }
    EXPECT_EQ(next, 7);
  }
  try {
    (void)split_layers(2, 4, 0);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("bubbletea.layers = 2 is fewer than the 4 ranks"));
  }
}

// bubbletea.pipeline: every rank's place follows world rank order inside its pipeline (what the
// runtime's communicator split gives), and requests are dealt DC by DC.
void expect_places_in_rank_order(InferPipeline mode, const topo::Layout& layout) {
  std::map<int, std::vector<int>> members;  // pipeline -> world ranks, ascending
  for (int r = 0; r < layout.world_size(); ++r) members[pipeline_place(mode, layout, r).pipeline].push_back(r);
  for (const auto& [pipe, ranks] : members)
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const PipelinePlace p = pipeline_place(mode, layout, ranks[i]);
      EXPECT_EQ(p.index, static_cast<int>(i)) << "rank " << ranks[i];
      EXPECT_EQ(p.size, static_cast<int>(ranks.size())) << "rank " << ranks[i];
      EXPECT_EQ(p.dc, layout.coord(ranks[i]).dc) << "rank " << ranks[i];
    }
}

TEST(InferSplit, PipelinesPerReplicaOrPerDcFollowRankOrder) {
  ParallelCfg pc;
  pc.stages_per_dc = {2, 1};
  pc.dp_size = 2;
  pc.tp_size = 2;
  const topo::Layout layout(12, pc);
  // Replica: (stage 0, dp 1, tp 1) is the second rank of DC 0's replica-1 pipeline of 2 stages x 2.
  const PipelinePlace a = pipeline_place(InferPipeline::Replica, layout, layout.world_rank(0, 1, 1));
  EXPECT_EQ(a.pipeline, 1);
  EXPECT_EQ(a.index, 1);
  EXPECT_EQ(a.size, 4);
  const PipelinePlace b = pipeline_place(InferPipeline::Replica, layout, layout.world_rank(1, 1, 0));
  EXPECT_EQ(b.index, 2);
  const PipelinePlace c = pipeline_place(InferPipeline::Replica, layout, layout.world_rank(2, 0, 1));
  EXPECT_EQ(c.pipeline, 2);  // DC 1 x dp 2 + replica 0
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.size, 2);
  // Dc: the DC's ranks in rank order.
  const PipelinePlace d = pipeline_place(InferPipeline::Dc, layout, layout.world_rank(1, 0, 1));
  EXPECT_EQ(d.pipeline, 0);
  EXPECT_EQ(d.index, 5);
  EXPECT_EQ(d.size, 8);
  for (const auto mode : {InferPipeline::Replica, InferPipeline::Dc}) expect_places_in_rank_order(mode, layout);
  // Dealt DC by DC: DC 0's first pipeline, DC 1's first, then the second ones.
  std::vector<int> order;
  for (const auto& p : serving_pipelines(InferPipeline::Replica, layout)) order.push_back(p.pipeline);
  EXPECT_EQ(order, (std::vector<int>{0, 2, 1, 3}));
  order.clear();
  for (const auto& p : serving_pipelines(InferPipeline::Dc, layout)) order.push_back(p.pipeline);
  EXPECT_EQ(order, (std::vector<int>{0, 1}));

  // dp_across_dcs: every DC holds whole pipelines (2 stages) of its own replicas (2 of 4).
  ParallelCfg across;
  across.stages_per_dc = {2, 2};
  across.dp_size = 4;
  across.dp_across_dcs = true;
  const topo::Layout al(8, across);
  for (const auto mode : {InferPipeline::Replica, InferPipeline::Dc}) expect_places_in_rank_order(mode, al);
  order.clear();
  for (const auto& p : serving_pipelines(InferPipeline::Replica, al)) order.push_back(p.pipeline);
  EXPECT_EQ(order, (std::vector<int>{0, 6, 1, 7}));  // DC 0: replicas 0, 1; DC 1: replicas 2, 3
  // A DC that holds no stage serves nothing.
  ParallelCfg idle_dc;
  idle_dc.stages_per_dc = {0, 2};
  const topo::Layout il(2, idle_dc);
  const auto serving = serving_pipelines(InferPipeline::Dc, il);
  ASSERT_EQ(serving.size(), 1U);
  EXPECT_EQ(serving[0].dc, 1);
}

TEST(InferSplit, ChunkSizesDependOnlyOnThePrompt) {
  EXPECT_EQ(chunk_sizes(10, 0), std::vector<int>({10}));
  EXPECT_EQ(chunk_sizes(10, 4), std::vector<int>({4, 4, 2}));
  EXPECT_EQ(chunk_sizes(8, 4), std::vector<int>({4, 4}));
  EXPECT_EQ(chunk_sizes(3, 4), std::vector<int>({3}));
}

// The inference model draws exactly the training model's initial tensors (same names, same
// values), so a checkpoint of one loads into the other.
TEST_F(InferModel, RandomInitMatchesTheTrainingModel) {
  const InferShape sh = small_shape();
  ModelCfg mc;
  mc.layers = sh.layers;
  mc.hidden = sh.hidden;
  mc.heads = sh.heads;
  mc.seq_len = sh.context;
  mc.vocab = sh.vocab;
  mc.init_std = 0.02;
  model::StageModel train(mc, 1, model::StageSpec{}, *be, nullptr, kSeed);
  auto inf = whole(8);
  int compared = 0;
  for (const auto& p : inf->params()) {
    model::ParamTensor* t = train.find_param(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    ASSERT_EQ(t->full_shape, p.shape) << p.name;
    const auto n = static_cast<std::size_t>(t->shard_numel());
    EXPECT_EQ(host_of(*be, t->value, n), host_of(*be, p.value, n)) << p.name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 + 12 * sh.layers + 2);
}

// Token-by-token decoding over the KV cache gives the logits whose cross-entropy is the training
// model's loss on the same sequence (its attention is the backend's fused causal kernel).
TEST_F(InferModel, CachedAttentionAgreesWithTheTrainingForward) {
  const InferShape sh = small_shape();
  ModelCfg mc;
  mc.layers = sh.layers;
  mc.hidden = sh.hidden;
  mc.heads = sh.heads;
  mc.seq_len = 12;
  mc.vocab = sh.vocab;
  mc.init_std = 0.2;  // large weights: attention patterns far from uniform
  model::StageModel train(mc, 1, model::StageSpec{}, *be, nullptr, kSeed);
  InferenceModel inf(sh, LayerRange{0, sh.layers, true, true}, *be, 8);
  inf.init_random(kSeed, 0.2);
  const auto seq = ids(13, sh.vocab, 5);
  std::vector<std::int32_t> tokens(seq.begin(), seq.begin() + 12), targets(seq.begin() + 1, seq.end());
  train.forward(0, tokens.data(), targets.data(), nullptr, nullptr);
  const double expect = train.micro_loss(0);

  // One token at a time over the cache: the logits of every position.
  KvCache cache = inf.make_cache(12);
  std::vector<float> logits(static_cast<std::size_t>(sh.vocab));
  double loss = 0;
  for (int t = 0; t < 12; ++t) {
    inf.forward(cache, 1, &tokens[static_cast<std::size_t>(t)], nullptr, nullptr, logits.data());
    double mx = -1e30, sum = 0;
    for (float v : logits) mx = std::max(mx, static_cast<double>(v));
    for (float v : logits) sum += std::exp(v - mx);
    loss += -(logits[static_cast<std::size_t>(targets[static_cast<std::size_t>(t)])] - mx - std::log(sum));
  }
  loss /= 12;
  EXPECT_NEAR(loss, expect, 1e-5 * std::fabs(expect));
  EXPECT_EQ(cache.len, 12);
}

// Chunked prefill (positions [pos, pos + n) attending to the cache) equals one whole-prompt pass
// to rounding, and gives the same tokens.
TEST_F(InferModel, ChunkedPrefillMatchesWholePrompt) {
  auto m = whole(30);
  const auto prompt = ids(30, small_shape().vocab, 11);
  KvCache a = m->make_cache(30), b = m->make_cache(30);
  std::vector<float> la(37), lb(37);
  m->forward(a, 30, prompt.data(), nullptr, nullptr, la.data());
  for (int pos = 0; pos < 30; pos += 7) {
    const int n = std::min(7, 30 - pos);
    m->forward(b, n, prompt.data() + pos, nullptr, nullptr, pos + n == 30 ? lb.data() : nullptr);
  }
  double worst = 0;
  for (std::size_t i = 0; i < la.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(la[i] - lb[i])));
  EXPECT_LT(worst, 1e-5);
  for (std::size_t l = 0; l < a.k.size(); ++l) {
    const auto ka = host_of(*be, a.k[l], 30 * 16), kb = host_of(*be, b.k[l], 30 * 16);
    for (std::size_t i = 0; i < ka.size(); ++i) ASSERT_NEAR(ka[i], kb[i], 1e-5) << "layer " << l << " elem " << i;
  }
  EXPECT_EQ(generate(*m, prompt, 0, 10), generate(*m, prompt, 7, 10));
}

// generate_with (atlas sample): greedy through it is generate()'s greedy; past the context the
// window slides (the last context / 2 tokens prefilled from position 0: the logits there are a
// fresh forward of those tokens); the stop token ends it and is returned; bad prompts are errors.
TEST_F(InferModel, GenerateWithSlidesTheWindowAndStops) {
  const int context = small_shape().context;  // 48
  auto m = whole(context);
  const auto prompt = ids(10, small_shape().vocab, 5);
  std::vector<std::vector<float>> seen;
  std::vector<std::int32_t> emitted;
  const auto greedy = [&](std::span<const float> l, int) {
    seen.emplace_back(l.begin(), l.end());
    return InferenceModel::argmax(l);
  };
  const auto emit = [&](std::int32_t t) { emitted.push_back(t); };
  GenerateOptions go;
  go.max_new = 30;  // 10 + 30 fit the context: no slide
  const auto out = generate_with(*m, prompt, go, greedy, emit);
  EXPECT_EQ(out, generate(*m, prompt, 0, 30));
  EXPECT_EQ(emitted, out);

  // 10 + 60 tokens: predicting token j of the sequence uses seq[w, j), w = 0 up to j = 48, then
  // w = j - 24 at j = 49 (the slide) until j - w passes 48 again.
  seen.clear();
  emitted.clear();
  go.max_new = 60;
  const auto longer = generate_with(*m, prompt, go, greedy, emit);
  ASSERT_EQ(longer.size(), 60U);
  std::vector<std::int32_t> seq(prompt);
  seq.insert(seq.end(), longer.begin(), longer.end());
  int w = 0, slides = 0;
  for (int j = 10; j < 70; ++j) {
    if (j - w > context) {
      w = j - context / 2;
      ++slides;
    }
    KvCache c = m->make_cache(context);
    std::vector<float> ref(static_cast<std::size_t>(small_shape().vocab));
    m->forward(c, j - w, seq.data() + w, nullptr, nullptr, ref.data());
    const auto& got = seen[static_cast<std::size_t>(j - 10)];
    for (std::size_t v = 0; v < ref.size(); ++v) ASSERT_NEAR(got[v], ref[v], 1e-5) << "token " << j << " id " << v;
  }
  EXPECT_EQ(slides, 1);

  // The stop token: chosen third, emitted, returned, nothing after it.
  emitted.clear();
  go.max_new = 20;
  go.stop_token = 3;
  const auto stopped = generate_with(
      *m, prompt, go, [](std::span<const float>, int i) { return i == 2 ? 3 : 1; }, emit);
  EXPECT_EQ(stopped, (std::vector<std::int32_t>{1, 1, 3}));
  EXPECT_EQ(emitted, stopped);

  // An empty prompt, one beyond the context, an id outside the vocabulary: each its own message.
  const std::vector<std::pair<std::vector<std::int32_t>, std::string>> bad = {
      {{}, "a prompt of 0 tokens: it must hold 1 to 48 tokens"},
      {std::vector<std::int32_t>(49, 1), "a prompt of 49 tokens: it must hold 1 to 48 tokens"},
      {{1, 37}, "prompt token 37 at position 1 is outside the inference vocabulary [0, 37)"}};
  for (const auto& [prompt_ids, message] : bad) {
    try {
      (void)generate_with(*m, prompt_ids, go, greedy, emit);
      FAIL() << "expected an error for " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::Config);
      EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
    }
  }
}

// forward() in pieces (BubbleTea stops a chunk between blocks when training's data comes):
// begin, the blocks one by one, end give bitwise forward()'s logits and KV; the pieces out of
// order are internal errors, not silent garbage.
TEST_F(InferModel, AChunkRunInPiecesIsBitwiseTheWholeForward) {
  auto m = whole(8);
  const auto prompt = ids(16, small_shape().vocab, 5);
  KvCache a = m->make_cache(16), b = m->make_cache(16);
  std::vector<float> la(37), lb(37);
  for (int pos = 0; pos < 16; pos += 8) {
    m->forward(a, 8, prompt.data() + pos, nullptr, nullptr, pos == 8 ? la.data() : nullptr);
    m->forward_begin(b, 8, prompt.data() + pos, nullptr);
    for (int l = 0; l < small_shape().layers; ++l) m->forward_block(b, 8, l);
    EXPECT_EQ(b.len, pos) << "the cache grows when the chunk ends, not before";
    m->forward_end(b, 8, nullptr, pos == 8 ? lb.data() : nullptr);
  }
  EXPECT_EQ(la, lb);  // bitwise
  ASSERT_EQ(b.len, 16);
  for (std::size_t l = 0; l < a.k.size(); ++l) {
    EXPECT_EQ(host_of(*be, a.k[l], 16 * 16), host_of(*be, b.k[l], 16 * 16)) << "layer " << l;
    EXPECT_EQ(host_of(*be, a.v[l], 16 * 16), host_of(*be, b.v[l], 16 * 16)) << "layer " << l;
  }
  KvCache c = m->make_cache(16);
  m->forward_begin(c, 8, prompt.data(), nullptr);
  EXPECT_THROW(m->forward_block(c, 8, 1), Error) << "block 1 before block 0";
  m->forward_block(c, 8, 0);
  EXPECT_THROW(m->forward_end(c, 8, nullptr, lb.data()), Error) << "ended after 1 of 4 blocks";
}

// The pipeline split (three ranks' layer ranges chained, activations through host buffers as
// MPI would carry them) then the KV handoff through the wire format and a whole-model decode:
// bitwise the standalone generation.
TEST_F(InferModel, SplitPrefillAndKvHandoffAreBitwiseStandalone) {
  const InferShape sh = small_shape();
  const int chunk = 6;
  const auto prompt = ids(17, sh.vocab, 3);
  auto ref_model = whole(chunk);
  const std::vector<std::int32_t> expect = generate(*ref_model, prompt, chunk, 9);

  std::vector<std::unique_ptr<InferenceModel>> stages;
  std::vector<KvCache> caches;
  for (int i = 0; i < 3; ++i) {
    stages.push_back(std::make_unique<InferenceModel>(sh, split_layers(sh.layers, 3, i), *be, chunk));
    stages.back()->init_random(kSeed, 0.02);
    caches.push_back(stages.back()->make_cache(17));
  }
  std::vector<float> a(chunk * 16), b(chunk * 16), logits(37);
  int pos = 0;
  for (int n : chunk_sizes(17, chunk)) {
    const bool last = pos + n == 17;
    stages[0]->forward(caches[0], n, prompt.data() + pos, nullptr, a.data(), nullptr);
    stages[1]->forward(caches[1], n, nullptr, a.data(), b.data(), nullptr);
    stages[2]->forward(caches[2], n, nullptr, b.data(), nullptr, last ? logits.data() : nullptr);
    pos += n;
  }
  const std::int32_t first = InferenceModel::argmax(logits);

  // Handoff: each stage's part through encode/decode, assembled into a whole-model cache.
  auto decoder = whole(1);
  KvCache full = decoder->make_cache(17 + 9);
  for (int i = 0; i < 3; ++i) {
    const std::vector<char> bytes = wire::encode_kv(42, *stages[static_cast<std::size_t>(i)], caches[static_cast<std::size_t>(i)]);
    const wire::KvPart part = wire::decode_kv(bytes);
    EXPECT_EQ(part.request, 42);
    EXPECT_EQ(part.len, 17);
    const float* src = part.data.data();
    for (int l = 0; l < part.layers; ++l) {
      be->upload(full.k[static_cast<std::size_t>(part.first_layer + l)].data(), src, 17 * 16 * 4);
      src += 17 * 16;
      be->upload(full.v[static_cast<std::size_t>(part.first_layer + l)].data(), src, 17 * 16 * 4);
      src += 17 * 16;
    }
  }
  full.len = 17;
  // The standalone cache, for a bitwise comparison of the handed-off keys and values.
  KvCache ref = ref_model->make_cache(17);
  pos = 0;
  for (int n : chunk_sizes(17, chunk)) {
    ref_model->forward(ref, n, prompt.data() + pos, nullptr, nullptr, nullptr);
    pos += n;
  }
  for (std::size_t l = 0; l < ref.k.size(); ++l) {
    EXPECT_EQ(host_of(*be, ref.k[l], 17 * 16), host_of(*be, full.k[l], 17 * 16)) << "K of layer " << l;
    EXPECT_EQ(host_of(*be, ref.v[l], 17 * 16), host_of(*be, full.v[l], 17 * 16)) << "V of layer " << l;
  }
  EXPECT_EQ(decode_greedy(*decoder, full, first, 9), expect);
  EXPECT_EQ(expect.size(), 9U);
}

TEST_F(InferModel, ErrorsNameTheLimit) {
  auto m = whole(8);
  const auto prompt = ids(45, small_shape().vocab, 1);
  try {
    (void)generate(*m, prompt, 8, 8);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("does not fit bubbletea.context = 48"));
  }
  KvCache c = m->make_cache(4);
  std::vector<std::int32_t> five(5, 1);
  EXPECT_THROW(m->forward(c, 5, five.data(), nullptr, nullptr, nullptr), Error);
  std::vector<std::int32_t> bad{1, 99};
  try {
    m->forward(c, 2, bad.data(), nullptr, nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("outside the inference vocabulary [0, 37)"));
  }
  EXPECT_THROW((void)m->make_cache(49), Error);
  EXPECT_THROW(InferenceModel(InferShape{2, 10, 4, 16, 8}, LayerRange{0, 2, true, true}, *be, 4), ConfigError);
}

TEST_F(InferModel, MemoryFiguresAreExact) {
  const InferShape sh = small_shape();
  auto m = whole(8);
  const std::size_t c = 16, v = 37, t = 48;
  const std::size_t block = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + 4 * c * c + 4 * c + 4 * c * c + c;
  EXPECT_EQ(m->weight_bytes(), 4 * (v * c + t * c + sh.layers * block + 2 * c));
  EXPECT_EQ(m->kv_bytes_per_token(), 2 * 4 * c * 4);
  EXPECT_EQ(m->make_cache(10).bytes(), 10 * m->kv_bytes_per_token());
}

TEST_F(InferModel, CalibratedCostPredictsTheChunks) {
  auto m = whole(32);
  PrefillCost cost = calibrate(*m, 3);
  EXPECT_GT(cost.per_token_ms + cost.fixed_ms, 0.0);
  EXPECT_GE(cost.scale, 1.0);
  EXPECT_GT(cost.predict_ms(32, 0), cost.predict_ms(1, 0));
  // Online correction: the 90th percentile of the last 32 actual/raw ratios, once 8 were seen.
  const double before = cost.scale;
  for (int i = 0; i < 7; ++i) cost.observe(32, 0, 2.0 * cost.raw_ms(32, 0));
  EXPECT_EQ(cost.scale, before);  // too few chunks yet
  cost.observe(32, 0, 2.0 * cost.raw_ms(32, 0));
  EXPECT_NEAR(cost.scale, 2.0, 1e-12);
  // One preempted chunk (50x) among 32 does not move the 90th percentile.
  for (int i = 0; i < 30; ++i) cost.observe(16, 0, 1.5 * cost.raw_ms(16, 0));
  cost.observe(16, 0, 50.0 * cost.raw_ms(16, 0));
  EXPECT_NEAR(cost.scale, 1.5, 1e-12);
  // A machine that got slower for good is followed.
  for (int i = 0; i < 32; ++i) cost.observe(8, 3, 3.0 * cost.raw_ms(8, 3));
  EXPECT_NEAR(cost.scale, 3.0, 1e-12);
  // The emulated compute time stays the calibrated one whatever the online scale learned.
  EXPECT_NEAR(cost.emulated_ms(8, 3), cost.raw_ms(8, 3) * before, 1e-12);
}

TEST(PrefillCostOnline, OneSlowChunkAmongTheFirstEightDoesNotSetTheScale) {
  // With 8-19 chunks the 90th percentile would be the largest ratio: one preempted chunk (a
  // 44.7 ms chunk predicted at 11.4 ms, issue found in review) would price every chunk out.
  PrefillCost cost;
  cost.per_token_ms = 0.1;
  for (int i = 0; i < 7; ++i) cost.observe(16, 0, 1.1 * cost.raw_ms(16, 0));
  cost.observe(16, 0, 4.0 * cost.raw_ms(16, 0));
  EXPECT_NEAR(cost.scale, 1.1, 1e-12);
  cost.observe(16, 0, 4.0 * cost.raw_ms(16, 0));  // a second one: the machine may be slower now
  EXPECT_NEAR(cost.scale, 4.0, 1e-12);
}

TEST(PrefillCostOnline, BubblesWhereNothingFitStepTheScaleBack) {
  PrefillCost cost;
  cost.per_token_ms = 0.1;
  cost.scale = cost.calibrated_scale = 1.2;
  for (int i = 0; i < 10; ++i) cost.observe(16, 0, 5.0 * cost.raw_ms(16, 0));  // a slow burst
  ASSERT_NEAR(cost.scale, 5.0, 1e-12);
  for (int i = 0; i < PrefillCost::kStarvedBubbles - 1; ++i) cost.nothing_fit();
  EXPECT_NEAR(cost.scale, 5.0, 1e-12) << "not before kStarvedBubbles bubbles in a row";
  cost.nothing_fit();
  EXPECT_NEAR(cost.scale, 4.0, 1e-12);
  // The window forgot the ratios above the new scale: the next ordinary chunk keeps it there.
  cost.observe(16, 0, 1.3 * cost.raw_ms(16, 0));
  EXPECT_NEAR(cost.scale, 4.0, 1e-12);
  // A chunk that ran resets the count; many starved bubbles never go below the calibration.
  for (int i = 0; i < PrefillCost::kStarvedBubbles - 1; ++i) cost.nothing_fit();
  EXPECT_NEAR(cost.scale, 4.0, 1e-12);
  for (int i = 0; i < 100 * PrefillCost::kStarvedBubbles; ++i) cost.nothing_fit();
  EXPECT_NEAR(cost.scale, 1.2, 1e-12);
}

TEST(PrefillCostEmulated, SleepOvershootDoesNotRunAway) {
  // device.backend = emulated sleeps emulated_ms per chunk; each sleep overshoots by a fixed
  // wake-up delay. The scale settles at (sleep + overshoot) / raw. Sleeping predict_ms instead
  // (before the fix) compounded the overshoot every few chunks up to the clamp (100).
  PrefillCost cost;
  cost.per_token_ms = 0.05;
  cost.scale = cost.calibrated_scale = 1.2;
  const double overshoot_ms = 0.1;
  for (int i = 0; i < 2000; ++i) cost.observe(16, 0, cost.emulated_ms(16, 0) + overshoot_ms);
  EXPECT_NEAR(cost.scale, 1.2 + overshoot_ms / cost.raw_ms(16, 0), 1e-9);
  PrefillCost old = cost;
  old.scale = 1.2;
  for (int i = 0; i < 2000; ++i) old.observe(16, 0, old.predict_ms(16, 0) + overshoot_ms);
  EXPECT_GT(old.scale, 10.0);  // what following predict_ms did
}

}  // namespace
}  // namespace atlas::bubbletea
