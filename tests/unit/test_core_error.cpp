// SPDX-License-Identifier: MIT
// Hints list their alternatives as one phrase (atlas::either), the way every "hint:" line reads.
#include <gtest/gtest.h>

#include "atlas/core/error.hpp"

namespace atlas {
namespace {

TEST(Either, JoinsAlternativesAsOnePhrase) {
  EXPECT_EQ(either({}), "");
  EXPECT_EQ(either({"add GPUs"}), "add GPUs");
  EXPECT_EQ(either({"add GPUs", "use a larger GPU"}), "add GPUs or use a larger GPU");
  EXPECT_EQ(either({"a", "b", "c"}), "a, b, or c");
  EXPECT_EQ(either({"a", "b", "c", "d"}), "a, b, c, or d");
}

}  // namespace
}  // namespace atlas
