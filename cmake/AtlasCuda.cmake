# SPDX-License-Identifier: MIT
# The CUDA backend (ATLAS_ENABLE_CUDA=ON): nvcc for src/device/cuda/**/*.cu, the host compiler for
# src/device/cuda/**/*.cpp, cuBLAS and NCCL. Everything lands in the OBJECT library atlas_cuda, so
# the static initialiser that registers the backend is never dropped by the linker: link it into
# the binary (CMakeLists.txt does) and into each GPU test. No GPU is needed to build.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "ATLAS_ENABLE_CUDA=ON, but CMake found no CUDA compiler\n"
    "  hint: -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc (the cuda-release preset sets it), "
    "or configure with -DATLAS_ENABLE_CUDA=OFF")
endif()
# `native` needs a GPU at configure time; CI has none, so the architectures are always named.
if(ATLAS_CUDA_ARCHITECTURES MATCHES "native|all")
  message(FATAL_ERROR "ATLAS_CUDA_ARCHITECTURES = ${ATLAS_CUDA_ARCHITECTURES}: name the "
    "architectures instead (90 for H100/H200, 80 for A100), e.g. -DATLAS_CUDA_ARCHITECTURES=\"80;90\"")
endif()
set(CMAKE_CUDA_ARCHITECTURES ${ATLAS_CUDA_ARCHITECTURES})
enable_language(CUDA)
# C++20 for nvcc too. CMake < 3.26 does not know nvcc's flag for it (a target with CUDA objects
# then fails to generate with "requires the language dialect CUDA20"), so teach it.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

find_package(CUDAToolkit REQUIRED)
find_package(NCCL)
if(NOT NCCL_FOUND)
  message(FATAL_ERROR "ATLAS_ENABLE_CUDA=ON needs NCCL (nccl.h and libnccl) for the intra-DC "
    "collectives, and none was found\n  hint: install NCCL next to the CUDA toolkit or set "
    "-DNCCL_ROOT=/path/to/nccl")
endif()
# Non-blocking communicators, ncclCommFinalize and ncclGetLastError: NCCL 2.14 or newer.
if(NCCL_VERSION VERSION_LESS 2.14)
  message(FATAL_ERROR "NCCL ${NCCL_VERSION} (${NCCL_INCLUDE_DIR}) is too old: atlas needs 2.14 or "
    "newer (non-blocking communicators)\n  hint: point -DNCCL_ROOT at a newer NCCL")
endif()
message(STATUS "CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
  "${ATLAS_CUDA_ARCHITECTURES}, CUDA toolkit ${CUDAToolkit_VERSION}, NCCL ${NCCL_VERSION}")

file(GLOB_RECURSE ATLAS_CUDA_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/*.cu)
add_library(atlas_cuda OBJECT ${ATLAS_CUDA_SOURCES})
set_target_properties(atlas_cuda PROPERTIES
  CUDA_ARCHITECTURES "${ATLAS_CUDA_ARCHITECTURES}"
  CUDA_SEPARABLE_COMPILATION OFF
  POSITION_INDEPENDENT_CODE ON)
target_include_directories(atlas_cuda PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda)
target_link_libraries(atlas_cuda
  PUBLIC atlas_core CUDA::cudart CUDA::cublas CUDA::cublasLt NCCL::NCCL
  PRIVATE atlas_warnings)
# nvcc: host-compiler warnings as errors like the rest of the tree, and nvcc's own warnings too.
target_compile_options(atlas_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=all-warnings -lineinfo>)
