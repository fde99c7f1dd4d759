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
set_tests_properties(test_slurm PROPERTIES LABELS slurm TIMEOUT 180 SKIP_RETURN_CODE 77
  PROCESSORS 2 RESOURCE_LOCK slurm)
