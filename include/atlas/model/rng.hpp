// SPDX-License-Identifier: MIT
// Counter-based random numbers: every value is a pure function of (key, counter), so a TP shard,
// a pipeline stage or a data-parallel replica draws exactly the numbers the single-rank run draws
// for the same logical element, in any order and on any rank. Not for cryptography.
#pragma once

#include <cstdint>
#include <string_view>

namespace atlas::model::rng {

/// SplitMix64 finaliser: a bijective 64-bit mixer.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Stream key for `name` under `seed` (e.g. a parameter name, or "data.train").
[[nodiscard]] std::uint64_t key(std::uint64_t seed, std::string_view name) noexcept;

/// 64 random bits number `counter` of stream `key`.
[[nodiscard]] constexpr std::uint64_t bits(std::uint64_t key, std::uint64_t counter) noexcept {
  return mix64(key ^ mix64(counter));
}

/// Uniform double in [0, 1), 53 random bits, element `counter` of stream `key`.
[[nodiscard]] double uniform(std::uint64_t key, std::uint64_t counter) noexcept;

/// Standard normal (Box-Muller over two 64-bit draws 2*counter, 2*counter+1) of stream `key`.
[[nodiscard]] double normal(std::uint64_t key, std::uint64_t counter) noexcept;

}  // namespace atlas::model::rng
