// SPDX-License-Identifier: MIT
// The split backward (StageModel::backward_input + backward_weight) of a TP shard: at np = P
// every rank holds TP shard tp_rank = rank of a tp = P model (MpiCollective over the world); the
// split run's gradients, grad_in and losses equal the whole backward()'s bit for bit on every
// rank (first, middle and last stage and the one-stage model; one and two chunks; fp32 and bf16).
#include <gtest/gtest.h>

#include "atlas/device/collective.hpp"
#include "atlas/device/host_backend.hpp"
#include "atlas/mpi/comm.hpp"
#include "unit/split_backward_driver.hpp"

namespace atlas {
namespace {

TEST(SplitBackwardTp, EveryShardsSplitBackwardEqualsItsWholeBackwardBitwise) {
  const mpi::Comm world = mpi::Comm::world();
  device::MpiCollective group(world);
  ModelCfg cfg;
  cfg.layers = 6;
  cfg.hidden = 16;
  cfg.heads = 4;
  cfg.seq_len = 5;
  cfg.vocab = 13;
  cfg.init_std = 0.2;
  if (cfg.heads % world.size() != 0) GTEST_SKIP() << "tp must divide the heads";
  for (Precision prec : {Precision::Fp32, Precision::Bf16}) {
    auto be = device::make_host_backend(1, prec);
    for (const auto& [stage, pp] : {std::pair{0, 1}, std::pair{0, 3}, std::pair{1, 3}, std::pair{2, 3}}) {
      for (int chunks : {1, 2}) {
        const model::StageSpec spec{stage, pp, world.rank(), world.size(), chunks};
        const std::string what = "stage " + std::to_string(stage) + " of " + std::to_string(pp) + " v " +
                                 std::to_string(chunks) + (prec == Precision::Bf16 ? " bf16" : " fp32") + " tp rank " +
                                 std::to_string(world.rank());
        const auto whole = testutil::run_stage(cfg, 2, spec, *be, &group, false, 3);
        const auto split = testutil::run_stage(cfg, 2, spec, *be, &group, true, 3);
        testutil::expect_bitwise(split, whole, what);
      }
    }
  }
}

}  // namespace
}  // namespace atlas
