# SPDX-License-Identifier: MIT
# WAN transport tests (room wan/): framing and multirail on loopback (unit), make_transport over
# MPI with ranks split into two DCs (mpi), and the network-namespace emulation (netns, root only).
atlas_unit_test(test_wan_framing unit/test_wan_framing.cpp)
set_tests_properties(test_wan_framing PROPERTIES TIMEOUT 30)
atlas_unit_test(test_wan_multirail unit/test_wan_multirail.cpp)
set_tests_properties(test_wan_multirail PROPERTIES TIMEOUT 90)
