// SPDX-License-Identifier: MIT
// bf16 storage of saved activations (docs/precision.md, "Storage"; #22 item 1): at bf16 the
// tensors backward reads only as GEMM operands (ln1, qkv, ln2, gelu, ln_f) are stored as bf16,
// and training is bitwise the same as with every activation fp32 (StageSpec::fp32_activations,
// the code path of before), one stage and a 2-stage chain; fp32 and tf32 store nothing as bf16;
// the arena shrinks by the hand-computed amount. The GEMM entry point that reads a bf16 operand
// equals the fp32 one. Label unit: about a second.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "atlas/device/host_backend.hpp"
#include "atlas/device/rounding.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::model {
namespace {

constexpr int kBatch = 4;
constexpr int kSteps = 25;

ModelCfg tiny_model() {
  ModelCfg cfg;
  cfg.layers = 2;
  cfg.hidden = 32;
  cfg.heads = 2;
  cfg.seq_len = 16;
  cfg.vocab = 64;
  cfg.init_std = 0.02;
  return cfg;
}

TrainCfg tiny_train() {
  TrainCfg train;
  train.micro_batch_size = kBatch;
  train.micro_batches = 1;
  train.lr = 3e-3;
  train.min_lr = 3e-4;
  train.warmup_steps = 5;
  train.weight_decay = 0.1;
  train.grad_clip = 1.0;
  return train;
}

std::vector<std::int32_t> tokens(std::size_t n, int vocab) {
  std::vector<std::int32_t> t(n);
  const std::uint64_t key = rng::key(5, "bf16-storage");
  t[0] = 1;
  for (std::size_t i = 1; i < n; ++i) {
    const double u = rng::uniform(key, i);
    t[i] = u < 0.8 ? (7 * t[i - 1] + 1) % vocab : static_cast<int>(u * 991) % vocab;
  }
  return t;
}

std::vector<float> host_copy(device::Backend& be, const device::Buffer& b) {
  std::vector<float> out(b.floats());
  be.download(out.data(), b.data(), b.bytes());
  return out;
}

struct TrainResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // final values
};

/// kSteps of AdamW training of one stage (pp 1), two micro-batches a step (both in flight at
/// once, as 1F1B's warm-up holds them).
TrainResult train_one_stage(Precision precision, bool fp32_activations) {
  const ModelCfg cfg = tiny_model();
  const TrainCfg train = tiny_train();
  auto be = device::make_host_backend(1, precision);
  StageSpec spec;
  spec.fp32_activations = fp32_activations;
  StageModel model(cfg, kBatch, spec, *be, nullptr, 99);
  EXPECT_EQ(model.stores_bf16_activations(), precision == Precision::Bf16 && !fp32_activations);
  model.set_loss_scale(0.5F);
  AdamW opt(train);
  const std::size_t n = model.tokens_per_micro();
  const std::vector<std::int32_t> stream = tokens(2 * n * kSteps + 1, cfg.vocab);
  TrainResult run;
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    const std::int32_t* tok = stream.data() + 2 * static_cast<std::size_t>(step) * n;
    model.forward(0, tok, tok + 1, nullptr, nullptr);
    model.forward(1, tok + n, tok + n + 1, nullptr, nullptr);
    model.backward(0, nullptr, nullptr);
    model.backward(1, nullptr, nullptr);
    run.losses.push_back(model.micro_loss(0) + model.micro_loss(1));
    const double norm = std::sqrt(model.local_grad_sq_norm());
    opt.step(model.params(), *be, lr_at(step, train, kSteps), clip_scale(norm, train.grad_clip));
  }
  for (const ParamTensor& p : model.params()) run.params[p.name] = host_copy(*be, p.value);
  return run;
}

TEST(Bf16Storage, TrainingIsBitwiseTheSameAsWithFp32Activations) {
  const TrainResult ref = train_one_stage(Precision::Bf16, true);
  const TrainResult b16 = train_one_stage(Precision::Bf16, false);
  ASSERT_EQ(ref.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the model must learn";
  for (int s = 0; s < kSteps; ++s) {
    // bitwise: EXPECT_EQ on doubles compares exactly
    EXPECT_EQ(b16.losses[static_cast<std::size_t>(s)], ref.losses[static_cast<std::size_t>(s)]) << "step " << s;
  }
  ASSERT_EQ(b16.params.size(), ref.params.size());
  for (const auto& [name, values] : ref.params) {
    const std::vector<float>& got = b16.params.at(name);
    ASSERT_EQ(got.size(), values.size());
    EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size() * sizeof(float)), 0) << name;
  }
  // and it is a bf16 run: it differs from fp32 (else nothing was rounded)
  const TrainResult fp32 = train_one_stage(Precision::Fp32, false);
  EXPECT_NE(fp32.losses, ref.losses);
}

TEST(Bf16Storage, Fp32AndTf32RunsStoreNothingAsBf16) {
  const ModelCfg cfg = tiny_model();
  for (Precision p : {Precision::Fp32, Precision::Tf32}) {
    auto be = device::make_host_backend(1, p);
    StageModel model(cfg, kBatch, StageSpec{}, *be, nullptr, 1);
    EXPECT_FALSE(model.stores_bf16_activations()) << to_string(p);
    for (const StageModel::SavedTensor& t : model.saved_tensors())
      EXPECT_EQ(t.element_bytes, 4) << to_string(p) << " " << t.name;
  }
}

/// One step of a 2-stage chain (one block each): every gradient of both stages and the act_in
/// gradient are bitwise the same with bf16 and with fp32 storage.
std::vector<std::vector<float>> two_stage_grads(bool fp32_activations) {
  const ModelCfg cfg = tiny_model();
  auto be = device::make_host_backend(1, Precision::Bf16);
  StageSpec s0{0, 2, 0, 1};
  StageSpec s1{1, 2, 0, 1};
  s0.fp32_activations = s1.fp32_activations = fp32_activations;
  StageModel first(cfg, kBatch, s0, *be, nullptr, 7);
  StageModel last(cfg, kBatch, s1, *be, nullptr, 7);
  const std::size_t n = first.tokens_per_micro();
  const std::vector<std::int32_t> stream = tokens(n + 1, cfg.vocab);
  device::Buffer act = be->alloc_floats(first.boundary_floats());
  device::Buffer grad = be->alloc_floats(first.boundary_floats());
  first.zero_grad();
  last.zero_grad();
  first.forward(0, stream.data(), nullptr, nullptr, &act);
  last.forward(0, nullptr, stream.data() + 1, &act, nullptr);
  last.backward(0, nullptr, &grad);
  first.backward(0, &grad, nullptr);
  std::vector<std::vector<float>> out{host_copy(*be, grad)};
  for (StageModel* m : {&first, &last})
    for (const ParamTensor& p : m->params()) out.push_back(host_copy(*be, p.grad));
  return out;
}

TEST(Bf16Storage, TwoStageGradientsAreBitwiseTheSame) {
  const auto ref = two_stage_grads(true);
  const auto b16 = two_stage_grads(false);
  ASSERT_EQ(ref.size(), b16.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(ref[i].size(), b16[i].size());
    EXPECT_EQ(std::memcmp(ref[i].data(), b16[i].data(), ref[i].size() * sizeof(float)), 0) << "tensor " << i;
  }
}

TEST(Bf16Storage, ElementTypeOfEverySavedTensor) {
  const ModelCfg cfg = tiny_model();
  auto be = device::make_host_backend(1, Precision::Bf16);
  StageModel model(cfg, kBatch, StageSpec{}, *be, nullptr, 1);
  ASSERT_TRUE(model.stores_bf16_activations());
  // the GEMM-only tensors are bf16; what non-GEMM backward code reads stays fp32
  const std::map<std::string, int> expected{
      {"res", 4},   {"ln1", 2},  {"mean1", 4}, {"rstd1", 4},    {"qkv", 2},      {"att", 4},
      {"atty", 4},  {"x2", 4},   {"ln2", 2},   {"mean2", 4},    {"rstd2", 4},    {"fc", 4},
      {"gelu", 2},  {"lnf", 2},  {"lnf_mean", 4}, {"lnf_rstd", 4}, {"probs", 4}, {"losses", 4}};
  std::map<std::string, int> seen;
  for (const StageModel::SavedTensor& t : model.saved_tensors()) {
    ASSERT_TRUE(expected.count(t.name) == 1) << "unexpected saved tensor " << t.name;
    EXPECT_EQ(t.element_bytes, expected.at(t.name)) << t.name << " of layer " << t.layer;
    ++seen[t.name];
  }
  EXPECT_EQ(seen.size(), expected.size());
  EXPECT_EQ(seen["res"], cfg.layers + 1);
  EXPECT_EQ(seen["gelu"], cfg.layers);
}

TEST(Bf16Storage, ArenaShrinksByTheHandComputedBytes) {
  const ModelCfg cfg = tiny_model();
  // n = B*T = 64 tokens, C = 32: per block ln1 [n, C], qkv [n, 3C], ln2 [n, C], gelu [n, 4C]
  // go from 4 to 2 bytes, and ln_f [n, C] once (every slot is a multiple of 64 bytes here, so no
  // padding changes): 2 * (64 * 9 * 32) * 2 + 64 * 32 * 2 = 73728 + 4096 bytes.
  const std::size_t expected = 2 * (64 * 9 * 32) * 2 + 64 * 32 * 2;
  ASSERT_EQ(expected, 77824U);
  std::size_t per_micro[2] = {};
  std::size_t peak[2] = {};
  for (int fp32 = 0; fp32 < 2; ++fp32) {
    auto be = device::make_host_backend(1, Precision::Bf16);
    StageSpec spec;
    spec.fp32_activations = fp32 == 1;
    StageModel model(cfg, kBatch, spec, *be, nullptr, 3);
    const std::size_t n = model.tokens_per_micro();
    const std::vector<std::int32_t> stream = tokens(n + 1, cfg.vocab);
    model.forward(0, stream.data(), stream.data() + 1, nullptr, nullptr);
    model.forward(1, stream.data(), stream.data() + 1, nullptr, nullptr);
    EXPECT_EQ(model.activation_bytes(), 2 * model.activation_bytes_per_micro());
    per_micro[fp32] = model.activation_bytes_per_micro();
    peak[fp32] = be->buffer_peak_bytes();  // the backend's allocator: parameters, scratch, arenas
    std::size_t sum = 0;  // the saved tensors account for the arena (every slot here is aligned)
    for (const StageModel::SavedTensor& t : model.saved_tensors()) sum += t.elements * static_cast<std::size_t>(t.element_bytes);
    EXPECT_EQ(sum + 2 * n * sizeof(std::int32_t), per_micro[fp32]);
  }
  EXPECT_EQ(per_micro[1] - per_micro[0], expected);
  EXPECT_EQ(peak[1] - peak[0], 2 * expected) << "two micro-batches in flight";
  std::printf("bf16 storage: %zu -> %zu activation bytes per micro-batch (%.1f%% less)\n", per_micro[1],
              per_micro[0], 100.0 * static_cast<double>(expected) / static_cast<double>(per_micro[1]));
}

TEST(Bf16Storage, TheSavedTensorsAccountForTheArenaWithTheSplitBackward) {
  // The split backward's q/k/v gradient reserve (the qkv slot's other half at bf16 storage) is a
  // saved tensor too: the list summed to the arena less 6 n C bytes per layer without it.
  const ModelCfg cfg = tiny_model();
  for (int fp32 = 0; fp32 < 2; ++fp32) {
    auto be = device::make_host_backend(1, Precision::Bf16);
    StageSpec spec;
    spec.fp32_activations = fp32 == 1;
    spec.split_backward = true;
    StageModel model(cfg, kBatch, spec, *be, nullptr, 3);
    const std::size_t n = model.tokens_per_micro();
    std::size_t sum = 0;
    int reserves = 0;
    for (const StageModel::SavedTensor& t : model.saved_tensors()) {
      sum += t.elements * static_cast<std::size_t>(t.element_bytes);
      reserves += t.name == "qkv_grad" ? 1 : 0;
    }
    EXPECT_EQ(sum + 2 * n * sizeof(std::int32_t), model.activation_bytes_per_micro()) << "fp32 activations " << fp32;
    EXPECT_EQ(reserves, fp32 == 1 ? 0 : cfg.layers) << "bf16 storage only";
  }
}

TEST(Bf16Storage, GemmsWithABf16OperandEqualTheFp32Gemm) {
  for (Precision p : {Precision::Bf16, Precision::Fp32}) {
    auto be = device::make_host_backend(1, p);
    const int m = 5, n = 7, k = 9;
    std::vector<float> a(static_cast<std::size_t>(k) * m), b(static_cast<std::size_t>(k) * n);
    const std::uint64_t key = rng::key(3, "gemm");
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rng::normal(key, i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(rng::normal(key, 1000 + i));
    device::Buffer da = be->alloc_floats(a.size());
    device::Buffer db = be->alloc_floats(b.size());
    device::Buffer db16 = be->alloc(b.size() * sizeof(device::Bf16Bits));
    device::Buffer c1 = be->alloc_floats(static_cast<std::size_t>(m) * n);
    device::Buffer c2 = be->alloc_floats(static_cast<std::size_t>(m) * n);
    be->upload(da.data(), a.data(), a.size() * sizeof(float));
    // B holds bf16 values, so the fp32 gemm and the one on the stored bf16 copy see the same B
    for (float& x : b) x = device::round_to_bf16(x);
    be->upload(db.data(), b.data(), b.size() * sizeof(float));
    be->to_bf16(db16.bf16(), db.f32(), b.size());
    device::Buffer dw = be->alloc_floats(b.size());
    be->from_bf16(dw.f32(), db16.bf16(), b.size());
    EXPECT_EQ(host_copy(*be, dw), b) << "to_bf16 then from_bf16 of bf16 values is exact";
    // A transposed ([k, m] stored), B not ([k, n]): the shape of the weight gradient
    be->gemm(device::Trans::Yes, device::Trans::No, m, n, k, 1.0F, da.f32(), m, db.f32(), n, 0.0F, c1.f32(), n);
    be->gemm_bf16_b(device::Trans::Yes, device::Trans::No, m, n, k, 1.0F, da.f32(), m, db16.bf16(), n, 0.0F,
                    c2.f32(), n);
    const std::vector<float> r1 = host_copy(*be, c1);
    const std::vector<float> r2 = host_copy(*be, c2);
    EXPECT_EQ(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)), 0) << to_string(p);
    // the same with the bf16 operand on the left: C^T [n, m] = B^T A (gemm_bf16_a)
    device::Buffer c3 = be->alloc_floats(static_cast<std::size_t>(n) * m);
    device::Buffer c4 = be->alloc_floats(static_cast<std::size_t>(n) * m);
    be->gemm(device::Trans::Yes, device::Trans::No, n, m, k, 1.0F, db.f32(), n, da.f32(), m, 0.0F, c3.f32(), m);
    be->gemm_bf16_a(device::Trans::Yes, device::Trans::No, n, m, k, 1.0F, db16.bf16(), n, da.f32(), m, 0.0F,
                    c4.f32(), m);
    const std::vector<float> r3 = host_copy(*be, c3);
    const std::vector<float> r4 = host_copy(*be, c4);
    EXPECT_EQ(std::memcmp(r3.data(), r4.data(), r3.size() * sizeof(float)), 0) << "gemm_bf16_a " << to_string(p);
  }
}

}  // namespace
}  // namespace atlas::model
