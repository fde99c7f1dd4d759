# SPDX-License-Identifier: MIT
# The CUDA fused attention kernels run on the CPU through the cuda_emu shim (tests/support/
# cuda_emu): built in every configuration, so CI checks the kernels' logic without a GPU. The
# GPU comparisons are test_cuda_attention (gpu.cmake).
atlas_unit_test(test_flash_attention_emulated unit/test_flash_attention_emulated.cpp)
target_include_directories(test_flash_attention_emulated BEFORE PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/support/cuda_emu ${PROJECT_SOURCE_DIR}/src/device/cuda/kernels)
# g++ does not know nvcc's #pragma unroll.
target_compile_options(test_flash_attention_emulated PRIVATE -Wno-unknown-pragmas)
