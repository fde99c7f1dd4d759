// SPDX-License-Identifier: MIT
// bf16 storage of saved activations under tensor parallelism (docs/precision.md, "Storage"): at
// np = P every rank holds TP shard rank of a tp = P model (MpiCollective over MPI_COMM_WORLD) on
// a bf16 host backend; 20 AdamW steps with bf16-stored activations give bitwise the losses and
// parameter shards of the same run with every activation fp32 (StageSpec::fp32_activations).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "atlas/device/collective.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/model/optimizer.hpp"
#include "atlas/model/rng.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::model {
namespace {

constexpr int kBatch = 2;
constexpr int kSteps = 20;

struct TrainResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
};

TrainResult train(bool fp32_activations) {
  mpi::Comm world = mpi::Comm::world();
  ModelCfg cfg;
  cfg.layers = 2;
  cfg.hidden = 16;
  cfg.heads = 4;
  cfg.seq_len = 8;
  cfg.vocab = 32;
  cfg.init_std = 0.05;
  TrainCfg tc;
  tc.micro_batch_size = kBatch;
  tc.lr = 3e-3;
  tc.min_lr = 3e-4;
  tc.warmup_steps = 3;
  tc.weight_decay = 0.1;
  tc.grad_clip = 1.0;
  auto be = device::make_host_backend(1, Precision::Bf16);
  device::MpiCollective group(world);
  StageSpec spec{0, 1, world.rank(), world.size()};
  spec.fp32_activations = fp32_activations;
  StageModel model(cfg, kBatch, spec, *be, &group, 11);
  EXPECT_EQ(model.stores_bf16_activations(), !fp32_activations);
  AdamW opt(tc);
  const std::size_t n = model.tokens_per_micro();
  const std::uint64_t key = rng::key(21, "tp-bf16");
  TrainResult out;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::int32_t> tok(n + 1);
    for (std::size_t i = 0; i <= n; ++i)
      tok[i] = static_cast<std::int32_t>(rng::bits(key, static_cast<std::uint64_t>(step) * 1000 + i) % 8) * 3;
    model.zero_grad();
    model.forward(0, tok.data(), tok.data() + 1, nullptr, nullptr);
    model.backward(0, nullptr, nullptr);
    out.losses.push_back(model.micro_loss(0));
    const double norm = std::sqrt(world.allreduce(model.local_grad_sq_norm(), MPI_SUM));
    opt.step(model.params(), *be, lr_at(step, tc, kSteps), clip_scale(norm, tc.grad_clip));
  }
  for (const ParamTensor& p : model.params()) {
    std::vector<float> v(p.value.floats());
    be->download(v.data(), p.value.data(), p.value.bytes());
    out.params.push_back(std::move(v));
  }
  return out;
}

TEST(Bf16StorageTp, LossesAndShardsAreBitwiseTheSameAsWithFp32Activations) {
  const TrainResult ref = train(true);
  const TrainResult b16 = train(false);
  ASSERT_EQ(ref.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "the model must learn";
  EXPECT_EQ(b16.losses, ref.losses) << "bitwise, on tp rank " << mpi::Comm::world().rank();
  ASSERT_EQ(b16.params.size(), ref.params.size());
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_EQ(b16.params[i].size(), ref.params[i].size());
    EXPECT_EQ(std::memcmp(b16.params[i].data(), ref.params[i].data(), ref.params[i].size() * sizeof(float)), 0)
        << "parameter " << i;
  }
}

}  // namespace
}  // namespace atlas::model
