// SPDX-License-Identifier: MIT
// Units and strict number parsing shared by decks, CLIs and reports. Byte suffixes are binary
// (K = 1024). Parsers reject trailing junk and never clamp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace atlas::units {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;

/// "4M" -> 4194304. Accepts a non-negative integer with an optional binary suffix K, M, G, T
/// (optionally followed by "B" or "iB"). Returns nullopt on anything else or on overflow.
std::optional<std::uint64_t> parse_bytes(std::string_view text);
/// Integer with no trailing junk (base 10, optional sign). nullopt on junk or out-of-range.
std::optional<std::int64_t> parse_int(std::string_view text);
/// Finite floating-point number with no trailing junk.
std::optional<double> parse_double(std::string_view text);
/// "true"/"false"/"1"/"0" only.
std::optional<bool> parse_bool(std::string_view text);

/// 4194304 -> "4M" when exact, else the plain integer (round-trips through parse_bytes).
std::string format_bytes_exact(std::uint64_t bytes);
/// Human-readable, e.g. "3.2 MiB".
std::string format_bytes_human(double bytes);

/// Gbit/s -> bytes per second.
constexpr double gbps_to_bytes_per_s(double gbps) { return gbps * 1e9 / 8.0; }

}  // namespace atlas::units
