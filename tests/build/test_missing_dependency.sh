#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make build` on a machine where a dependency is missing: configure (in a scratch build directory)
# stops, names each missing dependency with its Debian package and the CMake variable that points
# at it, and never calls apt/dpkg/sudo. The missing dependencies are simulated with
# CMAKE_DISABLE_FIND_PACKAGE_<Pkg>; apt-get, apt, dpkg, dpkg-query and sudo are replaced on PATH by
# stubs that record the call.  Usage: test_missing_dependency.sh SOURCE_DIR CMAKE_COMMAND
set -euo pipefail
src="$1"
cmake_cmd="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/stubs"
for tool in apt-get apt dpkg dpkg-query sudo; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/called"\nexit 1\n' "$tool" "$work" > "$work/stubs/$tool"
  chmod +x "$work/stubs/$tool"
done
# cmake as configured for this build, first on PATH (the Makefile calls `cmake`).
ln -s "$cmake_cmd" "$work/stubs/cmake"

fail() { echo "FAIL: $*" >&2; echo "---- make build output ----" >&2; cat "$work/out" >&2; exit 1; }

set +e
PATH="$work/stubs:$PATH" env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make --no-print-directory -C "$src" build BUILD_DIR="$work/build" \
  CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_HDF5=ON -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON" \
  > "$work/out" 2>&1
rc=$?
set -e

[[ $rc -ne 0 ]] || fail "make build succeeded although HDF5 and BLAS were hidden"
[[ ! -e "$work/called" ]] || fail "make build called a package tool: $(cat "$work/called")"
grep -q "missing HDF5" "$work/out" || fail "no line names HDF5"
grep -q "libhdf5-openmpi-dev" "$work/out" || fail "HDF5's Debian package is not named"
grep -q "HDF5_ROOT" "$work/out" || fail "the CMake variable for HDF5 is not named"
grep -q "missing OpenBLAS" "$work/out" || fail "no line names OpenBLAS"
grep -q "libopenblas-dev" "$work/out" || fail "OpenBLAS's Debian package is not named"
grep -q "2 required dependencies are missing" "$work/out" || fail "the count is not 2"
# Nothing else is reported missing, and the build never started.
[[ $(grep -c "^ *missing " "$work/out") -eq 2 ]] || fail "other dependencies reported missing"
if grep -q "Building CXX" "$work/out"; then fail "the build started"; fi
echo "OK: make build named the 2 hidden dependencies and their packages without calling apt"
