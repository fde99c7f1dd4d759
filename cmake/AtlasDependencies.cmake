# SPDX-License-Identifier: MIT
# Finds every dependency and exposes each as an imported target (atlas::hdf5, atlas::blas, ...).
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(OpenMP COMPONENTS CXX)

# HDF5: only the Open MPI flavour may be linked (mixing serial and parallel breaks
# H5Pset_fapl_mpio at run time), so point FindHDF5 at the parallel compiler wrapper.
if(EXISTS /usr/bin/h5pcc.openmpi AND NOT HDF5_C_COMPILER_EXECUTABLE)
  set(HDF5_C_COMPILER_EXECUTABLE /usr/bin/h5pcc.openmpi)
endif()
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "atlas needs parallel HDF5 (Debian: libhdf5-openmpi-dev)")
endif()
add_library(atlas::hdf5 INTERFACE IMPORTED)
target_include_directories(atlas::hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(atlas::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(atlas::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

# OpenBLAS (CPU GEMM). Use the library's own cblas.h.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
  /usr/include/openblas /usr/include/x86_64-linux-gnu)
find_library(OPENBLAS_LIBRARY NAMES openblas)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found (Debian: libopenblas-dev)")
endif()
add_library(atlas::blas INTERFACE IMPORTED)
target_include_directories(atlas::blas INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(atlas::blas INTERFACE ${OPENBLAS_LIBRARY})

# Intel ISA-L: CRC32C (crc32_iscsi) for WAN frames.
find_path(ISAL_INCLUDE_DIR isa-l/crc.h)
find_library(ISAL_LIBRARY NAMES isal)
if(NOT ISAL_INCLUDE_DIR OR NOT ISAL_LIBRARY)
  message(FATAL_ERROR "ISA-L not found (Debian: libisal-dev)")
endif()
add_library(atlas::isal INTERFACE IMPORTED)
target_include_directories(atlas::isal INTERFACE ${ISAL_INCLUDE_DIR})
target_link_libraries(atlas::isal INTERFACE ${ISAL_LIBRARY})

# {fmt}: std::format-style formatting (GCC 12's libstdc++ has no <format>).
find_package(fmt REQUIRED)

# PCRE2 (8-bit): GPT-2's pre-tokenization regular expression, with Unicode classes (UTF + UCP).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
if(PCRE2_FOUND)
  add_library(atlas::pcre2 ALIAS PkgConfig::PCRE2)
else()
  find_path(PCRE2_INCLUDE_DIR pcre2.h)
  find_library(PCRE2_LIBRARY NAMES pcre2-8)
  if(NOT PCRE2_INCLUDE_DIR OR NOT PCRE2_LIBRARY)
    message(FATAL_ERROR "PCRE2 not found (Debian: libpcre2-dev)")
  endif()
  add_library(atlas::pcre2 INTERFACE IMPORTED)
  target_include_directories(atlas::pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
  target_link_libraries(atlas::pcre2 INTERFACE ${PCRE2_LIBRARY})
endif()
