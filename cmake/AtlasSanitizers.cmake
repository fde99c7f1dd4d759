# SPDX-License-Identifier: MIT
# ASan + UBSan for the cpu-debug preset. Suppressions for Open MPI live in tests/support/.
if(ATLAS_ENABLE_SANITIZERS)
  target_compile_options(atlas_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(atlas_options INTERFACE -fsanitize=address,undefined)
endif()
