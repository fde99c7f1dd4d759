// SPDX-License-Identifier: MIT
// Real training with device.cuda_graphs, without a GPU: the recording backend
// (tests/support/recording_backend.hpp, which records calls as a CUDA graph would and replays
// them on launch) is registered as the cuda backend, and the Trainer walks its table as on a GPU:
// pipelines across 2 DCs (1f1b, atlas, interleaved), DP sums that start from the backward's
// gradient groups (between block graphs), fp32 and bf16. Every step's loss and the final
// parameters must be the host backend's bit for bit, with every block pass recorded and launched
// and none refused. np 2: 2 stages in 2 DCs; np 4: dp 2 of them, and 2 stages per DC.
#include "train_fixture.hpp"

#include "support/recording_backend.hpp"

namespace atlas::runtime {
namespace {

using testing::make_cfg;
using Shape = testing::PipelineShape;

struct GraphRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> params;
  device::GraphStats stats;
};

GraphRun train(const Config& cfg, const mpi::Comm& world, int steps) {
  testing::TrainerRig rig(cfg, world);
  Trainer& trainer = rig.trainer;
  GraphRun out;
  for (int s = 0; s < steps; ++s) out.losses.push_back(trainer.train_step(s).loss);
  out.params = trainer.gather_full(false);
  out.stats = trainer.model().graph_stats();
  return out;
}

TEST(TrainGraphs, TrainingWithBlockGraphsIsBitwiseTheHostRun) {
  const mpi::Comm world = mpi::Comm::world();
  const std::vector<Shape> shapes = testing::two_dc_shapes(world.size());
  if (shapes.empty()) GTEST_SKIP() << "runs at np 2 and 4";
  device::register_backend_factory(atlas::Backend::Cuda, [](const DeviceCfg& c) -> std::unique_ptr<device::Backend> {
    return std::make_unique<testutil::RecordingBackend>(effective_precision(c));
  });
  for (const Shape& sh : shapes) {
    int pp = 0;
    for (int x : sh.stages_per_dc) pp += x;
    for (const char* prec : {"fp32", "bf16"}) {
      for (const char* kind : {"1f1b", "atlas", "interleaved"}) {
        if (std::string(kind) == "interleaved" && pp > 2) continue;  // one interleaved shape is enough
        const bool v2 = std::string(kind) == "interleaved";
        const std::vector<std::string> keys = {
            "model.layers=8", std::string("device.precision=") + prec,
            std::string("schedule.kind=") + (v2 ? "1f1b" : kind), std::string("schedule.virtual_stages=") + (v2 ? "2" : "1"),
            "train.dp_bucket_bytes=4096"};  // several buckets: some start between block graphs
        std::vector<std::string> on = keys;
        on.insert(on.end(), {"device.backend=cuda", "device.cuda_graphs=true"});
        const GraphRun host = train(make_cfg(1, sh.dp, sh.stages_per_dc, 2 * pp, keys), world, 4);
        const GraphRun graphs = train(make_cfg(1, sh.dp, sh.stages_per_dc, 2 * pp, on), world, 4);
        const std::string what = testing::shape_name(sh) + " " + kind + " " + prec;
        EXPECT_EQ(host.stats.launches, 0) << what;
        EXPECT_GT(graphs.stats.recorded, 0) << what;
        EXPECT_GT(graphs.stats.launches, graphs.stats.recorded) << what << ": graphs launched after their recording";
        EXPECT_EQ(graphs.stats.refused, 0) << what << ": " << graphs.stats.first_refusal;
        if (world.rank() != 0) continue;
        EXPECT_EQ(graphs.losses, host.losses) << what << ": every step's loss (bitwise)";
        EXPECT_EQ(graphs.params, host.params) << what << ": the parameters after the last step (bitwise)";
        EXPECT_LT(host.losses.back(), host.losses.front()) << what << ": the loss falls";
      }
    }
  }
  device::register_backend_factory(atlas::Backend::Cuda, nullptr);
}

}  // namespace
}  // namespace atlas::runtime
