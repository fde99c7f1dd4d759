// SPDX-License-Identifier: MIT
// mpi/tags.hpp: the tag layout's ranges are disjoint, and a deck whose pipeline tags exceed the
// MPI's MPI_TAG_UB is a ConfigError naming the bound, the deck keys and a fix. And which command
// lines start MPI at all (app::needs_mpi: the offline commands do not, unless under a launcher).
// No MPI needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "atlas/app/app.hpp"
#include "atlas/core/error.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/mpi/comm.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::mpi {
namespace {

using ::testing::HasSubstr;

std::string config_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.problems().empty() ? std::string() : e.problems().front();
  }
  return "";
}

TEST(MpiTags, PipelineRangesAreDisjoint) {
  const int m = 64;
  const int e = 8;
  EXPECT_LT(tags::kWanPreflight, tags::kBoundaryBase);
  EXPECT_LT(tags::kEmbedding, tags::kBoundaryBase);
  EXPECT_NE(tags::kWanPreflight, tags::kEmbedding);
  EXPECT_EQ(tags::boundary(0, 0, m), tags::kBoundaryBase);
  EXPECT_EQ(tags::boundary(0, m - 1, m) + 1, tags::boundary(1, 0, m));  // activations, then gradients
  EXPECT_EQ(tags::boundary(1, m - 1, m) + 1, tags::eval(0, m));        // then eval batches
  EXPECT_EQ(tags::eval(e - 1, m), tags::pipeline_max(m, e));
  EXPECT_EQ(tags::token(0, 0, 5), 1);
  EXPECT_EQ(tags::token(0, 3, 5) + 1, tags::token(1, 0, 5) - 1);
  EXPECT_EQ(tags::token(2, 3, 5), tags::token_max(3, 5));  // the largest: last link, last position
  static_assert(tags::token(2, 3, 5) == tags::token_max(3, 5));
  // A table whose largest token is the bound fits (it was refused, one over).
  EXPECT_NO_THROW(tags::check_tokens(3, 5, 8, 14));
  EXPECT_THROW(tags::check_tokens(3, 5, 8, 13), ConfigError);
}

TEST(MpiTags, TypicalDecksFitTheStandardBound) {
  EXPECT_NO_THROW(tags::check_pipeline(1024, 64, tags::kStandardBound));
  EXPECT_NO_THROW(tags::check_tokens(8, 2049, 1024, tags::kStandardBound));
  // The largest deck the schema allows fits Open MPI's bound (2^31 - 1).
  const int max_micro = static_cast<int>(deck::limits::kMaxMicroBatches);
  EXPECT_NO_THROW(tags::check_pipeline(max_micro, max_micro, 2147483647));
}

TEST(MpiTags, ADeckAboveTheTagBoundIsAConfigErrorNamingBoundKeysAndFix) {
  const int max_micro = static_cast<int>(deck::limits::kMaxMicroBatches);
  EXPECT_THROW(tags::check_pipeline(max_micro, 10, tags::kStandardBound), ConfigError);
  const std::string msg = config_message([&] { tags::check_pipeline(max_micro, 10, tags::kStandardBound); });
  EXPECT_THAT(msg, HasSubstr("train.micro_batches = 65536"));
  EXPECT_THAT(msg, HasSubstr("train.eval_batches = 10"));
  EXPECT_THAT(msg, HasSubstr("MPI_TAG_UB is 32767"));
  EXPECT_THAT(msg, HasSubstr("need MPI message tags up to 131097"));
  // The fix it proposes fits, one more micro-batch does not.
  EXPECT_THAT(msg, HasSubstr("lower train.micro_batches to at most 16371"));
  EXPECT_NO_THROW(tags::check_pipeline(16371, 10, tags::kStandardBound));
  EXPECT_THROW(tags::check_pipeline(16372, 10, tags::kStandardBound), ConfigError);

  const std::string tokens = config_message([&] { tags::check_tokens(4, 10000, 4096, tags::kStandardBound); });
  EXPECT_THAT(tokens, HasSubstr("MPI_TAG_UB is 32767"));
  EXPECT_THAT(tokens, HasSubstr("train.micro_batches (now 4096)"));
}

// Offline commands and the help texts run without MPI_Init (Open MPI's singleton start-up took
// ~0.5 s of every `atlas plan`), except under a launcher, where every rank must join.
TEST(MpiEnvironment, OfflineCommandsStartWithoutMpiUnlessLaunched) {
  const char* const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID"};
  for (const char* v : launcher_vars) ::unsetenv(v);
  auto needs = [](std::vector<std::string> words) {
    words.insert(words.begin(), "atlas");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    return app::needs_mpi(static_cast<int>(argv.size()), argv.data());
  };
  ASSERT_FALSE(Environment::launched());
  for (const char* offline : {"schedule", "plan", "simulate", "report", "tokenize"})
    EXPECT_FALSE(needs({offline, "x.deck"})) << offline;
  EXPECT_FALSE(needs({}));
  EXPECT_FALSE(needs({"--help"}));
  EXPECT_FALSE(needs({"train", "--help-deck"}));
  EXPECT_FALSE(needs({"nosuch"}));
  for (const char* online : {"train", "bench", "profile", "export", "import"}) EXPECT_TRUE(needs({online, "x"})) << online;
  for (const char* v : launcher_vars) {
    ::setenv(v, "0", 1);
    EXPECT_TRUE(Environment::launched()) << v;
    EXPECT_TRUE(needs({"plan", "x.deck"})) << v;
    ::unsetenv(v);
  }
}

// A count past MPI-3's int (a tensor part of over 2^31 floats) throws instead of wrapping to a
// short message that both sides would agree on without an error.
TEST(MpiCount, ACountPastIntMaxIsAnErrorNotAWrappedCount) {
  EXPECT_EQ(detail::mpi_count(0), 0);
  EXPECT_EQ(detail::mpi_count(static_cast<std::size_t>(INT32_MAX)), INT32_MAX);
  try {
    (void)detail::mpi_count(static_cast<std::size_t>(INT32_MAX) * 4 + 8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::Internal);
    EXPECT_THAT(e.what(), HasSubstr("an MPI message of 8589934596 elements: MPI-3 counts are int"));
  }
}

}  // namespace
}  // namespace atlas::mpi
