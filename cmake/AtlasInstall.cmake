# SPDX-License-Identifier: MIT
# install() rules and the build tree's mirror of the installed layout.
#   <prefix>/bin/atlas, <prefix>/bin/atlas-* (the helper programs atlas execs, e.g. the BubbleTea
#   decode worker, which it looks for next to itself)
#   <prefix>/share/atlas/{profiles,scripts/report,inputs}: what the binary looks up at run time,
#   found relative to the binary (core/paths.hpp: <bin>/${ATLAS_DATA_DIR_FROM_BIN}).
# The build tree gets the same <build>/share/atlas, made of links back to the checkout, so a
# build-tree binary (bin/ or tests/) finds the checkout's files by the same rule and nothing
# absolute is compiled in.

# Installed binaries keep the run paths of libraries outside the system directories (an HDF5 or
# MPI from a module system); the system ones need none.
set_target_properties(atlas PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

set(ATLAS_DATA_SUBDIRS profiles scripts inputs)
set(ATLAS_BUILD_DATA_DIR "${CMAKE_BINARY_DIR}/${CMAKE_INSTALL_DATADIR}/atlas")
file(MAKE_DIRECTORY "${ATLAS_BUILD_DATA_DIR}")
foreach(d ${ATLAS_DATA_SUBDIRS})
  if(NOT EXISTS "${ATLAS_BUILD_DATA_DIR}/${d}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${d}" "${ATLAS_BUILD_DATA_DIR}/${d}" SYMBOLIC)
  endif()
endforeach()

install(TARGETS atlas RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Every helper program (tools/*.cpp -> atlas-<name>).
get_property(_atlas_tools DIRECTORY ${PROJECT_SOURCE_DIR}/tools PROPERTY BUILDSYSTEM_TARGETS)
foreach(t ${_atlas_tools})
  get_target_property(_type ${t} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    set_target_properties(${t} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(_atlas_share "${CMAKE_INSTALL_DATADIR}/atlas")
install(DIRECTORY profiles/ DESTINATION ${_atlas_share}/profiles)
install(DIRECTORY inputs/ DESTINATION ${_atlas_share}/inputs)
install(DIRECTORY scripts/report/ DESTINATION ${_atlas_share}/scripts/report
  USE_SOURCE_PERMISSIONS PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
