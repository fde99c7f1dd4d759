#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A rank of a running job dies; the restart launcher resumes it from the latest checkpoint; the
# loss at every step equals an uninterrupted run's. Twice: a rank killed at the start of a step,
# and a rank killed while a checkpoint is being written (after the .tmp, before the rename: the
# previous checkpoint must be the one resumed). Uses the fault-injection variables of
# include/atlas/runtime/fault.hpp. Cleans up its temp dir; no network beyond loopback.
# usage: test_kill_restart.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_kill_restart.sh kill-test "$@"
export ATLAS_RESTART_BACKOFF_S=1 ATLAS_MAX_RESTARTS=2
# 4 ranks: 2 DCs x 2 stages, dp 1; a checkpoint every 2 steps.
COMMON=(inputs/default.deck parallel.dp_size=1 run.steps=8 run.log_every_steps=1 ckpt.every_steps=2
        ckpt.keep_last=5 train.eval_every_steps=0 run.out_dir="$T" wan.recv_timeout_s=20)
MPI=(mpirun -np 4 --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

# The loss column of metrics.csv, the last record of each step (a resumed run repeats steps).
losses() { awk -F, 'NR > 1 { loss[$1] = $2 } END { for (s = 0; s < 8; s++) print s, loss[s] }' "$1"; }

"${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name=straight > "$T/straight.out" 2>&1
check "the uninterrupted run finished" grep -q "^# OK: 8 steps" "$T/straight.out"

# ---- a rank dies at the start of step 5 (the latest checkpoint holds 4 steps) ----
ATLAS_FAULT_KILL=2:5 scripts/launch/atlas-run-restart.sh -- "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" \
  run.name=killed > "$T/killed.out" 2>&1
check "rank 2 was killed by the fault injection" grep -q "fault injection (ATLAS_FAULT_KILL): killing this rank at step 5" "$T/killed.out"
check "the launcher restarted it with run.resume=latest" grep -q "attempt 2/3: .*run.resume=latest" "$T/killed.out"
check "it resumed from step-000004.h5" grep -q "# resumed from .*step-000004.h5 at step 4" "$T/killed.out"
check "the restarted run finished" grep -q "^# OK:" "$T/killed.out"
check "every step's loss equals the uninterrupted run's" diff <(losses "$T/straight/metrics.csv") <(losses "$T/killed/metrics.csv")
check "metrics.csv has one row per step (the resumed run dropped the killed job's rows past its checkpoint)" \
  test "$(awk -F, 'NR > 1 { print $1 }' "$T/killed/metrics.csv" | tr '\n' ' ')" = "0 1 2 3 4 5 6 7 "

# ---- a rank dies while the checkpoint of step 4 is being written ----
ATLAS_FAULT_KILL_IN_CKPT=1:4 scripts/launch/atlas-run-restart.sh -- "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" \
  run.name=ckptkill > "$T/ckptkill.out" 2>&1
check "rank 1 died inside the checkpoint write" grep -q "fault injection (ATLAS_FAULT_KILL_IN_CKPT): killing this rank at step 4" "$T/ckptkill.out"
check "the half-written checkpoint was skipped and the previous one resumed" grep -q "# resumed from .*step-000002.h5 at step 2" "$T/ckptkill.out"
check "the restarted run finished" grep -q "^# OK:" "$T/ckptkill.out"
check "every step's loss equals the uninterrupted run's" diff <(losses "$T/straight/metrics.csv") <(losses "$T/ckptkill/metrics.csv")

# ---- a job killed in a directory whose earlier job finished: its run.json no longer says OK ----
grep -q '"status":"OK"' "$T/straight/run.json"
check "the earlier job's run.json said OK" test $? -eq 0
ATLAS_FAULT_KILL=2:3 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name=straight > "$T/again.out" 2>&1
# Rank 0 says "interrupted" when the launcher's SIGTERM reaches it (core/signals), "running" when
# it was killed outright; never the earlier job's "OK".
check "the killed job's run.json says running or interrupted (no earlier OK beside its metrics)" \
  grep -qE '^\{"run":"straight","status":"(running","first_step":0,"steps":8|interrupted","signal":"SIGTERM","step":3,"steps":8)' "$T/straight/run.json"

launch_finish
