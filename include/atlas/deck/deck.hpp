// SPDX-License-Identifier: MIT
// Deck text -> typed Config. Rank 0 reads the file and broadcasts the bytes; every rank parses
// the same text, so every rank reaches the same verdict and deck errors are collective.
#pragma once

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

/// parse + validate; throws ConfigError with all problems.
Config parse_and_validate(const std::string& file_name, const std::string& text,
                          const std::vector<std::string>& overrides, const JobShape& shape);

/// Reads a whole file. Throws ConfigError naming the file when it cannot be read.
std::string read_text_file(const std::string& path);

/// Collective over `comm`: rank 0 reads `path` and broadcasts it; all ranks parse and validate.
/// Every rank throws the same ConfigError on a bad deck.
Config load(const mpi::Comm& comm, const std::string& path,
            const std::vector<std::string>& overrides, const JobShape& shape);

/// The resolved deck: every key with its effective value, grouped by section. It is itself a
/// valid deck that parses back to the same Config.
std::string resolved_deck(const Config& cfg);

}  // namespace atlas::deck
