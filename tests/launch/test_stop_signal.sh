#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Signals a running `atlas train` answers (include/atlas/core/signals.hpp):
#   - SIGUSR1 to mpirun (which passes it on to the ranks): every rank stops after the same step
#     with a checkpoint of that step, exit code 8, the STOPPED footer and run.json "stopped";
#     run.resume=latest then finishes the run with every step's loss equal to an uninterrupted
#     run's;
#   - the same with BubbleTea on (its decode worker shares the ranks' process group: the stop
#     request must not kill it);
#   - SIGTERM to world rank 0: the job dies (the launcher ends the other ranks), but rank 0 first
#     writes the "interrupted" note into log.txt and run.json (with the deck keys that resume it,
#     run.resume_fallback too when it started from a checkpoint outside its ckpt.dir).
# Cleans up its temp dir and every process it started; no network beyond loopback.
# usage: test_stop_signal.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_stop_signal.sh stop-test "$@"
STEPS=30
COMMON=(inputs/default.deck parallel.dp_size=1 run.steps=$STEPS run.log_every_steps=1 ckpt.every_steps=0
        train.eval_every_steps=0 run.out_dir="$T" wan.recv_timeout_s=20 profile.enabled=false)
MPI_ARGS=(--oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
MPI=(mpirun -np 4 "${MPI_ARGS[@]}")

# The loss column of metrics.csv, one line per step.
losses() { awk -F, -v n=$STEPS 'NR > 1 { loss[$1] = $2 } END { for (s = 0; s < n; s++) print s, loss[s] }' "$1"; }
# Rows of metrics.csv so far (0 before the file exists).
rows() { if [[ -f $1 ]]; then echo $(($(wc -l <"$1") - 1)); else echo 0; fi; }

# Starts the job in the background as $job (mpirun's pid), waits until it has logged $2 steps,
# then sends signal $3 to mpirun and waits for the job's status ($status). $1 = run.name; the
# rest: the deck and overrides (default: COMMON's) after the word "--", or more overrides. With
# "--" the job runs in a session of its own and the signal goes to every process of it (mpirun
# puts each rank in a process group of its own, which a rank's children share), as srun's step
# daemon signals every process of a step, the ranks' children too.
signal_job() {
  local name=$1 after=$2 sig=$3 session=0
  shift 3
  local -a args=("${COMMON[@]}") mpi=("${MPI[@]}")
  if [[ ${1:-} == -- ]]; then shift; mpi=(setsid mpirun -np 2 "${MPI_ARGS[@]}"); args=(); session=1; fi
  "${mpi[@]}" "$ATLAS_BIN" train "${args[@]}" run.name="$name" "$@" >"$T/$name.out" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    (($(rows "$T/$name/metrics.csv") >= after)) && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  signalled_at=$(rows "$T/$name/metrics.csv")
  if ((session)); then
    pkill "-$sig" -s "$job"
  elif [[ $sig == TERM ]]; then
    # To world rank 0 itself: mpirun passes a SIGTERM on and sends SIGKILL a second later, which
    # on a loaded machine can come before rank 0 has run its handler (the note is best effort
    # there); the launcher then ends the other ranks.
    local p rank0=""
    for p in $(pgrep -P "$job"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && rank0=$p
    done
    [[ -n $rank0 ]] || { echo "FAIL: world rank 0 of mpirun $job not found"; fail=1; rank0=$job; }
    kill -TERM "$rank0"
  else
    kill "-$sig" "$job"
  fi
  # Bounded: a job that ignores the signal is killed after 120 s and the checks below fail.
  for _ in $(seq 1200); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$job" 2>/dev/null && { echo "FAIL: the job did not end within 120 s of SIG$sig"; kill -KILL "$job"; fail=1; }
  wait "$job"
  status=$?
}

"${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name=straight >"$T/straight.out" 2>&1
check "the uninterrupted run finished" grep -q "^# OK: $STEPS steps" "$T/straight.out"

# ---- SIGUSR1: checkpoint and stop, then resume ----
signal_job stopped 3 USR1
check "SIGUSR1 arrived before the run's end (after $signalled_at steps)" test "$signalled_at" -lt $((STEPS - 8))
check "the job exited with code 8 (stopped on request), not $status" test "$status" -eq 8
# A signal that lands between two stages' step ends reaches one step's sum on some ranks only:
# "seen by" counts the ranks whose sum carried it.
check "the ranks agreed on the request" grep -qE "^# stop requested \(SIGUSR1, seen by [1-4] of 4 ranks\): stopping after [0-9]+ of run.steps = $STEPS steps" "$T/stopped.out"
stop_at=$(sed -n 's/^# stop requested .*stopping after \([0-9]*\) of run.steps.*/\1/p' "$T/stopped.out")
# Two logged steps after the signal reached the ranks; mpirun passes it on within a few steps
# of these ~70 ms.
check "it stopped soon after the signal (signalled after $signalled_at, stopped after ${stop_at:-?})" \
  test "${stop_at:-999}" -le $((signalled_at + 8))
check "the checkpoint of that step was written" test -f "$T/stopped/ckpt/$(printf 'step-%06d.h5' "${stop_at:-0}")"
check "the footer says STOPPED, not OK" grep -q "^# STOPPED on request after ${stop_at:-?} of run.steps = $STEPS steps" "$T/stopped.out"
check "no OK footer" bash -c "! grep -q '^# OK:' '$T/stopped.out'"
check "no next line" bash -c "! grep -q '^# next:' '$T/stopped.out'"
check "run.json says stopped, with exit code 8 and the checkpoint" \
  grep -q "\"status\":\"stopped\",\"exit_code\":8,\"steps_done\":${stop_at:-?},\"checkpoint\":\".*step-0*${stop_at:-?}.h5\"" "$T/stopped/run.json"
check "metrics.csv stops at that step" test "$(rows "$T/stopped/metrics.csv")" -eq "${stop_at:-0}"
"${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name=stopped run.resume=latest >"$T/resumed.out" 2>&1
check "the resumed run started at the stop's step" grep -q "# resumed from .*step-0*${stop_at:-?}.h5 at step ${stop_at:-?}" "$T/resumed.out"
check "the resumed run finished" grep -q "^# OK:" "$T/resumed.out"
check "every step's loss equals the uninterrupted run's" diff <(losses "$T/straight/metrics.csv") <(losses "$T/stopped/metrics.csv")
# metrics.csv's header is the column list docs/formats.md gives, in its order.
doc_columns() {
  awk '/^## Run metrics/ { on = 1; next } /^## / { on = 0 } on && /^\| `/' docs/formats.md |
    cut -d'|' -f2 | grep -o '`[a-z0-9_]*`' | tr -d '`' | paste -sd, -
}
check "metrics.csv's columns are the documented ones" test "$(head -1 "$T/stopped/metrics.csv")" = "$(doc_columns)"

# ---- SIGUSR1 with BubbleTea serving prefills (a decode worker process beside rank 0) ----
workers_before=$(pgrep -c -f atlas-decode-worker)
signal_job bubbletea 3 USR1 -- inputs/bubbletea_loopback.deck run.steps=100000 run.log_every_steps=1 \
  run.out_dir="$T" profile.enabled=false profile.trace_json=false
check "BubbleTea job: exit code 8, not $status (its decode worker survived the request)" test "$status" -eq 8
check "BubbleTea job: the STOPPED footer" grep -q "^# STOPPED on request after" "$T/bubbletea.out"
check "BubbleTea job: its decode worker ended normally (no warning about it)" \
  bash -c "! grep -i 'warn.*decode worker' '$T/bubbletea.out'"
check "BubbleTea job: run.json says stopped, with the prefills served before" \
  grep -qE '"status":"stopped",.*"prefill_tokens":[1-9]' "$T/bubbletea/run.json"
# run.json's prefill_tokens is the job's (BubbleTea's report, bubbletea.json), not rank 0's share.
same_prefill() {
  python3 - "$T/bubbletea/run.json" "$T/bubbletea/bubbletea.json" <<'PY'
import json, sys
run, bt = (json.load(open(p)) for p in sys.argv[1:3])
assert run["prefill_tokens"] == bt["prefill_tokens"] > 0, (run["prefill_tokens"], bt["prefill_tokens"])
PY
}
check "BubbleTea job: run.json's prefill_tokens is the job's (bubbletea.json's)" same_prefill
check "BubbleTea job: no decode worker left behind" test "$(pgrep -c -f atlas-decode-worker)" -eq "$workers_before"

# ---- SIGTERM to rank 0: the job dies, rank 0 leaves the interrupted note ----
signal_job termed 3 TERM run.steps=100000
check "the job did not exit 0 after SIGTERM (status $status)" test "$status" -ne 0
check "log.txt has the interrupted note" \
  grep -q "^ERROR: rank 0 received SIGTERM during step [0-9]* of run.steps = 100000 (.*); no checkpoint of this run was written yet" "$T/termed/log.txt"
check "run.json says interrupted, with the step" \
  grep -q '^{"run":"termed","status":"interrupted","signal":"SIGTERM","step":[0-9]*,"steps":100000,"checkpoint_step":null}$' "$T/termed/run.json"
check "no stray run.json.signal.tmp" test ! -e "$T/termed/run.json.signal.tmp"

# ---- a run started from a checkpoint outside its ckpt.dir: the note's resume keys find it ----
# (run.resume=latest alone found nothing in the new run's ckpt.dir and started from step 0.)
from=$T/straight/ckpt/step-$(printf %06d $STEPS).h5
signal_job fromfile 3 TERM run.steps=100000 run.resume="$from"
check "the note names run.resume_fallback with the checkpoint it started from" \
  grep -q "the newest checkpoint is at step $STEPS (resume with run.resume=latest run.resume_fallback=$from)" "$T/fromfile/log.txt"

launch_finish
