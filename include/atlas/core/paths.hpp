// SPDX-License-Identifier: MIT
// Where atlas finds the read-only files it ships (device profiles, report scripts, example decks)
// at run time: relative to its own binary, so an installed tree works from any directory and no
// source path is baked in. Not for run outputs or the training data (those follow the deck).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace atlas::core {

/// The data directories that exist, best first: <bin>/../share/atlas for the running binary
/// (read from /proc/self/exe; the path from bin to data comes from the install layout, see
/// build_info.hpp). An installed tree has its copies there; a build tree has links back to the
/// source tree there (made at configure time), so a build-tree binary finds the checkout's files
/// and an installed one never does. Empty when none exists. Local; no MPI.
[[nodiscard]] std::vector<std::filesystem::path> data_dirs();

/// The first existing `rel` (e.g. "profiles/device/h100.profile") in the working directory, then
/// in each data_dirs() entry; nullopt when none has it. Local; no MPI.
[[nodiscard]] std::optional<std::filesystem::path> find_data_file(const std::string& rel);

}  // namespace atlas::core
