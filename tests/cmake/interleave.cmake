# SPDX-License-Identifier: MIT
# Interleaved 1F1B (schedule.virtual_stages): the table, the simulator and the deck's checks.
atlas_unit_test(test_schedule_interleaved unit/test_schedule_interleaved.cpp)
# Training with model chunks: the losses and gradients of one chunk, atlas over chunks, and
# checkpoints that move between chunk counts (np 2: 2 DCs; np 4: dp 2, and 2 stages per DC).
atlas_mpi_test(test_train_interleaved SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_interleaved.cpp
  NP 2 4 TIMEOUT 180)
foreach(np 2 4)
  set_tests_properties(test_train_interleaved_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
# The atlas search's depth with model chunks: deadlock-free depths (exhaustive on small shapes, the
# engine over a sweep), a WAN-bound case that goes deeper within memory, memory per GPU with chunks.
atlas_unit_test(test_schedule_depth_chunks unit/test_schedule_depth_chunks.cpp)
target_include_directories(test_schedule_depth_chunks PRIVATE ${PROJECT_SOURCE_DIR}/src/sched)
