#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One job per run directory, end to end with the binary: a second `atlas train` into a run
# directory whose lock is held ends within seconds with exit code 2 and a message naming the
# directory, the holder's pid and the fix, without touching the first job's files; a lock file
# whose holder died does not block; and two real jobs started with one run.name: the second is
# refused while the first runs on undisturbed; a job whose ckpt.dir is a running job's default
# checkpoint directory is refused as well. Loopback only; removes its temp dir.
# usage: test_run_dir_lock.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_run_dir_lock.sh lock-test "$@"
# 2 ranks: 2 DCs x 1 stage, dp 1.
COMMON=(inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 run.log_every_steps=1
        train.eval_every_steps=0 run.out_dir="$T")
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
train() { # NAME STEPS [CKPT_EVERY [KEY=VALUE...]] -> exit status returned
  timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name="$1" run.steps="$2" \
    ckpt.every_steps="${3:-0}" "${@:4}"
}

# ---- a lock held by another process (util-linux flock, the same flock(2) lock) ----
mkdir -p "$T/held"
echo "step,loss" > "$T/held/metrics.csv"
flock -F "$T/held/.lock" sh -c "echo \"pid \$\$ on host elsewhere, since 2026-01-01T00:00:00Z\" > '$T/held/.lock'; exec sleep 120" &
holder=$!
for _ in $(seq 50); do grep -q pid "$T/held/.lock" 2>/dev/null && break; sleep 0.1; done
start=$SECONDS
train held 2 > "$T/held.out" 2>&1
rc=$?
check "the second job exits with code 2 (config; got $rc)" test "$rc" -eq 2
check "within seconds ($((SECONDS - start)) s)" test $((SECONDS - start)) -le 20
check "it names the run directory, the holder's pid and the fix" grep -q \
  "ERROR: run directory '$T/held' is in use by another atlas job (pid $holder on host elsewhere" "$T/held.out"
check "with a hint" grep -q "hint: give this job its own run.name (e.g. run.name=held_2)" "$T/held.out"
check "the first job's metrics.csv is untouched" test "$(cat "$T/held/metrics.csv")" = "step,loss"
check "and no resolved.deck was written" test ! -e "$T/held/resolved.deck"

# ---- the holder dies (SIGKILL, no clean-up): its lock file no longer blocks ----
kill -KILL "$holder"
wait "$holder" 2>/dev/null
train held 2 > "$T/stale.out" 2>&1
check "a job in a directory with a stale lock file runs" grep -q "^# OK: 2 steps" "$T/stale.out"

# ---- two real jobs with one run.name ----
train twice 40 > "$T/first.out" 2>&1 &
first=$!
for _ in $(seq 300); do grep -q pid "$T/twice/.lock" 2>/dev/null && break; sleep 0.1; done
train twice 2 > "$T/second.out" 2>&1
rc=$?
check "the second job exits with code 2 (got $rc)" test "$rc" -eq 2
check "it names the first job's rank 0" grep -q "ERROR: run directory '$T/twice' is in use by another atlas job (pid [0-9]* on host" "$T/second.out"
wait "$first"
check "the first job ends OK" grep -q "^# OK: 40 steps" "$T/first.out"
check "with its own 40 metrics rows only" test "$(awk -F, 'NR > 1' "$T/twice/metrics.csv" | wc -l)" -eq 40

# ---- a second job pointing its ckpt.dir into a running job's default checkpoint directory ----
train ckA 40 10 > "$T/ckA.out" 2>&1 &
first=$!
for _ in $(seq 300); do grep -q pid "$T/ckA/ckpt/.lock" 2>/dev/null && break; sleep 0.1; done
train ckB 2 1 ckpt.dir="$T/ckA/ckpt" > "$T/ckB.out" 2>&1
rc=$?
check "the job sharing the checkpoint directory exits with code 2 (got $rc)" test "$rc" -eq 2
check "it names the checkpoint directory and the first job's rank 0" grep -q \
  "ERROR: checkpoint directory '$T/ckA/ckpt' is in use by another atlas job (pid [0-9]* on host" "$T/ckB.out"
check "with a hint" grep -q "hint: give this job its own ckpt.dir" "$T/ckB.out"
wait "$first"
check "the first job ends OK" grep -q "^# OK: 40 steps" "$T/ckA.out"
check "its checkpoints are its own (steps 30 and 40 kept, none of the second job's)" test \
  "$(cd "$T/ckA/ckpt" && echo step-*)" = "step-000030.h5 step-000040.h5"

launch_finish
