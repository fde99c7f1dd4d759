// SPDX-License-Identifier: MIT
// Check macros for foreign calls and invariants. Every failure throws atlas::Error with the call
// text, the library's own message and the call site. MPI/HDF5 checks live next to their wrappers.
#pragma once

#include <cerrno>
#include <sstream>
#include <string>

#include "atlas/core/error.hpp"

namespace atlas::detail {
[[noreturn]] void throw_sys_error(int err, const char* call, const char* file, int line);
}  // namespace atlas::detail

/// Always-on invariant check; failure is an internal error (a bug in atlas).
#define ATLAS_ASSERT(cond, msg)                                                             \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::ostringstream atlas_os_;                                                         \
      atlas_os_ << "internal error: assertion '" #cond "' failed: " << msg;                 \
      ::atlas::detail::throw_error(::atlas::ExitCode::Internal, atlas_os_.str(), __FILE__, \
                                   __LINE__);                                               \
    }                                                                                       \
  } while (0)

#ifdef NDEBUG
#define ATLAS_DEBUG_ASSERT(cond, msg) \
  do {                                \
  } while (0)
#else
#define ATLAS_DEBUG_ASSERT(cond, msg) ATLAS_ASSERT(cond, msg)
#endif

/// Raise a local error of class `code` with a streamed message.
#define ATLAS_THROW(code, msg)                                                            \
  do {                                                                                    \
    std::ostringstream atlas_os_;                                                         \
    atlas_os_ << msg;                                                                     \
    ::atlas::detail::throw_error(::atlas::ExitCode::code, atlas_os_.str(), __FILE__, __LINE__); \
  } while (0)

/// POSIX call returning -1 and setting errno on failure.
#define ATLAS_SYS_CHECK(call)                                                  \
  do {                                                                         \
    if ((call) < 0) ::atlas::detail::throw_sys_error(errno, #call, __FILE__, __LINE__); \
  } while (0)
