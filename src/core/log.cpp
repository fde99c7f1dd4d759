// SPDX-License-Identifier: MIT
// Logging sinks. info goes to stdout on world rank 0; warn/error to stderr on every rank.
#include "atlas/core/log.hpp"

#include <cstdio>
#include <fstream>
#include <mutex>

#include "atlas/core/error.hpp"

namespace atlas::log {

namespace {
int g_world_rank = 0;
bool g_quiet = false;
std::mutex g_mutex;
std::ofstream g_rank_file;
}  // namespace

void init(int world_rank, const std::string& host) {
  g_world_rank = world_rank;
  detail::set_rank_identity(world_rank, host);
}

void set_rank_file(const std::string& path) {
  std::lock_guard lock(g_mutex);
  g_rank_file.close();
  if (!path.empty()) g_rank_file.open(path, std::ios::app);
}

void set_quiet(bool quiet) { g_quiet = quiet; }

void info_str(const std::string& msg) {
  if (g_world_rank != 0 || g_quiet) return;
  std::lock_guard lock(g_mutex);
  std::fputs(msg.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void warn_str(const std::string& msg) {
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%sWARNING: %s\n", detail::rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
}

void error_str(const std::string& msg) {
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%sERROR: %s\n", detail::rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
}

void rank_str(const std::string& msg) {
  std::lock_guard lock(g_mutex);
  if (g_rank_file.is_open()) {
    g_rank_file << msg << '\n';
    g_rank_file.flush();
  }
}

}  // namespace atlas::log
