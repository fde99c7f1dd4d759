# SPDX-License-Identifier: MIT
# Finds every dependency with CMake's own find modules / package configs and exposes each as a
# target (MPI::MPI_CXX, atlas::hdf5, atlas::blas, ...). Nothing here installs anything: a missing
# dependency is named, with the Debian package that provides it and the CMake variable that points
# at it elsewhere, and configuring stops after all of them have been checked (one line each).
#
# Debian puts parallel HDF5 and OpenBLAS's headers off the default search paths; the hints below
# (ATLAS_DEPENDENCY_HINTS) add those places after anything the user names, so the standard find
# modules still decide everywhere else.

set(ATLAS_MISSING_COUNT 0)
set(ATLAS_MISSING_TEXT "")

# atlas_missing(WHAT DEBIAN_PACKAGE HOW_TO_POINT): record one missing dependency.
macro(atlas_missing what package point)
  math(EXPR ATLAS_MISSING_COUNT "${ATLAS_MISSING_COUNT} + 1")
  string(APPEND ATLAS_MISSING_TEXT "\n  missing ${what}\n"
    "      Debian package: ${package}   (apt-get install ${package})\n"
    "      elsewhere: ${point}")
endmacro()

# Debian/Ubuntu multiarch locations (only searched when they exist, after user-given roots).
set(ATLAS_DEPENDENCY_HINTS "" CACHE STRING
  "Extra include/library prefixes searched for OpenBLAS and ISA-L before the system defaults")
set(_atlas_multiarch "")
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(_atlas_multiarch "${CMAKE_LIBRARY_ARCHITECTURE}")
endif()

find_package(Threads REQUIRED)
find_package(OpenMP QUIET COMPONENTS CXX)

# ---- MPI ----
find_package(MPI QUIET COMPONENTS CXX)
if(NOT TARGET MPI::MPI_CXX)
  atlas_missing("MPI (C++ bindings, mpicxx)" "libopenmpi-dev openmpi-bin"
    "-DMPI_HOME=/path/to/mpi or -DMPI_CXX_COMPILER=/path/to/mpicxx")
endif()

# ---- HDF5, parallel (MPI-IO) flavour, C API only ----
# Mixing serial and parallel HDF5 breaks H5Pset_fapl_mpio at run time, so FindHDF5 is pointed at a
# parallel compiler wrapper when the user named none (h5pcc; Debian's Open MPI flavour first).
if(NOT HDF5_C_COMPILER_EXECUTABLE AND NOT HDF5_ROOT AND NOT DEFINED ENV{HDF5_ROOT})
  find_program(ATLAS_H5PCC NAMES h5pcc.openmpi h5pcc
    DOC "parallel HDF5 compiler wrapper used to find HDF5 (set HDF5_C_COMPILER_EXECUTABLE to override)")
  if(ATLAS_H5PCC)
    set(HDF5_C_COMPILER_EXECUTABLE "${ATLAS_H5PCC}")
  endif()
endif()
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 QUIET COMPONENTS C)
if(NOT HDF5_FOUND)
  atlas_missing("HDF5 (parallel, C API)" "libhdf5-openmpi-dev"
    "-DHDF5_ROOT=/path/to/parallel/hdf5 or -DHDF5_C_COMPILER_EXECUTABLE=/path/to/h5pcc")
elseif(NOT HDF5_IS_PARALLEL)
  atlas_missing("parallel HDF5: the HDF5 ${HDF5_VERSION} found is the serial build, and atlas writes checkpoints with MPI-IO"
    "libhdf5-openmpi-dev"
    "-DHDF5_ROOT=/path/to/parallel/hdf5 or -DHDF5_C_COMPILER_EXECUTABLE=/path/to/h5pcc")
else()
  add_library(atlas::hdf5 INTERFACE IMPORTED)
  target_include_directories(atlas::hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS})
  target_link_libraries(atlas::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
  target_compile_definitions(atlas::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
endif()

# ---- OpenBLAS (CPU GEMM; atlas calls cblas_sgemm and openblas_set_num_threads) ----
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS QUIET)
# OpenBLAS's own cblas.h: the directory that also holds openblas_config.h (Debian: under
# /usr/include/<multiarch>/openblas-<threading>, the generic cblas.h may be netlib's).
set(_atlas_blas_suffixes openblas-pthread openblas-openmp openblas-serial openblas)
if(_atlas_multiarch)
  list(PREPEND _atlas_blas_suffixes ${_atlas_multiarch}/openblas-pthread
    ${_atlas_multiarch}/openblas-openmp ${_atlas_multiarch}/openblas-serial)
endif()
find_path(OPENBLAS_INCLUDE_DIR NAMES openblas_config.h
  HINTS ${ATLAS_DEPENDENCY_HINTS} ENV OpenBLAS_HOME
  PATH_SUFFIXES ${_atlas_blas_suffixes} include
  DOC "directory of OpenBLAS's cblas.h and openblas_config.h")
if(NOT BLAS_FOUND OR NOT OPENBLAS_INCLUDE_DIR OR NOT EXISTS "${OPENBLAS_INCLUDE_DIR}/cblas.h")
  atlas_missing("OpenBLAS (library and cblas.h)" "libopenblas-dev"
    "-DBLAS_LIBRARIES=/path/to/libopenblas.so -DOPENBLAS_INCLUDE_DIR=/path/to/include")
else()
  add_library(atlas::blas INTERFACE IMPORTED)
  target_include_directories(atlas::blas INTERFACE ${OPENBLAS_INCLUDE_DIR})
  target_link_libraries(atlas::blas INTERFACE ${BLAS_LIBRARIES})
endif()

# ---- Boost.Program_options ----
find_package(Boost 1.74 QUIET COMPONENTS program_options)
if(NOT TARGET Boost::program_options)
  atlas_missing("Boost.Program_options (1.74 or newer)" "libboost-program-options-dev"
    "-DBoost_ROOT=/path/to/boost")
endif()

# ---- {fmt}: std::format-style formatting (GCC 12's libstdc++ has no <format>) ----
find_package(fmt QUIET)
if(NOT TARGET fmt::fmt)
  atlas_missing("{fmt}" "libfmt-dev" "-Dfmt_ROOT=/path/to/fmt")
endif()

# ---- OpenSSL libcrypto: HMAC/SHA-256 of the WAN handshake ----
find_package(OpenSSL QUIET COMPONENTS Crypto)
if(NOT TARGET OpenSSL::Crypto)
  atlas_missing("OpenSSL (libcrypto)" "libssl-dev" "-DOPENSSL_ROOT_DIR=/path/to/openssl")
endif()

# ---- pkg-config modules (PCRE2, ISA-L), with a find_path/find_library fallback ----
find_package(PkgConfig QUIET)

# atlas_find_pkg(TARGET PKG_MODULE HEADER LIBNAME VAR_PREFIX): atlas::<TARGET> from pkg-config's
# module, else from <VAR_PREFIX>_INCLUDE_DIR / <VAR_PREFIX>_LIBRARY.
function(atlas_find_pkg target module header libname prefix)
  if(PkgConfig_FOUND)
    pkg_check_modules(${prefix}_PC QUIET IMPORTED_TARGET GLOBAL ${module})
  endif()
  if(${prefix}_PC_FOUND)
    add_library(atlas::${target} ALIAS PkgConfig::${prefix}_PC)
    return()
  endif()
  find_path(${prefix}_INCLUDE_DIR ${header} HINTS ${ATLAS_DEPENDENCY_HINTS} PATH_SUFFIXES include)
  find_library(${prefix}_LIBRARY NAMES ${libname} HINTS ${ATLAS_DEPENDENCY_HINTS}
    PATH_SUFFIXES lib lib64)
  if(${prefix}_INCLUDE_DIR AND ${prefix}_LIBRARY)
    add_library(atlas::${target} INTERFACE IMPORTED GLOBAL)
    target_include_directories(atlas::${target} INTERFACE ${${prefix}_INCLUDE_DIR})
    target_link_libraries(atlas::${target} INTERFACE ${${prefix}_LIBRARY})
  endif()
endfunction()

# PCRE2 (8-bit): GPT-2's pre-tokenization regular expression, with Unicode classes (UTF + UCP).
atlas_find_pkg(pcre2 libpcre2-8 pcre2.h pcre2-8 PCRE2)
if(NOT TARGET atlas::pcre2)
  atlas_missing("PCRE2 (8-bit, libpcre2-8)" "libpcre2-dev"
    "PKG_CONFIG_PATH, or -DPCRE2_INCLUDE_DIR=... -DPCRE2_LIBRARY=...")
endif()

# Intel ISA-L: CRC32C (crc32_iscsi) for WAN frames.
atlas_find_pkg(isal libisal isa-l/crc.h isal ISAL)
if(NOT TARGET atlas::isal)
  atlas_missing("Intel ISA-L (isa-l/crc.h, libisal)" "libisal-dev"
    "PKG_CONFIG_PATH, or -DISAL_INCLUDE_DIR=... -DISAL_LIBRARY=...")
endif()

# ---- libpng: atlas bench ablation's bar chart (src/bench/png.cpp) ----
find_package(PNG QUIET)
if(NOT TARGET PNG::PNG)
  atlas_missing("libpng (png.h, libpng16)" "libpng-dev"
    "-DPNG_PNG_INCLUDE_DIR=/path/to/include -DPNG_LIBRARY=/path/to/libpng16.so")
endif()

# ---- GoogleTest (only for the test suites) ----
if(ATLAS_ENABLE_TESTS)
  find_package(GTest QUIET)
  if(NOT TARGET GTest::gtest OR NOT TARGET GTest::gmock)
    atlas_missing("GoogleTest and GoogleMock (the test suites)" "libgtest-dev libgmock-dev"
      "-DGTest_ROOT=/path/to/googletest, or -DATLAS_ENABLE_TESTS=OFF")
  endif()
endif()

# ---- one report for everything missing ----
if(ATLAS_MISSING_COUNT GREATER 0)
  if(ATLAS_MISSING_COUNT EQUAL 1)
    set(_atlas_what "a required dependency is")
  else()
    set(_atlas_what "${ATLAS_MISSING_COUNT} required dependencies are")
  endif()
  message(FATAL_ERROR "atlas: ${_atlas_what} missing (nothing was installed):${ATLAS_MISSING_TEXT}\n"
    "On Debian, `sudo scripts/install-deps.sh` (or `make test`, which calls it) installs them all.")
endif()
