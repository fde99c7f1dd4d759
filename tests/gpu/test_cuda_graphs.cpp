// SPDX-License-Identifier: MIT
// Block graphs (device.cuda_graphs) on the CUDA backend: a few training steps with graphs give the
// eager run's losses and weights (not bit for bit: the fused attention's dQ and the embedding
// gradient add with atomicAdd, so two eager runs differ too; the distance is printed), every
// block pass is recorded without a refusal, and the recorded graphs are launched. fp32 and bf16,
// whole and split backward. Label gpu; skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>

#include "cuda_backend.hpp"
#include "gpu/cuda_test_util.hpp"
#include "unit/graphs_driver.hpp"

namespace atlas {
namespace {

std::unique_ptr<device::Backend> cuda(Precision p) { return testutil::make_cuda(p); }

class CudaGraphs : public testutil::CudaDeviceTest {};

TEST_F(CudaGraphs, TrainingWithBlockGraphsMatchesTheEagerRun) {
  for (const Precision prec : {Precision::Fp32, Precision::Bf16}) {
    for (const bool split : {false, true}) {
      const std::string what = std::string(to_string(prec)) + (split ? ", split backward" : "");
      auto eager_be = cuda(prec);
      const testutil::Trained eager = testutil::train(*eager_be, false, split);
      auto graph_be = cuda(prec);
      const testutil::Trained graphs = testutil::train(*graph_be, true, split);
      const auto& st = graphs.stats;
      std::cout << what << ": " << st.recorded << " recorded, " << st.launches << " launches, " << st.eager
                << " eager, " << st.refused << " refused, " << st.dropped << " dropped"
                << (st.first_refusal.empty() ? "" : "; first refusal: " + st.first_refusal) << "\n";
      EXPECT_EQ(st.refused, 0) << what << ": " << st.first_refusal;
      const long long keys = 3 * 3 * (split ? 3 : 2);
      EXPECT_GE(st.recorded, keys) << what;
      EXPECT_GE(st.launches, 2 * keys) << what;
      ASSERT_EQ(graphs.losses.size(), eager.losses.size());
      double worst = 0.0;
      for (std::size_t i = 0; i < eager.losses.size(); ++i)
        worst = std::max(worst, std::abs(graphs.losses[i] - eager.losses[i]) / std::abs(eager.losses[i]));
      std::cout << what << ": largest relative loss difference graphs vs eager " << worst << "\n";
      EXPECT_LE(worst, 1e-4) << what;
      for (std::size_t i = 0; i < eager.params.size(); ++i)
        EXPECT_LE(testutil::max_rel_diff(graphs.params[i], eager.params[i]), 1e-4) << what << ", tensor " << i;
    }
  }
}

}  // namespace
}  // namespace atlas
