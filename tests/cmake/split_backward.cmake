# SPDX-License-Identifier: MIT
# The zero-bubble split of the backward (issue 24 item 5), model and runtime side: the backend's
# two halves of linear_backward, StageModel::backward_input/backward_weight against backward()
# bit for bit (TP > 1 over MPI too), the misuse errors, the runtime's row check, and real
# training on a split table with the unsplit run's losses.
atlas_unit_test(test_split_backward unit/test_split_backward.cpp)
