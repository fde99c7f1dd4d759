#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check_rooms.sh catches what it promises: on a scratch copy of the tree with one violation of
# each rule planted, it exits 1 and names every one (file and rule); on the real tree it passes
# (the ctest architecture_rules). Usage: test_check_rooms.sh SOURCE_DIR
set -euo pipefail
src="$1"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp -r "$src/src" "$src/include" "$scratch/"
mkdir -p "$scratch/tests/architecture"
cp "$src/tests/architecture/check_rooms.sh" "$scratch/tests/architecture/"

# One violation per rule.
printf '#include "atlas/sim/simulator.hpp"\n' >>"$scratch/src/runtime/fault.cpp"
printf 'static const char* planted = std::getenv("HOME");\n' >>"$scratch/src/wan/fd.cpp"
printf '#include <cuda_runtime.h>\n' >>"$scratch/src/model/rng.cpp"
printf '// ScheduleKind::Atlas\n' >>"$scratch/src/runtime/boundary.cpp"
printf 'void f() { atlas::sim::simulate(); }\n' >>"$scratch/src/runtime/profiler.cpp"
printf 'bool g(const Config& c) { return c.bubbletea.watch_recv; }\n' >>"$scratch/src/runtime/checkpointing.cpp"
for i in $(seq 1 1001); do echo "// padding $i"; done >"$scratch/src/core/big.cpp"
mkdir -p "$scratch/src/newroom" && printf '// x\n' >"$scratch/src/newroom/x.cpp"

set +e
out="$(bash "$scratch/tests/architecture/check_rooms.sh" "$scratch")"
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: check_rooms exited $rc on a tree with violations (expected 1)"; exit 1; }
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "FAIL: no report of: $1"; exit 1; }
}
expect "src/runtime/fault.cpp"
expect "room 'runtime' includes 'sim'"
expect "src/wan/fd.cpp"
expect "getenv outside src/core/env.cpp"
expect "src/model/rng.cpp: CUDA header outside src/device/cuda"
expect "src/runtime/boundary.cpp"
expect "branches on the schedule kind"
expect "src/runtime/profiler.cpp"
expect "training uses the simulator"
expect "src/runtime/checkpointing.cpp"
expect "reads BubbleTea's keys"
expect "src/core/big.cpp: 1001 lines"
expect "room 'newroom' is not in docs/architecture.md's table"
[ "$(grep -c . <<<"$out")" -eq 8 ] || { echo "FAIL: expected exactly 8 reports"; exit 1; }
echo "PASS: every planted violation reported"
