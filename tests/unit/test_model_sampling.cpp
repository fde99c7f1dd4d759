// SPDX-License-Identifier: MIT
// Token choice for atlas sample: greedy takes the largest logit (lowest id on ties), as top-k 1
// does without ties; drawn frequencies match softmax(logits / temperature) over many
// counter-based draws; top-k (ties with the k-th kept) and top-p keep exactly the tokens they
// should; bad parameters and bad logits are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "atlas/core/error.hpp"
#include "atlas/model/rng.hpp"
#include "atlas/model/sampling.hpp"

namespace atlas::model {
namespace {

constexpr int kDraws = 200000;

/// Frequencies of each id over kDraws draws with the counter-based uniform of `seed`.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplingParams& p, std::uint64_t seed = 7) {
  std::vector<double> f(logits.size(), 0.0);
  const std::uint64_t k = rng::key(seed, "test.sample");
  for (int i = 0; i < kDraws; ++i) f[static_cast<std::size_t>(sample_token(logits, p, rng::uniform(k, i)))] += 1.0;
  for (double& x : f) x /= kDraws;
  return f;
}

/// softmax(logits / t) restricted to `keep` (renormalised), in double.
std::vector<double> expected(const std::vector<float>& logits, double t, const std::vector<bool>& keep) {
  std::vector<double> e(logits.size(), 0.0);
  double z = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (keep[i]) z += e[i] = std::exp(static_cast<double>(logits[i]) / t);
  for (double& x : e) x /= z;
  return e;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  // 200k draws: the standard error of a frequency is <= 0.0012; 0.006 is five of them.
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.006) << "token " << i;
}

const std::vector<float> kLogits = {0.0F, std::log(2.0F), std::log(4.0F), std::log(1.0F / 2.0F), -3.0F};

TEST(Sampling, GreedyTakesTheLargestLogitLowestIdOnTies) {
  const std::vector<float> l = {1.0F, 3.0F, -2.0F, 3.5F};
  for (double u : {0.0, 0.3, 0.999999}) {
    EXPECT_EQ(sample_token(l, {0.0, 0, 1.0}, u), 3);
    EXPECT_EQ(sample_token(l, {1.0, 1, 1.0}, u), 3) << "top-k 1 is greedy at any temperature";
    EXPECT_EQ(sample_token(l, {5.0, 1, 1.0}, u), 3);
  }
  const std::vector<float> tied = {1.0F, 3.0F, -2.0F, 3.0F};
  for (double u : {0.0, 0.3, 0.999999}) EXPECT_EQ(sample_token(tied, {0.0, 0, 1.0}, u), 1) << "lowest id on ties";
}

TEST(Sampling, TopKKeepsTokensTiedWithTheKth) {
  // As transformers' TopKLogitsWarper: only logits below the k-th are removed.
  const std::vector<float> tied = {1.0F, 3.0F, -2.0F, 3.0F, 0.5F};
  expect_close(frequencies(tied, {1.0, 1, 1.0}), expected(tied, 1.0, {false, true, false, true, false}));
  expect_close(frequencies(tied, {1.0, 3, 1.0}), expected(tied, 1.0, {true, true, false, true, false}));
  const std::vector<float> three = {2.0F, 2.0F, 2.0F, 1.0F};
  expect_close(frequencies(three, {1.0, 2, 1.0}), expected(three, 1.0, {true, true, true, false}));
}

TEST(Sampling, FrequenciesFollowSoftmaxAtEachTemperature) {
  const std::vector<bool> all(kLogits.size(), true);
  for (double t : {1.0, 0.5, 2.0}) {
    SCOPED_TRACE("temperature " + std::to_string(t));
    expect_close(frequencies(kLogits, {t, 0, 1.0}), expected(kLogits, t, all));
  }
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  // Probabilities at t = 1: 1/7.55, 2/7.55, 4/7.55, 0.5/7.55, e^-3/7.55 -> the top 2 are ids 2 and 1.
  expect_close(frequencies(kLogits, {1.0, 2, 1.0}), expected(kLogits, 1.0, {false, true, true, false, false}));
  expect_close(frequencies(kLogits, {1.0, 3, 1.0}), expected(kLogits, 1.0, {true, true, true, false, false}));
  // k beyond the vocabulary keeps everything.
  expect_close(frequencies(kLogits, {1.0, 99, 1.0}), expected(kLogits, 1.0, std::vector<bool>(5, true)));
}

TEST(Sampling, TopPKeepsTheFewestTokensReachingP) {
  // Shares at t = 1: id 2 0.5298, id 1 0.2649, id 0 0.1325, id 3 0.0662, id 4 0.0066.
  expect_close(frequencies(kLogits, {1.0, 0, 0.5}), expected(kLogits, 1.0, {false, false, true, false, false}));
  expect_close(frequencies(kLogits, {1.0, 0, 0.6}), expected(kLogits, 1.0, {false, true, true, false, false}));
  expect_close(frequencies(kLogits, {1.0, 0, 0.9}), expected(kLogits, 1.0, {true, true, true, false, false}));
  // After top-k: top-k 2 leaves ids 2, 1 with shares 2/3, 1/3; top-p 0.6 keeps id 2 only.
  expect_close(frequencies(kLogits, {1.0, 2, 0.6}), expected(kLogits, 1.0, {false, false, true, false, false}));
  // The temperature comes first: at t = 4 the shares flatten (id 2 0.29, id 1 0.24), so p 0.5 keeps two.
  expect_close(frequencies(kLogits, {4.0, 0, 0.5}), expected(kLogits, 4.0, {false, true, true, false, false}));
}

TEST(Sampling, MinusInfinityIsNeverDrawnAndTheDrawIsAFunctionOfU) {
  const std::vector<float> l = {-INFINITY, 0.0F, -INFINITY, 0.0F};
  std::map<int, int> seen;
  for (int i = 0; i < 1000; ++i) ++seen[sample_token(l, {1.0, 0, 1.0}, i / 1000.0)];
  EXPECT_EQ(seen.size(), 2U);
  EXPECT_EQ(seen[1], 500);
  EXPECT_EQ(seen[3], 500);
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, 0.25), sample_token(l, {1.0, 0, 1.0}, 0.25));
}

TEST(Sampling, BadParametersAreErrorsNamingTheCaller) {
  auto message = [](const SamplingParams& p) {
    try {
      check_sampling(p, "atlas sample");
    } catch (const ConfigError& e) {
      return std::string(e.problems().at(0));
    }
    return std::string("no error");
  };
  EXPECT_NE(message({-1.0, 0, 1.0}).find("atlas sample: temperature -1 must be a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(message({NAN, 0, 1.0}).find("temperature nan"), std::string::npos);
  EXPECT_NE(message({1.0, -2, 1.0}).find("top-k -2 must be >= 0"), std::string::npos);
  EXPECT_NE(message({1.0, 0, 0.0}).find("top-p 0 must be in (0, 1]"), std::string::npos);
  EXPECT_NE(message({1.0, 0, 1.5}).find("top-p 1.5 must be in (0, 1]"), std::string::npos);
  EXPECT_EQ(message({0.0, 0, 1.0}), "no error");
}

TEST(Sampling, NonFiniteLogitsAreErrors) {
  auto message = [](const std::vector<float>& l) {
    try {
      (void)sample_token(l, {1.0, 0, 1.0}, 0.5);
    } catch (const ConfigError& e) {
      return std::string(e.problems().at(0));
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0.0F, NAN}).find("logit for token 1 is nan"), std::string::npos);
  EXPECT_NE(message({INFINITY, 0.0F}).find("logit for token 0 is inf"), std::string::npos);
  EXPECT_NE(message({-INFINITY, -INFINITY}).find("every one of the model's 2 logits is -inf"), std::string::npos);
}

}  // namespace
}  // namespace atlas::model
