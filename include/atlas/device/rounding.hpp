// SPDX-License-Identifier: MIT
// fp32 -> bf16 / tf32 rounding (round-to-nearest-even) for the precision contract of
// docs/precision.md: the host backend's bf16/tf32 emulation, the bf16 pipeline boundary wire
// format and the tests. Plain C++ (no CUDA types): the .cu side uses __float2bfloat16_rn, which
// rounds the same way. (Device-side bf16 storage of activations goes through Backend::to_bf16.)
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace atlas::device {

/// bf16 bits of `x`, round-to-nearest-even on the 16 dropped mantissa bits. NaN stays a (quiet)
/// NaN of the same sign; +-Inf stay; a value beyond the largest finite bf16 (0x7F7F = 3.3895e38)
/// by half an ulp or more rounds to Inf (as __float2bfloat16_rn does); denormals round like
/// any other value (no flush to zero).
[[nodiscard]] constexpr std::uint16_t float_to_bf16_bits(float x) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<std::uint16_t>((u >> 16) | 0x0040U);  // quiet NaN
  const std::uint32_t lsb = (u >> 16) & 1U;
  return static_cast<std::uint16_t>((u + 0x7FFFU + lsb) >> 16);
}

/// The fp32 value of bf16 bits `b` (exact).
[[nodiscard]] constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// `x` rounded to the nearest bf16 value (8-bit exponent, 7-bit mantissa), ties to even, as fp32.
[[nodiscard]] constexpr float round_to_bf16(float x) noexcept { return bf16_bits_to_float(float_to_bf16_bits(x)); }

/// `x` rounded to the nearest tf32 value (8-bit exponent, 10-bit mantissa: the low 13 mantissa
/// bits cleared), ties to even, as fp32. NaN stays a quiet NaN of the same sign; a value that
/// rounds past the largest finite tf32 (3.4024e38) becomes Inf.
[[nodiscard]] constexpr float round_to_tf32(float x) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFU) > 0x7F800000U) return std::bit_cast<float>((u | 0x00400000U) & ~0x1FFFU);
  const std::uint32_t lsb = (u >> 13) & 1U;
  return std::bit_cast<float>((u + 0x0FFFU + lsb) & ~0x1FFFU);
}

/// out[i] = round_to_bf16(in[i]) for i < n (`out` may alias `in`).
inline void round_to_bf16(const float* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = round_to_bf16(in[i]);
}
/// out[i] = round_to_tf32(in[i]) for i < n (`out` may alias `in`).
inline void round_to_tf32(const float* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = round_to_tf32(in[i]);
}

/// Packs n fp32 values as n bf16 values (2 bytes each, host byte order) into `out` (2n bytes,
/// any alignment): the wire format of a bf16 pipeline boundary tensor.
inline void pack_bf16(const float* in, void* out, std::size_t n) noexcept {
  auto* dst = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t b = float_to_bf16_bits(in[i]);
    std::memcpy(dst + 2 * i, &b, sizeof b);
  }
}
/// Widens n bf16 values (2n bytes at `in`, as pack_bf16 wrote them) to fp32 (exact).
inline void unpack_bf16(const void* in, float* out, std::size_t n) noexcept {
  const auto* src = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t b = 0;
    std::memcpy(&b, src + 2 * i, sizeof b);
    out[i] = bf16_bits_to_float(b);
  }
}

}  // namespace atlas::device
