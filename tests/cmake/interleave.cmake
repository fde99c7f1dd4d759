# SPDX-License-Identifier: MIT
# Interleaved 1F1B (schedule.virtual_stages): the table, the simulator and the deck's checks.
atlas_unit_test(test_schedule_interleaved unit/test_schedule_interleaved.cpp)
