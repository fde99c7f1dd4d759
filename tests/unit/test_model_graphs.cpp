// SPDX-License-Identifier: MIT
// Block graphs (device.cuda_graphs; device::GraphCache, StageModel's run_block) without a GPU:
// the recording backend (tests/support/recording_backend.hpp) records calls as a CUDA graph
// would, so training with graphs on gives bit for bit the plain host run's losses and weights
// only if every recorded block pass is static (no host value read at replay, no allocation, no
// dependence on having run eagerly). Also: a refused recording leaves the pass eager with the same
// results, an epoch change drops and re-records the graphs, and the misuse errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/device/graph_cache.hpp"
#include "support/recording_backend.hpp"
#include "unit/graphs_driver.hpp"
#include "unit/test_model_util.hpp"

namespace atlas {
namespace {

using testutil::RecordingBackend;
using testutil::small_model;
using testutil::train;
using testutil::Trained;

void expect_same(const Trained& got, const Trained& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (std::size_t i = 0; i < want.params.size(); ++i) EXPECT_EQ(got.params[i], want.params[i]) << what << ", tensor " << i;
}

TEST(ModelGraphs, TrainingWithBlockGraphsIsBitwiseTheEagerRun) {
  for (const Precision prec : {Precision::Fp32, Precision::Bf16}) {
    for (const bool split : {false, true}) {
      const std::string what = std::string(to_string(prec)) + (split ? ", split backward" : "");
      RecordingBackend eager_be(prec);
      const Trained eager = train(eager_be, false, split);
      RecordingBackend graph_be(prec);
      const Trained graphs = train(graph_be, true, split);
      expect_same(graphs, eager, what);
      EXPECT_EQ(eager_be.launches(), 0) << what;
      // 3 blocks x 3 arenas x (forward, backward) or (forward, B, W): every key recorded once, on
      // its second run (step 1), then launched in steps 1-3.
      const long long keys = 3 * 3 * (split ? 3 : 2);
      EXPECT_EQ(graphs.stats.recorded, keys) << what;
      EXPECT_EQ(graphs.stats.launches, 3 * keys) << what;
      EXPECT_EQ(graphs.stats.eager, keys) << what << ": the warm-up runs";
      EXPECT_EQ(graphs.stats.refused, 0) << what << ": " << graphs.stats.first_refusal;
      EXPECT_EQ(graph_be.launches(), graphs.stats.launches) << what;
      EXPECT_NE(graphs.losses.front(), graphs.losses.back()) << what << ": the model learns";
    }
  }
}

TEST(ModelGraphs, ARefusedRecordingStaysEagerWithTheSameResults) {
  RecordingBackend eager_be;
  const Trained eager = train(eager_be, false, false);
  RecordingBackend be;
  be.refuse_captures(true);
  const Trained refused = train(be, true, false);
  expect_same(refused, eager, "every recording refused");
  EXPECT_EQ(refused.stats.launches, 0);
  EXPECT_EQ(refused.stats.recorded, 0);
  EXPECT_EQ(refused.stats.refused, 3 * 3 * 2);
  EXPECT_NE(refused.stats.first_refusal.find("refused by the test"), std::string::npos) << refused.stats.first_refusal;
  EXPECT_EQ(be.launches(), 0);
}

TEST(GraphCache, AnEpochChangeDropsEveryGraphAndRecordsAgain) {
  RecordingBackend be;
  device::GraphCache cache(be, true);
  device::Buffer x = be.alloc_floats(4);
  be.fill(x.f32(), 1.0F, 4);
  const auto work = [&] { be.scale(x.f32(), 2.0F, 4); };
  for (int i = 0; i < 3; ++i) cache.run({1, 0, 0, 0, x.data()}, work);  // eager, record + launch, launch
  EXPECT_EQ(cache.stats().recorded, 1);
  EXPECT_EQ(cache.stats().launches, 2);
  be.bump_epoch();
  // recorded again at once: the key's warm-up ran (workspaces only grow)
  for (int i = 0; i < 3; ++i) cache.run({1, 0, 0, 0, x.data()}, work);
  EXPECT_EQ(cache.stats().dropped, 1);
  EXPECT_EQ(cache.stats().recorded, 2);
  EXPECT_EQ(cache.stats().eager, 1);
  EXPECT_EQ(cache.stats().launches, 5);
  EXPECT_EQ(testutil::download(be, x), std::vector<float>(4, 64.0F)) << "six doublings, each run once";
}

TEST(GraphCache, WorkThatCannotBeRecordedRunsEagerOnceAndIsRemembered) {
  RecordingBackend be;
  device::GraphCache cache(be, true);
  device::Buffer x = be.alloc_floats(2);
  std::vector<float> host(2, 0.0F);
  int calls = 0;
  // A download inside the work: the recording refuses it, the work runs again eagerly.
  const auto work = [&] {
    ++calls;
    be.fill(x.f32(), 3.0F, 2);
    be.download(host.data(), x.data(), 2 * sizeof(float));
  };
  cache.run({0, 0, 0, 0, x.data()}, work);  // warm-up
  cache.run({0, 0, 0, 0, x.data()}, work);  // recording refused: run eagerly
  cache.run({0, 0, 0, 0, x.data()}, work);  // remembered: eager, no recording tried
  EXPECT_EQ(calls, 4);
  EXPECT_FALSE(be.capturing());
  EXPECT_EQ(be.aborts(), 1) << "the recording is dropped, not ended into a graph";
  EXPECT_EQ(host, std::vector<float>(2, 3.0F));
  EXPECT_EQ(cache.stats().refused, 1);
  EXPECT_EQ(cache.stats().recorded, 0);
  EXPECT_NE(cache.stats().first_refusal.find("download inside a graph recording"), std::string::npos)
      << cache.stats().first_refusal;
}

TEST(GraphCache, ARecordingThatCannotStartRunsEagerAndIsRemembered) {
  RecordingBackend be;
  be.fail_begin_capture(true);
  device::GraphCache cache(be, true);
  device::Buffer x = be.alloc_floats(1);
  for (int i = 0; i < 3; ++i) cache.run({0, 0, 0, 0, x.data()}, [&] { be.scale(x.f32(), 2.0F, 1); });
  be.fill(x.f32(), 1.0F, 1);
  cache.run({0, 0, 0, 0, x.data()}, [&] { be.scale(x.f32(), 2.0F, 1); });
  EXPECT_EQ(testutil::download(be, x), std::vector<float>(1, 2.0F));
  EXPECT_EQ(cache.stats().refused, 1);
  EXPECT_EQ(cache.stats().eager, 4);
  EXPECT_NE(cache.stats().first_refusal.find("begin_capture failed (the test)"), std::string::npos)
      << cache.stats().first_refusal;
}

TEST(GraphCache, AReplayKeepsTheScalarsOfItsRecording) {
  // What makes a host value read by the work unusable in a graph: the replay uses the recorded one.
  RecordingBackend be;
  device::GraphCache cache(be, true);
  device::Buffer x = be.alloc_floats(1);
  float factor = 2.0F;
  for (int i = 0; i < 3; ++i) {
    be.fill(x.f32(), 1.0F, 1);
    cache.run({0, 0, 0, 0, x.data()}, [&] { be.scale(x.f32(), factor, 1); });
    factor += 1.0F;  // 3 at the recording (second run), 4 at the replay
  }
  EXPECT_EQ(testutil::download(be, x), std::vector<float>(1, 3.0F));
}

TEST(ModelGraphs, MisuseIsAClearError) {
  DeviceCfg host;
  auto be = device::make_backend(host);
  model::StageSpec spec;
  spec.graphs = true;
  try {
    model::StageModel model(small_model(), 2, spec, *be, nullptr, 1);
    FAIL() << "a host backend records no graphs";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.cuda_graphs = true, but the host backend records no graphs"),
              std::string::npos) << e.what();
  }
  RecordingBackend rec;
  spec.tp_size = 2;
  try {
    model::StageModel model(small_model(), 2, spec, rec, nullptr, 1);
    FAIL() << "graphs with TP";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.cuda_graphs = true with parallel.tp_size = 2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW({ device::GraphCache cache(*be, true); }, Error);
  EXPECT_THROW(be->begin_capture(), Error);
}

}  // namespace
}  // namespace atlas
