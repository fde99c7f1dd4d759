#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A peer that stops answering (ATLAS_FAULT_HANG: a stuck or cut-off rank, alive but silent) makes
# the ranks that wait on it give up within wan.recv_timeout_s with an error that names it (rank,
# stage, DC, over MPI or the WAN transport) and a hint; the job ends (no rank left hanging), with
# a non-zero exit, and the metrics of the steps before the hang are kept. The peer behind a WAN
# boundary and the peer behind an intra-DC one; the first over wan.transport = mpi; and a replica
# whose DP gradient sum never completes (one DC, one stage), and a TP member whose sum never
# completes. Loopback only; removes its temp dir.
# usage: test_peer_hang.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_peer_hang.sh hang-test "$@"
# 4 ranks: 2 DCs x 2 stages, dp 1: ranks 0, 1 in east (stages 0, 1), ranks 2, 3 in west.
COMMON=(inputs/default.deck parallel.dp_size=1 run.steps=6 run.log_every_steps=1 ckpt.every_steps=0
        train.eval_every_steps=0 run.out_dir="$T" wan.recv_timeout_s=3)
MPI=(mpirun -np 4 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
run_hang() { # NAME RANK:STEP -> exit status in $T/NAME.rc, output in $T/NAME.out
  ATLAS_FAULT_HANG=$2 timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name="$1" > "$T/$1.out" 2>&1
  echo $? > "$T/$1.rc"
}
# ---- rank 2 (stage 2, west) stops at step 3: rank 3 waits on it over MPI, rank 1 over the WAN ----
run_hang west 2:3
rc=$(cat "$T/west.rc")
check "the job ended by itself (exit $rc, not the 120 s guard)" test "$rc" -ne 0 -a "$rc" -ne 124
check "rank 2 stopped at step 3" grep -q "\[rank 2\] fault injection (ATLAS_FAULT_HANG): this rank stops at step 3" "$T/west.out"
# Both of its neighbours start waiting at the step's start; the first to time out aborts the job.
check "a waiting neighbour names the silent peer (rank 3 over MPI or rank 1 over the WAN)" \
  grep -qE "ERROR: step 3: no activation of micro-batch 0 from rank 2 \(stage 2, dc 1\) after 3 s over MPI|ERROR: WAN receive from peer 2 stalled: no data for 3.0 s" "$T/west.out"
check "a receive timeout carries the hint" bash -c "grep -q 'hint: the peer may have died or hung, or be waiting itself on a rank upstream' '$T/west.out' || ! grep -q 'after 3 s over' '$T/west.out'"
check "the steps before the hang are in metrics.csv" \
  test "$(awk -F, 'NR > 1 { print $1 }' "$T/west/metrics.csv" | tr '\n' ' ')" = "0 1 2 "
check "no pending-request 'bug' lines while the error unwinds" bash -c "! grep -q 'a missing wait' '$T/west.out'"
# Rank 0 writes run.json: "failed" with the error when it raised one, else (aborted by the rank
# that timed out first) "interrupted" (the abort reaches it as SIGTERM) or, killed outright, the
# "running" of the job's start; never an earlier job's "OK".
check "run.json says failed (exit code 3), interrupted (the abort's SIGTERM) or running, not OK" \
  grep -qE '"status":"failed","exit_code":3,"error":"|"status":"interrupted","signal":"SIGTERM"|"status":"running"' "$T/west/run.json"
# ---- rank 1 (stage 1, east) stops at step 2: rank 2 waits on it over the WAN transport ----
run_hang east 1:2
rc=$(cat "$T/east.rc")
check "the job ended by itself (exit $rc, not the 120 s guard)" test "$rc" -ne 0 -a "$rc" -ne 124
# Rank 2 waits on rank 1 across the WAN and rank 3 on rank 2 inside west, both from the step's
# start: whichever times out first names the rank it waits on (a chain: follow it upstream).
check "rank 2 names the silent peer across the WAN, or rank 3 names rank 2, which waits on it" \
  grep -qE "ERROR: step 2: no activation of micro-batch 0 from rank 1 \(stage 1, dc 0\) after 3 s over the WAN transport|ERROR: step 2: no activation of micro-batch 0 from rank 2 \(stage 2, dc 1\) after 3 s over MPI" "$T/east.out"
check "the steps before the hang are in metrics.csv" \
  test "$(awk -F, 'NR > 1 { print $1 }' "$T/east/metrics.csv" | tr '\n' ' ')" = "0 1 "
# ---- the same over wan.transport = mpi: the sender thread, whose send to the silent rank never
# completes, must not hold the error's report (the job hung until killed) ----
ATLAS_FAULT_HANG=2:3 timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name=mpiwan wan.transport=mpi \
  > "$T/mpiwan.out" 2>&1
rc=$?
check "wan.transport = mpi: the job ended by itself (exit $rc, expected 3)" test "$rc" -eq 3
check "naming a silent peer" grep -qE "ERROR: step 3: no (activation|gradient) of micro-batch 0 from rank [12]" "$T/mpiwan.out"
check "no pending-request 'bug' lines from the sender thread" bash -c "! grep -q 'a missing wait' '$T/mpiwan.out'"
# One DC, one stage, 2 ranks, rank 1 silent from step STEP: run_one_dc NAME STEP KEY=VALUE... -> $T/NAME.out
run_one_dc() {
  local name=$1 at=$2
  shift 2
  ATLAS_FAULT_HANG=1:$at timeout 120 mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo "$ATLAS_BIN" train inputs/default.deck cluster.dcs=east cluster.gpus_per_dc=2 \
    parallel.stages_per_dc=1 'model.layers_per_stage=""' cluster.latency_ms=0 cluster.bandwidth_gbps=0 \
    run.steps=6 ckpt.every_steps=0 train.eval_every_steps=0 run.out_dir="$T" wan.recv_timeout_s=3 \
    run.name="$name" "$@" > "$T/$name.out" 2>&1
}
# ---- dp 2: no pipeline neighbour to time out; the DP gradient sum must ----
run_one_dc dponly 3 parallel.dp_size=2
rc=$?
check "dp only: the job ended by itself (exit $rc, expected 3)" test "$rc" -eq 3
check "the DP gradient sum names its timeout and the fix" grep -q \
  "ERROR: rank 0: the data-parallel gradient sum (bucket 1 of [0-9]*, over this stage's 2 replicas) did not complete within 3 s" \
  "$T/dponly.out"
# ---- tp 2: a tensor-parallel sum the silent member never joins (it waited for ever: MPI sums
# of the TP group had no bound) ----
run_one_dc tponly 2 parallel.dp_size=1 parallel.tp_size=2
rc=$?
check "tp only: the job ended by itself (exit $rc, expected 3)" test "$rc" -eq 3
check "the TP sum names its group, its timeout and the key" grep -q \
  "ERROR: a tensor-parallel sum (over 2 ranks; this rank is member 0) did not complete within 3 s (wan.recv_timeout_s)" \
  "$T/tponly.out"
# ---- a stage that hangs in the evaluation (after step 1's training): its neighbour inside the
# DC, and rank 0 waiting for the validation loss, give up within wan.recv_timeout_s, naming the wait ----
ATLAS_FAULT_HANG_EVAL=1:1 timeout 120 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck parallel.dp_size=1 \
  run.steps=4 run.log_every_steps=1 ckpt.every_steps=0 train.eval_every_steps=2 run.out_dir="$T" \
  wan.recv_timeout_s=3 run.name=evalhang > "$T/evalhang.out" 2>&1
rc=$?
check "a hang in the evaluation: the job ended by itself (exit $rc, not the 120 s guard)" test "$rc" -ne 0 -a "$rc" -ne 124
check "rank 1 stopped before its evaluation" grep -q "\[rank 1\] fault injection (ATLAS_FAULT_HANG_EVAL): this rank stops at step 1" "$T/evalhang.out"
check "a waiting rank names the evaluation's wait and the limit" \
  grep -qE "ERROR: (evaluation: .* within 3 s \(wan.recv_timeout_s\)|WAN receive from peer 1 stalled)" "$T/evalhang.out"
check "no rank of either job is left running" bash -c "! pgrep -f '[r]un.out_dir=$T' > /dev/null"
launch_finish
