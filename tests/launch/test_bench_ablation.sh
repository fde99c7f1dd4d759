#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# atlas bench ablation end to end on loopback (no namespaces): a 2-DC deck at 4 ranks prints the
# five rows (a)-(e) with every column, the footer, and a valid PNG of the stated size; a 1-DC deck
# and a deck whose DCs hold different stage counts are clear config errors (exit 2) on every rank, as is
# --rows naming a row that does not exist, and a chart size or path that cannot be written (before
# any row runs).
# usage: test_bench_ablation.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_bench_ablation.sh ablation-test "$@"
MPI=(mpirun -np 4 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
DECK=tests/decks/ablation_2dc_4.deck

timeout 240 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" --steps 3 --png "$T/chart.png" --png-size 640x360 \
  run.out_dir="$T/runs" > "$T/ablation.out" 2>&1
echo $? > "$T/ablation.rc"
check "the bench ran (exit $(cat "$T/ablation.rc"))" test "$(cat "$T/ablation.rc")" -eq 0
check "the column names" grep -qE '^# row +setup +measured\[ms\] +predicted\[ms\] +ratio +vs_a_meas\[x\] +vs_a_pred\[x\] +vs_prev_meas\[x\] +vs_prev_pred\[x\] +wan\[MB\] +meas_bub\[%\] +pred_bub\[%\] +meas_util\[%\] +pred_util\[%\]' "$T/ablation.out"
# Each row: its id, then after the setup 12 numeric columns (vs_prev '-' on row a); measured and
# predicted > 0, ratio = measured / predicted (within the printed rounding, 2%), vs_a = 1 on row a, WAN bytes > 0.
for id in a b c d e; do
  check "row ($id) with every column" awk -v id="$id" '
    $1 == id { n = NF; r = $(n-11) / $(n-10); ok = $(n-11) > 0 && $(n-10) > 0 && (r / $(n-9) - 1)^2 < 4e-4 && $(n-3) > 0;
               if (id == "a") ok = ok && $(n-8) == 1 && $(n-7) == 1 && $(n-6) == "-";
               found = 1 }
    END { exit !(found && ok) }' "$T/ablation.out"
done
check "row (a) is DP across DCs with dp 4 and 2 micro-batches" \
  grep -q '(a) DP across DCs (MPI): parallel.dp_across_dcs=true parallel.stages_per_dc=1 1 parallel.dp_size=4 train.micro_batches=2' "$T/ablation.out"
check "the footer" grep -qE '^ablation: \(d\) atlas vs \(a\) DP across DCs measured [0-9.]+ x \(predicted [0-9.]+ x\)' "$T/ablation.out"
check "the chart is said" grep -q "^# chart: $T/chart.png (640x360 PNG" "$T/ablation.out"
# PNG: the 8-byte signature, IHDR first with width and height (big-endian), IEND last.
check "the chart is a PNG" test "$(head -c 8 "$T/chart.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a
check "its IHDR says 640 x 360" test "$(head -c 24 "$T/chart.png" | tail -c 12 | od -An -tx1 | tr -d ' \n')" = 494844520000028000000168
check "it ends with IEND" test "$(tail -c 8 "$T/chart.png" | head -c 4)" = IEND

# ---- bad input: one DC; unequal stage counts ----
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" cluster.dcs=east cluster.gpus_per_dc=4 cluster.latency_ms=0 \
  cluster.bandwidth_gbps=1 parallel.stages_per_dc=2 run.out_dir="$T/runs" > "$T/one_dc.out" 2>&1
echo $? > "$T/one_dc.rc"
check "a 1-DC deck exits 2 (exit $(cat "$T/one_dc.rc"))" test "$(cat "$T/one_dc.rc")" -eq 2
check "a 1-DC deck is named and explained" \
  grep -q "ERROR: bench ablation: $DECK: the pipeline must cross DCs (its layout uses 1 DC of 1)" "$T/one_dc.out"
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" "parallel.stages_per_dc=1 0" parallel.dp_size=4 "cluster.gpus_per_dc=4 4" \
  run.out_dir="$T/runs" > "$T/one_used.out" 2>&1
check "a 2-DC deck with one DC unused is the same error" \
  grep -q "the pipeline must cross DCs (its layout uses 1 DC of 2)" "$T/one_used.out"
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" "parallel.stages_per_dc=3 1" parallel.dp_size=1 \
  "cluster.gpus_per_dc=4 4" model.layers=4 run.out_dir="$T/runs" > "$T/unequal.out" 2>&1
check "unequal stage counts name row (a)'s need" \
  grep -q "parallel.stages_per_dc = 3 1: row (a) needs the same stage count in every DC" "$T/unequal.out"
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" --rows a,x run.out_dir="$T/runs" > "$T/rows.out" 2>&1
echo $? > "$T/rows.rc"
check "--rows with a bad letter exits 2 (exit $(cat "$T/rows.rc"))" test "$(cat "$T/rows.rc")" -eq 2
check "--rows names the bad letter and the rows" grep -q "\-\-rows a,x: 'x' is not a row; the rows are a, b, c, d, e" "$T/rows.out"
# A chart that cannot be made is refused before any row runs (it failed after all five).
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" --png-size 100x100 run.out_dir="$T/runs" > "$T/size.out" 2>&1
echo $? > "$T/size.rc"
check "--png-size 100x100 exits 2 (exit $(cat "$T/size.rc"))" test "$(cat "$T/size.rc")" -eq 2
check "--png-size names the range" grep -q "\-\-png-size 100x100: each side must be 200 to 8000 pixels" "$T/size.out"
check "--png-size: no row ran" bash -c "! grep -q '^# row ' '$T/size.out'"
timeout 60 "${MPI[@]}" "$ATLAS_BIN" bench ablation "$DECK" --png "$T/no/such/dir/c.png" run.out_dir="$T/runs" > "$T/png.out" 2>&1
check "--png in a missing directory is refused first" \
  grep -q "ERROR: atlas bench ablation: --png $T/no/such/dir/c.png: its directory $T/no/such/dir does not exist" "$T/png.out"
check "--png: no row ran" bash -c "! grep -q '^# row ' '$T/png.out'"
launch_finish
