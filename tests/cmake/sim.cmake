# SPDX-License-Identifier: MIT
# Tests of sim/ (profiles, cost model, simulator) and plan/ (planner, designs).
atlas_unit_test(test_sim_profile ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_profile.cpp)
atlas_unit_test(test_sim_simulator ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_simulator.cpp)
atlas_unit_test(test_plan_planner ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_plan_planner.cpp)
