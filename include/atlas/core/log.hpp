// SPDX-License-Identifier: MIT
// Logging: info() on world rank 0 only, warn()/error() on every rank with a [rank N host H]
// prefix, rank() into the per-rank log file. Not for progress rows (app/ prints those).
// Formatting is {fmt} (GCC 12 has no <format>); the same {} syntax as std::format.
#pragma once

#include <fmt/format.h>
#include <string>

namespace atlas::log {

/// Set once after MPI init: which rank this is and where per-rank logs go ("" = none).
void init(int world_rank, const std::string& host);
void set_rank_file(const std::string& path);
/// Quiet mode for tests: info() prints nothing.
void set_quiet(bool quiet);

void info_str(const std::string& msg);
void warn_str(const std::string& msg);
void error_str(const std::string& msg);
void rank_str(const std::string& msg);

template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  info_str(fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  warn_str(fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) {
  error_str(fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void rank(fmt::format_string<A...> f, A&&... a) {
  rank_str(fmt::format(f, std::forward<A>(a)...));
}

}  // namespace atlas::log
