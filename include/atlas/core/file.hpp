// SPDX-License-Identifier: MIT
// Writing a result file whole: the one place that turns every failed write (disk full, read-only
// file system, missing directory) into an atlas::Error (Io) naming the file and the reason.
#pragma once

#include <string>

namespace atlas {

/// Writes `text` to `path.tmp`, closes it (a failed write or close throws), then renames it over
/// `path`, so a reader never sees half a file and a failure never truncates an existing one.
/// Throws atlas::Error (Io) with the file, the system's reason and a hint. Not collective.
void write_file_whole(const std::string& path, const std::string& text);

}  // namespace atlas
