// SPDX-License-Identifier: MIT
// The deck's device profile files: found, read, and broadcast with the deck.
#include "atlas/deck/profiles.hpp"

#include <string>

#include "atlas/core/check.hpp"
#include "atlas/core/error.hpp"
#include "atlas/core/paths.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/mpi/agree.hpp"

namespace atlas::deck {

namespace fs = std::filesystem;

std::vector<fs::path> device_profile_dirs() {
  // The working directory, then the data directories of the binary (<bin>/../share/atlas:
  // an installed tree's copies, or a build tree's links to the checkout): core/paths.hpp.
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (ec)
    ATLAS_THROW(Io, "device profiles: cannot read the working directory to search profiles/device/ ("
                        << ec.message() << "): run atlas from an existing directory, or name the files with "
                                           "plan.profiles");
  std::vector<fs::path> dirs{cwd / "profiles/device"};
  for (const fs::path& data : core::data_dirs()) dirs.push_back(data / "profiles/device");
  return dirs;
}

void read_device_profiles(Config& cfg) {
  DeviceProfileFiles got;
  if (!cfg.plan.profiles.empty()) {
    for (const auto& path : cfg.plan.profiles) {
      try {
        got.files.push_back({path, read_text_file(path, kMaxDeckBytes, "device profile")});
      } catch (const ConfigError& e) {  // say which key named the file
        std::vector<std::string> problems;
        for (const auto& m : e.problems()) problems.push_back("plan.profiles: " + m);
        throw ConfigError(problems);
      }
    }
  } else {
    const std::vector<fs::path> dirs = device_profile_dirs();
    for (GpuKind kind : {GpuKind::Host, GpuKind::A100, GpuKind::H100, GpuKind::H200}) {
      const std::string name = std::string(to_string(kind)) + ".profile";
      for (const fs::path& dir : dirs) {
        std::error_code ec;
        if (!fs::exists(dir / name, ec)) continue;
        const std::string path = (dir / name).string();
        got.files.push_back({path, read_text_file(path, kMaxDeckBytes, "device profile")});
        break;
      }
    }
  }
  got.read = true;
  cfg.device_profiles = std::move(got);
}

void read_device_profiles(const mpi::Comm& comm, Config& cfg) {
  // Rank 0 reads the files once and every rank agrees on the outcome (mpi::agree_on_root: a
  // ConfigError, or any other failure such as a vanished working directory, is raised on every
  // rank alike, never leaving the others in a broadcast); then the files' bytes follow.
  const std::string count = mpi::agree_on_root(comm, 0, [&] {
    read_device_profiles(cfg);
    return std::to_string(cfg.device_profiles.files.size());
  });
  cfg.device_profiles.files.resize(std::stoul(count));
  for (auto& f : cfg.device_profiles.files) {
    comm.bcast_string(f.path, 0);
    comm.bcast_string(f.text, 0);
  }
  cfg.device_profiles.read = true;
}

}  // namespace atlas::deck
