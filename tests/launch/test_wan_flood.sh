#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Anyone who can reach a rank's WAN listener may open connections and never authenticate. With
# the ranks limited to 256 descriptors (ulimit -n 256), 1,000 such idle connections held against
# the listeners during a run leave training and its checkpoints unharmed: the run ends OK with
# every checkpoint written, and the log stays bounded (no warning per refused accept). Loopback
# only; stops the flood and removes its temp dir.
# usage: test_wan_flood.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_wan_flood.sh wan-flood "$@"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# One host: shared memory only, so every TCP listener of a rank is its WAN listener.
MPI=(mpirun -np 8 --mca btl self,vader --mca oob_tcp_if_include lo)
ARGS=(inputs/default.deck run.steps=60 run.log_every_steps=10 train.eval_every_steps=0 ckpt.every_steps=10
      ckpt.keep_last=10 run.out_dir="$T" run.name=flood wan.connect_timeout_s=20)
# Each rank (not mpirun) gets 256 descriptors.
"${MPI[@]}" bash -c 'ulimit -n 256 && exec "$0" "$@"' "$ATLAS_BIN" train "${ARGS[@]}" > "$T/flood.out" 2>&1 &
job=$!
# The ranks' WAN listening ports: every TCP listener of the job's atlas processes, once the
# set has stopped growing for a second.
listeners() {
  local pids
  # The ranks only (their command line starts with the binary), never mpirun, whose own
  # listeners (Open MPI's out-of-band and PMIx servers) are not atlas's to defend.
  pids=$(pgrep -d'|' -f "^$ATLAS_BIN train .*run.out_dir=$T" || true)
  [[ -z $pids ]] && return
  ss -Hltnp 2> /dev/null | grep -E "pid=($pids)," | awk '{ n = split($4, a, ":"); print a[n] }' | sort -u | tr '\n' ' '
}
ports=""
for _ in $(seq 1 300); do
  now=$(listeners)
  if [[ -n $now && $now == "$ports" ]]; then break; fi
  ports=$now
  sleep $([[ -n $now ]] && echo 1 || echo 0.1)
done
echo "$ports" > "$T/ports"
check "the ranks listen (ports: ${ports:-none})" test -n "$ports"
/usr/bin/python3 "$HERE/wan_flood.py" "$T/ports" "$T/stop" 1000 300 > "$T/flood_client.out" 2>&1 &
flood=$!
if timeout 240 tail --pid=$job -f /dev/null; then
  wait $job
  rc=$?
else
  rc=124  # still running after 240 s: stopped here
  pkill -KILL -f "[r]un.out_dir=$T" || true
  kill -KILL $job 2> /dev/null || true
  wait $job
fi
touch "$T/stop"
wait $flood
cat "$T/flood_client.out"
check "the run under the flood ended OK (exit $rc)" test "$rc" -eq 0
check "... with its 60 steps" grep -q "^# OK: 60 steps" "$T/flood.out"
check "... and every checkpoint" test "$(ls "$T/flood/ckpt/" | grep -c '^step-0000[1-6]0\.h5$')" -eq 6
check "the flood made its 1,000 connections" grep -qE "wan_flood: [0-9]{4,} connections made" "$T/flood_client.out"
check "the log stays bounded (under 200 lines of warnings)" test "$(grep -c WARNING "$T/flood.out")" -lt 200
check "no rank is left running" bash -c "! pgrep -f '[r]un.out_dir=$T' > /dev/null"
launch_finish
