#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Slurm scripts read a few deck keys themselves (scripts/slurm/common.sh atlas_deck_value: the
# layout, run.name, wan.key_file) before atlas runs: they must read them as atlas does, with
# [section] blocks, '#' inside quotes kept, the last key=value override winning. A sectioned deck's
# parallel.stages_per_dc read as missing failed the job; a sectioned dp_size read as 1.
# usage: test_deck_value.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
# shellcheck source=../../scripts/slurm/common.sh
source scripts/slurm/common.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/sect.deck" <<'DECK'
# a deck with [section] blocks
run.name = "a#b"   # a comment
[parallel]
stages_per_dc = 1 1 1
dp_size = 2  # two
[cluster]
dcs = a b c
DECK
ATLAS_DECK_PATH=$T/sect.deck
ATLAS_OVERRIDES=()
fail=0
expect() {
  local got
  got=$(atlas_deck_value "$1")
  if [[ $got == "$2" ]]; then echo "ok: $1 = '$got'"; else echo "FAIL: $1 = '$got', expected '$2'"; fail=1; fi
}
expect run.name "a#b"
expect parallel.stages_per_dc "1 1 1"
expect parallel.dp_size 2
expect cluster.dcs "a b c"
expect parallel.tp_size ""
ATLAS_OVERRIDES=(parallel.dp_size=4)
expect parallel.dp_size 4
exit $fail
