# SPDX-License-Identifier: MIT
# atlas-wan-delay needs libnetfilter_queue (Debian: libnetfilter-queue-dev). Without it the tool
# still builds and says why the delay emulation is unavailable.
find_path(NFQ_INCLUDE_DIR libnetfilter_queue/libnetfilter_queue.h)
find_library(NFQ_LIBRARY netfilter_queue)
find_library(NFNL_LIBRARY nfnetlink)
if(NFQ_INCLUDE_DIR AND NFQ_LIBRARY AND NFNL_LIBRARY)
  target_include_directories(${tool_name} PRIVATE ${NFQ_INCLUDE_DIR})
  target_link_libraries(${tool_name} PRIVATE ${NFQ_LIBRARY} ${NFNL_LIBRARY})
  target_compile_definitions(${tool_name} PRIVATE ATLAS_HAVE_NFQ=1)
else()
  message(STATUS "libnetfilter_queue not found: atlas-wan-delay built without NFQUEUE support")
  target_compile_definitions(${tool_name} PRIVATE ATLAS_HAVE_NFQ=0)
endif()
