// SPDX-License-Identifier: MIT
// A test's own temporary directory (removed with everything in it when the test ends) and a
// whole-file read.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace atlas::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& stem)
      : path(std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace atlas::test
