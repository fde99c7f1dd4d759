// SPDX-License-Identifier: MIT
// The one benchmark harness (issue #23): every `atlas bench NAME` is a Spec (name, one-line help,
// options) registered in src/app/bench_cmd.cpp, its command line parsed by one parser
// (Boost.Program_options) and its output in one style: a header (the command line, the build,
// the machine), '#'-comment lines and columns with units, and a footer line `NAME: conclusion`
// with the ratios measured side by side in the same run. Not for behaviour switches: what changes
// the thing measured is a deck key (DECK key=value), not an option.
//
// This room sits below the rooms whose benchmarks it runs (wan, io, model, sim, bubbletea): it
// knows nothing of MPI, decks or models.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace atlas::bench {

/// One `--name [VALUE]` option of a benchmark.
struct Option {
  std::string name;   ///< without the leading "--"
  std::string value;  ///< what the value is, for the usage line ("N", "BYTES", "LIST"); "" = a flag
  std::string def;    ///< the default, as the user would type it ("" = none)
  std::string help;   ///< one line
};

/// What a benchmark takes on its command line.
struct Spec {
  std::string name;                 ///< `atlas bench NAME`
  std::string help;                 ///< one line, for `atlas bench` without a name
  std::string operands;             ///< the words that are not options, e.g. "[DECK] [key=value ...]"
  std::vector<Option> options;
};

/// A parsed command line. Typed getters check the value and throw ConfigError naming the option,
/// the value and what was expected; every rank parses the same words, so the error is collective.
class Args {
 public:
  std::string bench;                    ///< the Spec's name
  std::vector<std::string> words;       ///< the words after the name, as given
  std::vector<std::string> positional;  ///< operands without '=' (decks)
  std::vector<std::string> overrides;   ///< key=value deck overrides, in order

  /// True when the option was on the command line.
  [[nodiscard]] bool given(const std::string& name) const;
  /// A flag's presence.
  [[nodiscard]] bool flag(const std::string& name) const { return given(name); }
  /// The value, else the Spec's default.
  [[nodiscard]] std::string text(const std::string& name) const;
  [[nodiscard]] int integer(const std::string& name, std::int64_t lo, std::int64_t hi) const;
  [[nodiscard]] double number(const std::string& name, double lo, double hi) const;
  /// Binary suffixes (K, M, G) as in decks.
  [[nodiscard]] std::uint64_t bytes(const std::string& name, std::uint64_t lo, std::uint64_t hi) const;
  /// A comma-separated list ("1,2,4").
  [[nodiscard]] std::vector<std::string> list(const std::string& name) const;
  /// One of `choices`.
  [[nodiscard]] std::string choice(const std::string& name, const std::vector<std::string>& choices) const;
  /// The first operand, else `def`; a second operand fails (one DECK at most).
  [[nodiscard]] std::string deck(const std::string& def = "") const;
  /// Throws ConfigError "NAME: --option VALUE: why" with the usage line.
  [[noreturn]] void fail(const std::string& why) const;

 private:
  friend Args parse(const Spec& spec, const std::vector<std::string>& words);
  const Spec* m_spec = nullptr;
  std::map<std::string, std::string> m_values;  ///< given options (flags: "")
  [[nodiscard]] const Option& option(const std::string& name) const;
};

/// Parses `words` (the command line after `atlas bench NAME`) against `spec` with
/// Boost.Program_options: --name VALUE or --name=VALUE, flags, operands anywhere. Throws
/// ConfigError for an unknown option, a missing value or a repeated option. `spec` must outlive
/// the result. Not collective.
[[nodiscard]] Args parse(const Spec& spec, const std::vector<std::string>& words);

/// "usage: atlas bench NAME OPERANDS [--opt VALUE] ..." and one line per option.
[[nodiscard]] std::string usage(const Spec& spec);

/// The header every benchmark prints first (rank 0): the command line, the build and the
/// machine (host name, hardware threads, 1-minute load, UTC time), each a '#' line.
[[nodiscard]] std::string header(const Args& args);

/// A column of a table: a name, a unit ("" = none) and a printf-like width.
struct Column {
  std::string name;
  std::string unit;
  int width = 10;
  bool left = false;  ///< left-aligned (names, labels)
};

/// Columns with units: head() is the '#' line of names (unit in brackets); row() lays out cells
/// already formatted by the bench, so the figures print exactly as the bench chose.
class Table {
 public:
  explicit Table(std::vector<Column> columns) : m_columns(std::move(columns)) {}
  [[nodiscard]] std::string head() const;
  [[nodiscard]] std::string row(const std::vector<std::string>& cells) const;

 private:
  std::vector<Column> m_columns;
};

/// The footer: "LABEL: text" (the ratios or the conclusion), one line.
[[nodiscard]] std::string footer(const std::string& label, const std::string& text);

}  // namespace atlas::bench
