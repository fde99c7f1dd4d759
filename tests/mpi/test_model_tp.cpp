// SPDX-License-Identifier: MIT
// Tensor-parallel equivalence over MPI: at np = P every rank holds TP shard tp_rank = rank of a
// tp = P model (MpiCollective over MPI_COMM_WORLD) and an in-process tp = 1 reference of the same
// seed; after forward/backward of two micro-batches in flight the losses, every gradient shard
// and the global gradient norm must equal the reference's to 1e-5 (max-norm relative). Also runs
// tp = P x pp = 2 (both stages chained in-process on every rank, tied embedding summed).
#include <gtest/gtest.h>

#include <cmath>

#include "atlas/device/host_backend.hpp"
#include "atlas/device/collective.hpp"
#include "atlas/model/gpt.hpp"
#include "atlas/mpi/comm.hpp"
#include "unit/test_model_util.hpp"

namespace atlas::model {
namespace {

using device::Buffer;
using device::MpiCollective;
using testutil::download;
using testutil::hyperslab;
using testutil::max_rel_diff;

constexpr int kBatch = 2;
constexpr int kMicros = 2;
constexpr std::uint64_t kSeed = 77;

ModelCfg cfg() {
  ModelCfg c;
  c.layers = 2;
  c.hidden = 16;
  c.heads = 4;  // tp = 1, 2, 4
  c.seq_len = 5;
  c.vocab = 13;
  c.init_std = 0.1;
  return c;
}

std::vector<std::int32_t> ids(std::size_t n, std::uint64_t seed) {
  std::vector<std::int32_t> v(n);
  const std::uint64_t key = rng::key(seed, "ids");
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(rng::bits(key, i) % 13);
  return v;
}

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int m = 0; m < kMicros; ++m) {
      tok.push_back(ids(kBatch * 5, 100 + static_cast<std::uint64_t>(m)));
      tgt.push_back(ids(kBatch * 5, 200 + static_cast<std::uint64_t>(m)));
    }
    ref = std::make_unique<StageModel>(cfg(), kBatch, StageSpec{}, *be, nullptr, kSeed);
    ref->set_loss_scale(1.0F / kMicros);
    ref->zero_grad();
    ref->forward(0, tok[0].data(), tgt[0].data(), nullptr, nullptr);
    ref->forward(1, tok[1].data(), tgt[1].data(), nullptr, nullptr);
    ref->backward(0, nullptr, nullptr);
    ref->backward(1, nullptr, nullptr);
  }

  // Every shard's gradient equals the hyperslab of the reference gradient.
  void expect_grads_match(StageModel& shard) {
    for (ParamTensor& p : shard.params()) {
      const ParamTensor* r = ref->find_param(p.name);
      ASSERT_NE(r, nullptr) << p.name;
      EXPECT_EQ(download(*be, p.value), hyperslab(download(*be, r->value), p)) << p.name;
      const double rel = max_rel_diff(download(*be, p.grad), hyperslab(download(*be, r->grad), p));
      EXPECT_LE(rel, 1e-5) << p.name << " on tp rank " << world.rank();
    }
  }

  mpi::Comm world = mpi::Comm::world();
  std::unique_ptr<device::Backend> be = device::make_host_backend(1);
  std::vector<std::vector<std::int32_t>> tok, tgt;
  std::unique_ptr<StageModel> ref;
};

TEST_F(TensorParallel, MpiCollectiveSumsOverTheGroup) {
  MpiCollective group(world);
  EXPECT_EQ(group.size(), world.size());
  EXPECT_EQ(group.rank(), world.rank());
  Buffer b = be->alloc_floats(4);
  const std::vector<float> mine = {static_cast<float>(world.rank() + 1), 1.0F, 0.0F, 9.0F};
  be->upload(b.data(), mine.data(), 4 * sizeof(float));
  group.allreduce_sum(b, 3);  // the last element is not part of the reduction
  const auto sum = download(*be, b);
  const int p = world.size();
  EXPECT_EQ(sum[0], static_cast<float>(p * (p + 1) / 2));
  EXPECT_EQ(sum[1], static_cast<float>(p));
  EXPECT_EQ(sum[3], 9.0F);
}

TEST_F(TensorParallel, ShardedModelEqualsSingleRankModel) {
  MpiCollective group(world);
  const int tp = world.size();
  StageModel shard(cfg(), kBatch, StageSpec{0, 1, world.rank(), tp}, *be, &group, kSeed);
  shard.set_loss_scale(1.0F / kMicros);
  shard.zero_grad();
  shard.forward(0, tok[0].data(), tgt[0].data(), nullptr, nullptr);
  shard.forward(1, tok[1].data(), tgt[1].data(), nullptr, nullptr);
  shard.backward(0, nullptr, nullptr);
  shard.backward(1, nullptr, nullptr);
  for (int m = 0; m < kMicros; ++m) {
    EXPECT_NEAR(shard.micro_loss(m), ref->micro_loss(m), 1e-5 * ref->micro_loss(m));
  }
  expect_grads_match(shard);
  // Global norm: the TP group's sum of local squared norms counts every logical element once.
  const double global = world.allreduce(shard.local_grad_sq_norm(), MPI_SUM);
  EXPECT_NEAR(global, ref->local_grad_sq_norm(), 1e-5 * ref->local_grad_sq_norm());
  // wte, wpe, ln_f replicated; per block 6C replicated + (12C^2 + 7C) / tp sharded
  const std::int64_t c = 16;
  EXPECT_EQ(shard.local_parameter_count(),
            13 * c + 5 * c + 2 * c + 2 * (6 * c + (12 * c * c + 7 * c) / tp));
}

TEST_F(TensorParallel, ShardedPipelineEqualsSingleRankModel) {
  MpiCollective group(world);
  const int tp = world.size();
  StageModel s0(cfg(), kBatch, StageSpec{0, 2, world.rank(), tp}, *be, &group, kSeed);
  StageModel s1(cfg(), kBatch, StageSpec{1, 2, world.rank(), tp}, *be, &group, kSeed);
  std::vector<Buffer> act, grad;
  for (int m = 0; m < kMicros; ++m) {
    act.push_back(be->alloc_floats(s0.boundary_floats()));
    grad.push_back(be->alloc_floats(s0.boundary_floats()));
  }
  for (StageModel* s : {&s0, &s1}) {
    s->set_loss_scale(1.0F / kMicros);
    s->zero_grad();
  }
  for (int m = 0; m < kMicros; ++m) {
    const auto i = static_cast<std::size_t>(m);
    s0.forward(m, tok[i].data(), nullptr, nullptr, &act[i]);
    s1.forward(m, nullptr, tgt[i].data(), &act[i], nullptr);
  }
  for (int m = 0; m < kMicros; ++m) {
    const auto i = static_cast<std::size_t>(m);
    s1.backward(m, nullptr, &grad[i]);
    s0.backward(m, &grad[i], nullptr);
    EXPECT_NEAR(s1.micro_loss(m), ref->micro_loss(m), 1e-5 * ref->micro_loss(m));
  }
  // tied embedding: the embedding group's sum (first + last stage, same tp rank)
  auto sum = download(*be, s0.tied_embedding()->grad);
  const auto head = download(*be, s1.tied_embedding()->grad);
  for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += head[k];
  for (StageModel* s : {&s0, &s1}) {
    be->upload(s->tied_embedding()->grad.data(), sum.data(), sum.size() * sizeof(float));
  }
  expect_grads_match(s0);
  expect_grads_match(s1);
  const double global =
      world.allreduce(s0.local_grad_sq_norm() + s1.local_grad_sq_norm(), MPI_SUM);
  EXPECT_NEAR(global, ref->local_grad_sq_norm(), 1e-5 * ref->local_grad_sq_norm());
}

}  // namespace
}  // namespace atlas::model
