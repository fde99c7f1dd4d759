#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# atlas report splits a run's time as the run itself does: rank 0's compute, intra-DC wait and WAN
# wait summed over the profile equal metrics.csv's rank0_* columns summed over the steps. The
# runtime takes waits out of slots (the gradient-norm sum inside the optimizer slot, the
# tied-embedding exchange inside the all-reduce); the profile records them per event
# (/events/wan_wait_s, intra_wait_s) and the report counted the whole slot by its kind before
# (rank 0's WAN wait read 0 where the run had 10 ms). Cleans up its temp dir; loopback only.
# usage: test_report_matches_footer.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_report_matches_footer.sh report-footer "$@"
command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c 'import h5py' 2>/dev/null || {
  echo "SKIP: /usr/bin/python3 with h5py is needed (apt-get install python3-h5py)"; exit 77; }
mpirun -np 4 --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  "$ATLAS_BIN" train inputs/default.deck parallel.dp_size=1 run.steps=6 run.out_dir="$T" run.name=a \
  profile.enabled=true ckpt.every_steps=0 ckpt.final=false train.eval_every_steps=0 wan.recv_timeout_s=20 \
  >"$T/train.out" 2>&1
check "the run finished" grep -q "^# OK: 6 steps" "$T/train.out"
"$ATLAS_BIN" report "$T/a" --no-png --json "$T/s.json" >"$T/report.out" 2>&1
check "atlas report read it" test -s "$T/s.json"
split_agrees() {
  /usr/bin/python3 - "$T/s.json" "$T/a/metrics.csv" <<'PY'
import csv, json, sys
r0 = json.load(open(sys.argv[1]))["ranks"][0]
rows = list(csv.DictReader(open(sys.argv[2])))
ok = True
for key, col in (("compute", "rank0_compute_ms"), ("intra_dc", "rank0_intra_dc_ms"), ("wan_wait", "rank0_wan_wait_ms")):
    report_ms, metrics_ms = 1e3 * r0[key], sum(float(r[col]) for r in rows)
    print(f"{key}: report {report_ms:.3f} ms, metrics.csv {metrics_ms:.3f} ms")
    ok &= abs(report_ms - metrics_ms) <= 0.02 + 1e-4 * metrics_ms  # metrics.csv rounds to 0.001 ms a row
ok &= sum(float(r["rank0_wan_wait_ms"]) for r in rows) > 0  # the exchange is there to be split
sys.exit(0 if ok else 1)
PY
}
check "rank 0's compute / intra-DC / WAN split equals metrics.csv's" split_agrees
launch_finish
