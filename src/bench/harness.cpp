// SPDX-License-Identifier: MIT
// The benchmark harness: one parser (Boost.Program_options), one header, columns with units,
// one footer (see the header file). No benchmark lives here.
#include "atlas/bench/harness.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>
#include <utility>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "atlas/core/build_info.hpp"
#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"

namespace atlas::bench {

namespace po = boost::program_options;

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    // Quoted when it holds a space, so the header line can be pasted back into a shell.
    out += w.find(' ') == std::string::npos ? w : "\"" + w + "\"";
  }
  return out;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  return in >> one ? one : "?";
}

}  // namespace

// ---- Args ----

const Option& Args::option(const std::string& name) const {
  ATLAS_ASSERT(m_spec != nullptr, "bench::Args used before bench::parse");
  for (const auto& o : m_spec->options)
    if (o.name == name) return o;
  ATLAS_THROW(Internal, "atlas bench " << bench << ": option --" << name << " is read but not in its Spec");
}

bool Args::given(const std::string& name) const {
  (void)option(name);
  return m_values.count(name) > 0;
}

std::string Args::text(const std::string& name) const {
  const Option& o = option(name);
  const auto it = m_values.find(name);
  return it == m_values.end() ? o.def : it->second;
}

void Args::fail(const std::string& why) const {
  throw ConfigError(fmt::format("atlas bench {}: {}\n  {}", bench, why, m_spec ? usage(*m_spec) : std::string()));
}

int Args::integer(const std::string& name, std::int64_t lo, std::int64_t hi) const {
  const std::string v = text(name);
  const auto n = units::parse_int(v);
  if (!n || *n < lo || *n > hi) fail(fmt::format("--{} '{}': expected an integer in [{}, {}]", name, v, lo, hi));
  return static_cast<int>(*n);
}

double Args::number(const std::string& name, double lo, double hi) const {
  const std::string v = text(name);
  const auto d = units::parse_double(v);
  if (!d || *d < lo || *d > hi) fail(fmt::format("--{} '{}': expected a number in [{}, {}]", name, v, lo, hi));
  return *d;
}

std::uint64_t Args::bytes(const std::string& name, std::uint64_t lo, std::uint64_t hi) const {
  const std::string v = text(name);
  const auto b = units::parse_bytes(v);
  if (!b || *b < lo || *b > hi)
    fail(fmt::format("--{} '{}': expected bytes in [{}, {}] (binary suffixes K, M, G)", name, v,
                     units::format_bytes_exact(lo), units::format_bytes_exact(hi)));
  return *b;
}

std::vector<std::string> Args::list(const std::string& name) const {
  const std::string v = text(name);
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= v.size() && !v.empty()) {
    const std::size_t c = std::min(v.find(',', pos), v.size());
    out.push_back(v.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

std::string Args::choice(const std::string& name, const std::vector<std::string>& choices) const {
  const std::string v = text(name);
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    std::string all;
    for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
    fail(fmt::format("--{} '{}': expected one of {}", name, v, all));
  }
  return v;
}

std::string Args::deck(const std::string& def) const {
  // A second deck was ignored silently (bench step, schedules, profile, overlap took the first).
  if (positional.size() > 1) fail("unknown argument '" + positional[1] + "' (one DECK at most)");
  return positional.empty() ? def : positional.front();
}

// ---- parsing ----

Args parse(const Spec& spec, const std::vector<std::string>& words) {
  Args a;
  a.bench = spec.name;
  a.words = words;
  a.m_spec = &spec;
  po::options_description desc;
  for (const auto& o : spec.options) {
    if (o.value.empty()) desc.add_options()(o.name.c_str(), o.help.c_str());
    else desc.add_options()(o.name.c_str(), po::value<std::string>(), o.help.c_str());
  }
  desc.add_options()("operand", po::value<std::vector<std::string>>());
  po::positional_options_description operands;
  operands.add("operand", -1);
  po::variables_map vm;
  try {
    // Long options only, never abbreviated (--rep is not --repeat), as the deck's keys.
    const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                      po::command_line_style::long_allow_next;
    po::store(po::command_line_parser(words).options(desc).positional(operands).style(style).run(), vm);
  } catch (const po::unknown_option& e) {
    a.fail(fmt::format("unknown option '{}'", e.get_option_name()));
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter)
      a.fail(fmt::format("option '{}' needs a value", e.get_option_name()));
    a.fail(e.what());
  } catch (const po::multiple_occurrences& e) {
    a.fail(fmt::format("option '{}' is given more than once", e.get_option_name()));
  } catch (const po::error& e) {
    a.fail(e.what());
  }
  for (const auto& [name, value] : vm) {
    if (name == "operand") {
      for (const auto& w : value.as<std::vector<std::string>>())
        (w.find('=') != std::string::npos ? a.overrides : a.positional).push_back(w);
    } else {
      a.m_values[name] = value.empty() ? std::string() : value.as<std::string>();
    }
  }
  // Operands keep their command-line order (program_options keeps it for one option).
  return a;
}

std::string usage(const Spec& spec) {
  std::string line = "usage: atlas bench " + spec.name;
  if (!spec.operands.empty()) line += " " + spec.operands;
  std::string lines;
  for (const auto& o : spec.options) {
    line += o.value.empty() ? fmt::format(" [--{}]", o.name) : fmt::format(" [--{} {}]", o.name, o.value);
    const std::string def = o.def.empty() ? "" : fmt::format(" (default {})", o.def);
    lines += fmt::format("\n    --{:<22} {}{}", o.value.empty() ? o.name : o.name + " " + o.value, o.help, def);
  }
  return line + lines;
}

// ---- output ----

std::string header(const Args& args) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  std::string out = fmt::format("# command: atlas bench {}{}{}\n", args.bench, args.words.empty() ? "" : " ",
                                join(args.words));
  out += fmt::format("# build: atlas {} ({}, {}), {}, HDF5 {}\n", build::kVersion, build::kGitSha, build::kBuildType,
                     build::kCompiler, build::kHdf5Version);
  out += fmt::format("# machine: {}, {} hardware threads, load (1-min) {}, {}\n", host,
                     std::max(1u, std::thread::hardware_concurrency()), load_average(), when);
  return out;
}

std::string Table::head() const {
  std::string out = "#";
  for (const auto& c : m_columns) {
    const std::string name = c.unit.empty() ? c.name : c.name + "[" + c.unit + "]";
    out += " " + (c.left ? fmt::format("{:<{}}", name, c.width) : fmt::format("{:>{}}", name, c.width));
  }
  return out + "\n";
}

std::string Table::row(const std::vector<std::string>& cells) const {
  ATLAS_ASSERT(cells.size() == m_columns.size(),
               "a table row has " << cells.size() << " cells for " << m_columns.size() << " columns");
  std::string out = " ";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const Column& c = m_columns[i];
    out += " " + (c.left ? fmt::format("{:<{}}", cells[i], c.width) : fmt::format("{:>{}}", cells[i], c.width));
  }
  return out + "\n";
}

std::string footer(const std::string& label, const std::string& text) { return label + ": " + text + "\n"; }

}  // namespace atlas::bench
