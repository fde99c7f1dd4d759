// SPDX-License-Identifier: MIT
// The profile of a small run: every slot of the table exactly once per rank and step, with sane
// times (ordered within a rank, inside the run), sends carrying their bytes, and profile.h5 +
// trace.json written by a real `run_training_job`; and the per-rank time table `atlas train`
// prints at the end.
#include <gmock/gmock.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "atlas/app/train_output.hpp"
#include "atlas/app/training_job.hpp"
#include "atlas/io/hdf5.hpp"
#include "atlas/sched/schedule.hpp"
#include "train_fixture.hpp"

namespace atlas::runtime {
namespace {

TEST(TrainOutputTable, RankTimeSumsTheStepReportsAndTheTablePrintsEachRank) {
  // Two steps of one rank: the optimizer's wait for the global norm arrives in wan_s (the
  // trainer's classification), not in compute_s, and so does not raise the utilization.
  runtime::StepReport r;
  r.step_s = 0.100;
  r.compute_s = 0.050;
  r.intra_s = 0.010;
  r.wan_s = 0.020;
  r.idle_s = 0.015;
  r.prefill_s = 0.005;
  app::RankTime a;
  EXPECT_EQ(a.utilization(), 0.0);
  a.add(r);
  a.add(r);
  EXPECT_NEAR(a.wall, 0.200, 1e-12);
  EXPECT_NEAR(a.compute, 0.100, 1e-12);
  EXPECT_NEAR(a.wan, 0.040, 1e-12);
  EXPECT_NEAR(a.prefill, 0.010, 1e-12);
  EXPECT_NEAR(a.utilization(), 0.55, 1e-12);
  app::RankTime b;
  b.add(r);
  const topo::Layout layout(2, testing::make_cfg(1, 1, {1, 1}, 2, {}).parallel);
  const std::string t = app::rank_time_table({a, b}, layout, {"east", "west"}, 2);
  EXPECT_THAT(t, ::testing::HasSubstr("per-rank time over 2 steps"));
  // The "where" column holds the whole coordinate, dp and tp index included (it was cut at 22).
  EXPECT_THAT(t, ::testing::ContainsRegex("0 dc 0 \\(east\\) stage 0 dp 0 tp 0 +0\\.10 +0\\.02 +0\\.04 +0\\.03 +0\\.01 +55\\.0"));
  EXPECT_THAT(t, ::testing::ContainsRegex("1 dc 1 \\(west\\) stage 1 dp 0 tp 0 +0\\.05 +0\\.01 +0\\.02 +0\\.01 +0\\.01 +55\\.0"));
}

// A logged step's job-wide figures are a sum over every rank that TrainOutput::step only starts:
// a rank that logs while another is 0.4 s behind (across DCs: a WAN round trip and the slowest
// rank's skew) goes on at once, and the row comes out once the sum is in (flush_row), with the
// job's figures. Before, every logged step waited for the slowest rank.
TEST(TrainOutputTable, ALoggedStepDoesNotWaitForTheOtherRanks) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs another rank to be late";
  const std::string dir = testing::shared_temp_dir(world, "atlas-output");
  const Config cfg = testing::make_cfg(1, 2, {1, 1}, 3, {"run.out_dir=" + dir, "run.name=o", "run.log_every_steps=1"});
  const topo::Layout layout(world.size(), cfg.parallel);
  const topo::Communicators comms = topo::Communicators::create(world, layout);
  app::TrainOutput out(cfg, world.rank() == 0, /*quiet=*/true);
  runtime::StepReport r;
  r.step = 0;
  r.step_s = 0.1;
  r.compute_s = 0.05;
  r.boundary.wan_bytes_sent = 1000;
  constexpr double kLate = 0.4;
  if (world.rank() == world.size() - 1) std::this_thread::sleep_for(std::chrono::duration<double>(kLate));
  const auto t0 = std::chrono::steady_clock::now();
  out.step(r, std::nullopt, 64, comms);
  const double in_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (world.rank() == 0) {
    EXPECT_LT(in_step, kLate / 4) << "rank 0 waited in step() for the late rank";
  }
  out.flush_row();  // every rank: the sum completes once the late rank started it
  comms.world.barrier();
  if (world.rank() == 0) {
    std::ifstream log(dir + "/o/log.txt");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    // The row with the job's mean bubble: every rank reported 50% busy.
    EXPECT_THAT(text, ::testing::ContainsRegex(" 0 +0\\.0000 +- +[^\\n]* 100\\.0 +50\\.0 +50\\.0 ")) << text;
  }
}

TEST(TrainReport, TheDpSumAcrossDcsIsAWanWait) {
  // parallel.dp_across_dcs: the DP replicas sit in different DCs, so the AllReduce slot's wait is
  // a WAN wait (wan_ms), not an intra-DC one (it was counted in intra_ms: a 3-DC ring over a
  // 20 ms WAN printed intra_ms 3306 and wan_ms 0 a step).
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4";
  const Config cfg = testing::make_cfg(1, 2, {2, 2}, 2, {"parallel.dp_across_dcs=true", "cluster.latency_ms=0 5 5 0"});
  const testing::Outcome out = testing::train(cfg, world, 2);
  ASSERT_EQ(out.reports.size(), 2U);
  for (const StepReport& r : out.reports) {
    EXPECT_GT(r.allreduce_s, 0.0);
    // The pipeline stays in one DC: every WAN wait here is the DP sum's.
    EXPECT_GE(r.wan_s, r.allreduce_s * (1 - 1e-9)) << "rank " << world.rank() << " step " << r.step;
  }
  // Inside one DC the same sum is an intra-DC wait, and nothing waits on the WAN.
  const Config one = testing::make_cfg(1, 2, {2, 0}, 2);
  const testing::Outcome in_dc = testing::train(one, world, 2);
  for (const StepReport& r : in_dc.reports) {
    EXPECT_GT(r.allreduce_s, 0.0);
    EXPECT_EQ(r.wan_s, 0.0);
    EXPECT_GE(r.intra_s, r.allreduce_s * (1 - 1e-9));
  }
}

TEST(TrainReport, TheTiedEmbeddingExchangeAcrossDcsIsAWanWait) {
  // A pipeline over two DCs, DP 2 inside each: the AllReduce slot's wait for the tied-embedding
  // partner's half crosses the WAN (it was counted in intra_ms with the DP sums, and wan_ms
  // missed it).
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4";
  const Config cfg = testing::make_cfg(1, 2, {1, 1}, 4);
  const testing::Outcome out = testing::train(cfg, world, 3);
  double exchange = 0.0;
  for (const StepReport& r : out.reports) {
    EXPECT_GE(r.wan_s, r.exchange_s) << "rank " << world.rank() << " step " << r.step;
    EXPECT_LE(r.exchange_s, r.allreduce_s * (1 + 1e-9)) << "rank " << world.rank() << " step " << r.step;
    EXPECT_LE(r.intra_s, r.allreduce_s - r.exchange_s + 1e-9) << "rank " << world.rank() << " step " << r.step;
    // every rank is a first or last stage: its half of the tied embedding's gradient crossed the WAN
    EXPECT_EQ(r.boundary.wan_exchange_bytes,
              static_cast<std::int64_t>(cfg.model.vocab) * cfg.model.hidden * static_cast<std::int64_t>(sizeof(float)))
        << "rank " << world.rank() << " step " << r.step;
    exchange += r.exchange_s;
  }
  EXPECT_GT(world.allreduce(exchange, MPI_SUM), 0.0) << "the exchange's wait was measured";
}

TEST(TrainProfile, EverySlotOnceWithSaneTimesAndFilesWritten) {
  const mpi::Comm world = mpi::Comm::world();
  if (world.size() != 4) GTEST_SKIP() << "runs at np 4";
  const std::string dir = testing::shared_temp_dir(world, "atlas-profile");
  constexpr int kSteps = 3;
  Config cfg = testing::make_cfg(1, 2, {1, 1}, 3,
                                 {"profile.enabled=true", "profile.trace_json=true", "run.out_dir=" + dir,
                                  "run.name=p", "run.steps=" + std::to_string(kSteps), "schedule.kind=atlas"});
  app::JobOptions opt;
  opt.quiet = true;
  const app::JobResult result = app::run_training_job(cfg, world, opt);
  EXPECT_EQ(result.steps_run, kSteps);

  if (world.rank() == 0) {
    // run.json's mean step is the one atlas bench reports: the first step's one-time costs left out
    std::ifstream json(dir + "/p/run.json");
    const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"("mean_step_ms":([0-9.]+))"))) << text;
    EXPECT_NEAR(std::stod(m[1].str()), result.mean_step_s * 1e3, 1e-3) << text;
    const std::string path = dir + "/p/profile.h5";
    ASSERT_TRUE(std::filesystem::exists(path));
    h5::File f = h5::open_file(path, h5::Access::ReadOnly);
    EXPECT_EQ(h5::read_attr_string(f.get(), "format"), "atlas-profile");
    EXPECT_EQ(h5::read_attr_int(f.get(), "version"), 1);
    auto read_i32 = [&](const char* name) {
      h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), name, H5P_DEFAULT)));
      std::vector<std::int32_t> v(h5::dataset_dims(d.get())[0]);
      ATLAS_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
      return v;
    };
    auto read_f64 = [&](const char* name) {
      h5::Dataset d(ATLAS_H5_CHECK(H5Dopen2(f.get(), name, H5P_DEFAULT)));
      std::vector<double> v(h5::dataset_dims(d.get())[0]);
      ATLAS_H5_CHECK(H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
      return v;
    };
    const auto rank = read_i32("events/world_rank");
    const auto step = read_i32("events/step");
    const auto slot = read_i32("events/slot_index");
    const auto kind = read_i32("events/kind");
    const auto start = read_f64("events/start_s");
    const auto end = read_f64("events/end_s");
    const auto complete = read_f64("events/complete_s");

    // Rebuild the table the job ran, to know each row's length.
    const topo::Layout layout(4, cfg.parallel);
    const sched::ScheduleTable table = sched::build_schedule(cfg, layout);
    std::map<std::pair<int, int>, std::multiset<int>> seen;
    std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;
    double t_max = 0;
    for (std::size_t i = 0; i < rank.size(); ++i) {
      seen[{rank[i], step[i]}].insert(slot[i]);
      ASSERT_GE(start[i], 0.0);
      ASSERT_LE(start[i], end[i]);
      ASSERT_LE(end[i], complete[i] + 1e-12);
      t_max = std::max(t_max, complete[i]);
      if (kind[i] != static_cast<int>(sched::SlotKind::WanSend)) spans[{rank[i], step[i]}].push_back({start[i], end[i]});
    }
    for (int r = 0; r < 4; ++r)
      for (int s = 0; s < kSteps; ++s) {
        const topo::Coord c = layout.coord(r);
        const auto& row = table.row(c.stage, c.dp);
        const auto& got = seen[{r, s}];
        ASSERT_EQ(got.size(), row.size()) << "rank " << r << " step " << s;
        for (int k = 0; k < static_cast<int>(row.size()); ++k)
          EXPECT_EQ(got.count(k), 1u) << "rank " << r << " step " << s << " slot " << k;
        // The main thread runs slots one after another.
        auto v = spans[{r, s}];
        std::sort(v.begin(), v.end());
        for (std::size_t k = 1; k < v.size(); ++k) EXPECT_GE(v[k].first, v[k - 1].second - 1e-9);
      }
    EXPECT_LT(t_max, 600.0) << "times are seconds since the job's start";
    const auto losses = read_f64("steps/loss");
    ASSERT_EQ(losses.size(), static_cast<std::size_t>(kSteps));
    EXPECT_EQ(losses[0], result.losses[0]);
    // trace.json is there and is the Chrome trace format's outer object.
    std::ifstream trace(dir + "/p/trace.json");
    std::string head(64, '\0');
    trace.read(head.data(), 64);
    EXPECT_EQ(head.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\"", 0), 0u);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace atlas::runtime
