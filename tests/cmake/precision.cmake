# SPDX-License-Identifier: MIT
# device.precision (#22, docs/precision.md): the bf16/tf32 rounding helpers, the host backend's
# emulation of the GPU's matmul numerics, emulated-bf16 training against fp32, bf16 boundaries.
atlas_unit_test(test_device_rounding unit/test_device_rounding.cpp)
atlas_unit_test(test_device_precision unit/test_device_precision.cpp)
atlas_unit_test(test_model_precision unit/test_model_precision.cpp)
atlas_unit_test(test_model_bf16_storage unit/test_model_bf16_storage.cpp)
atlas_mpi_test(test_model_bf16_storage_tp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_model_bf16_storage_tp.cpp
  NP 1 2 TIMEOUT 60)
atlas_mpi_test(test_train_precision SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_precision.cpp
  NP 1 2 TIMEOUT 120)
foreach(np 1 2)
  set_tests_properties(test_train_precision_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
atlas_unit_test(test_sched_precision unit/test_sched_precision.cpp)
# Block graphs (device.cuda_graphs) on the recording host backend: bitwise the eager run.
atlas_unit_test(test_model_graphs unit/test_model_graphs.cpp)
# Training with device.cuda_graphs through the Trainer, the recording backend standing in for cuda.
atlas_mpi_test(test_train_graphs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_graphs.cpp NP 2 4 TIMEOUT 180)
foreach(np 2 4)
  set_tests_properties(test_train_graphs_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
