// SPDX-License-Identifier: MIT
// atlas::env: the one place the process environment is read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "atlas/core/env.hpp"
#include "atlas/core/error.hpp"

namespace {

TEST(CoreEnv, ReadsAListedVariableAndTreatsEmptyAsUnset) {
  ::setenv("ATLAS_WAN_DC", "1", 1);
  EXPECT_EQ(atlas::env::get("ATLAS_WAN_DC"), std::optional<std::string>("1"));
  ::setenv("ATLAS_WAN_DC", "", 1);
  EXPECT_FALSE(atlas::env::get("ATLAS_WAN_DC").has_value());
  ::unsetenv("ATLAS_WAN_DC");
  EXPECT_FALSE(atlas::env::get("ATLAS_WAN_DC").has_value());
}

TEST(CoreEnv, RefusesAVariableThatIsNotListed) {
  ::setenv("ATLAS_NOT_A_FACT", "1", 1);
  EXPECT_FALSE(atlas::env::listed("ATLAS_NOT_A_FACT"));
  try {
    (void)atlas::env::get("ATLAS_NOT_A_FACT");
    FAIL() << "an unlisted variable was read";
  } catch (const atlas::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not listed in atlas::env::kVariables"), std::string::npos) << e.what();
  }
  ::unsetenv("ATLAS_NOT_A_FACT");
}

TEST(CoreEnv, EveryVariableIsListedOnceWithAMeaning) {
  std::set<std::string> names;
  for (const auto& v : atlas::env::kVariables) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " listed twice";
    EXPECT_GT(std::string(v.meaning).size(), 10U) << v.name;
  }
}

// The host name every rank map, profile, lock holder and log prefix uses: the kernel's.
TEST(CoreEnv, HostNameIsTheKernels) {
  std::string kernel;
  std::ifstream("/proc/sys/kernel/hostname") >> kernel;
  ASSERT_FALSE(kernel.empty());
  EXPECT_EQ(atlas::env::host_name(), kernel);
}

}  // namespace
