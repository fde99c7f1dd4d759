// SPDX-License-Identifier: MIT
// The one place atlas calls getenv and setenv (see the header).
#include "atlas/core/env.hpp"

#include <unistd.h>

#include <cstdlib>

#include "atlas/core/check.hpp"

namespace atlas::env {

bool listed(std::string_view name) {
  for (const Variable& v : kVariables)
    if (name == v.name) return true;
  return false;
}

std::optional<std::string> get(std::string_view name) {
  ATLAS_ASSERT(listed(name), "environment variable " << name
                                                     << " is read but not listed in atlas::env::kVariables "
                                                        "(include/atlas/core/env.hpp)");
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool set_default(std::string_view name, const std::string& value) {
  ATLAS_ASSERT(listed(name), "environment variable " << name
                                                     << " is set but not listed in atlas::env::kVariables "
                                                        "(include/atlas/core/env.hpp)");
  const std::string n(name);
  if (std::getenv(n.c_str()) != nullptr) return false;
  return ::setenv(n.c_str(), value.c_str(), 0) == 0;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "unknown-host";
  return host;
}

}  // namespace atlas::env
