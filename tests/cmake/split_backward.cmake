# SPDX-License-Identifier: MIT
# The zero-bubble split of the backward (issue 24 item 5), model and runtime side: the backend's
# two halves of linear_backward, StageModel::backward_input/backward_weight against backward()
# bit for bit (TP > 1 over MPI too), the misuse errors, the runtime's row check, and real
# training on a split table with the unsplit run's losses.
atlas_unit_test(test_split_backward unit/test_split_backward.cpp)
# TP > 1: every TP shard's split backward against its whole backward, bit for bit.
atlas_mpi_test(test_model_split_tp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_model_split_tp.cpp NP 2 TIMEOUT 60)
# Training on a table rewritten into B + W slots: the unsplit run's losses and gradients.
atlas_mpi_test(test_train_split_backward SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_split_backward.cpp
  NP 2 4 TIMEOUT 180)
foreach(np 2 4)
  set_tests_properties(test_train_split_backward_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
# The CUDA backend's two halves (bitwise) and a StageModel's split backward on the GPU (label gpu;
# built only with ATLAS_ENABLE_CUDA, skips where no device is visible).
if(ATLAS_ENABLE_CUDA)
  atlas_gpu_test(test_cuda_split_backward gpu/test_cuda_split_backward.cpp)
endif()
