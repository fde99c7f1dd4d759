// SPDX-License-Identifier: MIT
// Profile files read by `atlas plan`, `atlas simulate` and `atlas profile`: the readers of a
// device or WAN profile file, and the deck overrides a WAN profile gives. The profiles' types and
// text format live in sched/profile.hpp (the cost model's input); this is their I/O.
#pragma once

#include <string>
#include <vector>

#include "atlas/sched/profile.hpp"

namespace atlas::sim {

using sched::BlockPoint;
using sched::builtin_device_profile;
using sched::DeviceProfile;
using sched::format_device_profile;
using sched::parse_device_profile;
using sched::parse_wan_profile;
using sched::WanProfile;

/// Reads and parses a device profile file; ConfigError naming the file.
DeviceProfile load_device_profile(const std::string& path);
/// Reads and parses a WAN profile file; ConfigError naming the file.
WanProfile load_wan_profile(const std::string& path);

/// For `--wan FILE` of plan/simulate: the deck overrides (cluster.latency_ms, bandwidth_gbps)
/// that give the DCs of the deck at `deck_path` (with `overrides` applied) the WAN profile's
/// matrices. Put them before the user's own overrides so those still win.
std::vector<std::string> wan_profile_overrides(const std::string& wan_path, const std::string& deck_path,
                                               const std::vector<std::string>& overrides);

}  // namespace atlas::sim
