// SPDX-License-Identifier: MIT
// data_dirs(): the shipped read-only files, found relative to the running binary.
#include "atlas/core/paths.hpp"

#include <system_error>

#include "atlas/core/build_info.hpp"

namespace atlas::core {

namespace fs = std::filesystem;

std::vector<fs::path> data_dirs() {
  std::vector<fs::path> dirs;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return dirs;
  const fs::path dir = (exe.parent_path() / build::kDataDirFromBin).lexically_normal();
  if (fs::is_directory(dir, ec)) dirs.push_back(dir);
  return dirs;
}

std::optional<fs::path> find_data_file(const std::string& rel) {
  std::error_code ec;
  std::vector<fs::path> bases{fs::current_path(ec)};
  for (auto& d : data_dirs()) bases.push_back(std::move(d));
  for (const fs::path& base : bases) {
    if (base.empty()) continue;
    if (fs::exists(base / rel, ec)) return base / rel;
  }
  return std::nullopt;
}

}  // namespace atlas::core
