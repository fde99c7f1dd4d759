#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# atlas report's WAN link table counts the tied-embedding exchange: the first and last stage sum
# their embedding gradients over the WAN once a step, in no slot of the table, and the link table
# (wan_send slots only) missed those bytes (~21% of a 2-DC run's WAN bytes). The profile records
# them in /exchanges; summed over the links the report's bytes now equal run.json's wan_bytes. With
# three DCs the first and last stage are two DCs apart: their exchange gets rows of its own, in the
# report and in trace.json. Cleans up its temp dir; loopback only.
# usage: test_report_exchange_bytes.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_report_exchange_bytes.sh report-exch "$@"
command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c 'import h5py' 2>/dev/null || {
  echo "SKIP: /usr/bin/python3 with h5py is needed (apt-get install python3-h5py)"; exit 77; }
MPI=(mpirun --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
# Emulated compute: the same WAN traffic without the final validation pass, whose boundary sends
# (no slot of the table, not profiled) run.json's wan_bytes would count as well.
COMMON=(run.steps=4 run.out_dir="$T" profile.enabled=true ckpt.every_steps=0 ckpt.final=false
        train.eval_every_steps=0 wan.recv_timeout_s=20 device.backend=emulated)

# Two DCs, one pipeline of four stages: the exchange crosses east <-> west on the table's links.
"${MPI[@]}" -np 4 "$ATLAS_BIN" train inputs/default.deck parallel.dp_size=1 run.name=two "${COMMON[@]}" \
  >"$T/two.out" 2>&1
check "the 2-DC run finished" grep -q "^# OK: 4 steps" "$T/two.out"
"$ATLAS_BIN" report "$T/two" --no-png --json "$T/two.json" >"$T/two-report.out" 2>&1
check "atlas report read it" test -s "$T/two.json"
# run.json's wan_bytes is everything the WAN transport sent: the steps' traffic and the pre-flight
# check (train_cmd.cpp preflight_wan: 16 KiB to every WAN peer of a rank).
links_add_up() { # report.json run_dir [every: each link carries exchange bytes]
  /usr/bin/python3 - "$1" "$2" "${3:-}" <<'PY'
import json, sys
import h5py
links = json.load(open(sys.argv[1]))["links"]
wan = json.load(open(sys.argv[2] + "/run.json"))["wan_bytes"]
with h5py.File(sys.argv[2] + "/profile.h5") as f:
    ev, x = f["events"], f["exchanges"]
    send = ev["kind"][()] == list(f.attrs["slot_kind_names"]).index("wan_send")
    peers = set(zip(ev["world_rank"][()][send], ev["peer"][()][send])) | set(zip(x["world_rank"][()], x["peer"][()]))
total, exch = sum(l["bytes"] for l in links), sum(l["exchange_bytes"] for l in links)
preflight = 16384 * len(peers)
print(f"report {total} bytes ({exch} of them the exchange); run.json {wan} = {wan - preflight} + pre-flight {preflight}")
every = sys.argv[3] != "every" or all(l["exchange_bytes"] > 0 for l in links)
sys.exit(0 if total == wan - preflight and exch > 0 and every else 1)
PY
}
check "the report's link bytes add up to run.json's wan_bytes, the exchange included" links_add_up "$T/two.json" "$T/two" every

# Three DCs, one stage each: the first (a) and last (c) stage are joined by no link of the table.
K=("cluster.dcs=a b c" "cluster.gpus_per_dc=1 1 1" "parallel.stages_per_dc=1 1 1" parallel.dp_size=1
   "cluster.latency_ms=0 1 1 1 0 1 1 1 0" "cluster.bandwidth_gbps=0 1 1 1 0 1 1 1 0" model.layers=6)
"${MPI[@]}" -np 3 "$ATLAS_BIN" train inputs/default.deck "${K[@]}" run.name=three "${COMMON[@]}" \
  >"$T/three.out" 2>&1
check "the 3-DC run finished" grep -q "^# OK: 4 steps" "$T/three.out"
"$ATLAS_BIN" report "$T/three" --no-png --json "$T/three.json" >"$T/three-report.out" 2>&1
check "the exchange between a and c has rows of its own" grep -Eq '^WAN a>c +4 +[0-9]+ +[0-9]+ ' "$T/three-report.out"
check "... and a link track in trace.json" grep -q '"name":"WAN c>a (embedding exchange)"' "$T/three/trace.json"
check "the links add up to run.json's wan_bytes again" links_add_up "$T/three.json" "$T/three"
launch_finish
