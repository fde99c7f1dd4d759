# SPDX-License-Identifier: MIT
# Tests of bubbletea/: the inference model (bitwise split/handoff equivalence), requests and the
# bubble map, the budget learner, the decode worker over loopback sockets, and the service inside
# real training.
atlas_unit_test(test_bubbletea_model unit/test_bubbletea_model.cpp)
atlas_unit_test(test_bubbletea_requests unit/test_bubbletea_requests.cpp)
atlas_unit_test(test_bubbletea_budget unit/test_bubbletea_budget.cpp)
atlas_unit_test(test_bubbletea_decode unit/test_bubbletea_decode.cpp)
add_dependencies(test_bubbletea_decode atlas-decode-worker)
target_compile_definitions(test_bubbletea_decode PRIVATE ATLAS_DECODE_WORKER_EXE="$<TARGET_FILE:atlas-decode-worker>")

# Needs the decode worker program (started per DC by the service) and the corpus (training).
atlas_mpi_test(test_bubbletea_service SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_bubbletea_service.cpp
  NP 1 2 3 4 TIMEOUT 120)
add_dependencies(test_bubbletea_service atlas-decode-worker)
target_compile_definitions(test_bubbletea_service PRIVATE
  ATLAS_DECODE_WORKER_EXE="$<TARGET_FILE:atlas-decode-worker>")
foreach(np 1 2 3 4)
  set_tests_properties(test_bubbletea_service_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
