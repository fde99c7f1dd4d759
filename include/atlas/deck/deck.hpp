// SPDX-License-Identifier: MIT
// Deck text -> typed Config. Rank 0 reads the file and broadcasts the bytes; every rank parses
// the same text, so every rank reaches the same verdict and deck errors are collective.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::deck {

/// What the job looks like from outside the deck.
struct JobShape {
  int world_size = -1;     ///< ranks in the job; -1 = not launched (plan/schedule/simulate)
  bool cuda_built = false; ///< whether this binary has the CUDA backend
};

/// Parses deck text (file name used in messages) plus "key=value" overrides.
/// Throws ConfigError listing every problem: syntax, unknown keys, types, ranges, missing keys.
Config parse(const std::string& file_name, const std::string& text,
             const std::vector<std::string>& overrides);

/// Cross-field checks (layout vs job size, model vs stages, ...). Returns every problem.
std::vector<std::string> validate(const Config& cfg, const JobShape& shape);

/// "" when the deck's model.* block is the one the runtime builds (GPT: one key/value head per
/// head, a 4 x hidden GELU MLP), else the error naming the keys that differ (atlas train and
/// atlas import refuse such a deck; schedule, simulate and plan model it).
std::string runtime_block_mismatch(const Config& cfg);

/// One warning per key the overrides set more than once with different values (the last wins, as
/// a script that appends its own to the user's expects; a deck file may not set a key twice).
std::vector<std::string> repeated_overrides(const std::vector<std::string>& overrides);

/// parse + validate; throws ConfigError with all problems.
Config parse_and_validate(const std::string& file_name, const std::string& text,
                          const std::vector<std::string>& overrides, const JobShape& shape);

/// The largest deck (and device/WAN profile) file atlas reads: 16 MiB.
inline constexpr std::uint64_t kMaxDeckBytes = 16ull * 1024 * 1024;

/// Reads a whole file. Throws ConfigError naming the file when it cannot be read, is not a
/// regular file (a FIFO, a device such as /dev/zero, a directory) or has more than `max_bytes`.
/// Never blocks: a FIFO is refused without waiting for a writer. `kind_of_file` names the file in
/// messages ("cannot read deck 'x'", "cannot read device profile 'x'").
/// `line` without a '#' comment that is not inside a double-quoted string (decks, device
/// profiles, validation lists).
std::string strip_comment(const std::string& line);

std::string read_text_file(const std::string& path, std::uint64_t max_bytes = kMaxDeckBytes,
                           const std::string& kind_of_file = "deck");

/// Collective over `comm`: rank 0 reads `path` and broadcasts it; all ranks parse and validate.
/// Rank 0 then reads the deck's device profile files and broadcasts them too (cfg.device_profiles).
/// Every rank throws the same ConfigError on a bad deck.
Config load(const mpi::Comm& comm, const std::string& path,
            const std::vector<std::string>& overrides, const JobShape& shape);

/// The resolved deck: every key with its effective value, grouped by section. It is itself a
/// valid deck that parses back to the same Config.
std::string resolved_deck(const Config& cfg);

}  // namespace atlas::deck
