# SPDX-License-Identifier: MIT
# Finds NCCL (header nccl.h, library libnccl) and exposes it as the imported target NCCL::NCCL.
# Looks in NCCL_ROOT / $ENV{NCCL_ROOT} / $ENV{NCCL_HOME}, then next to the CUDA toolkit, then the
# system paths. Sets NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR and NCCL_LIBRARY.
set(_atlas_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _atlas_nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _atlas_nccl_hints ${CUDAToolkit_INCLUDE_DIRS}/..)
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_atlas_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_atlas_nccl_hints} PATH_SUFFIXES lib64 lib
  lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _atlas_nccl_defines
    REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${part} +([0-9]+).*" "\\1" NCCL_VERSION_${part}
      "${_atlas_nccl_defines}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
