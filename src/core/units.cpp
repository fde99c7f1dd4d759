// SPDX-License-Identifier: MIT
// Strict parsers: whole-string matches only, no clamping, no atoi.
#include "atlas/core/units.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace atlas::units {

std::optional<std::int64_t> parse_int(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && (text.front() == '-' || text.front() == '+')) return std::nullopt;  // "+-5": one sign
  }
  std::int64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && (text.front() == '-' || text.front() == '+')) return std::nullopt;  // "+-5": one sign
  }
  double v = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  return std::nullopt;
}

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr == text.data()) return std::nullopt;
  std::string_view suffix(ptr, static_cast<std::size_t>(end - ptr));
  std::uint64_t mult = 1;
  if (!suffix.empty()) {
    switch (suffix.front()) {
      case 'K': mult = kKiB; break;
      case 'M': mult = kMiB; break;
      case 'G': mult = kGiB; break;
      case 'T': mult = kGiB * 1024; break;
      case 'B': mult = 1; break;
      default: return std::nullopt;
    }
    if (suffix.front() == 'B') {
      suffix.remove_prefix(1);
    } else {
      suffix.remove_prefix(1);
      if (suffix == "B" || suffix == "iB") suffix = {};
    }
    if (!suffix.empty()) return std::nullopt;
  }
  if (v > std::numeric_limits<std::uint64_t>::max() / mult) return std::nullopt;
  return v * mult;
}

std::string format_bytes_exact(std::uint64_t bytes) {
  static constexpr struct {
    std::uint64_t mult;
    char suffix;
  } kUnits[] = {{kGiB * 1024, 'T'}, {kGiB, 'G'}, {kMiB, 'M'}, {kKiB, 'K'}};
  if (bytes != 0) {
    for (const auto& u : kUnits) {
      if (bytes % u.mult == 0) return std::to_string(bytes / u.mult) + u.suffix;
    }
  }
  return std::to_string(bytes);
}

std::string format_bytes_human(double bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f %s" : "%.1f %s", bytes, kNames[i]);
  return buf;
}

}  // namespace atlas::units
