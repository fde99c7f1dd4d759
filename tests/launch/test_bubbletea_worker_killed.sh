#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A BubbleTea decode worker killed mid-run: training goes on to its OK footer, prefills go on,
# and each pipeline's ranks report the lost worker once, naming its address. Only this job's
# workers are killed: the children of its ranks (mpirun's children). And a pipeline rank that
# cannot send Finish to its worker at the end (ATLAS_FAULT_BT_FINISH): the pipeline's first rank
# does not wait bubbletea's 60 s for results that cannot come; both say so. Cleans up its temp dir.
# usage: test_bubbletea_worker_killed.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_bubbletea_worker_killed.sh bt-worker-test "$@"
out=$T/job.out
mpirun -np 2 --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo "$ATLAS_BIN" train inputs/bubbletea_loopback.deck run.steps=150 \
  run.log_every_steps=1 run.out_dir="$T" run.name=bt profile.trace_json=false >"$out" 2>&1 &
job=$!
for _ in $(seq 600); do
  [[ -f $T/bt/metrics.csv ]] && (($(wc -l <"$T/bt/metrics.csv") >= 20)) && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
workers=()
for rank in $(pgrep -P "$job"); do
  for w in $(pgrep -P "$rank" -f atlas-decode-worker); do workers+=("$w"); done
done
check "the job's decode workers were running (${#workers[@]} found)" test "${#workers[@]}" -ge 1
((${#workers[@]})) && kill -KILL "${workers[@]}"
for _ in $(seq 1200); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then echo "FAIL: the job did not end within 120 s"; kill -KILL "$job"; fail=1; fi
wait "$job"
status=$?
check "training finished (exit 0, not $status)" test "$status" -eq 0
check "the OK footer" grep -q "^# OK: 150 steps" "$out"
grep "WARNING: BubbleTea: .*decode.worker" "$out"
n=$(grep -c "WARNING: BubbleTea: .*decode.worker" "$out")
check "one warning per pipeline about its lost worker, not two ($n)" test "$n" -le 2 -a "$n" -ge 1
check "the warning names the worker's address, not (?)" bash -c "! grep 'decode.worker' '$out' | grep -qF '(?)'"
# ---- rank 1 (DC 0's second stage) does not send Finish ----
SECONDS=0
ATLAS_FAULT_BT_FINISH=1:0 timeout 200 mpirun -np 4 --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo "$ATLAS_BIN" train inputs/bubbletea_loopback.deck run.steps=20 "cluster.gpus_per_dc=2 2" \
  "parallel.stages_per_dc=2 2" run.out_dir="$T" run.name=nofinish profile.trace_json=false >"$T/nofinish.out" 2>&1
status=$?
took=$SECONDS
check "a rank without Finish: training finished (exit 0, not $status)" test "$status" -eq 0
check "... within 40 s ($took s; the first rank waited 60 s for results before)" test "$took" -lt 40
check "... the rank says why" grep -q "WARNING: BubbleTea: decode worker of DC 0, inference pipeline 0: fault injection: Finish not sent" "$T/nofinish.out"
check "... the first rank says its results are not collected" \
  grep -q "WARNING: BubbleTea: decode worker of DC 0, inference pipeline 0: 1 other rank(s) of the pipeline could not send Finish" "$T/nofinish.out"
launch_finish
