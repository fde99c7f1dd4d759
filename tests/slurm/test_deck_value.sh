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

# What the job holds on each node (`scontrol show job -d`'s per-node lines) bounds the ranks the
# hostfile may put there: 12 ranks of DC b on b1, where the job holds 8 CPUs, stop the job before
# the launch (srun would refuse the step, mpirun would share the cores), unless --overcommit; a
# CUDA deck needs one GPU per rank. CPU_IDs ranges and several GPU types add up.
SLURM_JOB_ID=7
JOB_DETAIL="   JOB_GRES=gpu:16
     Nodes=a[1-5] CPU_IDs=0-3,8-11 Mem=0 GRES=gpu:a100:4(IDX:0-3),gpu:v100:2(IDX:4-5)
     Nodes=b1 CPU_IDs=0-7 Mem=0 GRES=gpu:8(IDX:0-7)"
scontrol() {
  if [[ $1 == show && $2 == hostnames ]]; then
    case $3 in "a[1-5]") printf 'a%s\n' 1 2 3 4 5 ;; *) tr ',' '\n' <<<"$3" ;; esac
  elif [[ $1 == show && $2 == job && $3 == -d && $4 == "$SLURM_JOB_ID" ]]; then
    echo "$JOB_DETAIL"
  else return 1; fi
}
caps=$(atlas_job_node_caps | tr '\n' ';')
if [[ $caps == "a1 8 6;a2 8 6;a3 8 6;a4 8 6;a5 8 6;b1 8 8;" ]]; then echo "ok: node caps $caps"
else echo "FAIL: node caps '$caps'"; fail=1; fi
ATLAS_OVERRIDES=(parallel.dp_size=3 parallel.tp_size=4 "parallel.stages_per_dc=1 1" "cluster.dcs=a b")
got=$( (atlas_write_hostfile "$T/hostfile1") 2>&1)
if [[ $got == "ERROR: the per-DC hostfile puts 12 ranks on node b1, which need 12 CPUs (12 x 1 CPUs per task), but this job holds 8 CPUs there"* &&
  $got == *"hint: request more CPUs on that node"* ]]; then
  echo "ok: 12 ranks on 8 CPUs refused"
else echo "FAIL: 12 ranks on 8 CPUs: '$got'"; fail=1; fi
got=$( (SLURM_OVERCOMMIT=1 atlas_write_hostfile "$T/hostfile2") 2>&1)
if [[ -z $got && $(wc -l <"$T/hostfile2") -eq 24 ]]; then echo "ok: --overcommit shares the CPUs"
else echo "FAIL: with --overcommit: '$got'"; fail=1; fi
# Two CPUs per task: a1-a3's 4 ranks need 8 (they have 8), b1's 12 need 24.
got=$( (SLURM_OVERCOMMIT= SLURM_CPUS_PER_TASK=2 atlas_write_hostfile "$T/hostfile3") 2>&1)
if [[ $got == *"puts 12 ranks on node b1, which need 24 CPUs (12 x 2 CPUs per task), but this job holds 8 CPUs there"* ]]; then
  echo "ok: CPUs per task counted"
else echo "FAIL: CPUs per task: '$got'"; fail=1; fi
# CUDA: b1's 12 ranks on its 8 GPUs (CPUs overcommitted) run sharing GPUs, with a warning;
# refused where the job asked for a GPU per task (srun would refuse the step); 8 ranks fit.
ATLAS_OVERRIDES=(parallel.dp_size=3 parallel.tp_size=4 "parallel.stages_per_dc=1 1" "cluster.dcs=a b" device.backend=cuda)
got=$( (SLURM_OVERCOMMIT=1 atlas_write_hostfile "$T/hostfile4") 2>&1)
if [[ $got == "# WARNING: the per-DC hostfile puts 12 ranks on node b1, but this job holds 8 GPUs there: ranks share GPUs"* &&
  $(wc -l <"$T/hostfile4") -eq 24 ]]; then
  echo "ok: 12 CUDA ranks on 8 GPUs warned"
else echo "FAIL: 12 CUDA ranks on 8 GPUs: '$got'"; fail=1; fi
got=$( (SLURM_OVERCOMMIT=1 SLURM_GPUS_PER_TASK=1 atlas_write_hostfile "$T/hostfile4b") 2>&1)
if [[ $got == "ERROR: the per-DC hostfile puts 12 ranks on node b1, but this job holds 8 GPUs there, and it asked for 1 per task (--gpus-per-task)"* ]]; then
  echo "ok: 12 CUDA ranks on 8 GPUs refused with --gpus-per-task"
else echo "FAIL: 12 CUDA ranks on 8 GPUs, --gpus-per-task: '$got'"; fail=1; fi
ATLAS_OVERRIDES=(parallel.dp_size=2 parallel.tp_size=4 "parallel.stages_per_dc=1 1" "cluster.dcs=a b" device.backend=cuda)
ATLAS_RANKS_PER_DC=$(atlas_ranks_per_dc)
got=$( (SLURM_OVERCOMMIT=1 atlas_write_hostfile "$T/hostfile5") 2>&1)
if [[ -z $got && $(grep -c b1 "$T/hostfile5") -eq 8 ]]; then echo "ok: 8 CUDA ranks on 8 GPUs"
else echo "FAIL: 8 CUDA ranks on 8 GPUs: '$got'"; fail=1; fi
# A node whose GPUs the job does not hold as GRES ("GRES=": a cluster that does not schedule its
# GPUs) gives no GPU count, so the CUDA check leaves it alone; its 32 CPUs hold the 12 ranks.
# Not GPUs: vgpu and shard entries; an IDX list's commas split no entry into a count.
JOB_DETAIL="     Nodes=a[1-5] CPU_IDs=0-3,8-11 Mem=0 GRES=vgpu:4(IDX:0-3),gpu:2(IDX:0,2),shard:8(IDX:0-1)
     Nodes=b1 CPU_IDs=0-31 Mem=0 GRES=
     Nodes=c1 Mem=0 GRES=gpu:tesla:2(IDX:0-1)"
caps=$(atlas_job_node_caps | tr '\n' ';')
if [[ $caps == "a1 8 2;a2 8 2;a3 8 2;a4 8 2;a5 8 2;b1 32 -;c1 - 2;" ]]; then echo "ok: node caps $caps"
else echo "FAIL: node caps '$caps'"; fail=1; fi
ATLAS_OVERRIDES=(parallel.dp_size=3 parallel.tp_size=4 "parallel.stages_per_dc=1 1" "cluster.dcs=a b" device.backend=cuda)
ATLAS_RANKS_PER_DC=$(atlas_ranks_per_dc)
caps=$(atlas_job_node_caps | grep '^b1 ')
got=$( (SLURM_OVERCOMMIT= atlas_write_hostfile "$T/hostfile6") 2>&1)
if [[ $caps == "b1 32 -" && $got != *ERROR* && $got != *"node b1"* && $got == *"4 ranks on node a1, but this job holds 2 GPUs"* &&
  $(grep -c b1 "$T/hostfile6") -eq 12 ]]; then echo "ok: no GRES, no GPU check ($caps)"
else echo "FAIL: no GRES: caps '$caps', '$got'"; fail=1; fi
exit $fail
