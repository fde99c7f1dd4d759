# SPDX-License-Identifier: MIT
# Warning flags for atlas's own targets (not for third-party code).
add_library(atlas_warnings INTERFACE)
target_compile_options(atlas_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough
  # GCC 12 false positives inside libstdc++ string code (GCC PR 105329, PR 105651):
  -Wno-restrict>)
if(ATLAS_WARNINGS_AS_ERRORS)
  target_compile_options(atlas_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
