// SPDX-License-Identifier: MIT
// Writing a result file whole: the one place that turns every failed write (disk full, read-only
// file system, missing directory) into an atlas::Error (Io) naming the file and the reason; and
// the check of an output directory a command is told to write into; and reading an input file
// in blocks, where a failed read is an error and never a silent early end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atlas {

/// Writes `text` to `path.tmp`, closes it (a failed write or close throws), then renames it over
/// `path`, so a reader never sees half a file and a failure never truncates an existing one. A
/// `path.tmp` that is a symbolic link is refused (Io), never written through. Written in place
/// instead (they cannot be replaced): this process's stdout or stderr (/dev/stdout, also when
/// redirected to a file: after what was printed so far), a character device or a FIFO (a shell's
/// `>(cmd)`, /dev/null), through any links; a FIFO nobody reads is an Io error at once, not a
/// wait. A block device is refused.
/// `durable`: the file is fsynced before the rename and its directory after it, so a crash of
/// the machine leaves the old file or the whole new one (for results that took long to make).
/// Throws atlas::Error (Io) with the file, the system's reason and a hint. Not collective.
void write_file_whole(const std::string& path, const std::string& text, bool durable = false);

/// write_file_whole for files that belong together (weights and their config): every file is
/// written to its .tmp first, and only when all are written are they renamed, in order. A
/// failed write leaves every `path` as it was and removes the .tmp files. A failed rename (rare:
/// the target became a directory) leaves the files renamed before it replaced and the others as
/// they were, and removes every .tmp: callers that must not be read half-replaced mark it with
/// `before_renames` (the HF export's marker). `before_renames`, when given, runs once every file
/// is written, just before the first rename (a marker that the renames are under way); if it
/// throws, nothing is renamed.
void write_files_whole(const std::vector<std::pair<std::string, std::string>>& files, bool durable = false,
                       const std::function<void()>& before_renames = {});

/// What move_aside moved: the new subdirectory and how many files ("" and 0: nothing to move).
struct MovedAside {
  std::string dir;
  int files = 0;
  std::uint64_t bytes = 0;  ///< their sizes, summed
};

/// Moves the regular files of `dir` (not its subdirectories, nor links) whose name `which` accepts into a new
/// subdirectory `earlier-run-YYYYmmdd-HHMMSS[-N]` of `dir`: an earlier run's results and
/// checkpoints kept, never deleted, when a fresh run starts in the same place. Nothing is created
/// when no file matches. A file that cannot be moved throws Io naming it, `why` (what the move is
/// for, e.g. "a fresh start (run.resume = \"\")") and the fix; the files moved before it stay moved.
/// `links_too`: symbolic links that `which` accepts move too (the link itself, never its target):
/// checkpoints, which run.resume = latest would follow; results (a metrics.csv linked to
/// /dev/null is the user's choice) stay.
MovedAside move_aside(const std::string& dir, const std::function<bool(const std::string& name)>& which,
                      const std::string& why, bool links_too = false);

/// fsync(2) of a file, or of a directory (which makes the renames and removals in it durable).
/// Throws atlas::Error (Io) naming the path and the system's reason.
void fsync_path(const std::string& path, bool directory);

/// `--out DIR` of command `command` ("atlas tokenize", ...): one that exists as anything but a
/// directory is the user's slip, a ConfigError ("--out DIR exists and is not a directory" with a
/// hint) before any work; a missing one is fine (the command creates it).
void check_output_dir(const std::string& command, const std::string& dir);

/// A result file a command will write at its end (`atlas plan --deck-out FILE`, `atlas simulate
/// --json FILE`): a missing parent directory, a parent that is not a directory, or a FILE that is
/// a directory is a ConfigError naming the option, before the command's work (which may take
/// minutes), not an I/O error after it.
void check_output_file(const std::string& command, const std::string& option, const std::string& path);

/// Reads `path` from its start in blocks of up to `block_bytes` and calls `on_block(data,
/// offset)` for each (offset = the bytes of the file before `data`). A file that cannot be opened,
/// or a read that fails (EIO: std::ifstream sets badbit where the end of the file sets eofbit, and
/// the rest of the file would be dropped without a word), throws atlas::Error (Io) naming `what`
/// ("corpus file"), the path, how far it got and the system's reason, then `hint`.
void read_file_blocks(const std::string& path, std::string_view what, std::string_view hint,
                      std::size_t block_bytes,
                      const std::function<void(std::string_view data, std::int64_t offset)>& on_block);

}  // namespace atlas
