// SPDX-License-Identifier: MIT
// write_file_whole, read_file_blocks and the output checks (see the header).
#include "atlas/core/file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"

namespace atlas {

namespace {

/// write(2) of all of `text` to `fd` (EINTR retried): 0, or the errno of the write that failed
/// (EIO for one that wrote nothing); `written` counts the bytes that went.
int write_all(int fd, std::string_view text, std::size_t& written) {
  written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A descriptor left non-blocking (a stdout some parent set O_NONBLOCK on): wait until it
      // takes more, as a blocking write would.
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, -1);
      continue;
    }
    if (n <= 0) return n < 0 ? errno : EIO;
    written += static_cast<std::size_t>(n);
  }
  return 0;
}

/// Writes `text` to `path`.tmp (fsynced when `durable`) and returns that name; a failure removes
/// what it wrote and throws, `path` left as it was. A `path`.tmp that is a symbolic link is
/// refused, never followed (O_NOFOLLOW: in a shared directory a planted link would have made the
/// write truncate its target).
std::string stage(const std::string& path, std::string_view text, bool durable) {
  const std::string tmp = path + ".tmp";
  const auto reason = [](int err) { return err != 0 ? std::string(": ") + std::strerror(err) : std::string(); };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int err = errno;
    ATLAS_THROW(Io, "cannot create " << tmp << reason(err)
                                     << (err == ELOOP ? "\n  hint: it is a symbolic link; remove it (atlas never writes "
                                                        "through one)"
                                                      : "\n  hint: check that the directory exists and is writable"));
  }
  std::size_t written = 0;
  int err = write_all(fd, text, written);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    ATLAS_THROW(Io, "writing " << tmp << " failed" << reason(err) << "\n  hint: the disk may be full or the file system "
                               << "read-only; " << path << " was left as it was");
  }
  if (durable) {
    try {
      fsync_path(tmp, false);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    }
  }
  return tmp;
}

void commit(const std::string& tmp, const std::string& path) {
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

/// The standard stream (1 or 2) that `path` is, through any links (/dev/stdout, /dev/fd/2,
/// /proc/self/fd/1), whatever it is (a terminal, a pipe, a file the shell redirected it to); -1
/// when none.
int standard_stream(const struct stat& st) {
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat s {};
    if (::fstat(fd, &s) == 0 && s.st_dev == st.st_dev && s.st_ino == st.st_ino) return fd;
  }
  return -1;
}

/// How `path` is written: replaced by a rename (a regular file, a link to one, or nothing there
/// yet), or in place: this process's stdout or stderr (`--json /dev/stdout`, also when the shell
/// sent it to a file: a rename would need /dev/stdout.tmp beside it, and as root would replace
/// the /dev/stdout link itself), a character device or a FIFO (a shell's `>(cmd)`, /dev/null),
/// through any links. A block device is refused: atlas never writes one, and a link to one
/// (planted, or mistyped) would be an unrecoverable write.
bool in_place(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (standard_stream(st) >= 0 || S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return true;
  if (S_ISBLK(st.st_mode))
    ATLAS_THROW(Io, "refusing to write " << path << ": it is a block device\n  hint: name a file (atlas writes its "
                                         << "results to files, /dev/stdout or a pipe)");
  return false;
}

/// Writes `text` where in_place() said. The standard streams are written through their own
/// descriptor after what the program printed so far (both stdio and iostreams flushed first), so
/// a redirected stdout keeps its earlier lines; anything else is opened. A FIFO nobody reads is an
/// error at once, not a wait without end (the open is non-blocking, then the writes block).
void write_in_place(const std::string& path, std::string_view text) {
  struct stat st {};
  const int stream = ::stat(path.c_str(), &st) == 0 ? standard_stream(st) : -1;
  int fd = stream;
  if (stream >= 0) {
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
  } else {
    fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      ATLAS_THROW(Io, "cannot open " << path << " to write: " << std::strerror(err)
                                     << (err == ENXIO ? "\n  hint: it is a pipe (FIFO) that no process reads; start "
                                                        "its reader first"
                                                      : "\n  hint: check that it is writable"));
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  std::size_t written = 0;
  int err = write_all(fd, text, written);
  if (stream < 0 && ::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  if (err != 0)
    ATLAS_THROW(Io, "writing " << path << " failed after " << written << " of " << text.size()
                               << " bytes: " << std::strerror(err)
                               << (err == EPIPE ? "\n  hint: its reader closed it early" : "\n  hint: check the device"));
}

std::string dir_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void write_file_whole(const std::string& path, const std::string& text, bool durable) {
  if (in_place(path)) {
    write_in_place(path, text);
    return;
  }
  commit(stage(path, text, durable), path);
  if (durable) fsync_path(dir_of(path), true);
}

void write_files_whole(const std::vector<std::pair<std::string, std::string>>& files, bool durable,
                       const std::function<void()>& before_renames) {
  std::vector<std::string> staged;  // "" for a file written in place (in the rename loop, in order)
  try {
    for (const auto& [path, text] : files) staged.push_back(in_place(path) ? std::string() : stage(path, text, durable));
    if (before_renames) before_renames();
  } catch (...) {
    for (const std::string& tmp : staged) {
      std::error_code ec;
      if (!tmp.empty()) std::filesystem::remove(tmp, ec);
    }
    throw;
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      if (staged[i].empty())
        write_in_place(files[i].first, files[i].second);
      else
        commit(staged[i], files[i].first);
    } catch (...) {
      // The files renamed so far stay replaced (a rename cannot be taken back); the ones not yet
      // renamed keep their old contents, and no .tmp is left behind.
      for (std::size_t j = i + 1; j < staged.size(); ++j) {
        std::error_code ec;
        if (!staged[j].empty()) std::filesystem::remove(staged[j], ec);
      }
      throw;
    }
  }
  if (durable)
    for (std::size_t i = 0; i < files.size(); ++i)
      if (!staged[i].empty()) fsync_path(dir_of(files[i].first), true);
}

MovedAside move_aside(const std::string& dir, const std::function<bool(const std::string& name)>& which,
                      const std::string& why, bool links_too) {
  namespace fs = std::filesystem;
  MovedAside out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  std::vector<fs::path> files;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    // Regular files only, not through links: a metrics.csv linked to /dev/null (or /dev/full) is
    // the user's choice of where results go, not an earlier run's file.
    if (const fs::file_status st = it->symlink_status(ec);
        (fs::is_regular_file(st) || (links_too && fs::is_symlink(st))) && which(it->path().filename().string()))
      files.push_back(it->path());
  if (ec)
    ATLAS_THROW(Io, "cannot list " << dir << ": " << ec.message() << "\n  hint: fix its permissions or its file system");
  if (files.empty()) return out;
  std::sort(files.begin(), files.end());
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  fs::path aside;
  for (int n = 0;; ++n) {
    aside = fs::path(dir) / (std::string("earlier-run-") + stamp + (n == 0 ? "" : "-" + std::to_string(n)));
    if (fs::create_directory(aside, ec)) break;
    if (ec)
      ATLAS_THROW(Io, why << " could not make " << aside.string() << " to keep the earlier run's files in: "
                          << ec.message() << "\n  hint: fix the permissions of " << dir
                          << ", or resume that run with run.resume = latest, or give this run its own run.name");
  }
  for (const fs::path& f : files) {
    const std::uintmax_t size = fs::is_symlink(fs::symlink_status(f, ec)) ? 0 : fs::file_size(f, ec);
    fs::rename(f, aside / f.filename(), ec);
    if (ec)
      ATLAS_THROW(Io, why << " could not move the earlier run's " << f.string() << " into " << aside.string() << ": "
                          << ec.message()
                          << "\n  hint: move it away yourself, or resume that run with run.resume = latest, or give "
                             "this run its own run.name; "
                          << out.files << " file(s) were moved before it");
    ++out.files;
    out.bytes += size == static_cast<std::uintmax_t>(-1) ? 0 : size;
  }
  fsync_path(aside.string(), true);  // the entries moved in
  fsync_path(dir, true);             // and out
  out.dir = aside.string();
  return out;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) ATLAS_THROW(Io, "cannot open '" << path << "' to fsync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) ATLAS_THROW(Io, "fsync('" << path << "') failed: " << std::strerror(err));
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

void read_file_blocks(const std::string& path, std::string_view what, std::string_view hint,
                      std::size_t block_bytes,
                      const std::function<void(std::string_view data, std::int64_t offset)>& on_block) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    ATLAS_THROW(Io, "cannot read " << what << " " << path << ": "
                                   << (errno != 0 ? std::strerror(errno) : "open failed") << "\n  hint: " << hint);
  std::vector<char> block(std::max<std::size_t>(block_bytes, 1));
  for (std::int64_t offset = 0; in;) {
    errno = 0;
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    if (in.bad())
      ATLAS_THROW(Io, "reading " << what << " " << path << " failed after " << offset << " bytes"
                                 << (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string())
                                 << "\n  hint: " << hint);
    const auto n = static_cast<std::size_t>(in.gcount());
    if (n > 0) on_block(std::string_view(block.data(), n), offset);
    offset += static_cast<std::int64_t>(n);
  }
}

}  // namespace atlas
