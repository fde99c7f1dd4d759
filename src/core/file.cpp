// SPDX-License-Identifier: MIT
// write_file_whole (see the header).
#include "atlas/core/file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas {

void write_file_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const auto reason = [] { return errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(); };
  {
    errno = 0;
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f)
      ATLAS_THROW(Io, "cannot create " << tmp << reason() << "\n  hint: check that the directory exists and is writable");
    f << text;
    f.close();
    if (f.fail()) {
      const std::string why = reason();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      ATLAS_THROW(Io, "writing " << tmp << " failed" << why << "\n  hint: the disk may be full or the file system "
                                 << "read-only; " << path << " was left as it was");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);  // nothing half-written is left beside `path`
    ATLAS_THROW(Io, "cannot rename " << tmp << " to " << path << ": " << ec.message() << "\n  hint: " << path
                                     << " must be a file name (not a directory) in a writable directory; it was "
                                        "left as it was");
  }
}

void check_output_dir(const std::string& command, const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    throw ConfigError(command + ": --out " + dir +
                      " exists and is not a directory\n  hint: name a directory (it is created if missing)");
}

void check_output_file(const std::string& command, const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string what = command + ": " + option + " " + path;
  if (path.empty()) throw ConfigError(what + " names no file\n  hint: give a file name");
  if (fs::is_directory(path, ec))
    throw ConfigError(what + " is a directory\n  hint: name a file, e.g. " + (fs::path(path) / "out").string());
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;  // the working directory
  if (!fs::exists(parent, ec))
    throw ConfigError(what + ": its directory " + parent.string() + " does not exist\n  hint: create it first (mkdir -p " +
                      parent.string() + ") or name a file in an existing directory");
  if (!fs::is_directory(parent, ec))
    throw ConfigError(what + ": " + parent.string() + " is not a directory\n  hint: name a file in a directory");
}

}  // namespace atlas
