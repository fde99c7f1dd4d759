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
