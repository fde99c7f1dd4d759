// SPDX-License-Identifier: MIT
// Deck parser and validator: every error the parser can raise is triggered by a bad deck in
// tests/decks/bad/ (table-driven against expected_errors.txt); every deck in inputs/ validates;
// overrides, sections and the resolved deck round trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "atlas/bubbletea/requests.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/sim/profile.hpp"

namespace atlas::deck {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return env ? fs::path(env) : fs::path(ATLAS_SOURCE_DIR);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

/// Every problem the parser+validator reports for a deck, or {} if it is fine.
std::vector<std::string> problems_of(const std::string& name, const std::string& text, int ranks,
                                     const std::vector<std::string>& overrides = {}) {
  JobShape shape;
  shape.world_size = ranks;
  try {
    parse_and_validate(name, text, overrides, shape);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

const char* kMinimal =
    "cluster.dcs = east west\ncluster.gpus_per_dc = 4 4\ncluster.latency_ms = 0 10 10 0\n"
    "cluster.bandwidth_gbps = 0 1 1 0\nparallel.stages_per_dc = 1 1\n";

TEST(Units, ParsersAreStrict) {
  EXPECT_EQ(units::parse_bytes("4M"), 4u * 1024 * 1024);
  EXPECT_EQ(units::parse_bytes("256K"), 256u * 1024);
  EXPECT_EQ(units::parse_bytes("1GiB"), 1024ull * 1024 * 1024);
  EXPECT_EQ(units::parse_bytes("17"), 17u);
  EXPECT_FALSE(units::parse_bytes("4Q"));
  EXPECT_FALSE(units::parse_bytes("-4K"));
  EXPECT_FALSE(units::parse_bytes("99999999999999999999"));
  EXPECT_EQ(units::parse_int("42"), 42);
  EXPECT_FALSE(units::parse_int("42x"));
  EXPECT_FALSE(units::parse_int(" 42"));
  EXPECT_EQ(units::parse_int("+42"), 42);
  EXPECT_EQ(units::parse_int("-42"), -42);
  EXPECT_FALSE(units::parse_int("+-5")) << "one sign (it read -5)";
  EXPECT_FALSE(units::parse_int("++5"));
  EXPECT_EQ(units::parse_double("1e-3"), 1e-3);
  EXPECT_FALSE(units::parse_double("+-1.5"));
  EXPECT_EQ(units::parse_double("+1.5"), 1.5);
  EXPECT_FALSE(units::parse_double("inf"));
  EXPECT_EQ(units::parse_bool("1"), true);
  EXPECT_FALSE(units::parse_bool("yes"));
  EXPECT_EQ(units::format_bytes_exact(4u * 1024 * 1024), "4M");
  EXPECT_EQ(units::format_bytes_exact(1000), "1000");
}

TEST(Deck, OverridesHoldNoQuoteAndAQuotedNumberListIsTheList) {
  // A quote inside a value cannot be written back (resolved.deck, --deck-out, a checkpoint's deck
  // did not parse again); a number list quoted whole (as a shell passes it) is the list.
  try {
    (void)parse("q", kMinimal, {"run.name=a\"b"});
    FAIL() << "a quote in a value was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("expected a string without double quotes"));
  }
  const Config c = parse("q", kMinimal, {"cluster.gpus_per_dc=\"4 4\"", "cluster.latency_ms=\"0 5 5 0\""});
  EXPECT_EQ(c.cluster.gpus_per_dc, (std::vector<int>{4, 4}));
  EXPECT_EQ(c.cluster.latency_ms, (std::vector<double>{0, 5, 5, 0}));
  // Quoted element by element: still the elements.
  EXPECT_EQ(parse("q", kMinimal, {"cluster.gpus_per_dc=\"4\" \"4\""}).cluster.gpus_per_dc, (std::vector<int>{4, 4}));
  EXPECT_THROW((void)parse("q", kMinimal, {"cluster.dcs=a\"b\" west"}), ConfigError);
}

TEST(Deck, AKeyOverriddenTwiceWithDifferentValuesIsWarnedOf) {
  // The last wins (a script appends its own after the user's), but no longer silently.
  const auto w = repeated_overrides({"train.micro_batches=2", "run.steps=5", "train.micro_batches = 8", "run.steps=5"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], "train.micro_batches is set 2 times on the command line ('2', then '8'): the last, '8', is used");
  EXPECT_TRUE(repeated_overrides({"a.b=1", "c.d=2"}).empty());
  EXPECT_EQ(parse("o", kMinimal, {"train.micro_batches=2", "train.micro_batches=8"}).train.micro_batches, 8);
}

TEST(Deck, OneDefinitionOfTheGlobalBatchAndTokensPerStep) {
  // dp x micro_batches x micro_batch_size sequences of seq_len tokens: the figure training's
  // tokens/s, the simulator, the planner and the benchmarks all divide by (bench sim left out
  // micro_batch_size before it used this).
  const Config c = parse("mem", kMinimal,
                         {"parallel.dp_size=3", "train.micro_batches=4", "train.micro_batch_size=2", "model.seq_len=16",
                          "cluster.gpus_per_dc=8 8"});
  EXPECT_EQ(c.sequences_per_step(), 3 * 4 * 2);
  EXPECT_EQ(c.tokens_per_step(), 3 * 4 * 2 * 16);
}

TEST(Deck, MinimalDeckGetsEveryDefault) {
  const Config c = parse("mem", kMinimal, {});
  EXPECT_EQ(c.cluster.dcs, (std::vector<std::string>{"east", "west"}));
  EXPECT_EQ(c.parallel.pp_size(), 2);
  EXPECT_EQ(c.wan.rails, 4);
  EXPECT_EQ(c.wan.chunk_bytes, 256u * 1024);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::OneFOneB);
  EXPECT_TRUE(c.model.layers_per_stage.empty());
  EXPECT_DOUBLE_EQ(c.cluster.latency(0, 1), 10.0);
}

TEST(Deck, SectionsCommentsQuotesAndOverrides) {
  const std::string text = std::string(kMinimal) +
                           "[wan]\nrails = 8   # inline comment\nchunk_bytes = 1M\n"
                           "[run]\nname = \"my run # not a comment\"\n";
  const Config c = parse("mem", text, {"wan.rails=16", "train.lr=0.5"});
  EXPECT_EQ(c.wan.rails, 16);  // the override wins over the deck
  EXPECT_EQ(c.wan.chunk_bytes, 1024u * 1024);
  EXPECT_EQ(c.run.name, "my run # not a comment");
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
}

// The restart loop and a requeued Slurm job pass run.resume=latest; a fine-tune's start named in
// the deck file (which they cannot read) must survive as the fallback, or a restart before the
// run's first checkpoint would start from random weights.
TEST(Deck, CommandLineLatestKeepsTheDecksResumePathAsTheFallback) {
  const std::string deck = std::string(kMinimal) + "[run]\nresume = \"base/step-000100.h5\"\n";
  const Config c = parse("mem", deck, {"run.resume=latest"});
  EXPECT_EQ(c.run.resume, "latest");
  EXPECT_EQ(c.run.resume_fallback, "base/step-000100.h5");
  // A fallback given anywhere wins, an empty one included (the user cleared it).
  EXPECT_EQ(parse("mem", deck, {"run.resume=latest", "run.resume_fallback=other.h5"}).run.resume_fallback,
            "other.h5");
  EXPECT_EQ(parse("mem", deck, {"run.resume=latest", "run.resume_fallback="}).run.resume_fallback, "");
  EXPECT_EQ(parse("mem", deck + "resume_fallback = d.h5\n", {"run.resume=latest"}).run.resume_fallback, "d.h5");
  // Nothing to keep: no override, an override that is not latest, a deck without a path.
  EXPECT_EQ(parse("mem", deck, {}).run.resume_fallback, "");
  EXPECT_EQ(parse("mem", deck, {"run.resume=x.h5"}).run.resume_fallback, "");
  EXPECT_EQ(parse("mem", kMinimal, {"run.resume=latest"}).run.resume_fallback, "");
  EXPECT_EQ(parse("mem", std::string(kMinimal) + "run.resume = latest\n", {"run.resume=latest"}).run.resume_fallback,
            "");
  // An emulated run starts from no checkpoint: the restart of an emulated rehearsal of a
  // fine-tune deck must not get the deck's path as a fallback it would refuse.
  EXPECT_EQ(parse("mem", deck, {"run.resume=latest", "device.backend=emulated"}).run.resume_fallback, "");
}

TEST(Deck, BadOverridesAreReportedWithTheDeckProblems) {
  const auto p = problems_of("mem", std::string(kMinimal) + "wan.rails = 0\n", -1,
                             {"wan.rialz=3", "nonsense", "train.lr=x"});
  ASSERT_EQ(p.size(), 4u) << ::testing::PrintToString(p);
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("mem:6: wan.rails = \"0\": expected an integer in [1, 64]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("command line: unknown key 'wan.rialz' (did you mean 'wan.rails'")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("command line: cannot read override 'nonsense': expected key=value")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("command line: train.lr = \"x\": expected a number in [0, 1000]")));
  // The hint names what dropping the override brings back: the deck's line where it has one.
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("train.lr = \"x\": expected a number in [0, 1000]\n  hint: drop "
                                                          "the override to use the default (")));
  const auto q = problems_of("mem", std::string(kMinimal) + "wan.rails = 8\n", -1, {"wan.rails=0"});
  ASSERT_EQ(q.size(), 1u) << ::testing::PrintToString(q);
  EXPECT_THAT(q[0], ::testing::HasSubstr("command line: wan.rails = \"0\": expected an integer in [1, 64]\n  hint: drop "
                                         "the override to use the deck's value (8, mem:6)"));
}

TEST(Deck, TypeErrorsAndCrossFieldProblemsAreReportedTogether) {
  const auto p = problems_of("mem", std::string(kMinimal) + "model.heads = 3\ntrain.lr = fast\n", 8,
                             {"parallel.dp_size=2"});
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("train.lr = \"fast\": expected a number in [0, 1000]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("model.hidden = 128 is not divisible by model.heads = 3")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("= 4 ranks, but the job has 8")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("drop the override")).Times(0));
  // A missing required key makes cross-field checks pointless: only it is reported.
  const auto q = problems_of("mem", "cluster.dcs = a b\nmodel.heads = 3\n", 8);
  EXPECT_THAT(q, ::testing::Contains(::testing::HasSubstr("missing required key 'cluster.gpus_per_dc'")));
  EXPECT_THAT(q, ::testing::Not(::testing::Contains(::testing::HasSubstr("not divisible"))));
}

// The behaviour switches that were environment variables before #23 are deck keys: defaults,
// overrides, resolved.deck; a bad value is a config error naming the key.
TEST(Deck, BehaviourSwitchesAreDeckKeys) {
  const Config d = parse("mem", kMinimal, {});
  EXPECT_EQ(d.wan.tcp_congestion, "auto");
  EXPECT_EQ(d.wan.warmup_bytes, 1024u * 1024);
  EXPECT_EQ(d.device.sched_batch, SchedBatch::Auto);
  EXPECT_DOUBLE_EQ(d.device.nccl_timeout_s, 300.0);
  EXPECT_EQ(d.ckpt.transfer, CkptTransfer::Auto);
  EXPECT_EQ(parse("mem", kMinimal, {"ckpt.transfer=collective"}).ckpt.transfer, CkptTransfer::Collective);
  EXPECT_THAT(problems_of("mem", kMinimal, -1, {"ckpt.transfer=fast"}),
              ::testing::Contains(::testing::HasSubstr("ckpt.transfer = \"fast\": expected one of: auto, collective, independent")));
  const Config c = parse("mem", kMinimal,
                         {"wan.tcp_congestion=reno", "wan.warmup_bytes=0", "device.sched_batch=false",
                          "device.nccl_timeout_s=42.5"});
  EXPECT_EQ(c.wan.tcp_congestion, "reno");
  EXPECT_EQ(c.wan.warmup_bytes, 0u);
  EXPECT_EQ(c.device.sched_batch, SchedBatch::Off);
  EXPECT_DOUBLE_EQ(c.device.nccl_timeout_s, 42.5);
  EXPECT_EQ(parse("mem", kMinimal, {"device.sched_batch=true"}).device.sched_batch, SchedBatch::On);
  const std::string resolved = resolved_deck(c);
  for (const char* line : {"\nwan.tcp_congestion = reno\n", "\nwan.warmup_bytes = 0\n", "\ndevice.sched_batch = false\n",
                           "\ndevice.nccl_timeout_s = 42.5\n"})
    EXPECT_NE(resolved.find(line), std::string::npos) << line;
  const std::string help = Schema::instance().help_text();
  for (const char* key : {"wan.tcp_congestion", "wan.warmup_bytes", "device.sched_batch", "device.nccl_timeout_s"})
    EXPECT_NE(help.find(key), std::string::npos) << key;
}

TEST(Deck, BadBehaviourSwitchesAreConfigErrors) {
  const auto p = problems_of("mem", kMinimal, -1,
                             {"wan.warmup_bytes=lots", "device.sched_batch=1", "device.nccl_timeout_s=0",
                              "bubbletea.pipeline=stage"});
  ASSERT_EQ(p.size(), 4u) << ::testing::PrintToString(p);
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("bubbletea.pipeline = \"stage\": expected one of: replica, dc")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("wan.warmup_bytes = \"lots\": expected")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("device.sched_batch = \"1\": expected one of: auto, true, false")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("device.nccl_timeout_s = \"0\": expected a number in [0.001, 1000000]")));
  for (const char* bad : {"BBR", "no such", "\"\"", "averyveryverylongname"}) {
    const auto q = problems_of("mem", kMinimal, -1, {std::string("wan.tcp_congestion=") + bad});
    EXPECT_THAT(q, ::testing::Contains(::testing::HasSubstr("is not a TCP congestion control name"))) << bad;
  }
}

TEST(Deck, ResolvedDeckIsAValidDeckThatRoundTrips) {
  const Config a = parse("mem", std::string(kMinimal) + "wan.chunk_bytes = 3000\nrun.name = \"a b\"\n", {});
  const std::string resolved = resolved_deck(a);
  const Config b = parse("resolved", resolved, {});
  EXPECT_EQ(resolved_deck(b), resolved);
  EXPECT_EQ(b.wan.chunk_bytes, 3000u);
  EXPECT_EQ(b.run.name, "a b");
  EXPECT_EQ(b.cluster.latency_ms, a.cluster.latency_ms);
  // Every schema key appears exactly once.
  for (const auto& k : Schema::instance().keys())
    EXPECT_NE(resolved.find("\n" + k.key + " = "), std::string::npos) << k.key;
}

TEST(Deck, ResolvedDeckWritesNumbersAsTheUserWroteThem) {
  // The shortest text that reads back to the same double: 43.49, not 43.490000000000002 (what
  // `atlas plan` printed in the plan's deck), and the value round-trips to the bit.
  const Config a = parse("mem", kMinimal,
                         {"cluster.latency_ms=0 43.49 43.49 0", "cluster.bandwidth_gbps=0 0.1 0.1 0", "schedule.bwd_over_fwd=2.1"});
  const std::string resolved = resolved_deck(a);
  EXPECT_THAT(resolved, ::testing::HasSubstr("\ncluster.latency_ms = 0 43.49 43.49 0\n"));
  EXPECT_THAT(resolved, ::testing::HasSubstr("\ncluster.bandwidth_gbps = 0 0.1 0.1 0\n"));
  EXPECT_THAT(resolved, ::testing::HasSubstr("\nschedule.bwd_over_fwd = 2.1\n"));
  const Config b = parse("resolved", resolved, {});
  EXPECT_EQ(b.cluster.latency_ms, a.cluster.latency_ms);
  EXPECT_EQ(b.cluster.bandwidth_gbps, a.cluster.bandwidth_gbps);
  EXPECT_EQ(b.schedule.bwd_over_fwd, a.schedule.bwd_over_fwd);
}

TEST(Deck, MissingFileIsAConfigErrorNamingIt) {
  try {
    read_text_file("/nonexistent/deck.deck");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot read deck '/nonexistent/deck.deck'"));
  }
}

TEST(Deck, DeckFileMustBeARegularFileOfBoundedSize) {
  // /dev/zero used to end in bad_alloc and a FIFO blocked for ever: both are refused at once.
  const fs::path dir = fs::temp_directory_path() / ("atlas-deck-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path fifo = dir / "deck.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path big = dir / "big.deck";
  {
    std::ofstream out(big);
    const std::string line = "# " + std::string(1000, 'x') + "\n";
    for (int i = 0; i < 17 * 1024; ++i) out << line;
  }
  const std::vector<std::pair<std::string, std::string>> cases{
      {"/dev/zero", "cannot read deck '/dev/zero': it is a character device, expected a regular file"},
      {fifo.string(), "cannot read deck '" + fifo.string() + "': it is a FIFO (named pipe), expected a regular file"},
      {dir.string(), "cannot read deck '" + dir.string() + "': it is a directory, expected a regular file"},
      {big.string(), "cannot read deck '" + big.string() + "': it has 17460224 bytes, more than the 16M a deck may have"},
  };
  for (const auto& [path, message] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)read_text_file(path);
      ADD_FAILURE() << path << " was read";
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0) << path;
  }
  fs::remove_all(dir);
}

TEST(Deck, FilesNamedByKeysAreReadTheSameWay) {
  // A device profile, a WAN profile and a request trace are refused like a deck, naming the key.
  Config cfg = parse("mem", kMinimal, {"plan.profiles=/dev/zero", "bubbletea.trace=/dev/zero"});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no ConfigError)");
  };
  EXPECT_THAT(message([&] { deck::read_device_profiles(cfg); }),
              ::testing::HasSubstr("plan.profiles: cannot read device profile '/dev/zero': it is a character device"));
  EXPECT_THAT(message([&] { (void)bubbletea::load_requests(cfg, 2); }),
              ::testing::HasSubstr("bubbletea.trace: cannot read request trace '/dev/zero': it is a character device"));
  EXPECT_THAT(message([&] { (void)sim::load_wan_profile("/dev/zero"); }),
              ::testing::HasSubstr("cannot read WAN profile '/dev/zero': it is a character device"));
}

TEST(Deck, IntegersAreCheckedAgainstTheirFieldsType) {
  // Range-checked as 64-bit values and then narrowed to int, these ran as 4 and -1.
  const auto p = problems_of("mem", kMinimal, -1,
                             {"model.layers=4294967300", "run.steps=9223372036854775807", "ckpt.keep_last=-2147483649"});
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr(
                     "command line: model.layers = \"4294967300\": expected an integer in [1, 4096]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr(
                     "command line: run.steps = \"9223372036854775807\": expected an integer in [1, 1000000000]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("command line: ckpt.keep_last = \"-2147483649\"")));
  // A 64-bit field takes the whole 64-bit range.
  EXPECT_EQ(parse("mem", kMinimal, {"run.seed=9223372036854775807"}).run.seed, 9223372036854775807LL);
  // Every integer key has a bound inside its field's type, and the text says which.
  for (const auto& k : Schema::instance().keys()) {
    if (k.type != ValueType::Int && k.type != ValueType::IntList) continue;
    ASSERT_TRUE(k.type_min && k.type_max) << k.key;
    if (k.max) {
      EXPECT_LE(*k.max, static_cast<double>(*k.type_max)) << k.key;
    }
    if (k.min) {
      EXPECT_GE(*k.min, static_cast<double>(*k.type_min)) << k.key;
    }
    EXPECT_THAT(k.expectation(), ::testing::HasSubstr(" in [")) << k.key;
  }
}

TEST(Deck, NumbersThatSizeMemoryOrTimeAreBounded) {
  // Every number has an upper bound (model.init_std excepted: a diverging init is the run's
  // NaN check to catch), and every duration fits std::chrono.
  for (const auto& k : Schema::instance().keys()) {
    const bool number = k.type == ValueType::Int || k.type == ValueType::IntList || k.type == ValueType::Float ||
                        k.type == ValueType::FloatList || k.type == ValueType::Bytes;
    if (!number || k.key == "model.init_std" || k.key == "run.seed") continue;
    EXPECT_TRUE(k.max) << k.key << " has no upper bound";
    const bool duration = k.key.ends_with("_s") || k.key.ends_with("_ms") || k.key.ends_with("_us");
    if (duration && k.max) {
      EXPECT_LE(*k.max, limits::kMaxSeconds) << k.key;
    }
  }
  const auto p = problems_of("mem", kMinimal, -1,
                             {"wan.recv_timeout_s=1e300", "train.micro_batches=3000000", "bubbletea.guard_ms=nan"});
  ASSERT_EQ(p.size(), 3u) << ::testing::PrintToString(p);
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("wan.recv_timeout_s = \"1e300\": expected a number in [0.001, 1000000]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("train.micro_batches = \"3000000\": expected an integer in [1, 65536]")));
  EXPECT_THAT(p, ::testing::Contains(::testing::HasSubstr("bubbletea.guard_ms = \"nan\"")));
}

TEST(Deck, RejectedDivisorsNeverReachTheDivisions) {
  // model.heads = 0 (or x, -4, empty) divided model.hidden: SIGFPE. A rejected value is
  // reported once, and the cross-field checks see the key's default.
  for (const char* v : {"0", "x", "-4", "", "99999999999999999999"}) {
    const auto p = problems_of("mem", std::string(kMinimal) + "parallel.tp_size = 2\n", -1,
                               {std::string("model.heads=") + v, std::string("bubbletea.heads=") + v,
                                "bubbletea.enabled=true", std::string("parallel.tp_size=") + v});
    ASSERT_EQ(p.size(), 3u) << v << ": " << ::testing::PrintToString(p);
    for (const auto& m : p) EXPECT_THAT(m, ::testing::HasSubstr("expected an integer in [1, ")) << v;
  }
}

TEST(Deck, EveryBadDeckGivesItsDocumentedMessage) {
  const fs::path dir = source_dir() / "tests/decks/bad";
  std::istringstream table(slurp(dir / "expected_errors.txt"));
  std::string line;
  std::set<std::string> covered;
  int cases = 0;
  while (std::getline(table, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto bar1 = line.find('|');
    const auto bar2 = line.find('|', bar1 + 1);
    ASSERT_NE(bar2, std::string::npos) << line;
    const std::string file = trim(line.substr(0, bar1));
    const int ranks = std::stoi(trim(line.substr(bar1 + 1, bar2 - bar1 - 1)));
    std::string pattern = trim(line.substr(bar2 + 1));
    // "\n" in the table stands for a newline inside one problem (the hint line).
    for (auto pos = pattern.find("\\n"); pos != std::string::npos; pos = pattern.find("\\n"))
      pattern.replace(pos, 2, "\n");
    const auto problems = problems_of(file, slurp(dir / file), ranks);
    ASSERT_FALSE(problems.empty()) << file << " was accepted";
    const std::regex re(pattern);
    bool found = false;
    for (const auto& p : problems) found = found || std::regex_search(p, re);
    EXPECT_TRUE(found) << file << ": no problem matches /" << pattern << "/; got:\n"
                       << ::testing::PrintToString(problems);
    covered.insert(file);
    ++cases;
  }
  // Every bad deck in the folder is in the table.
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".deck") {
      EXPECT_TRUE(covered.count(e.path().filename().string())) << e.path() << " has no expected message";
    }
  EXPECT_GE(cases, 57);
}

TEST(Deck, ACudaDeckIsModelledOnABuildWithoutCuda) {
  // schedule, simulate and plan (world_size -1) model a GPU deck on any build, e.g. on a login
  // node without CUDA; a launched job (train, bench) on such a build is refused.
  EXPECT_TRUE(problems_of("mem", kMinimal, -1, {"device.backend=cuda"}).empty());
  EXPECT_THAT(problems_of("mem", kMinimal, 2, {"device.backend=cuda"}),
              ::testing::Contains(::testing::HasSubstr("device.backend = cuda, but this binary was built without CUDA")));
}

TEST(Deck, EveryExampleDeckInInputsValidates) {
  int decks = 0;
  for (const auto& e : fs::directory_iterator(source_dir() / "inputs")) {
    if (e.path().extension() != ".deck") continue;
    // As a CUDA build sees it: a GPU deck (device.backend = cuda) validates there, and nothing
    // else in a deck depends on the build.
    JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;
    std::vector<std::string> p;
    try {
      parse_and_validate(e.path().string(), slurp(e.path()), {}, shape);
    } catch (const ConfigError& err) {
      p = err.problems();
    }
    EXPECT_TRUE(p.empty()) << e.path() << ":\n" << ::testing::PrintToString(p);
    ++decks;
  }
  EXPECT_GE(decks, 1);
}

TEST(Deck, InputsReadmeIsGeneratedFromTheSchema) {
  const std::string readme = slurp(source_dir() / "inputs/README.md");
  EXPECT_EQ(readme, Schema::instance().markdown())
      << "inputs/README.md is stale: regenerate with `atlas schedule --help-deck-markdown > inputs/README.md`";
}

TEST(Deck, SuggestionsFindNearKeys) {
  const auto s = Schema::instance().suggestions("wan.rail_count");
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), "wan.rails");
  EXPECT_EQ(Schema::instance().suggestions("parallel.dp").front(), "parallel.dp_size");
}

}  // namespace
}  // namespace atlas::deck
