// SPDX-License-Identifier: MIT
// Deck parsing: a line scan (for file:line in every message, duplicates and syntax), Boost's
// config-file parser (for sections and key recognition), then typed conversion by the schema.
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/log.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/schema.hpp"

namespace atlas::deck {

namespace po = boost::program_options;

namespace {

struct DeckLine {
  std::string key;
  std::string value;
  int line = 0;
};

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

bool valid_key(const std::string& k) {
  if (k.empty() || k.front() == '.' || k.back() == '.') return false;
  for (char c : k)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '_' || c == '.'))
      return false;
  return k.find("..") == std::string::npos;
}

std::string where(const std::string& file, int line) {
  return line > 0 ? file + ":" + std::to_string(line) : "command line";
}

std::string unknown_key_message(const std::string& key) {
  std::string msg = "unknown key '" + key + "'";
  const auto sugg = Schema::instance().suggestions(key);
  if (!sugg.empty()) {
    msg += " (did you mean '" + sugg.front() + "'";
    for (std::size_t i = 1; i < sugg.size(); ++i) msg += " or '" + sugg[i] + "'";
    msg += "?)";
  } else {
    msg += "\n  hint: every key is listed in inputs/README.md and by `atlas schedule --help-deck`";
  }
  return msg;
}

/// Line scan: every `key = value` with its line, in order; syntax problems and duplicates.
std::vector<DeckLine> scan(const std::string& file, const std::string& text, ProblemList& problems) {
  std::vector<DeckLine> out;
  std::map<std::string, int> seen;
  std::istringstream in(text);
  std::string raw, section;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = trim(strip_comment(raw));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3 || !valid_key(trim(line.substr(1, line.size() - 2)))) {
        problems.add(where(file, line_no) + ": bad section header '" + line +
                     "': expected [name] with lower-case letters, digits and _");
        continue;
      }
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      problems.add(where(file, line_no) + ": cannot read '" + line +
                   "': expected 'section.key = value' or '[section]'");
      continue;
    }
    std::string key = trim(line.substr(0, eq));
    const std::string value = trim(line.substr(eq + 1));
    if (!section.empty()) key = section + "." + key;
    if (!valid_key(key) || key.find('.') == std::string::npos) {
      problems.add(where(file, line_no) + ": bad key '" + key +
                   "': expected section.key in lower_snake case (e.g. wan.rails)");
      continue;
    }
    if (std::count(value.begin(), value.end(), '"') % 2 != 0) {
      problems.add(where(file, line_no) + ": " + key + " = " + value +
                   ": unterminated quoted string");
      continue;
    }
    if (auto it = seen.find(key); it != seen.end()) {
      problems.add(where(file, line_no) + ": key '" + key + "' is set twice (first at line " +
                   std::to_string(it->second) + ")\n  hint: keep one of the two lines");
      continue;
    }
    seen[key] = line_no;
    out.push_back({key, value, line_no});
  }
  return out;
}

/// Boost's config-file parser over the same text: it must agree that each key is known.
void boost_recognise(const std::string& file, const std::string& text,
                     std::vector<DeckLine>& lines, ProblemList& problems) {
  po::options_description desc;
  for (const auto& k : Schema::instance().keys())
    desc.add_options()(k.key.c_str(), po::value<std::string>());
  std::istringstream in(text);
  std::map<std::string, bool> registered;
  try {
    const auto parsed = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
    for (const auto& o : parsed.options) registered[o.string_key] = !o.unregistered;
  } catch (const po::error& e) {
    // The line scan reports syntax with line numbers; only report what it did not catch.
    if (problems.empty()) problems.add(file + ": " + e.what());
    return;
  }
  for (auto& l : lines) {
    const auto it = registered.find(l.key);
    // A key Boost did not see under this name (a "[ train ]" header with spaces: Boost keeps
    // them) is checked against the schema itself: it was accepted unchecked, typos included.
    if ((it != registered.end() && !it->second) || (it == registered.end() && !Schema::instance().find(l.key))) {
      problems.add(where(file, l.line) + ": " + unknown_key_message(l.key));
      l.key.clear();  // reported; skip conversion
    }
  }
}

}  // namespace

std::string strip_comment(const std::string& line) {
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') quoted = !quoted;
    if (line[i] == '#' && !quoted) return line.substr(0, i);
  }
  return line;
}


namespace {

/// A command-line run.resume = latest (the restart loop's, a requeued Slurm job's, a user's)
/// over a deck whose run.resume names a checkpoint (a fine-tune's start) keeps that checkpoint
/// as run.resume_fallback unless one is given: a restart before the run's first checkpoint
/// starts from those weights, not from random ones. The restart loop cannot read the deck, so
/// the rule lives here, next to the one place that sees both layers.
void keep_deck_resume_as_fallback(const std::map<std::string, DeckLine>& in_deck,
                                  std::map<std::string, DeckLine>& given) {
  const auto deck = in_deck.find("run.resume");
  const auto now = given.find("run.resume");
  if (deck == in_deck.end() || now == given.end() || now->second.line != 0) return;
  if (unquote(now->second.value) != "latest" || given.count("run.resume_fallback")) return;
  const std::string path = unquote(deck->second.value);
  if (path.empty() || path == "latest") return;
  // An emulated run keeps no checkpoint and starts from none: nothing to fall back to.
  if (const auto b = given.find("device.backend"); b != given.end() && unquote(b->second.value) == "emulated") return;
  given["run.resume_fallback"] = DeckLine{"run.resume_fallback", deck->second.value, deck->second.line};
}

/// Parses without throwing: every problem goes to `problems`; `unusable` is set when a required
/// key is missing or a line could not be read at all (then cross-field checks are pointless).
Config parse_collect(const std::string& file_name, const std::string& text,
                     const std::vector<std::string>& overrides, ProblemList& problems,
                     std::vector<std::string>& bad_keys, bool& unusable) {
  std::vector<DeckLine> lines = scan(file_name, text, problems);
  boost_recognise(file_name, text, lines, problems);

  std::map<std::string, DeckLine> given;
  for (const auto& l : lines)
    if (!l.key.empty()) given[l.key] = l;
  const std::map<std::string, DeckLine> in_deck = given;  // before the overrides (their hints)
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems.add("command line: cannot read override '" + o + "': expected key=value");
      continue;
    }
    const std::string key = trim(o.substr(0, eq));
    if (!Schema::instance().find(key)) {
      problems.add("command line: " + unknown_key_message(key));
      continue;
    }
    given[key] = DeckLine{key, trim(o.substr(eq + 1)), 0};
  }
  keep_deck_resume_as_fallback(in_deck, given);

  Config cfg;
  for (const auto& spec : Schema::instance().keys()) {
    std::string text_value;
    int line = -1;
    if (auto it = given.find(spec.key); it != given.end()) {
      text_value = it->second.value;
      line = it->second.line;
    } else if (spec.required) {
      problems.add(file_name + ": missing required key '" + spec.key + "' (" + spec.help +
                   "; expects " + spec.expectation() + ")");
      unusable = true;
      continue;
    } else {
      text_value = spec.default_text;
    }
    std::string why;
    const auto v = spec.convert(text_value, why);
    if (!v) {
      std::string msg = (line < 0 ? std::string("schema default") : where(file_name, line)) + ": " +
                        spec.key + " = \"" + unquote(text_value) + "\": expected " + why;
      // Dropping an override brings back the deck's line where it has one, not the default.
      const auto deck_line = in_deck.find(spec.key);
      if (line == 0 && deck_line != in_deck.end())
        msg += "\n  hint: drop the override to use the deck's value (" + unquote(deck_line->second.value) + ", " +
               where(file_name, deck_line->second.line) + ")";
      else if (!spec.required)
        msg += std::string("\n  hint: ") + (line == 0 ? "drop the override" : "remove the line") +
               " to use the default (" + spec.default_text + ")";
      problems.add(msg);
      bad_keys.push_back(spec.key);
      if (spec.required) {
        unusable = true;
      } else if (const auto d = spec.convert(spec.default_text, why)) {
        // Cross-field checks then see the default, never the field's zero (model.heads = 0
        // would divide by zero); their messages about this key are dropped below.
        spec.set(cfg, *d);
      }
      continue;
    }
    spec.set(cfg, *v);
  }
  return cfg;
}

}  // namespace

Config parse(const std::string& file_name, const std::string& text,
             const std::vector<std::string>& overrides) {
  ProblemList problems;
  std::vector<std::string> bad_keys;
  bool unusable = false;
  Config cfg = parse_collect(file_name, text, overrides, problems, bad_keys, unusable);
  problems.throw_if_any();
  return cfg;
}

Config parse_and_validate(const std::string& file_name, const std::string& text,
                          const std::vector<std::string>& overrides, const JobShape& shape) {
  ProblemList problems;
  std::vector<std::string> bad_keys;
  bool unusable = false;
  Config cfg = parse_collect(file_name, text, overrides, problems, bad_keys, unusable);
  // Report everything at once: cross-field problems too, unless a required key is missing.
  // A key whose value was rejected keeps its default here, so cross-field messages that name
  // it would be about a value the user did not write: those are left out.
  if (!unusable) {
    for (auto& v : validate(cfg, shape)) {
      bool about_bad_key = false;
      for (const auto& k : bad_keys) about_bad_key = about_bad_key || v.find(k) != std::string::npos;
      if (!about_bad_key) problems.add(std::move(v));
    }
  }
  problems.throw_if_any();
  return cfg;
}

namespace {

/// Reads `path` if it is a regular file of at most `max_bytes`; otherwise returns "" and sets
/// `error` to the reason, naming the file. Never blocks on a FIFO and never reads a device.
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes, std::string& error,
                              const std::string& kind_of_file = "deck") {
  const std::string what = "cannot read " + kind_of_file + " '" + path + "': ";
  // O_NONBLOCK: opening a FIFO with no writer must not wait; fstat then says what it is.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error = what + (errno == ENOENT ? std::string("no such file") : std::strerror(errno)) +
            " (expected a readable " + kind_of_file + " file)";
    return {};
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error = what + std::strerror(errno);
    return {};
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    error = what + "it is " + kind + ", expected a regular file\n  hint: write the " + kind_of_file +
            " to a file and pass its path";
    return {};
  }
  const auto too_big = [&](std::uint64_t n) {
    return what + "it has " + std::to_string(n) + " bytes, more than the " +
           units::format_bytes_exact(max_bytes) + " a " + kind_of_file + " may have\n  hint: is this the " +
           kind_of_file + "? It is a short text file";
  };
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    error = too_big(static_cast<std::uint64_t>(st.st_size));
    return {};
  }
  std::string text;
  text.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > max_bytes) break;  // grew past the limit while read
      text.resize(std::min<std::size_t>(text.size() + 65536, max_bytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = what + std::strerror(errno);
      return {};
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) {
    error = too_big(got);
    return {};
  }
  text.resize(got);
  return text;
}

}  // namespace

std::string read_text_file(const std::string& path, std::uint64_t max_bytes, const std::string& kind_of_file) {
  std::string error;
  std::string text = read_regular_file(path, max_bytes, error, kind_of_file);
  if (!error.empty()) throw ConfigError(error);
  return text;
}

std::vector<std::string> repeated_overrides(const std::vector<std::string>& overrides) {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> order;
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) continue;  // parse_collect reports it
    const std::string key = trim(o.substr(0, eq));
    auto& v = values[key];
    if (v.empty()) order.push_back(key);
    v.push_back(trim(o.substr(eq + 1)));
  }
  std::vector<std::string> out;
  for (const auto& key : order) {
    const auto& v = values[key];
    if (std::all_of(v.begin(), v.end(), [&](const std::string& x) { return x == v.front(); })) continue;
    std::string list;
    for (const auto& x : v) list += (list.empty() ? "'" : ", then '") + x + "'";
    out.push_back(fmt::format("{} is set {} times on the command line ({}): the last, '{}', is used", key, v.size(),
                              list, v.back()));
  }
  return out;
}

Config load(const mpi::Comm& comm, const std::string& path,
            const std::vector<std::string>& overrides, const JobShape& shape) {
  // Rank 0 reads and broadcasts: one file-system read per job, and every rank sees the same
  // bytes (a file edited during start-up cannot split the job's verdict). A file that cannot be
  // read is the same error on every rank: rank 0 broadcasts its reason.
  std::string text;
  std::string error;
  if (comm.rank() == 0) text = read_regular_file(path, kMaxDeckBytes, error);
  int readable = error.empty() ? 1 : 0;
  comm.bcast(std::span<int>(&readable, 1), 0);
  if (!readable) {
    comm.bcast_string(error, 0);
    throw ConfigError(error);
  }
  comm.bcast_string(text, 0);
  Config cfg = parse_and_validate(path, text, overrides, shape);
  if (comm.rank() == 0)
    for (const auto& w : repeated_overrides(overrides)) log::warn("{}", w);
  read_device_profiles(comm, cfg);  // the cost model's device profiles travel with the deck
  return cfg;
}

std::string resolved_deck(const Config& cfg) {
  std::ostringstream os;
  os << "# atlas resolved deck: every key with its effective value (defaults included).\n"
     << "# This file is itself a valid deck.\n";
  std::string section;
  for (const auto& spec : Schema::instance().keys()) {
    if (spec.section() != section) {
      section = spec.section();
      os << "\n";
    }
    std::string value = spec.get(cfg);
    if (value.empty()) value = "\"\"";
    os << spec.key << " = " << value << "\n";
  }
  return os.str();
}

}  // namespace atlas::deck
