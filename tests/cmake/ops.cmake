# SPDX-License-Identifier: MIT
# Tests of the operations tooling: the restart launcher, the Slurm scripts (a private single-node
# Slurm), the report (atlas report / atlas_report.py) and the trace checker.

# ---- launch / slurm ----
add_test(NAME test_restart
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/test_restart.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(test_restart PROPERTIES LABELS unit TIMEOUT 30)

add_test(NAME test_slurm
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/test_slurm.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_slurm PROPERTIES LABELS slurm TIMEOUT 300 SKIP_RETURN_CODE 77
  PROCESSORS 2 RESOURCE_LOCK slurm)

# ---- report ----
add_executable(write_trace ${CMAKE_CURRENT_SOURCE_DIR}/report/write_trace.cpp)
target_link_libraries(write_trace PRIVATE atlas_core atlas_warnings)

set(ATLAS_REPORT_TEST_ENV "ATLAS_BIN=$<TARGET_FILE:atlas>" "ATLAS_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "ATLAS_WRITE_TRACE=$<TARGET_FILE:write_trace>")
foreach(t summary schedule cli)
  add_test(NAME test_report_${t}
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/report/test_report.py -k ${t}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_report_${t} PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77
    ENVIRONMENT "${ATLAS_REPORT_TEST_ENV}")
endforeach()
# The report's per-rank split equals the run's own (metrics.csv), waits inside slots included.
add_test(NAME test_report_matches_footer
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_report_matches_footer.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_report_matches_footer PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77
  FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# The report's WAN link bytes include the tied-embedding exchange and add up to run.json's.
add_test(NAME test_report_exchange_bytes
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_report_exchange_bytes.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_report_exchange_bytes PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77
  FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# Corrupted profile.h5 files (missing datasets, wrong types, cut files, NaN/inf, negative
# durations...): one ERROR line and a non-zero status, never a traceback or rows of nan/inf.
add_test(NAME test_report_corrupt
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/report/test_report_corrupt.py
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_report_corrupt PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "${ATLAS_REPORT_TEST_ENV}")
# The per-slot compute overlap of a trace (scripts/report/compute_overlap.py), on a made-up trace.
add_test(NAME test_compute_overlap
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/report/test_compute_overlap.py
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_compute_overlap PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME test_check_trace
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/report/test_check_trace.py
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_check_trace PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77
  ENVIRONMENT "${ATLAS_REPORT_TEST_ENV}")

# The Slurm scripts read deck keys as atlas does ([section] blocks, quoted '#', overrides).
add_test(NAME test_slurm_deck_value COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/test_deck_value.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(test_slurm_deck_value PROPERTIES LABELS unit TIMEOUT 30)
