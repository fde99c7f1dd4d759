// SPDX-License-Identifier: MIT
// Deck fuzzer (issue 27): seeded mutants of every deck in inputs/ (numbers replaced by 0, -1,
// 2^31, 2^32+4, 2^63-1, 1e300, nan, inf, junk, empty; lines deleted, duplicated, swapped; unknown
// keys; keys added; garbage lines; cut files; overrides on the command line). Each mutant runs
// what `atlas schedule DECK` runs (parse, validate, layout, cost model, the schedule tables) in a
// forked child with a time limit; a sample also runs through the real binary (`atlas schedule`,
// `atlas simulate`, `atlas plan`). Every run must end without a signal, with exit code 0, 1 or
// 2, and with every config error naming a key (or the file). Not a test of the messages' words.
// Environment: ATLAS_FUZZ_SEED, ATLAS_FUZZ_MUTANTS (default 1200), ATLAS_FUZZ_BINARY_EVERY (default
// 40), ATLAS_BIN (the binary; without it the binary sample is skipped).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "atlas/bubbletea/cost.hpp"
#include "atlas/core/error.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/deck/schema.hpp"
#include "atlas/sched/cost_model.hpp"
#include "atlas/sched/schedule.hpp"
#include "atlas/topo/layout.hpp"

extern char** environ;

namespace atlas::deck {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path source_dir() {
  const char* env = std::getenv("ATLAS_SOURCE_DIR");
  return env ? fs::path(env) : fs::path(ATLAS_SOURCE_DIR);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::uint64_t env_u64(const char* name, std::uint64_t def) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::strtoull(v, nullptr, 10) : def;
}

// ---- mutants ----

struct Mutant {
  std::string base;                    ///< the inputs/ deck it came from
  std::string text;                    ///< the mutated deck
  std::vector<std::string> overrides;  ///< key=value words for the command line
  std::vector<std::string> edits;      ///< what was done, for the failure message
};

const std::vector<std::string>& special_values() {
  static const std::vector<std::string> v{
      "0", "-1", "-4", "1", "2", "3", "7", "64", "1000", "65536", "2147483647", "2147483648",
      "4294967296", "4294967300", "9223372036854775807", "9223372036854775808",
      "99999999999999999999", "-2147483649", "-9223372036854775808", "1e300", "-1e300", "1e-300",
      "1e7", "1e6", "0.5", "-0.5", "nan", "inf", "-inf", "NaN", "", "x", "junk", "4Q", "1.5.2",
      "0x10", "1e3", "+5", "--5", "true", "false", "\"quoted\"", "\"unterminated", "4 4",
      "0 0 0 0", "1 2 3 4 5 6 7 8 9", "/dev/zero", "/tmp", "1G", "16G", "1T", "9999999T", "#",
      "a b c", "\xc3\xa9", std::string(400, '9'), "3000000", "10000000"};
  return v;
}

bool is_key_line(const std::string& line, std::string* key, std::string* value) {
  static const std::regex re(R"(^\s*([a-z0-9_.]+)\s*=\s*(.*?)\s*$)");
  std::smatch m;
  if (!std::regex_match(line, m, re)) return false;
  if (key) *key = m[1];
  if (value) *value = m[2];
  return true;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

/// Drops a trailing comment so a value can be replaced whole.
std::string strip_comment(const std::string& v) {
  const auto h = v.find('#');
  std::string s = h == std::string::npos ? v : v.substr(0, h);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

Mutant make_mutant(const std::vector<std::pair<std::string, std::string>>& decks, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const auto& [name, text] = decks[pick(decks.size())];
  Mutant m;
  m.base = name;
  std::vector<std::string> lines = split_lines(text);
  const auto& vals = special_values();
  const auto& keys = Schema::instance().keys();
  auto key_lines = [&] {
    std::vector<std::size_t> idx;
    for (std::size_t i = 0; i < lines.size(); ++i)
      if (is_key_line(lines[i], nullptr, nullptr)) idx.push_back(i);
    return idx;
  };
  // Mostly one edit, so that many mutants stay valid and reach the scheduler.
  const std::size_t roll = pick(10);
  const int n_edits = roll < 6 ? 1 : roll < 9 ? 2 : 3;
  static const std::vector<std::string> mild{"0", "1", "2", "3", "4", "8", "16", "100", "0.5", "true", "false"};
  bool truncate = false;
  for (int e = 0; e < n_edits; ++e) {
    const auto kl = key_lines();
    const std::size_t op = pick(20);
    std::string key, value;
    if (op < 6 && !kl.empty()) {  // a key's whole value
      const std::size_t i = kl[pick(kl.size())];
      is_key_line(lines[i], &key, &value);
      const std::string v = pick(3) == 0 ? mild[pick(mild.size())] : vals[pick(vals.size())];
      lines[i] = key + " = " + v;
      m.edits.push_back("set " + key + " = " + v);
    } else if (op < 9 && !kl.empty()) {  // one number inside a value (list elements too)
      const std::size_t i = kl[pick(kl.size())];
      is_key_line(lines[i], &key, &value);
      auto words = split_list(strip_comment(value));
      if (words.empty()) words.emplace_back("0");
      const std::size_t w = pick(words.size());
      const std::size_t how = pick(4);
      std::string nv;
      if (how == 0) nv = vals[pick(vals.size())];
      else if (how == 1) nv = words[w] + "000";
      else if (how == 2) nv = "-" + words[w];
      else nv = words[w] + "e300";
      words[w] = nv;
      std::string joined;
      for (const auto& x : words) joined += (joined.empty() ? "" : " ") + x;
      lines[i] = key + " = " + joined;
      m.edits.push_back("element " + std::to_string(w) + " of " + key + " -> " + nv);
    } else if (op < 10 && !kl.empty()) {  // delete a line
      const std::size_t i = kl[pick(kl.size())];
      m.edits.push_back("delete line '" + lines[i] + "'");
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 11 && !kl.empty()) {  // duplicate a key
      const std::size_t i = kl[pick(kl.size())];
      m.edits.push_back("duplicate line '" + lines[i] + "'");
      lines.push_back(lines[i]);
    } else if (op < 12) {  // an unknown key
      const std::string& k = keys[pick(keys.size())].key;
      std::string u = k;
      u[k.find('.') + 1 + pick(k.size() - k.find('.') - 1)] = 'q';
      if (pick(3) == 0) u = "frob.widget_count";
      lines.push_back(u + " = 4");
      m.edits.push_back("unknown key " + u);
    } else if (op < 13 && kl.size() >= 2) {  // swap two keys' values
      const std::size_t a = kl[pick(kl.size())];
      const std::size_t b = kl[pick(kl.size())];
      std::string ka, va, kb, vb;
      is_key_line(lines[a], &ka, &va);
      is_key_line(lines[b], &kb, &vb);
      lines[a] = ka + " = " + vb;
      lines[b] = kb + " = " + va;
      m.edits.push_back("swap values of " + ka + " and " + kb);
    } else if (op < 17) {  // any schema key (most are absent from the decks) to a special value
      const std::string& k = keys[pick(keys.size())].key;
      std::string v = pick(3) == 0 ? mild[pick(mild.size())] : vals[pick(vals.size())];
      if (pick(4) == 0 && !kl.empty()) {  // or another key's value
        std::string k2;
        is_key_line(lines[kl[pick(kl.size())]], &k2, &v);
        v = strip_comment(v);
      }
      if (pick(4) == 0) {
        m.overrides.push_back(k + "=" + v);
        m.edits.push_back("override " + k + "=" + v);
      } else {
        lines.push_back(k + " = " + v);
        m.edits.push_back("add " + k + " = " + v);
      }
    } else if (op < 19) {  // a line the parser cannot read
      static const std::vector<std::string> garbage{
          "[Bad Section", "= 4", "novalue", "wan.rails 4", "\x01\x02\x7f", "[run]\nsteps = 5",
          "[model]\nheads = 0", "Run.Steps = 4", "run..steps = 4", ".run = 1", "run.steps = \"4",
          "[", "[]", "====", "run.steps == 4", "parallel.dp_size = 2 # \"comment"};
      const std::string g = garbage[pick(garbage.size())];
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(pick(lines.size() + 1)), g);
      m.edits.push_back("insert '" + g + "'");
    } else {
      truncate = true;
    }
  }
  m.text = join_lines(lines);
  if (truncate && !m.text.empty()) {
    const std::size_t at = pick(m.text.size());
    m.text.resize(at);
    m.edits.push_back("cut at byte " + std::to_string(at));
  }
  return m;
}

// ---- running a mutant ----

struct Outcome {
  int code = -1;         ///< exit code, or -1 when killed
  int signal = 0;        ///< the signal that ended it
  bool timed_out = false;
  std::string messages;  ///< config errors, one per line block
  double seconds = 0.0;
};

/// What `atlas schedule` does between reading the deck and printing, with run_app's mapping of
/// exceptions to exit codes. Runs in the forked child.
int schedule_pipeline(const Mutant& m, std::string& messages) {
  try {
    JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = false;
    Config cfg = parse_and_validate("mutant.deck", m.text, m.overrides, shape);
    read_device_profiles(cfg);
    const topo::Layout layout(cfg.parallel);  // the deck's layout, parallel.dp_across_dcs included
    const sched::CostModel cost = sched::cost_model(cfg, layout);
    std::vector<ScheduleKind> kinds{ScheduleKind::GPipe, ScheduleKind::OneFOneB};
    // The atlas search times many candidate tables: only on the smaller tables, to bound the run.
    const double slots = 6.0 * cfg.train.micro_batches * layout.pp_size() * layout.dp_size();
    if (slots <= 20000) kinds.push_back(ScheduleKind::Atlas);
    for (ScheduleKind k : kinds) {
      const sched::ScheduleTable t = sched::build_schedule(cost, sched::schedule_options(cfg, k));
      if (cfg.bubbletea.enabled) (void)sched::place_prefill(t, bubbletea::prefill_plan(cfg, layout, t));
    }
    return 0;
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) messages += "ERROR: " + p + "\n";
    return static_cast<int>(ExitCode::Config);
  } catch (const Error& e) {
    messages = std::string("ERROR: ") + e.what() + "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    messages = std::string("ERROR: internal error: ") + e.what() + "\n";
    return static_cast<int>(ExitCode::Internal);
  }
}

/// Reads `fd` to its end (or the deadline) while the child runs, then reaps it.
Outcome collect(pid_t pid, int fd, double limit_s) {
  Outcome o;
  const auto t0 = Clock::now();
  char buf[4096];
  for (;;) {
    const double left = limit_s - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) {
      o.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child closed its end (it is exiting)
    if (o.messages.size() < 1'000'000) o.messages.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (WIFEXITED(status)) o.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  return o;
}

Outcome run_in_child(const Mutant& m, double limit_s) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string messages;
    const int code = schedule_pipeline(m, messages);
    std::size_t off = 0;
    while (off < messages.size()) {
      const ssize_t n = ::write(fds[1], messages.data() + off, messages.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    ::_exit(code);  // no atexit handlers, no gtest teardown in the child
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return {};
  }
  return collect(pid, fds[0], limit_s);
}

/// The real binary: `atlas CMD FILE overrides... [extra]`, stderr captured, stdout dropped.
Outcome run_binary(const std::string& bin, const std::string& cmd, const std::string& file,
                   const Mutant& m, const std::vector<std::string>& extra, double limit_s) {
  std::vector<std::string> words{bin, cmd, file};
  words.insert(words.end(), m.overrides.begin(), m.overrides.end());
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return {};
  }
  return collect(pid, fds[0], limit_s);
}

// ---- the checks ----

/// Every config error must name what it is about: a deck key, the deck file, or (command-line
/// override problems) the command line.
std::string unnamed_problem(const std::string& messages, const std::string& file) {
  const auto& keys = Schema::instance().keys();
  std::vector<std::string> problems;
  for (const auto& line : split_lines(messages)) {
    if (line.rfind("ERROR: ", 0) == 0) problems.push_back(line.substr(7));
    else if (!problems.empty()) problems.back() += "\n" + line;
  }
  for (const auto& p : problems) {
    bool named = p.find(file) != std::string::npos || p.find("command line") != std::string::npos;
    for (const auto& k : keys) named = named || p.find(k.key) != std::string::npos;
    if (!named) return p;
  }
  return {};
}

std::string describe(const Mutant& m, std::uint64_t seed, std::size_t index) {
  std::string s = "mutant " + std::to_string(index) + " (seed " + std::to_string(seed) + ", from " + m.base +
                  "; reproduce with ATLAS_FUZZ_SEED=" + std::to_string(seed) + ")\nedits:";
  for (const auto& e : m.edits) s += "\n  " + e;
  s += "\noverrides:";
  for (const auto& o : m.overrides) s += " '" + o + "'";
  s += "\n---- deck ----\n" + m.text + "---- end ----";
  return s;
}

void check_outcome(const Outcome& o, const std::string& what, const std::string& file, const std::string& desc,
                   bool allow_usage) {
  ASSERT_FALSE(o.timed_out) << what << " ran past its time limit\n" << desc;
  ASSERT_EQ(o.signal, 0) << what << " ended by signal " << o.signal << "\n" << o.messages << desc;
  const bool ok = o.code == 0 || o.code == 2 || (allow_usage && o.code == 1);
  ASSERT_TRUE(ok) << what << " exit code " << o.code << " (expected 0, 1 or 2)\n" << o.messages << desc;
  if (o.code == 2) {
    ASSERT_NE(o.messages.find("ERROR: "), std::string::npos) << what << ": exit 2 without a message\n" << desc;
    const std::string bad = unnamed_problem(o.messages, file);
    ASSERT_TRUE(bad.empty()) << what << ": a config error names no key:\n  " << bad << "\n" << desc;
  }
}

TEST(DeckFuzz, MutatedDecksEndInAConfigErrorNamingTheKeyOrRun) {
  const std::uint64_t seed = env_u64("ATLAS_FUZZ_SEED", 27);
  const std::size_t count = env_u64("ATLAS_FUZZ_MUTANTS", 1200);
  std::vector<std::pair<std::string, std::string>> decks;
  for (const auto& e : fs::directory_iterator(source_dir() / "inputs"))
    if (e.path().extension() == ".deck") decks.emplace_back(e.path().filename().string(), slurp(e.path()));
  std::sort(decks.begin(), decks.end());
  ASSERT_GE(decks.size(), 5u);
  // Relative paths in the decks (profiles, traces) resolve from the checkout, as in ctest.
  fs::current_path(source_dir());
  std::printf("deck fuzzer: seed %llu, %zu mutants of %zu decks in inputs/ (ATLAS_FUZZ_SEED, ATLAS_FUZZ_MUTANTS)\n",
              static_cast<unsigned long long>(seed), count, decks.size());

  const char* bin_env = std::getenv("ATLAS_BIN");
  const std::string bin = bin_env ? bin_env : "";
  const bool have_bin = !bin.empty() && ::access(bin.c_str(), X_OK) == 0;
  if (!have_bin) std::printf("deck fuzzer: no ATLAS_BIN: the sample through the binary is skipped\n");
  const fs::path tmp = fs::temp_directory_path() / ("atlas-deck-fuzz-" + std::to_string(::getpid()));
  fs::create_directories(tmp);

  // Every `every`-th mutant also runs through the binary (ATLAS_FUZZ_BINARY_EVERY, for longer
  // campaigns of simulate and plan).
  const std::size_t every = std::max<std::uint64_t>(1, env_u64("ATLAS_FUZZ_BINARY_EVERY", 40));
  const auto t0 = Clock::now();
  int codes[7] = {};
  int binary_runs = 0;
  double slowest = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t mseed = seed * 1'000'003ULL + i;
    const Mutant m = make_mutant(decks, mseed);
    const std::string desc = describe(m, seed, i);
    const Outcome o = run_in_child(m, 30.0);
    check_outcome(o, "in-process schedule", "mutant.deck", desc, false);
    ++codes[std::clamp(o.code, 0, 6)];
    slowest = std::max(slowest, o.seconds);
    if (!have_bin || i % every != 7 % every) continue;
    // The sample through the real binary: atlas schedule, and every third also simulate or plan.
    const fs::path file = tmp / ("mutant_" + std::to_string(i) + ".deck");
    {
      std::ofstream out(file, std::ios::binary);
      out << m.text;
    }
    const Outcome b = run_binary(bin, "schedule", file.string(), m, {"--quiet"}, 60.0);
    check_outcome(b, "atlas schedule", file.string(), desc, true);
    EXPECT_EQ(b.code, o.code) << "atlas schedule and the in-process run disagree\n" << b.messages << desc;
    ++binary_runs;
    if ((i / every) % 3 == 0) {
      const Outcome s = run_binary(bin, "simulate", file.string(), m, {}, 60.0);
      check_outcome(s, "atlas simulate", file.string(), desc, true);
      ++binary_runs;
    } else if ((i / every) % 3 == 1 && m.base.rfind("plan_", 0) != 0 && m.base.rfind("sim_gpt", 0) != 0) {
      // The planner searches every shape of the cluster: the 1,000-GPU decks take seconds each.
      const Outcome p = run_binary(bin, "plan", file.string(), m, {"--quiet"}, 60.0);
      check_outcome(p, "atlas plan", file.string(), desc, true);
      ++binary_runs;
    }
    fs::remove(file);
  }
  fs::remove_all(tmp);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("deck fuzzer: %zu mutants in %.1f s (slowest %.2f s): %d ran (exit 0), %d config errors (exit 2); "
              "%d runs of the binary\n",
              count, secs, slowest, codes[0], codes[2], binary_runs);
  EXPECT_GE(count, 1000u);
  EXPECT_GT(codes[0], 0) << "no mutant ran: the mutations are too rough to reach the scheduler";
  EXPECT_GT(codes[2], 0);
}

}  // namespace
}  // namespace atlas::deck
