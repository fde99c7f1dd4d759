# SPDX-License-Identifier: MIT
# Tests of core/, deck/, topo/ and sched/.
atlas_unit_test(test_deck ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_deck.cpp)
atlas_unit_test(test_core_file ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_file.cpp)
atlas_unit_test(test_layout ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_layout.cpp)
atlas_unit_test(test_schedule ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_schedule.cpp)
atlas_mpi_test(test_communicators SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_communicators.cpp NP 1 2 4 8)
atlas_mpi_test(test_agree SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_agree.cpp NP 1 2 3)
