// SPDX-License-Identifier: MIT
// `atlas bench validate` (see validate.hpp): published runs' decks simulated, predicted vs
// published iteration time per row, mean and max error per group.
#include "atlas/sim/bench_validate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/paths.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/memory.hpp"
#include "atlas/sim/simulator.hpp"

namespace atlas::sim {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRunsFile = "inputs/validate/runs.txt";

struct RunLine {
  int number = 0;
  std::string group, deck, source;
  double published_s = 0.0;
};

std::vector<RunLine> read_runs(const std::string& file) {
  const std::string text = deck::read_text_file(file, deck::kMaxDeckBytes, "validation list");
  std::vector<RunLine> out;
  std::vector<std::string> problems;
  std::istringstream in(text);
  std::string raw;
  int number = 0;
  while (std::getline(in, raw)) {
    ++number;
    std::istringstream line(deck::strip_comment(raw));
    RunLine r;
    r.number = number;
    std::string t;
    if (!(line >> r.group)) continue;  // blank or comment
    line >> r.deck >> t;
    std::getline(line, r.source);
    const auto q0 = r.source.find('"');
    const auto q1 = r.source.rfind('"');
    const auto v = units::parse_double(t);
    if (r.deck.empty() || !v || !(*v > 0) || q0 == std::string::npos || q1 == q0) {
      problems.push_back(fmt::format("{}:{}: expected 'group deck t_iter_s \"source\"' (t_iter_s > 0), got '{}'",
                                     file, number, raw));
      continue;
    }
    r.source = r.source.substr(q0 + 1, q1 - q0 - 1);
    r.published_s = *v;
    out.push_back(r);
  }
  if (out.empty() && problems.empty()) problems.push_back(fmt::format("{}: no runs listed", file));
  if (!problems.empty()) throw ConfigError(problems);
  return out;
}

}  // namespace

std::vector<ValidationRow> validate_runs(const std::string& runs_file, const std::vector<std::string>& overrides) {
  std::vector<ValidationRow> rows;
  const fs::path dir = fs::path(runs_file).parent_path();
  for (const RunLine& r : read_runs(runs_file)) {
    const std::string path = (dir / r.deck).string();
    deck::JobShape shape;
    shape.world_size = -1;
    shape.cuda_built = true;
    Config cfg = deck::parse_and_validate(path, deck::read_text_file(path), overrides, shape);
    deck::read_device_profiles(cfg);
    const SimResult s = simulate(cfg);
    ValidationRow v;
    v.group = r.group;
    v.deck = path;
    v.source = r.source;
    v.published_s = r.published_s;
    v.predicted_s = s.step_ms / 1e3;
    v.bubble = s.bubble_fraction;
    v.gpus = s.gpus;
    const sched::ScheduleMemory mem = sched::memory_per_gpu(s.cost, s.table);
    v.memory_bytes = mem.peak_bytes;
    v.limit_bytes = mem.limit_bytes;
    v.memory_fits = mem.fits();
    rows.push_back(v);
  }
  return rows;
}

ValidationSummary summarize(const std::vector<ValidationRow>& rows, const std::string& group) {
  ValidationSummary s;
  double sum = 0.0;
  for (const auto& r : rows) {
    if (r.group != group) continue;
    ++s.rows;
    sum += std::abs(r.error());
    s.max_abs_error = std::max(s.max_abs_error, std::abs(r.error()));
  }
  if (s.rows > 0) s.mean_abs_error = sum / s.rows;
  return s;
}

const atlas::bench::Spec& validate_bench_spec() {
  static const atlas::bench::Spec spec{
      "validate", "published training runs (Megatron-LM, Llama 3, ...) simulated: predicted vs published step time",
      "[key=value ...]",
      {{"runs", "FILE", kRunsFile, "the list of runs: group deck t_iter_s \"source\" per line, decks beside it"}}};
  return spec;
}

int run_validate_bench(const atlas::bench::Args& args) {
  std::string file = args.text("runs");
  if (!args.given("runs")) {
    const auto found = core::find_data_file(kRunsFile);
    if (found) file = found->string();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto rows = validate_runs(file, args.overrides);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("# runs: {} ({} rows); each deck simulated by `atlas simulate` (its own table, 1F1B unless the deck "
             "says otherwise); error = predicted / published - 1\n", file, rows.size());
  const atlas::bench::Table table({{"group", "", 9, true},
                                   {"deck", "", 28, true},
                                   {"gpus", "", 6},
                                   {"published", "s", 13},
                                   {"predicted", "s", 13},
                                   {"error", "%", 9},
                                   {"bubble", "%", 10},
                                   {"memory", "GiB", 14},
                                   {"source", "", 1, true}});
  fmt::print("{}", table.head());
  for (const auto& r : rows)
    fmt::print("{}", table.row({r.group, fs::path(r.deck).stem().string(), std::to_string(r.gpus),
                                fmt::format("{:.2f}", r.published_s), fmt::format("{:.2f}", r.predicted_s),
                                fmt::format("{:+.1f}", 100 * r.error()), fmt::format("{:.1f}", 100 * r.bubble),
                                fmt::format("{:.1f}/{:.0f}{}", r.memory_bytes / units::kGiB, r.limit_bytes / units::kGiB,
                                            r.fits() ? "" : "!"),
                                r.source}));
  std::vector<std::string> groups;
  for (const auto& r : rows)
    if (std::find(groups.begin(), groups.end(), r.group) == groups.end()) groups.push_back(r.group);
  std::string text;
  for (const auto& g : groups) {
    const ValidationSummary s = summarize(rows, g);
    text += fmt::format("{}{}: {} rows, mean |error| {:.1f}%, max {:.1f}%", text.empty() ? "" : "; ", g, s.rows,
                        100 * s.mean_abs_error, 100 * s.max_abs_error);
  }
  // A published run that ran but does not fit the memory model is the model's error, as a time
  // off is: said under the table and in the footer.
  std::string misfits;
  for (const auto& r : rows)
    if (!r.fits()) misfits += (misfits.empty() ? "" : ", ") + fs::path(r.deck).stem().string();
  fmt::print("# memory: the memory model's peak per GPU / the usable memory of the deck's device (atlas simulate's "
             "check); '!' marks a run the model says does not fit\n");
  if (!misfits.empty()) text += "; over the memory model's limit: " + misfits;
  fmt::print("# simulated in {:.2f} s\n", took);
  fmt::print("{}", atlas::bench::footer("validate", text));
  return 0;
}

}  // namespace atlas::sim
