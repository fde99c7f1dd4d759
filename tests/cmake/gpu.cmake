# SPDX-License-Identifier: MIT
# Tests of the device collectives and the CUDA backend. The host-side collective test always
# runs; the CUDA tests are built only with ATLAS_ENABLE_CUDA, carry the label "gpu" (excluded by
# the cpu presets; run them with `ctest --preset gpu` on a GPU machine) and skip with a message
# where cudaGetDeviceCount finds no device.
atlas_mpi_test(test_device_collective SOURCES mpi/test_device_collective.cpp NP 1 2 3 TIMEOUT 60)

if(ATLAS_ENABLE_CUDA)
  # Every backend op, CUDA vs host, on random inputs.
  atlas_gpu_executable(test_cuda_backend gpu/test_cuda_backend.cpp)
  # Two entries: the comparisons (reported by ctest as skipped where no GPU is visible) and the
  # factory checks that hold on any machine (a failure there is never hidden by a skip).
  add_test(NAME test_cuda_backend COMMAND test_cuda_backend --gtest_filter=CudaVsHost.*
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  add_test(NAME test_cuda_factory COMMAND test_cuda_backend --gtest_filter=CudaFactory.*
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_cuda_backend test_cuda_factory PROPERTIES LABELS gpu TIMEOUT 120)

  # The fused calls (cuBLASLt epilogues, fused kernels) and the bf16/tf32 GEMMs vs the host.
  atlas_gpu_test(test_cuda_fused gpu/test_cuda_fused.cpp)
  # Block graphs (device.cuda_graphs) vs the eager run on the GPU.
  atlas_gpu_test(test_cuda_graphs gpu/test_cuda_graphs.cpp)

  # NCCL (or staged MPI when ranks share a GPU) all-reduce through device::make_collective.
  atlas_mpi_test(test_nccl_comm SOURCES gpu/test_nccl_comm.cpp NP 1 2 LABELS gpu TIMEOUT 120)
  # A few training steps of a tiny model, cuda vs host, at np 1 and 2 (tp, dp, pipeline).
  atlas_mpi_test(test_cuda_train SOURCES gpu/test_cuda_train.cpp NP 1 2 LABELS gpu TIMEOUT 300)
  foreach(t test_nccl_comm test_cuda_train)
    target_link_libraries(${t} PRIVATE atlas_cuda)
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/src/device/cuda)
  endforeach()
  foreach(np 1 2)
    set_tests_properties(test_cuda_train_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
  endforeach()
  # Every test of these binaries needs a GPU: without one, ctest lists them as skipped.
  set_tests_properties(test_cuda_backend test_nccl_comm_np_1 test_nccl_comm_np_2
    test_cuda_train_np_1 test_cuda_train_np_2 PROPERTIES
    SKIP_REGULAR_EXPRESSION "no CUDA device visible")
endif()
