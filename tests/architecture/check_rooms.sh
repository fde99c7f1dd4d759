#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The architecture rules of docs/architecture.md, checked on the source tree: which rooms a room
# may include, where the environment is read, which files may name CUDA, file sizes, and the
# runtime's independence of the schedule kind and of the simulator. Prints every violation as
# file:line: rule, and exits 1 if there is any. Usage: check_rooms.sh [SOURCE_DIR]
set -u
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
cd "$root" || { echo "check_rooms: cannot enter $root" >&2; exit 2; }

fail=0
violation() { echo "$1: $2"; fail=1; }

# ---- room dependencies: a room may include only its own headers and these rooms' ----
declare -A allowed=(
  [core]=""
  [bench]="core"
  [mpi]="core"
  [deck]="core mpi"
  [topo]="core deck mpi"
  [device]="core deck mpi"
  [model]="core deck device mpi"
  [wan]="core deck mpi"
  [io]="core deck mpi"
  [sched]="core deck topo"
  [runtime]="core deck device io model mpi sched topo wan"
  [bubbletea]="core deck device io model mpi runtime sched topo wan"
  [sim]="core deck sched topo"
  [plan]="core deck sched sim topo"
  [app]="core bench deck device io model mpi plan runtime sched sim topo wan bubbletea"
)
# A room's benchmark (bench.hpp, bench.cpp, bench_*.cpp) measures it side by side with another
# room's prediction or reference, through the harness: it may use any room but app.
bench_allowed="core bench deck device io model mpi plan runtime sched sim topo wan bubbletea"
for dir in src/* include/atlas/*; do
  [ -d "$dir" ] || continue
  room="${dir##*/}"
  if [ -z "${allowed[$room]+set}" ]; then
    violation "$dir" "room '$room' is not in docs/architecture.md's table (add it there and here)"
    continue
  fi
  while IFS= read -r hit; do
    file="${hit%%:*}"; rest="${hit#*:}"; line="${rest%%:*}"
    used="$(sed -E 's|.*#include "atlas/([a-z_]+)/.*|\1|' <<<"$rest")"
    [ "$used" = "$room" ] && continue
    uses="${allowed[$room]}"
    case "${file##*/}" in bench.hpp|bench.cpp|bench_*.cpp|bench_*.hpp) uses="$bench_allowed" ;; esac
    case " $uses " in
      *" $used "*) ;;
      *) violation "$file:$line" "room '$room' includes '$used' (allowed: ${uses:-nothing})" ;;
    esac
  done < <(grep -rnE '^#include "atlas/[a-z_]+/' "$dir" 2>/dev/null)
done

# ---- the environment is read in one documented place ----
while IFS= read -r hit; do
  case "$hit" in src/core/env.cpp:*) ;; *) violation "${hit%%:*}:$(cut -d: -f2 <<<"$hit")" \
    "getenv outside src/core/env.cpp (use atlas::env::get, list the variable in core/env.hpp)" ;; esac
done < <(grep -rnE '\b(std::)?(secure_)?getenv\(' src include 2>/dev/null)

# ---- only src/device/cuda names CUDA ----
while IFS= read -r hit; do
  case "$hit" in src/device/cuda/*) ;; *) violation "${hit%%:*}" "CUDA header outside src/device/cuda" ;; esac
done < <(grep -rnE '#include <(cuda|cuda_runtime|cublas|cublasLt|cudnn|nccl)[a-zA-Z_]*\.h>' src include 2>/dev/null)

# ---- the runtime walks the table: no schedule kind, no simulator ----
while IFS= read -r hit; do
  violation "${hit%%:*}:$(cut -d: -f2 <<<"$hit")" "the runtime branches on the schedule kind (put it in the table)"
done < <(grep -rn 'ScheduleKind' src/runtime include/atlas/runtime 2>/dev/null)
while IFS= read -r hit; do
  violation "${hit%%:*}:$(cut -d: -f2 <<<"$hit")" "training uses the simulator (the table comes from sched)"
done < <(grep -rn 'sim::' src/runtime include/atlas/runtime src/app/train_cmd.cpp 2>/dev/null)

while IFS= read -r hit; do
  violation "${hit%%:*}:$(cut -d: -f2 <<<"$hit")" "the runtime reads BubbleTea's keys (its policy lives in bubbletea/)"
done < <(grep -rnE '\.bubbletea\.' src/runtime include/atlas/runtime 2>/dev/null)

# ---- file sizes ----
while IFS= read -r f; do
  n=$(wc -l <"$f")
  [ "$n" -gt 1000 ] && violation "$f" "$n lines (split it along its sections: at most 1,000)"
done < <(find src include -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh')
if [ -f src/runtime/trainer.cpp ]; then
  n=$(wc -l <src/runtime/trainer.cpp)
  [ "$n" -ge 500 ] && violation src/runtime/trainer.cpp "$n lines (the step walk stays under 500)"
fi

[ "$fail" -eq 0 ] && echo "check_rooms: every rule of docs/architecture.md holds"
exit "$fail"
