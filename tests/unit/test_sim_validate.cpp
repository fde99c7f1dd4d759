// SPDX-License-Identifier: MIT
// atlas bench validate's figures held in place: the simulator's step time of published runs
// (inputs/validate/runs.txt) within the issue's bounds, and fast.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "atlas/core/error.hpp"
#include "atlas/sim/bench_validate.hpp"

namespace atlas {
namespace {

std::filesystem::path source_dir() { return ATLAS_SOURCE_DIR; }

TEST(Validate, PublishedRunsWithinTheIssuesBoundsAndFast) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto rows = sim::validate_runs((source_dir() / "inputs/validate/runs.txt").string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& r : rows) {
    EXPECT_GT(r.predicted_s, 0.0) << r.deck;
    std::printf("%-10s %-40s published %8.2f s predicted %8.2f s error %+6.1f%%\n", r.group.c_str(),
                std::filesystem::path(r.deck).filename().c_str(), r.published_s, r.predicted_s, 100 * r.error());
  }
  // Issue #25's rows (Megatron-LM SC'21 Tables 1 and 2 on A100, Llama 3 405B on H100) within 5%
  // mean and 10% max.
  const sim::ValidationSummary pub = sim::summarize(rows, "published");
  EXPECT_EQ(pub.rows, 15);
  EXPECT_LE(pub.mean_abs_error, 0.05);
  EXPECT_LE(pub.max_abs_error, 0.10);
  // Further published runs (Korthikanti'22 full and selective recompute, MT-NLG 530B): held at
  // their present errors (mean 8%, max 21%: MT-NLG's DeepSpeed runs are slower than the model, cause
  // open: docs/bench.md, "MT-NLG 530B").
  const sim::ValidationSummary other = sim::summarize(rows, "other");
  EXPECT_EQ(other.rows, 11);
  EXPECT_LE(other.mean_abs_error, 0.10);
  EXPECT_LE(other.max_abs_error, 0.23);
  // Memory: every run fits the memory model but Llama 3's at 8,192 GPUs, whose figure is held
  // where it is (docs/bench.md, "Llama 3 405B: memory": Megatron-LM's interleaved warm-up depth
  // against Llama's own schedule, whose group size N is not published).
  for (const auto& r : rows) {
    EXPECT_GT(r.limit_bytes, 0.0) << r.deck;
    const std::string name = std::filesystem::path(r.deck).stem().string();
    const double gib = r.memory_bytes / (1024.0 * 1024 * 1024);
    if (name == "llama3_405b_8192") {
      EXPECT_NEAR(gib, 95.9, 0.1) << name;
    } else {
      EXPECT_TRUE(r.fits()) << name << ": " << gib << " GiB per GPU, more than the usable "
                            << r.limit_bytes / (1024.0 * 1024 * 1024);
      EXPECT_GT(gib, 20.0) << name << ": a published run at this scale fills most of its GPUs";
    }
  }
  EXPECT_LT(took, 60.0) << "simulating the published runs should take seconds";
}

TEST(Validate, ABadListLineIsAnErrorNamingFileAndLine) {
  const auto dir = std::filesystem::temp_directory_path() / "atlas_test_validate";
  std::filesystem::create_directories(dir);
  const auto file = dir / "runs.txt";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("# comment\npublished x.deck fast \"nowhere\"\n", f);
  std::fclose(f);
  try {
    sim::validate_runs(file.string());
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("runs.txt:2: expected 'group deck t_iter_s \"source\"'"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atlas
