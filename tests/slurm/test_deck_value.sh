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

# The ranks of each DC (the hostfile and the launch's task count come from them): stages x dp x tp;
# with parallel.dp_across_dcs a DC holds dp_size / DCs replicas (it counted all of them: a 16-rank
# ablation row (a) launched 32 tasks).
ranks() { # expected, overrides...
  local want=$1 got
  shift
  ATLAS_OVERRIDES=("$@")
  got=$( (atlas_ranks_per_dc) 2>&1)
  if [[ $got == "$want" ]]; then echo "ok: ranks per DC with ${*:-no override} = '$got'"
  else echo "FAIL: ranks per DC with ${*:-no override} = '$got', expected '$want'"; fail=1; fi
}
ranks "2 2 2"
ranks "8 8 8" parallel.dp_size=4 parallel.tp_size=2
ranks "2 2 2" parallel.dp_size=6 parallel.dp_across_dcs=true
ranks "4 4 4" parallel.dp_size=6 parallel.dp_across_dcs=1 parallel.tp_size=2 "parallel.stages_per_dc=1 1 1"
ranks "ERROR: $T/sect.deck: parallel.dp_across_dcs needs parallel.dp_size (4) to be a multiple of the DCs (3)" \
  parallel.dp_size=4 parallel.dp_across_dcs=true
ranks "ERROR: $T/sect.deck: parallel.dp_across_dcs = 'yes': expected true or false" parallel.dp_across_dcs=yes

# The hostfile keeps a TP group on one node: 12 ranks of DC a (tp 4) over 5 nodes go 4 to a node
# on 3 of them (blocks of 3 split two of the groups), DC b's 12 on its one node. scontrol stands in.
scontrol() { [[ $1 == show && $2 == hostnames ]] && tr ',' '\n' <<<"$3"; }
SLURM_JOB_NODELIST="a1,a2,a3,a4,a5,b1"
ATLAS_OVERRIDES=(parallel.dp_size=3 parallel.tp_size=4 "parallel.stages_per_dc=1 1" "cluster.dcs=a b")
ATLAS_DC_NODES="a1,a2,a3,a4,a5 b1"
ATLAS_RANKS_PER_DC=$(atlas_ranks_per_dc)
atlas_write_hostfile "$T/hostfile"
got=$(uniq -c "$T/hostfile" | awk '{printf "%s%sx%s", (NR > 1 ? " " : ""), $2, $1}')
if [[ $got == "a1x4 a2x4 a3x4 b1x12" ]]; then echo "ok: hostfile $got"
else echo "FAIL: hostfile $got, expected a1x4 a2x4 a3x4 b1x12"; fail=1; fi
# A tp_size of 0 (blocks of 0 ranks) stops the job with the key's name, not a division by zero.
ATLAS_OVERRIDES=(parallel.tp_size=0 "parallel.stages_per_dc=1 1" "cluster.dcs=a b")
got=$( (atlas_write_hostfile "$T/hostfile0") 2>&1)
if [[ $got == "ERROR: $T/sect.deck: parallel.tp_size = '0': expected a positive integer" ]]; then
  echo "ok: tp_size 0 refused"
else echo "FAIL: tp_size 0: '$got'"; fail=1; fi
exit $fail
