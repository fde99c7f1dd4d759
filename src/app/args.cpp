// SPDX-License-Identifier: MIT
// Command-line splitting shared by the subcommands.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "atlas/app/commands.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/deck/profiles.hpp"
#include "atlas/sched/profile.hpp"

namespace atlas::app {

std::string Args::option(const std::string& name, const std::string& def) const {
  const auto it = options.find(name);
  return it == options.end() ? def : it->second;
}

int Args::int_option(const std::string& name, int def) const {
  return int_option(name, def, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
}

int Args::int_option(const std::string& name, int def, int lo, int hi) const {
  const auto it = options.find(name);
  if (it == options.end()) return def;
  const auto v = units::parse_int(it->second);
  // Checked before narrowing: --width 4294967396 is not 100.
  if (!v || *v < lo || *v > hi) {
    const bool at_least = hi == std::numeric_limits<int>::max() && lo != std::numeric_limits<int>::min();
    throw UsageError("--" + name + " expects an integer " +
                     (at_least ? ">= " + std::to_string(lo)
                               : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]") +
                     ", got '" + it->second + "'");
  }
  return static_cast<int>(*v);
}

Args parse_args(const std::vector<std::string>& words, const std::vector<std::string>& value_options,
                const std::vector<std::string>& flags, const OptionHelp& help) {
  Args a;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "--help" || w == "-h") throw HelpRequested{value_options, flags, help};
    if (w.rfind("--", 0) == 0) {
      // --name value, or --name=value as most tools also take it.
      const auto eq = w.find('=');
      const std::string name = w.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const bool inline_value = eq != std::string::npos;
      if (std::find(value_options.begin(), value_options.end(), name) != value_options.end()) {
        if (inline_value) {
          a.options[name] = w.substr(eq + 1);
        } else {
          if (i + 1 >= words.size()) throw UsageError("option " + w + " needs a value");
          a.options[name] = words[++i];
        }
      } else if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        if (inline_value)
          throw UsageError("--" + name + " is a flag and takes no value, got '" + w + "'\n  hint: write --" + name);
        a.options[name] = "1";
      } else {
        throw UsageError("unknown option --" + name);
      }
    } else if (w.find('=') != std::string::npos) {
      a.overrides.push_back(w);
    } else if (w.size() > 1 && w[0] == '-' && !units::parse_double(w)) {
      // "-q": an option written with one dash (it was taken as the deck, and the real deck was
      // then blamed as a stray word).
      throw UsageError("unknown option " + w + "\n  hint: atlas's options take two dashes (--" + w.substr(1) +
                       "); --help lists this command's");
    } else {
      a.positional.push_back(w);
    }
  }
  return a;
}

void only_options(const Args& args, const std::string& mode, const std::vector<std::string>& allowed) {
  for (const auto& [name, value] : args.options)
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "--" : ", --") + a;
      throw UsageError("--" + name + " does not apply to atlas " + mode + " (it reads " + list +
                       ")\n  hint: drop it, or run the mode it belongs to");
    }
}

std::string deck_path(const Args& args, const char* command) {
  if (args.positional.empty())
    throw UsageError(std::string("atlas ") + command + " needs a deck: atlas " + command +
                     " inputs/<name>.deck [key=value ...]");
  // Words after the deck that are neither key=value nor --options were ignored silently before
  // (`train.micro_batches 8` ran the deck's value).
  if (args.positional.size() > 1) {
    std::string extra;
    bool key_like = false;
    for (std::size_t i = 1; i < args.positional.size(); ++i) {
      extra += (i > 1 ? ", '" : "'") + args.positional[i] + "'";
      const std::string& w = args.positional[i];
      key_like = key_like || (w.find('.') != std::string::npos && w.find('/') == std::string::npos &&
                              !(w.size() > 5 && w.ends_with(".deck")));
    }
    throw UsageError(std::string("atlas ") + command + " takes one deck (" + args.positional.front() +
                     "), then key=value overrides and --options; " + extra +
                     (args.positional.size() > 2 ? " are" : " is") + " neither" +
                     (key_like ? "\n  hint: an override is written key=value with no spaces, e.g. train.micro_batches=8"
                               : "\n  hint: one deck per command; a deck's keys are set as key=value"));
  }
  return args.positional.front();
}

void keep_heap_for_reuse() {
  // glibc only (the one C library atlas builds with); a refusal costs speed, not results.
  (void)mallopt(M_TOP_PAD, 64 << 20);
}

Config load_offline_deck(const std::string& path, const std::vector<std::string>& overrides) {
  deck::JobShape shape;
  shape.world_size = -1;
  shape.cuda_built = cuda_built();
  Config cfg = deck::parse_and_validate(path, deck::read_text_file(path), overrides, shape);
  for (const auto& w : deck::repeated_overrides(overrides)) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  deck::read_device_profiles(cfg);
  if (const std::string note = sched::offline_costing_note(cfg); !note.empty()) std::fputs(note.c_str(), stderr);
  return cfg;
}

}  // namespace atlas::app
