# SPDX-License-Identifier: MIT
# The CUDA fused attention kernels run on the CPU through the cuda_emu shim (tests/support/
# cuda_emu): built in every configuration, so CI checks the kernels' logic without a GPU. The
# GPU comparisons are test_cuda_attention (gpu.cmake).
atlas_unit_test(test_flash_attention_emulated unit/test_flash_attention_emulated.cpp)
target_include_directories(test_flash_attention_emulated BEFORE PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/support/cuda_emu ${PROJECT_SOURCE_DIR}/src/device/cuda/kernels)
# g++ does not know nvcc's #pragma unroll.
target_compile_options(test_flash_attention_emulated PRIVATE -Wno-unknown-pragmas)

if(ATLAS_ENABLE_CUDA)
  # The fused kernel on the GPU: fp32 vs the unfused path and the host, bf16 within tolerance,
  # determinism of dK/dV, the D > 128 fallback, a long sequence (label gpu; skips without a
  # device). The size rules (no GPU needed) are a separate entry, so a skip never hides them.
  atlas_gpu_executable(test_cuda_attention gpu/test_cuda_attention.cpp)
  add_test(NAME test_cuda_attention COMMAND test_cuda_attention --gtest_filter=CudaAttention.*
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  add_test(NAME test_cuda_attention_sizes
    COMMAND test_cuda_attention --gtest_filter=CudaAttentionSizes.*
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_cuda_attention test_cuda_attention_sizes PROPERTIES LABELS gpu
    TIMEOUT 300)
  set_tests_properties(test_cuda_attention PROPERTIES
    SKIP_REGULAR_EXPRESSION "no CUDA device visible")
endif()
