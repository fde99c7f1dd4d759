// SPDX-License-Identifier: MIT
// Writing a result file whole: the one place that turns every failed write (disk full, read-only
// file system, missing directory) into an atlas::Error (Io) naming the file and the reason; and
// the check of an output directory a command is told to write into.
#pragma once

#include <string>

namespace atlas {

/// Writes `text` to `path.tmp`, closes it (a failed write or close throws), then renames it over
/// `path`, so a reader never sees half a file and a failure never truncates an existing one.
/// Throws atlas::Error (Io) with the file, the system's reason and a hint. Not collective.
void write_file_whole(const std::string& path, const std::string& text);

/// `--out DIR` of command `command` ("atlas tokenize", ...): one that exists as anything but a
/// directory is the user's slip, a ConfigError ("--out DIR exists and is not a directory" with a
/// hint) before any work; a missing one is fine (the command creates it).
void check_output_dir(const std::string& command, const std::string& dir);

/// A result file a command will write at its end (`atlas plan --deck-out FILE`, `atlas simulate
/// --json FILE`): a missing parent directory, a parent that is not a directory, or a FILE that is
/// a directory is a ConfigError naming the option, before the command's work (which may take
/// minutes), not an I/O error after it.
void check_output_file(const std::string& command, const std::string& option, const std::string& path);

}  // namespace atlas
