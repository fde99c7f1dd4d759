# SPDX-License-Identifier: MIT
# Tests of the build itself: `make build` names a missing dependency and its Debian package without
# calling apt, and the installed tree is relocatable (cmake --install into a scratch prefix, run
# from an empty directory).
add_test(NAME test_missing_dependency
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/build/test_missing_dependency.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_COMMAND})
set_tests_properties(test_missing_dependency PROPERTIES LABELS unit TIMEOUT 120)

add_test(NAME test_install
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/build/test_install.sh ${PROJECT_SOURCE_DIR}
          ${PROJECT_BINARY_DIR} ${CMAKE_COMMAND})
set_tests_properties(test_install PROPERTIES LABELS unit TIMEOUT 120)

# Every shell script (scripts/, tests/) passes shellcheck at severity error: a construct bash parses
# differently from what it says (an arithmetic for-condition with a file test ended the loop at
# once, so the Slurm launcher's SIGUSR1 hand-off never waited). Skipped where shellcheck is absent.
add_test(NAME test_scripts_shellcheck
  COMMAND bash -c "command -v shellcheck >/dev/null || { echo 'shellcheck not installed: skipped'; exit 77; }; cd ${PROJECT_SOURCE_DIR} && find scripts tests bench .ci -type f \\( -name '*.sh' -o -name '*.sbatch' -o -name run \\) -print0 | xargs -0 shellcheck -S error -f gcc")
set_tests_properties(test_scripts_shellcheck PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)

# The architecture rules of docs/architecture.md (room includes, getenv, CUDA headers, the
# runtime's independence of the schedule kind and the simulator, file sizes) hold on the tree,
# and the checker reports a planted violation of each.
add_test(NAME architecture_rules
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/architecture/check_rooms.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(architecture_rules PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME architecture_rules_catch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/architecture/test_check_rooms.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(architecture_rules_catch PROPERTIES LABELS unit TIMEOUT 60)
