// SPDX-License-Identifier: MIT
// Counter-based random numbers (see rng.hpp).
#include "atlas/model/rng.hpp"

#include <cmath>
#include <numbers>

namespace atlas::model::rng {

std::uint64_t key(std::uint64_t seed, std::string_view name) noexcept {
  // FNV-1a over the name, then mixed with the seed.
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (const char ch : name) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001B3ULL;
  }
  return mix64(mix64(seed) ^ h);
}

double uniform(std::uint64_t k, std::uint64_t counter) noexcept {
  return static_cast<double>(bits(k, counter) >> 11) * 0x1.0p-53;
}

double normal(std::uint64_t k, std::uint64_t counter) noexcept {
  // u1 in (0, 1] so the log is finite.
  const double u1 = (static_cast<double>(bits(k, 2 * counter) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = uniform(k, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace atlas::model::rng
