// SPDX-License-Identifier: MIT
// Cost profiles: the device and WAN profile readers (good files, every error path), the built-in
// GPU table against profiles/device/*.profile, the measured-rate interpolation, the pluggable
// block timer and the profile lookup of a deck.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sim/measure.hpp"
#include "atlas/sim/profile.hpp"

namespace atlas::sim {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path source_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return env ? fs::path(env) : fs::path(ATLAS_SOURCE_DIR);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

const char* kDevice = R"(# a test device
format = atlas-profile 1
kind = device
name = testgpu
description = "a test GPU"
peak_tflops = 100
achievable_fraction = 0.5
memory_gib = 40
mem_bandwidth_gbs = 1000
nvlink_gbs = 200
source.peak_tflops = "made up for the test"
)";

TEST(DeviceProfile, ParsesKeysAndSources) {
  const DeviceProfile p = parse_device_profile("t.profile", kDevice);
  EXPECT_EQ(p.name, "testgpu");
  EXPECT_EQ(p.description, "a test GPU");
  EXPECT_DOUBLE_EQ(p.fwd_flops_per_s(1e9), 50e12);
  EXPECT_DOUBLE_EQ(p.bwd_ratio(1e9), 2.0);  // default
  EXPECT_DOUBLE_EQ(p.usable_bytes(), 40.0 * 1024 * 1024 * 1024 * 0.9);
  ASSERT_EQ(p.sources.size(), 1u);
  EXPECT_EQ(p.sources[0].first, "peak_tflops");
  EXPECT_EQ(p.sources[0].second, "made up for the test");
}

TEST(DeviceProfile, WriterAndReaderRoundTrip) {
  DeviceProfile p = parse_device_profile("t.profile", kDevice);
  p.table = {{128, 4, 64, 2, 1, 0.5, 1.25}, {256, 4, 64, 1, 2, 0.75, 1.5}};
  p.selective_recompute = true;
  const DeviceProfile q = parse_device_profile("round.profile", format_device_profile(p));
  EXPECT_EQ(q.name, p.name);
  EXPECT_DOUBLE_EQ(q.peak_tflops, p.peak_tflops);
  EXPECT_TRUE(q.selective_recompute);
  ASSERT_EQ(q.table.size(), 2u);
  EXPECT_EQ(q.table[1].tp, 2);
  EXPECT_DOUBLE_EQ(q.table[0].bwd_ms, 1.25);
  EXPECT_EQ(q.sources, p.sources);
}

TEST(DeviceProfile, EveryProblemIsReportedWithFileAndLine) {
  const std::string text = std::string(kDevice) +
                           "peak_tflops = 5\n"           // twice
                           "memory_gb = 3\n"             // unknown key
                           "grad_bytes = lots\n"         // not a number
                           "row = 1 2 3 4 5 6 7\n"       // row before table
                           "this line has no equals\n";
  const std::string msg = error_of([&] { parse_device_profile("bad.profile", text); });
  EXPECT_THAT(msg, HasSubstr("bad.profile:12: key 'peak_tflops' is set twice"));
  EXPECT_THAT(msg, HasSubstr("bad.profile:13: unknown device profile key 'memory_gb'"));
  EXPECT_THAT(msg, HasSubstr("bad.profile:14: grad_bytes = \"lots\": expected a number in [0, 1e+12]"));
  EXPECT_THAT(msg, HasSubstr("bad.profile:15: 'row' before 'table = ...'"));
  EXPECT_THAT(msg, HasSubstr("bad.profile:16: cannot read 'this line has no equals'"));
}

// Values that would make a cost zero-divided or infinite are refused where they are read (a
// profile with nvlink_gbs = 0, or peak_tflops = inf, reached the schedule engine as an internal
// error: an assertion on a non-finite step, or an event loop that never converged).
TEST(DeviceProfile, ZeroNvlinkInfiniteAndHugeNumbersAreRefused) {
  auto err = [](const std::string& from, const std::string& to) {
    std::string t = kDevice;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return error_of([&] { parse_device_profile("t.profile", t); });
  };
  EXPECT_THAT(err("nvlink_gbs = 200", "nvlink_gbs = 0"),
              HasSubstr("t.profile: nvlink_gbs must be > 0 (the tensor-parallel all-reduce's bandwidth"));
  EXPECT_THAT(err("peak_tflops = 100", "peak_tflops = inf"),
              HasSubstr("t.profile:6: peak_tflops = \"inf\": expected a number in [0, 1e+12]"));
  EXPECT_THAT(err("memory_gib = 40", "memory_gib = 1e300"),
              HasSubstr("t.profile:8: memory_gib = \"1e300\": expected a number in [0, 1e+12]"));
  EXPECT_THAT(err("nvlink_gbs = 200", "nvlink_gbs = 200\ntable = hidden heads seq_len micro_batch_size tp fwd_ms bwd_ms\n"
                                      "row = 4294967296 1 1 1 1 1 1"),
              HasSubstr("row's shape values must be at most 2^30"));
}

TEST(DeviceProfile, GemmCurveRoundTripsAndBadCurvesAreErrors) {
  DeviceProfile p = parse_device_profile("t.profile", kDevice);
  p.gemm_min_dim = {128, 1024};
  p.gemm_fraction = {0.3, 0.7};
  p.fused_attention = true;
  p.nvlink_efficiency = 0.75;
  const DeviceProfile q = parse_device_profile("round.profile", format_device_profile(p));
  EXPECT_EQ(q.gemm_min_dim, p.gemm_min_dim);
  EXPECT_EQ(q.gemm_fraction, p.gemm_fraction);
  EXPECT_TRUE(q.fused_attention);
  EXPECT_DOUBLE_EQ(q.nvlink_efficiency, 0.75);
  const std::string msg = error_of([] {
    parse_device_profile("bad.profile", std::string(kDevice) + "gemm_min_dim = 64 128\ngemm_fraction = 0.5 1.5 0.7\n"
                                                                "nvlink_efficiency = 2\n");
  });
  EXPECT_THAT(msg, HasSubstr("bad.profile: gemm_min_dim has 2 values but gemm_fraction has 3"));
  EXPECT_THAT(msg, HasSubstr("bad.profile: gemm_fraction has 1.5: fractions of peak must be in (0, 1]"));
  EXPECT_THAT(msg, HasSubstr("bad.profile: nvlink_efficiency must be in (0, 1]"));
}

TEST(DeviceProfile, RejectsWrongFormatKindAndMissingNumbers) {
  EXPECT_THAT(error_of([] { parse_device_profile("x.profile", "format = atlas-profile 2\nkind = wan\n"); }),
              HasSubstr("first key must be 'format = atlas-profile 1'"));
  EXPECT_THAT(error_of([] { parse_device_profile("x.profile", "format = atlas-profile 1\nkind = wan\n"); }),
              HasSubstr("kind = 'wan', but a device profile was expected"));
  const std::string msg = error_of([] { parse_device_profile("x.profile", "format = atlas-profile 1\nkind = device\n"); });
  EXPECT_THAT(msg, HasSubstr("missing key 'name'"));
  EXPECT_THAT(msg, HasSubstr("needs peak_tflops and achievable_fraction > 0, or a measured table"));
  EXPECT_THAT(msg, HasSubstr("memory_gib must be > 0"));
}

TEST(DeviceProfile, MeasuredRateIsInterpolatedInLogFlopsAndClamped) {
  DeviceProfile p = parse_device_profile("t.profile", kDevice);
  // Two measured blocks: hidden 64 (small, slow) and 256 (large, fast), seq 32, mbs 1.
  ModelCfg m;
  m.heads = 4;
  m.seq_len = 32;
  m.hidden = 64;
  const double f_small = sched::block_forward_flops(m, 32);
  m.hidden = 256;
  const double f_large = sched::block_forward_flops(m, 32);
  p.table = {{64, 4, 32, 1, 1, f_small / 1e9 * 1e3, 3 * f_small / 1e9 * 1e3},   // 1 GFLOP/s, bwd 3x
             {256, 4, 32, 1, 1, f_large / 4e9 * 1e3, 2 * f_large / 4e9 * 1e3}}; // 4 GFLOP/s, bwd 2x
  EXPECT_NEAR(p.fwd_flops_per_s(f_small), 1e9, 1e-3);
  EXPECT_NEAR(p.fwd_flops_per_s(f_large), 4e9, 1e-3);
  EXPECT_NEAR(p.fwd_flops_per_s(f_small / 10), 1e9, 1e-3);   // clamped below
  EXPECT_NEAR(p.fwd_flops_per_s(f_large * 10), 4e9, 1e-3);   // clamped above
  const double mid = std::sqrt(f_small * f_large);          // halfway in log(FLOPs)
  EXPECT_NEAR(p.fwd_flops_per_s(mid), 2.5e9, 1e-3);
  EXPECT_NEAR(p.bwd_ratio(mid), 2.5, 1e-12);
}

TEST(DeviceProfile, BuiltInGpusAgreeWithTheProfileFiles) {
  for (GpuKind g : {GpuKind::A100, GpuKind::H100, GpuKind::H200}) {
    const DeviceProfile b = builtin_device_profile(g);
    const fs::path file = source_dir() / "profiles/device" / (b.name + ".profile");
    const DeviceProfile f = load_device_profile(file.string());
    EXPECT_EQ(f.name, b.name);
    EXPECT_DOUBLE_EQ(f.peak_tflops, b.peak_tflops) << b.name;
    EXPECT_DOUBLE_EQ(f.achievable_fraction, b.achievable_fraction) << b.name;
    EXPECT_DOUBLE_EQ(f.memory_gib, b.memory_gib) << b.name;
    EXPECT_DOUBLE_EQ(f.mem_bandwidth_gbs, b.mem_bandwidth_gbs) << b.name;
    EXPECT_DOUBLE_EQ(f.nvlink_gbs, b.nvlink_gbs) << b.name;
    EXPECT_DOUBLE_EQ(f.activation_bytes, b.activation_bytes) << b.name;
    EXPECT_DOUBLE_EQ(f.grad_bytes, b.grad_bytes) << b.name;
    EXPECT_DOUBLE_EQ(f.state_bytes_per_param, b.state_bytes_per_param) << b.name;
    EXPECT_EQ(f.sequence_parallel, b.sequence_parallel) << b.name;
    EXPECT_EQ(f.selective_recompute, b.selective_recompute) << b.name;
    EXPECT_EQ(f.fused_attention, b.fused_attention) << b.name;
    EXPECT_EQ(f.gemm_min_dim, b.gemm_min_dim) << b.name;
    EXPECT_EQ(f.gemm_fraction, b.gemm_fraction) << b.name;
    EXPECT_DOUBLE_EQ(f.nvlink_efficiency, b.nvlink_efficiency) << b.name;
    // Every number a planner depends on names its source.
    bool peak_source = false;
    for (const auto& [k, v] : f.sources) peak_source |= k == "peak_tflops" && v.find("datasheet") != std::string::npos;
    EXPECT_TRUE(peak_source) << b.name;
  }
  // The GPU peaks are the ones sched's FLOP estimate uses (one table of truth).
  Config cfg;
  for (GpuKind g : {GpuKind::A100, GpuKind::H100, GpuKind::H200}) {
    cfg.plan.gpu = g;
    const DeviceProfile b = builtin_device_profile(g);
    EXPECT_DOUBLE_EQ(sched::device_flops(cfg), b.peak_tflops * 1e12 * b.achievable_fraction);
  }
}

TEST(DeviceProfile, TheCommittedHostProfileHasAMeasuredTable) {
  const DeviceProfile p = load_device_profile((source_dir() / "profiles/device/host.profile").string());
  EXPECT_EQ(p.name, "host");
  ASSERT_GE(p.table.size(), 4u);
  EXPECT_GT(p.measured_threads, 0);
  for (const auto& b : p.table) {
    EXPECT_GT(b.fwd_ms, 0);
    EXPECT_GT(b.bwd_ms, b.fwd_ms);  // two GEMMs per forward GEMM
  }
}

TEST(Measure, PluggableTimerFillsTheTableAndThePeak) {
  // A fake timer at exactly 2 GFLOP/s forward, backward 2.5x: the profile must reproduce it.
  const BlockTimer fake = [](const BlockShape& s) {
    ModelCfg m;
    m.hidden = s.hidden;
    m.heads = s.heads;
    m.seq_len = s.seq_len;
    const double flops = sched::block_forward_flops(m, static_cast<double>(s.micro_batch_size) * s.seq_len) / s.tp;
    return BlockTiming{flops / 2e9 * 1e3, 2.5 * flops / 2e9 * 1e3};
  };
  const auto shapes = default_host_shapes(false);
  const DeviceProfile p = measure_device_profile(fake, shapes, builtin_device_profile(GpuKind::Host));
  ASSERT_EQ(p.table.size(), shapes.size());
  EXPECT_NEAR(p.peak_tflops, 2e-3, 1e-12);
  EXPECT_DOUBLE_EQ(p.achievable_fraction, 1.0);
  EXPECT_NEAR(p.fwd_flops_per_s(1e7), 2e9, 1e-3);
  EXPECT_NEAR(p.bwd_ratio(1e9), 2.5, 1e-9);
}

TEST(Measure, SgemmTimerTimesATinyBlock) {
  const BlockTiming t = sgemm_block_timer(1, 1)({64, 4, 32, 1, 1});
  EXPECT_GT(t.fwd_ms, 0.0);
  EXPECT_GT(t.bwd_ms, 0.0);
  EXPECT_LT(t.fwd_ms, 1000.0);
}

// ---- WAN profiles ----

const char* kWan = R"(format = atlas-profile 1
kind = wan
name = test-wan
date = 2024-01
regions = a b c
rtt_ms = 0 10 20  10 0 30  20 30 0
bandwidth_gbps = 40
source.rtt_ms = "made up"
)";

TEST(WanProfile, GivesDeckOverridesWithOneWayLatency) {
  const WanProfile w = parse_wan_profile("w.profile", kWan);
  EXPECT_EQ(w.regions.size(), 3u);
  const auto ov = w.deck_overrides({"c", "a"});
  ASSERT_EQ(ov.size(), 2u);
  EXPECT_EQ(ov[0], "cluster.latency_ms=0 10 10 0");
  EXPECT_EQ(ov[1], "cluster.bandwidth_gbps=0 40 40 0");
  EXPECT_THAT(error_of([&] { (void)w.deck_overrides({"a", "mars"}); }),
              HasSubstr("DC 'mars' is not a region of WAN profile test-wan"));
}

std::string with(const std::string& from, const std::string& to) {
  std::string s = kWan;
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(WanProfile, RejectsNonSquareNegativeAndBadDiagonal) {
  const std::string rtt = "rtt_ms = 0 10 20  10 0 30  20 30 0";
  EXPECT_THAT(error_of([&] { parse_wan_profile("w.profile", with(rtt, "rtt_ms = 0 10 20 10 0 30 20 30")); }),
              HasSubstr("rtt_ms has 8 entries, but 3 regions need a square 3x3 matrix (9 entries, row-major)"));
  EXPECT_THAT(error_of([&] { parse_wan_profile("w.profile", with(rtt, "rtt_ms = 0 -10 20 10 0 30 20 30 0")); }),
              HasSubstr("rtt_ms has \"-10\": expected a space-separated list of numbers in [0, 1e+12]"));
  EXPECT_THAT(error_of([&] { parse_wan_profile("w.profile", with(rtt, "rtt_ms = 5 10 20 10 0 30 20 30 0")); }),
              HasSubstr("rtt_ms diagonal entry (a, a) is 5, must be 0"));
  EXPECT_THAT(error_of([&] { parse_wan_profile("w.profile", with("bandwidth_gbps = 40", "bandwidth_gbps = 1 2")); }),
              HasSubstr("bandwidth_gbps has 2 entries; give one value or a square 3x3 matrix"));
}

TEST(WanProfile, TheCommittedAwsProfileIsValidAndSourced) {
  const WanProfile w = load_wan_profile((source_dir() / "profiles/wan/aws_2017.profile").string());
  EXPECT_EQ(w.regions.size(), 9u);
  EXPECT_EQ(w.rtt_ms.size(), 81u);
  EXPECT_FALSE(w.date.empty());
  ASSERT_GE(w.sources.size(), 2u);
  // us-east-1 -> eu-west-1 measured 80.55 ms RTT: 40.275 ms one way.
  const auto ov = w.deck_overrides({"us-east-1", "eu-west-1"});
  EXPECT_EQ(ov[0], "cluster.latency_ms=0 40.275 40.26 0");
}

// ---- lookup ----

// The deck's profile as every command gets it: the files read with the deck, then chosen.
DeviceProfile resolve_device_profile(Config cfg) {
  deck::read_device_profiles(cfg);
  return sched::device_profile(cfg);
}

TEST(ResolveProfile, DeckFilesWinAndAMismatchIsAnError) {
  const fs::path dir = fs::temp_directory_path() / "atlas_test_sim_profile";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "test.profile") << kDevice;
  }
  Config cfg;
  cfg.plan.gpu = GpuKind::H100;
  cfg.plan.profiles = {(dir / "test.profile").string()};
  EXPECT_THAT(error_of([&] { (void)resolve_device_profile(cfg); }),
              HasSubstr("plan.gpu = h100, but no file in plan.profiles is a 'h100' profile (found: testgpu"));
  cfg.plan.profiles = {(dir / "missing.profile").string()};
  EXPECT_THAT(error_of([&] { (void)resolve_device_profile(cfg); }), HasSubstr("missing.profile"));
  // The h100 file next to it is found by name.
  cfg.plan.profiles = {(dir / "test.profile").string(), (source_dir() / "profiles/device/h100.profile").string()};
  EXPECT_EQ(resolve_device_profile(cfg).name, "h100");
  // Without plan.profiles: the source tree's file.
  cfg.plan.profiles.clear();
  cfg.plan.gpu = GpuKind::H200;
  const DeviceProfile p = resolve_device_profile(cfg);
  EXPECT_EQ(p.name, "h200");
  EXPECT_THAT(p.path, HasSubstr("profiles/device/h200.profile"));
  // The files read once serve a copy whose plan.gpu changed (sim::machine_config): no new search.
  Config read = cfg;
  deck::read_device_profiles(read);
  read.plan.gpu = GpuKind::A100;
  EXPECT_EQ(sched::device_profile(read).name, "a100");
  // A Config whose files nobody read is a bug in the caller, not a silent fallback.
  EXPECT_THROW((void)sched::device_profile(cfg), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atlas::sim
