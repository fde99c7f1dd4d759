// SPDX-License-Identifier: MIT
// Reading the device profile files of a deck (cfg.device_profiles): the files plan.profiles
// names, else profiles/device/<kind>.profile from the profile directories. Rank 0 reads them and
// broadcasts them with the deck text; sched::device_profile picks and parses one (no I/O there).
#pragma once

#include <filesystem>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/mpi/comm.hpp"

namespace atlas::deck {

/// Where profiles/device/<kind>.profile is looked for, first match wins: the working directory,
/// then <bin>/../share/atlas of the running binary (core::data_dirs). The one place that says where the built-in profile files live.
std::vector<std::filesystem::path> device_profile_dirs();

/// Reads the deck's device profile files into cfg.device_profiles (one process). ConfigError
/// naming the file ("plan.profiles: cannot read device profile ...") when a listed file cannot be
/// read. Parsing waits for sched::device_profile.
void read_device_profiles(Config& cfg);

/// Collective over `comm`: rank 0 reads (read_device_profiles) and broadcasts the files, or its
/// error, which every rank then throws alike.
void read_device_profiles(const mpi::Comm& comm, Config& cfg);

}  // namespace atlas::deck
