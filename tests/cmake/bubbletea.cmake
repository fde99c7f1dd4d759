# SPDX-License-Identifier: MIT
# Tests of bubbletea/: the inference model (bitwise split/handoff equivalence), requests and the
# bubble map, the decode worker over loopback sockets, and the service inside real training.
atlas_unit_test(test_bubbletea_model unit/test_bubbletea_model.cpp)
atlas_unit_test(test_bubbletea_requests unit/test_bubbletea_requests.cpp)
atlas_unit_test(test_bubbletea_decode unit/test_bubbletea_decode.cpp)
