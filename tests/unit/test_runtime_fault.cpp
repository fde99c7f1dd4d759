// SPDX-License-Identifier: MIT
// The fault-injection variables (runtime/fault.hpp): a malformed value is a ConfigError naming the
// variable and the expected form; a value for another rank or step, or a resumed run, does nothing.
// (The kill and the hang themselves are exercised by tests/launch/*.sh.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "atlas/core/error.hpp"
#include "atlas/runtime/fault.hpp"

namespace atlas::runtime {
namespace {

using ::testing::HasSubstr;

TEST(FaultInjection, MalformedValuesAreConfigErrorsNamingTheVariable) {
  for (const char* var : {"ATLAS_FAULT_KILL", "ATLAS_FAULT_HANG"})
    for (const char* bad : {"3", "a:b", "1:", ":2"}) {
      ::setenv(var, bad, 1);
      try {
        if (std::string(var) == "ATLAS_FAULT_KILL") maybe_inject_kill(var, 0, 0, false);
        else maybe_inject_hang(var, 0, 0, false);
        ADD_FAILURE() << var << "=" << bad << " was accepted";
      } catch (const ConfigError& e) {
        EXPECT_THAT(e.what(), HasSubstr(std::string(var) + " = \"" + bad + "\": expected RANK:STEP (two integers)"));
      }
      ::unsetenv(var);
    }
}

TEST(FaultInjection, OtherRankOtherStepOrAResumedRunIsLeftAlone) {
  ::setenv("ATLAS_FAULT_HANG", "1:2", 1);
  // Each call returns (a match would sleep until killed: the test's timeout).
  EXPECT_NO_THROW(maybe_inject_hang("ATLAS_FAULT_HANG", 0, 2, false));  // another rank
  EXPECT_NO_THROW(maybe_inject_hang("ATLAS_FAULT_HANG", 1, 3, false));  // another step
  EXPECT_NO_THROW(maybe_inject_hang("ATLAS_FAULT_HANG", 1, 2, true));   // resumed: ignored
  ::unsetenv("ATLAS_FAULT_HANG");
  EXPECT_NO_THROW(maybe_inject_hang("ATLAS_FAULT_HANG", 1, 2, false));  // unset
}

}  // namespace
}  // namespace atlas::runtime
