# SPDX-License-Identifier: MIT
# Every ATLAS_ENABLE_* switch, and the configure-time feature summary (also baked into build_info).
option(ATLAS_ENABLE_CUDA "Build the CUDA backend (cuBLAS, kernels, NCCL)" OFF)
option(ATLAS_ENABLE_TESTS "Build the GoogleTest suites" ON)
option(ATLAS_ENABLE_SANITIZERS "Build with ASan and UBSan" OFF)
option(ATLAS_WARNINGS_AS_ERRORS "Treat warnings in atlas's own code as errors" ON)
set(ATLAS_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures (no GPU here: name them)")

add_library(atlas_options INTERFACE)

function(atlas_flag_word var out)
  if(${var})
    set(${out} "ON" PARENT_SCOPE)
  else()
    set(${out} "OFF" PARENT_SCOPE)
  endif()
endfunction()

function(atlas_print_summary)
  message(STATUS "atlas ${PROJECT_VERSION} (${ATLAS_GIT_SHA}) feature summary:")
  foreach(f CUDA TESTS SANITIZERS)
    if(ATLAS_ENABLE_${f})
      message(STATUS "  [x] ${f}")
    else()
      message(STATUS "  [ ] ${f}")
    endif()
  endforeach()
  message(STATUS "  MPI ${MPI_CXX_VERSION}, HDF5 ${HDF5_VERSION} (parallel=${HDF5_IS_PARALLEL}), Boost ${Boost_VERSION}")
endfunction()
