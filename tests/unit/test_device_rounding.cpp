// SPDX-License-Identifier: MIT
// The bf16 / tf32 rounding helpers of device/rounding.hpp: round-to-nearest-even with ties, NaN,
// Inf, denormals, the largest finite values and the overflow to Inf, the wire pack/unpack.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "atlas/device/rounding.hpp"

namespace atlas::device {
namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

TEST(Bf16Rounding, ExactValuesStayAndTiesGoToEven) {
  EXPECT_EQ(round_to_bf16(1.0F), 1.0F);
  EXPECT_EQ(round_to_bf16(-2.5F), -2.5F);
  EXPECT_EQ(round_to_bf16(0.0F), 0.0F);
  EXPECT_TRUE(std::signbit(round_to_bf16(-0.0F)));
  // 1 + 2^-8 lies half-way between 1 (even mantissa) and 1 + 2^-7: goes to 1.
  EXPECT_EQ(round_to_bf16(1.0F + 0x1p-8F), 1.0F);
  // 1 + 3 * 2^-8 lies half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
  EXPECT_EQ(round_to_bf16(1.0F + 3 * 0x1p-8F), 1.0F + 0x1p-6F);
  // Just above and below the tie round to the nearest.
  EXPECT_EQ(round_to_bf16(from_bits(0x3F808001U)), 1.0F + 0x1p-7F);
  EXPECT_EQ(round_to_bf16(from_bits(0x3F807FFFU)), 1.0F);
  EXPECT_EQ(float_to_bf16_bits(1.0F), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-1.0F), 0xBF80);
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625F);
  EXPECT_EQ(round_to_bf16(3.14159265F), 3.140625F);
}

TEST(Bf16Rounding, NanInfAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_bf16(inf), inf);
  EXPECT_EQ(round_to_bf16(-inf), -inf);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A signalling NaN whose payload sits only in the dropped bits must not become Inf.
  const float snan = from_bits(0x7F800001U);
  EXPECT_TRUE(std::isnan(round_to_bf16(snan)));
  EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(0xFFFFFFFFU))));
  EXPECT_TRUE(std::signbit(round_to_bf16(from_bits(0xFF800001U))));
  // Largest finite bf16: 0x7F7F (1.1111111b x 2^127).
  const float max_bf16 = bf16_bits_to_float(0x7F7F);
  EXPECT_EQ(round_to_bf16(max_bf16), max_bf16);
  EXPECT_EQ(max_bf16, 0x1.FEp127F);
  // Below half an ulp past it: stays finite; at the tie (odd mantissa 0x7F) and above: Inf.
  EXPECT_EQ(round_to_bf16(from_bits(0x7F7F7FFFU)), max_bf16);
  EXPECT_EQ(round_to_bf16(from_bits(0x7F7F8000U)), inf);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(round_to_bf16(-std::numeric_limits<float>::max()), -inf);
}

TEST(Bf16Rounding, DenormalsRoundWithoutFlushing) {
  const float tiny = std::numeric_limits<float>::denorm_min();  // 0x00000001
  EXPECT_EQ(round_to_bf16(tiny), 0.0F);
  // Smallest bf16 denormal: 0x0001 = 2^-133.
  EXPECT_EQ(round_to_bf16(0x1p-133F), 0x1p-133F);
  EXPECT_EQ(bits(round_to_bf16(from_bits(0x00018000U))), 0x00020000U);  // tie, odd -> up
  EXPECT_EQ(bits(round_to_bf16(from_bits(0x00008000U))), 0x00000000U);  // tie, even -> down
  // The largest fp32 denormal rounds up to the smallest bf16 normal.
  EXPECT_EQ(bits(round_to_bf16(from_bits(0x007FFFFFU))), 0x00800000U);
}

TEST(Bf16Rounding, MatchesNearestOfTheTwoNeighboursOnRandomValues) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(any(rng));
    if (!std::isfinite(x)) continue;
    const float r = round_to_bf16(x);
    const std::uint32_t lo = bits(x) & 0xFFFF0000U;
    const float down = from_bits(lo);
    const float up = from_bits(lo + 0x10000U);  // may be Inf
    ASSERT_TRUE(r == down || r == up) << x;
    const double dd = std::fabs(static_cast<double>(x) - down);
    const double du = std::isinf(up) ? std::ldexp(1.0, 128) - std::fabs(static_cast<double>(x))
                                     : std::fabs(static_cast<double>(up) - x);
    if (dd < du) {
      ASSERT_EQ(r, down) << x;
    } else if (du < dd) {
      ASSERT_EQ(r, up) << x;
    } else {
      ASSERT_EQ(bits(r) & 0x10000U, 0U) << "tie not to even: " << x;
    }
  }
}

TEST(Tf32Rounding, TiesNanInfDenormalsAndMax) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_tf32(1.0F), 1.0F);
  EXPECT_EQ(round_to_tf32(1.0F + 0x1p-11F), 1.0F);                // tie, even -> down
  EXPECT_EQ(round_to_tf32(1.0F + 3 * 0x1p-11F), 1.0F + 0x1p-9F);  // tie, odd -> up
  EXPECT_EQ(round_to_tf32(from_bits(0x3F801001U)), 1.0F + 0x1p-10F);
  EXPECT_EQ(round_to_tf32(1.0F + 0x1p-10F), 1.0F + 0x1p-10F);     // exact in tf32
  EXPECT_NE(round_to_bf16(1.0F + 0x1p-10F), 1.0F + 0x1p-10F);     // not in bf16
  EXPECT_EQ(round_to_tf32(inf), inf);
  EXPECT_EQ(round_to_tf32(-inf), -inf);
  EXPECT_TRUE(std::isnan(round_to_tf32(from_bits(0x7F800001U))));
  EXPECT_TRUE(std::isnan(round_to_tf32(std::numeric_limits<float>::quiet_NaN())));
  const float max_tf32 = from_bits(0x7F7FE000U);
  EXPECT_EQ(round_to_tf32(max_tf32), max_tf32);
  EXPECT_EQ(round_to_tf32(from_bits(0x7F7FEFFFU)), max_tf32);
  EXPECT_EQ(round_to_tf32(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(bits(round_to_tf32(from_bits(0x00001000U))), 0U);       // tie, even -> 0
  EXPECT_EQ(bits(round_to_tf32(from_bits(0x00003000U))), 0x4000U);  // tie, odd -> up
  EXPECT_EQ(round_to_tf32(-3.0F), -3.0F);
}

TEST(Bf16Wire, PackUnpackIsRoundingAndHalvesTheBytes) {
  const std::vector<float> in = {1.0F, -0.0F, 3.14159265F, 1e-40F, 65504.0F, -1e30F,
                                 std::numeric_limits<float>::infinity()};
  std::vector<unsigned char> wire(2 * in.size() + 1);
  pack_bf16(in.data(), wire.data() + 1, in.size());  // unaligned destination
  std::vector<float> out(in.size());
  unpack_bf16(wire.data() + 1, out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(bits(out[i]), bits(round_to_bf16(in[i]))) << i;
  std::vector<float> rounded(in);
  round_to_bf16(rounded.data(), rounded.data(), rounded.size());
  EXPECT_EQ(rounded, out);
}

}  // namespace
}  // namespace atlas::device
