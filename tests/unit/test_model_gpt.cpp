// SPDX-License-Identifier: MIT
// StageModel: the whole tiny model's parameter gradient against finite differences, pipeline-split
// equivalence (stages chained in-process, micro-batches interleaved, tied embedding summed) with
// the single-stage model, layout-independent initialisation, the weight-decay rule by parameter
// name, and the error paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "atlas/core/error.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"
#include "test_model_util.hpp"

namespace atlas::model {
namespace {

using device::Buffer;
using testutil::download;
using testutil::hyperslab;
using testutil::max_rel_diff;
using testutil::upload;

ModelCfg tiny_cfg() {
  ModelCfg cfg;
  cfg.layers = 3;
  cfg.hidden = 8;
  cfg.heads = 2;
  cfg.seq_len = 4;
  cfg.vocab = 11;
  cfg.init_std = 0.02;
  return cfg;
}

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> ids(n);
  const std::uint64_t key = rng::key(seed, "ids");
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>(rng::bits(key, i) % vocab);
  return ids;
}

// A TP group that exists only so shards can be constructed without MPI; any all-reduce fails.
class ConstructOnlyGroup final : public device::Collective {
 public:
  ConstructOnlyGroup(int rank, int size) : m_rank(rank), m_size(size) {}
  void allreduce_sum(device::Buffer&, std::size_t) override {
    FAIL() << "ConstructOnlyGroup cannot all-reduce";
  }
  [[nodiscard]] int size() const override { return m_size; }
  [[nodiscard]] int rank() const override { return m_rank; }

 private:
  int m_rank, m_size;
};

class Gpt : public ::testing::Test {
 protected:
  std::unique_ptr<device::Backend> be = device::make_host_backend(2);
  static constexpr int kBatch = 2;
  static constexpr std::uint64_t kSeed = 1234;
};

TEST_F(Gpt, InitialLossIsNearLogVocabAndInitFollowsTheRules) {
  ModelCfg cfg = tiny_cfg();
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.seq_len = 64;  // 128 tokens: a loss average that is not dominated by a few samples
  StageModel model(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  const std::size_t n = model.tokens_per_micro();
  const auto tok = random_ids(n, cfg.vocab, 1), tgt = random_ids(n, cfg.vocab, 2);
  model.forward(0, tok.data(), tgt.data(), nullptr, nullptr);
  // Near-uniform predictions. Not exactly ln V: with the tied head the input token's own logit
  // is about |wte row|^2 / rms(x) = C * std^2 / (sqrt(2) std) = 0.9 above the others.
  EXPECT_GT(model.micro_loss(0), std::log(cfg.vocab) - 0.05);
  EXPECT_LT(model.micro_loss(0), std::log(cfg.vocab - 1 + std::exp(0.9)) + 0.1);
  model.release(0);

  auto stats = [&](const char* name) {
    const auto v = download(*be, model.find_param(name)->value);
    double sum = 0.0, sq = 0.0;
    for (float x : v) {
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    const double mean = sum / static_cast<double>(v.size());
    return std::pair{mean, std::sqrt(sq / static_cast<double>(v.size()) - mean * mean)};
  };
  const auto [qkv_mean, qkv_std] = stats("h.1.attn.qkv.weight");
  EXPECT_NEAR(qkv_mean, 0.0, 0.001);
  EXPECT_NEAR(qkv_std, cfg.init_std, 0.05 * cfg.init_std);
  const auto [proj_mean, proj_std] = stats("h.0.mlp.proj.weight");
  EXPECT_NEAR(proj_std, cfg.init_std / std::sqrt(2.0 * cfg.layers), 0.05 * cfg.init_std);
  for (const char* ones : {"h.0.ln_1.weight", "ln_f.weight"}) {
    for (float x : download(*be, model.find_param(ones)->value)) ASSERT_EQ(x, 1.0F) << ones;
  }
  for (const char* zeros : {"h.0.attn.qkv.bias", "h.1.mlp.fc.bias", "ln_f.bias"}) {
    for (float x : download(*be, model.find_param(zeros)->value)) ASSERT_EQ(x, 0.0F) << zeros;
  }
  // 12 tensors per block + wte, wpe, ln_f.{weight,bias}; parameter count matches the config
  EXPECT_EQ(model.params().size(), 12U * 2 + 4);
  EXPECT_EQ(model.local_parameter_count(), cfg.parameter_count());
}

TEST_F(Gpt, WholeModelGradientMatchesFiniteDifferences) {
  ModelCfg cfg = tiny_cfg();
  cfg.init_std = 0.3;  // larger weights: gradients well above fp32 finite-difference noise
  StageModel model(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  const std::size_t n = model.tokens_per_micro();
  const auto tok = random_ids(n, cfg.vocab, 3), tgt = random_ids(n, cfg.vocab, 4);
  model.zero_grad();
  model.forward(0, tok.data(), tgt.data(), nullptr, nullptr);
  model.backward(0, nullptr, nullptr);
  EXPECT_EQ(model.activation_bytes(), 0U);

  int micro = 1;
  auto loss = [&] {
    model.forward(micro, tok.data(), tgt.data(), nullptr, nullptr);
    const double l = model.micro_loss(micro);
    model.release(micro);
    ++micro;
    return l;
  };
  constexpr float kEps = 5e-3F;
  int checked = 0;
  for (ParamTensor& p : model.params()) {
    auto values = download(*be, p.value);
    const auto grad = download(*be, p.grad);
    const std::uint64_t key = rng::key(7, p.name);
    for (int s = 0; s < 3; ++s) {
      const std::size_t i = rng::bits(key, static_cast<std::uint64_t>(s)) % values.size();
      const float saved = values[i];
      values[i] = saved + kEps;
      be->upload(p.value.data(), values.data(), values.size() * sizeof(float));
      const double up = loss();
      values[i] = saved - kEps;
      be->upload(p.value.data(), values.data(), values.size() * sizeof(float));
      const double down = loss();
      values[i] = saved;
      be->upload(p.value.data(), values.data(), values.size() * sizeof(float));
      const double fd = (up - down) / (2.0 * kEps);
      EXPECT_NEAR(grad[i], fd, 2e-4 + 2e-2 * std::abs(fd)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(model.params().size()));
}

// Runs micro-batches 0..2 through a chain of stages and returns the stages (grads accumulated).
struct Chain {
  std::vector<std::unique_ptr<StageModel>> stages;
  std::vector<double> losses;
};

Chain run_pipeline(device::Backend& be, const ModelCfg& cfg, int pp, int batch,
                   const std::vector<std::vector<std::int32_t>>& tok,
                   const std::vector<std::vector<std::int32_t>>& tgt) {
  Chain chain;
  for (int s = 0; s < pp; ++s) {
    chain.stages.push_back(std::make_unique<StageModel>(cfg, batch, StageSpec{s, pp, 0, 1}, be,
                                                        nullptr, 1234));
    chain.stages.back()->set_loss_scale(1.0F / 3.0F);
    chain.stages.back()->zero_grad();
  }
  const int micros = static_cast<int>(tok.size());
  const std::size_t boundary = chain.stages[0]->boundary_floats();
  // act[s][m]: output of stage s for micro m; grad[s][m]: dL/d input of stage s+1
  std::vector<std::vector<Buffer>> act(static_cast<std::size_t>(pp)), grad(act.size());
  for (int s = 0; s < pp; ++s) {
    for (int m = 0; m < micros; ++m) {
      act[static_cast<std::size_t>(s)].push_back(be.alloc_floats(boundary));
      grad[static_cast<std::size_t>(s)].push_back(be.alloc_floats(boundary));
    }
  }
  auto at = [](std::vector<std::vector<Buffer>>& v, int s, int m) -> Buffer* {
    return s < 0 ? nullptr : &v[static_cast<std::size_t>(s)][static_cast<std::size_t>(m)];
  };
  // GPipe across the chain: all forwards (all micro-batches in flight), then all backwards.
  for (int m = 0; m < micros; ++m) {
    for (int s = 0; s < pp; ++s) {
      const bool last = s == pp - 1;
      chain.stages[static_cast<std::size_t>(s)]->forward(
          m, s == 0 ? tok[static_cast<std::size_t>(m)].data() : nullptr,
          last ? tgt[static_cast<std::size_t>(m)].data() : nullptr, at(act, s - 1, m),
          last ? nullptr : at(act, s, m));
    }
  }
  EXPECT_EQ(chain.stages[0]->activation_bytes(),
            3 * chain.stages[0]->activation_bytes_per_micro());
  for (int m = 0; m < micros; ++m) {
    for (int s = pp - 1; s >= 0; --s) {
      chain.stages[static_cast<std::size_t>(s)]->backward(
          m, s == pp - 1 ? nullptr : at(grad, s, m), at(grad, s - 1, m));
    }
    chain.losses.push_back(chain.stages.back()->micro_loss(m));
  }
  return chain;
}

TEST_F(Gpt, PipelineSplitEqualsSingleStageModel) {
  const ModelCfg cfg = tiny_cfg();
  std::vector<std::vector<std::int32_t>> tok, tgt;
  for (int m = 0; m < 3; ++m) {
    tok.push_back(random_ids(kBatch * 4, cfg.vocab, 10 + static_cast<std::uint64_t>(m)));
    tgt.push_back(random_ids(kBatch * 4, cfg.vocab, 20 + static_cast<std::uint64_t>(m)));
  }
  // Reference: one stage, 1F1B order (F0 F1 B0 F2 B1 B2), several micro-batches in flight.
  StageModel ref(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  ref.set_loss_scale(1.0F / 3.0F);
  ref.zero_grad();
  ref.forward(0, tok[0].data(), tgt[0].data(), nullptr, nullptr);
  ref.forward(1, tok[1].data(), tgt[1].data(), nullptr, nullptr);
  ref.backward(0, nullptr, nullptr);
  ref.forward(2, tok[2].data(), tgt[2].data(), nullptr, nullptr);
  ref.backward(1, nullptr, nullptr);
  ref.backward(2, nullptr, nullptr);
  EXPECT_EQ(ref.tied_embedding(), nullptr);

  for (const std::vector<int>& split : {std::vector<int>{}, std::vector<int>{2, 1},
                                        std::vector<int>{1, 0, 2}}) {
    ModelCfg pcfg = cfg;
    pcfg.layers_per_stage = split;
    const int pp = split.empty() ? 3 : static_cast<int>(split.size());
    SCOPED_TRACE("pp = " + std::to_string(pp) + (split.empty() ? " even" : " uneven"));
    Chain chain = run_pipeline(*be, pcfg, pp, kBatch, tok, tgt);
    for (int m = 0; m < 3; ++m) {
      EXPECT_NEAR(chain.losses[static_cast<std::size_t>(m)], ref.micro_loss(m),
                  1e-5 * ref.micro_loss(m));
    }
    StageModel& first = *chain.stages.front();
    StageModel& last = *chain.stages.back();
    ASSERT_NE(first.tied_embedding(), nullptr);
    ASSERT_NE(last.tied_embedding(), nullptr);
    EXPECT_TRUE(last.tied_embedding()->tied_copy);
    EXPECT_FALSE(last.tied_embedding()->counts_in_norm);
    EXPECT_FALSE(first.tied_embedding()->tied_copy);
    if (pp == 3) {
      EXPECT_EQ(chain.stages[1]->tied_embedding(), nullptr);
    }

    // The tied-embedding rule, as the runtime applies it: sum the two copies' gradients.
    auto tied = download(*be, first.tied_embedding()->grad);
    const auto head = download(*be, last.tied_embedding()->grad);
    for (std::size_t i = 0; i < tied.size(); ++i) tied[i] += head[i];
    be->upload(first.tied_embedding()->grad.data(), tied.data(), tied.size() * sizeof(float));
    be->upload(last.tied_embedding()->grad.data(), tied.data(), tied.size() * sizeof(float));

    std::size_t seen = 0;
    double norm = 0.0;
    for (auto& stage : chain.stages) {
      norm += stage->local_grad_sq_norm();
      for (ParamTensor& p : stage->params()) {
        const ParamTensor* r = ref.find_param(p.name);
        ASSERT_NE(r, nullptr) << p.name;
        EXPECT_EQ(download(*be, p.value), download(*be, r->value)) << "init of " << p.name;
        const double rel = max_rel_diff(download(*be, p.grad), download(*be, r->grad));
        EXPECT_LE(rel, 1e-5) << "gradient of " << p.name;
        if (!p.tied_copy) ++seen;
      }
    }
    EXPECT_EQ(seen, ref.params().size()) << "every tensor is held exactly once (plus the copy)";
    EXPECT_NEAR(norm, ref.local_grad_sq_norm(), 1e-5 * ref.local_grad_sq_norm());
  }
}

TEST_F(Gpt, TensorParallelShardsInitialiseTheirSliceOfTheFullTensor) {
  ModelCfg cfg = tiny_cfg();
  cfg.heads = 4;
  StageModel full(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  for (int tp_size : {2, 4}) {
    for (int tp_rank = 0; tp_rank < tp_size; ++tp_rank) {
      ConstructOnlyGroup group(tp_rank, tp_size);
      StageModel shard(cfg, kBatch, StageSpec{1, 3, tp_rank, tp_size}, *be, &group, kSeed);
      EXPECT_EQ(shard.params().size(), 12U);  // the middle stage holds block 1 only
      for (const ParamTensor& p : shard.params()) {
        const ParamTensor* r = full.find_param(p.name);
        ASSERT_NE(r, nullptr) << p.name;
        EXPECT_EQ(download(*be, p.value), hyperslab(download(*be, r->value), p))
            << p.name << " tp " << tp_rank << "/" << tp_size;
        EXPECT_EQ(p.counts_in_norm, !p.replicated_over_tp || tp_rank == 0) << p.name;
        EXPECT_EQ(p.full_shape, r->full_shape);
      }
      const ParamTensor* qkv = shard.find_param("h.1.attn.qkv.weight");
      EXPECT_EQ(qkv->shard_dim(), 1);
      EXPECT_EQ(qkv->shard_offset, (std::vector<std::int64_t>{0, 8 / tp_size * tp_rank, 0}));
      EXPECT_EQ(shard.find_param("h.1.mlp.fc.weight")->shard_dim(), 0);
      EXPECT_EQ(shard.find_param("h.1.mlp.proj.weight")->shard_dim(), 1);
      EXPECT_TRUE(shard.find_param("h.1.mlp.proj.bias")->replicated_over_tp);
    }
  }
}

TEST_F(Gpt, WeightDecayAppliesToEveryWeightMatrixAndEmbeddingAndToNoBiasOrLayerNorm) {
  ModelCfg cfg = tiny_cfg();
  cfg.heads = 4;
  // GPT-2 practice, by name: the decayed ones, every other parameter exempt.
  auto decayed = [](const std::string& name) {
    for (const char* leaf : {"attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"}) {
      if (name.ends_with(leaf) && name.starts_with("h.")) return true;
    }
    return name == "wte" || name == "wpe";
  };
  // The whole model, and every stage of pp 3 x tp 2 (the tied LM-head copy of wte on the last).
  std::vector<std::unique_ptr<StageModel>> models;
  std::vector<std::unique_ptr<ConstructOnlyGroup>> groups;
  models.push_back(std::make_unique<StageModel>(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed));
  for (int stage = 0; stage < 3; ++stage) {
    for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
      groups.push_back(std::make_unique<ConstructOnlyGroup>(tp_rank, 2));
      models.push_back(std::make_unique<StageModel>(cfg, kBatch, StageSpec{stage, 3, tp_rank, 2},
                                                    *be, groups.back().get(), kSeed));
    }
  }
  int decayed_seen = 0, exempt_seen = 0;
  for (const auto& m : models) {
    for (const ParamTensor& p : m->params()) {
      EXPECT_EQ(p.decay, decayed(p.name)) << p.name << " (shape rank " << p.full_shape.size() << ")";
      EXPECT_EQ(decays_by_role(p.name), p.decay) << p.name;
      (p.decay ? decayed_seen : exempt_seen) += 1;
    }
  }
  // Per model 4 of the 12 tensors of each of the 3 blocks + wte, wpe decay; 8 + ln_f's 2 do not.
  // The whole model, then both TP ranks' stages (each with a tied wte copy on the last stage).
  EXPECT_EQ(decayed_seen, 3 * (4 * 3 + 2) + 2);
  EXPECT_EQ(exempt_seen, 3 * (8 * 3 + 2));
  // The one the shape rule got wrong: a bias of two dimensions.
  const ParamTensor* qkv_bias = models.front()->find_param("h.0.attn.qkv.bias");
  EXPECT_EQ(qkv_bias->full_shape, (std::vector<std::int64_t>{3, cfg.hidden}));
  EXPECT_FALSE(qkv_bias->decay);
  EXPECT_THROW((void)decays_by_role("h.0.attn.rope.table"), Error);

  // Through AdamW: with zero gradients only the decay moves a value, w -= lr * wd * w.
  StageModel& model = *models.front();
  model.zero_grad();
  for (ParamTensor& p : model.params()) {
    p.value = upload(*be, std::vector<float>(static_cast<std::size_t>(p.shard_numel()), 1.0F));
  }
  TrainCfg train;
  train.weight_decay = 0.1;
  AdamW opt(train);
  opt.step(model.params(), *be, /*lr=*/0.5, /*grad_scale=*/1.0);
  for (const ParamTensor& p : model.params()) {
    const float want = p.decay ? 1.0F - 0.5F * 0.1F : 1.0F;
    for (float x : download(*be, p.value)) ASSERT_FLOAT_EQ(x, want) << p.name;
  }
}

TEST_F(Gpt, BadShapesAreConfigErrorsListingEveryProblem) {
  ModelCfg cfg = tiny_cfg();
  cfg.hidden = 10;
  cfg.heads = 3;
  ConstructOnlyGroup group(0, 2);
  try {
    StageModel bad(cfg, kBatch, StageSpec{0, 2, 0, 2}, *be, &group, kSeed);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("model.hidden = 10 is not divisible by model.heads = 3"));
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("model.heads = 3 is not divisible by parallel.tp_size = 2"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("model.layers = 3 does not split evenly over 2"));
    EXPECT_EQ(e.problems().size(), 3U);
  }
  cfg = tiny_cfg();
  try {
    StageModel bad(cfg, kBatch, StageSpec{0, 1, 0, 2}, *be, nullptr, kSeed);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("no TP collective"));
  }
}

TEST_F(Gpt, OnlyTheChunkThatRunsTheHeadHoldsTheHeadsActivations) {
  // Last of 2 stages with 2 model chunks (4 layers, one per chunk): chunk 0's arena has no head
  // slots (lnf, its statistics, the logits, the losses), chunk 1's has them, once per pass.
  ModelCfg cfg = tiny_cfg();
  cfg.layers = 4;
  StageSpec spec{1, 2, 0, 1};
  spec.chunks = 2;
  StageModel model(cfg, kBatch, spec, *be, nullptr, kSeed);
  const std::size_t n = model.tokens_per_micro();
  auto r16 = [](std::size_t x) { return (x + 15) / 16 * 16; };  // slots are 64-byte aligned
  const std::size_t head =
      (r16(n * static_cast<std::size_t>(cfg.hidden)) + 3 * r16(n) + r16(n * static_cast<std::size_t>(cfg.vocab))) *
      sizeof(float);
  Buffer act_in = be->alloc_floats(model.boundary_floats());
  Buffer act_out = be->alloc_floats(model.boundary_floats());
  be->fill(act_in.f32(), 0.5F, model.boundary_floats());
  const auto tgt = random_ids(n, cfg.vocab, 6);
  model.set_loss_scale(1.0F);
  model.forward(0, nullptr, nullptr, &act_in, &act_out, 0);
  EXPECT_EQ(model.activation_bytes(), model.activation_bytes_per_micro() - head);
  model.forward(0, nullptr, tgt.data(), &act_in, nullptr, 1);
  EXPECT_EQ(model.activation_bytes(), 2 * model.activation_bytes_per_micro() - head);
  EXPECT_TRUE(std::isfinite(model.micro_loss(0)));
}

TEST_F(Gpt, ScheduleMistakesAndBadTokensAreReported) {
  const ModelCfg cfg = tiny_cfg();
  StageModel model(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  const std::size_t n = model.tokens_per_micro();
  auto tok = random_ids(n, cfg.vocab, 5);
  const auto tgt = random_ids(n, cfg.vocab, 6);
  model.forward(4, tok.data(), tgt.data(), nullptr, nullptr);
  EXPECT_EQ(model.micros_in_flight(), std::vector<int>{4});
  EXPECT_EQ(model.activation_bytes(), model.activation_bytes_per_micro());
  try {
    model.forward(4, tok.data(), tgt.data(), nullptr, nullptr);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("forward of micro-batch 4 while"));
  }
  try {
    model.backward(5, nullptr, nullptr);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("backward of micro-batch 5 without its forward"));
  }
  tok[3] = 11;
  try {
    model.forward(6, tok.data(), tgt.data(), nullptr, nullptr);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Config);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("tokens[3] = 11 of micro-batch 6 is outside the "
                                               "vocabulary [0, 11)"));
  }
  EXPECT_EQ(model.micros_in_flight(), std::vector<int>{4}) << "a rejected forward holds nothing";
  model.backward(4, nullptr, nullptr);
  EXPECT_TRUE(model.micros_in_flight().empty());
  EXPECT_THROW((void)model.micro_loss(9), Error);
  StageModel middle(cfg, kBatch, StageSpec{1, 3, 0, 1}, *be, nullptr, kSeed);
  Buffer small = be->alloc_floats(3);
  EXPECT_THROW(middle.forward(0, nullptr, nullptr, &small, &small), Error);
  EXPECT_THROW((void)middle.micro_loss(0), Error);
}


// The last stage keeps each micro-batch's per-token losses on the device and fetches them when a
// loss is first asked for (one wait for the device per step, not per micro-batch): the losses are
// those of asking right after each forward, bitwise, past the first buffer's 8 rows, an id
// forwarded again gives its new loss, and zero_grad drops what was never asked for.
TEST_F(Gpt, LossesFetchedTogetherEqualThoseFetchedOneByOne) {
  const ModelCfg cfg = tiny_cfg();
  const int micros = 19;
  std::vector<std::vector<std::int32_t>> tok, tgt;
  for (int m = 0; m < micros; ++m) {
    tok.push_back(random_ids(kBatch * 4, cfg.vocab, 40 + static_cast<std::uint64_t>(m)));
    tgt.push_back(random_ids(kBatch * 4, cfg.vocab, 70 + static_cast<std::uint64_t>(m)));
  }
  StageModel one(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  StageModel all(cfg, kBatch, StageSpec{}, *be, nullptr, kSeed);
  std::vector<double> each;
  for (int m = 0; m < micros; ++m) {
    one.forward(m, tok[static_cast<std::size_t>(m)].data(), tgt[static_cast<std::size_t>(m)].data(), nullptr, nullptr);
    each.push_back(one.micro_loss(m));
    one.release(m);
  }
  for (int m = 0; m < micros; ++m) {
    all.forward(m, tok[static_cast<std::size_t>(m)].data(), tgt[static_cast<std::size_t>(m)].data(), nullptr, nullptr);
    all.release(m);
  }
  for (int m = 0; m < micros; ++m) EXPECT_EQ(all.micro_loss(m), each[static_cast<std::size_t>(m)]) << "micro " << m;
  // Micro-batch 3 again, with micro-batch 5's data: its loss is the new one.
  all.forward(3, tok[5].data(), tgt[5].data(), nullptr, nullptr);
  all.release(3);
  EXPECT_EQ(all.micro_loss(3), each[5]);
  // Forwarded, never asked for, then zero_grad: gone, not taken for a later step's.
  all.forward(7, tok[0].data(), tgt[0].data(), nullptr, nullptr);
  all.release(7);
  all.zero_grad();
  EXPECT_THROW((void)all.micro_loss(7), Error);
}

}  // namespace
}  // namespace atlas::model
