#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A BubbleTea decode worker killed mid-run: training goes on to its OK footer, prefills go on,
# and each pipeline's ranks report the lost worker once, naming its address. Only this job's
# workers are killed: the children of its ranks (mpirun's children). Cleans up its temp dir.
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
launch_finish
