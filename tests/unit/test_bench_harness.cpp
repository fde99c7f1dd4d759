// SPDX-License-Identifier: MIT
// The benchmark harness (include/atlas/bench/harness.hpp): one parser for every `atlas bench X`
// (options, flags, deck and key=value operands, typed values with clear errors), the usage text,
// the header (command line, build, machine), columns with units and the footer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "atlas/bench/harness.hpp"
#include "atlas/core/error.hpp"

namespace atlas::bench {
namespace {

using ::testing::HasSubstr;

const Spec kSpec{"demo",
                 "a benchmark for the test",
                 "[DECK] [key=value ...]",
                 {{"rounds", "N", "3", "rounds"},
                  {"size", "BYTES", "1M", "bytes"},
                  {"gap-ms", "MS", "30", "gap"},
                  {"list", "LIST", "1,2,4", "a list"},
                  {"mode", "MODE", "auto", "a choice"},
                  {"quiet", "", "", "a flag"}}};

std::string config_error(const std::vector<std::string>& words, const char* option = nullptr) {
  try {
    const Args a = parse(kSpec, words);
    if (option != nullptr) (void)a.integer(option, 1, 10);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(BenchHarness, ParsesOptionsFlagsDecksAndOverrides) {
  const Args a = parse(kSpec, {"inputs/x.deck", "--rounds", "5", "run.steps=4", "--size=256K", "--quiet",
                               "parallel.stages_per_dc=1 1"});
  EXPECT_EQ(a.bench, "demo");
  EXPECT_EQ(a.positional, (std::vector<std::string>{"inputs/x.deck"}));
  EXPECT_EQ(a.overrides, (std::vector<std::string>{"run.steps=4", "parallel.stages_per_dc=1 1"}));
  EXPECT_EQ(a.deck("inputs/default.deck"), "inputs/x.deck");
  EXPECT_EQ(a.integer("rounds", 1, 10), 5);
  EXPECT_EQ(a.bytes("size", 1, 1u << 30), 256u * 1024);
  EXPECT_TRUE(a.flag("quiet"));
  EXPECT_TRUE(a.given("rounds"));
  EXPECT_FALSE(a.given("gap-ms"));
  EXPECT_DOUBLE_EQ(a.number("gap-ms", 0, 100), 30.0);  // the Spec's default
  EXPECT_EQ(a.list("list"), (std::vector<std::string>{"1", "2", "4"}));
  EXPECT_EQ(a.choice("mode", {"auto", "fast"}), "auto");
  const Args none = parse(kSpec, {});
  EXPECT_EQ(none.deck("inputs/default.deck"), "inputs/default.deck");
  EXPECT_FALSE(none.flag("quiet"));
}

TEST(BenchHarness, BadCommandLinesAreConfigErrorsNamingTheBenchAndTheUsage) {
  EXPECT_THAT(config_error({"--roundz", "3"}), HasSubstr("atlas bench demo: "));
  EXPECT_THAT(config_error({"--roundz", "3"}), HasSubstr("--roundz"));
  EXPECT_THAT(config_error({"--roundz", "3"}), HasSubstr("usage: atlas bench demo [DECK] [key=value ...] [--rounds N]"));
  EXPECT_THAT(config_error({"--round", "3"}), HasSubstr("--round"));  // never abbreviated
  EXPECT_THAT(config_error({"--rounds"}), HasSubstr("--rounds"));     // a missing value
  EXPECT_THAT(config_error({"--rounds", "x"}, "rounds"), HasSubstr("--rounds 'x': expected an integer in [1, 10]"));
  EXPECT_THAT(config_error({"--rounds", "11"}, "rounds"), HasSubstr("--rounds '11': expected an integer in [1, 10]"));
  const Args a = parse(kSpec, {"--size", "lots", "--mode", "slow"});
  EXPECT_THROW((void)a.bytes("size", 1, 100), ConfigError);
  try {
    (void)a.choice("mode", {"auto", "fast"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--mode 'slow': expected one of auto, fast"));
  }
  // An option the bench reads but its Spec does not list is a bug, not a user error.
  EXPECT_THROW((void)a.text("nonsense"), Error);
}

TEST(BenchHarness, UsageListsEveryOptionWithItsDefault) {
  const std::string u = usage(kSpec);
  EXPECT_THAT(u, HasSubstr("[--quiet]"));
  EXPECT_THAT(u, HasSubstr("[--size BYTES]"));
  EXPECT_THAT(u, HasSubstr("(default 1M)"));
}

TEST(BenchHarness, HeaderColumnsAndFooter) {
  const Args a = parse(kSpec, {"--rounds", "2", "parallel.stages_per_dc=1 1"});
  const std::string h = header(a);
  EXPECT_THAT(h, HasSubstr("# command: atlas bench demo --rounds 2 \"parallel.stages_per_dc=1 1\"\n"));
  EXPECT_THAT(h, HasSubstr("# build: atlas "));
  EXPECT_THAT(h, HasSubstr("# machine: "));
  EXPECT_THAT(h, HasSubstr("hardware threads"));
  const Table t({{"name", "", 6, true}, {"step", "ms", 10}});
  EXPECT_EQ(t.head(), "# name     step[ms]\n");
  EXPECT_EQ(t.row({"a", "1.5"}), "  a             1.5\n");
  EXPECT_THROW((void)t.row({"a"}), Error);
  EXPECT_EQ(footer("speedup", "1.74 x"), "speedup: 1.74 x\n");
}

}  // namespace
}  // namespace atlas::bench
