# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Shared by the launch tests (sourced, not run): arguments, a temp dir removed at exit, the MPI
# environment for root and oversubscription, and the ok/FAIL bookkeeping.
#   launch_setup SCRIPT_NAME TEMP_STEM SOURCE_DIR ATLAS_BIN   sets ROOT, ATLAS_BIN, T; cd ROOT
#   check DESCRIPTION COMMAND...                            prints ok/FAIL, remembers a failure
#   to OUT COMMAND...                                       COMMAND's output (both streams) into OUT
#   exits_with OUT_NAME CODE REGEX COMMAND...               COMMAND exits with CODE and its output
#                                                           ($T/OUT_NAME.out) matches REGEX (grep -E)
#   launch_finish                                           on a failure: every *.out's tail, exit 1

launch_setup() {
  local script=$1 stem=$2
  ROOT=$(cd "${3:?usage: $script SOURCE_DIR ATLAS_BIN}" && pwd)
  ATLAS_BIN=${4:?usage: $script SOURCE_DIR ATLAS_BIN}
  T=$(mktemp -d "/tmp/atlas-$stem.XXXXXX")
  trap 'rm -rf "$T"' EXIT
  cd "$ROOT" || exit 1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMP_WAIT_POLICY=passive
  fail=0
}

check() { # description, command...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}

to() { local out=$1; shift; "$@" > "$out" 2>&1; }

exits_with() {
  local out=$T/$1.out code=$2 re=$3; shift 3
  "$@" > "$out" 2>&1
  local rc=$?
  [[ $rc == "$code" ]] || { echo "  exit code $rc, expected $code"; cat "$out"; return 1; }
  grep -Eq -- "$re" "$out" || { echo "  no match for: $re"; cat "$out"; return 1; }
}

launch_finish() {
  if ((fail)); then
    for f in "$T"/*.out; do echo "---- $f"; tail -n 30 "$f"; done
    exit 1
  fi
}
