#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# atlas and its PyTorch peer (bench/gpt_peer.py) side by side on one GPU, in one go (issue #22):
# `atlas train DECK device.backend=cuda` and the peer in each mode, same model, shape, optimizer
# and micro-batch, then one table: tokens/s, step ms, MFU, peak memory, and atlas / peer.
# atlas's figures come from its run.json (mean_step_ms, tokens_per_step, mfu, peak_memory_bytes).
#
# usage: bench/run_peer.sh [--deck DECK] [--micro-batch N] [--steps N] [--modes "fp32 bf16 compile"]
#                          [--out DIR] [--atlas-keys "key=value ..."]
#   On the GPU host (docs/gpu.md): source .gpu/env.sh, then run it from the checkout root.
#   ATLAS_BIN: the atlas binary (default $ATLAS_BUNDLE/bin/atlas, else build-cuda/bin/atlas);
#   ATLAS_RUN_DIR: where atlas runs (its decks' data/ paths; default $ATLAS_SOURCE_DIR or .).
# Modes: fp32 (TF32 off, materialised attention: atlas's fp32 math), tf32, bf16 (autocast + SDPA +
# fused AdamW), compile (bf16 + torch.compile). Exit status: 0 when every side ran, 1 otherwise.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DECK=$HERE/gpt2_peer.deck MB=8 STEPS=20 MODES="fp32 bf16 compile" OUT="" KEYS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deck) DECK=$(realpath "$2"); shift 2;;
    --micro-batch) MB=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    --modes) MODES=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --atlas-keys) KEYS=$2; shift 2;;
    -h|--help) sed -n '3,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "run_peer.sh: unknown argument '$1' (see --help)" >&2; exit 2;;
  esac
done
[[ $MB =~ ^[1-9][0-9]*$ && $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "run_peer.sh: --micro-batch and --steps take positive integers" >&2; exit 2; }
ATLAS=${ATLAS_BIN:-}
if [[ -z $ATLAS ]]; then
  for c in "${ATLAS_BUNDLE:-/nonexistent}/bin/atlas" "$HERE/../build-cuda/bin/atlas"; do [[ -x $c ]] && { ATLAS=$c; break; }; done
fi
[[ -n $ATLAS && -x $ATLAS ]] || { echo "run_peer.sh: no atlas binary: set ATLAS_BIN or source .gpu/env.sh (docs/gpu.md)" >&2; exit 2; }
RUN_DIR=${ATLAS_RUN_DIR:-${ATLAS_SOURCE_DIR:-$(pwd)}}
OUT=${OUT:-$(mktemp -d /tmp/atlas_peer.XXXXXX)}
mkdir -p "$OUT"
# PyTorch must not see the bundle's libraries (env.sh's atlas_python does the same).
py() { LD_LIBRARY_PATH="${ATLAS_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" python3 "$@"; }
status=0
echo "# run_peer: deck $DECK, micro-batch $MB, $STEPS steps, peer modes: $MODES; output in $OUT"

# ---- atlas ----
name=peer_mb$MB
# shellcheck disable=SC2086
(cd "$RUN_DIR" && "$ATLAS" train "$DECK" device.backend=cuda train.micro_batch_size="$MB" run.steps="$STEPS" \
   run.out_dir="$OUT" run.name="$name" ckpt.every_steps=0 ckpt.final=false $KEYS) > "$OUT/atlas_mb$MB.log" 2>&1
rc=$?
tail -n 8 "$OUT/atlas_mb$MB.log"
[[ $rc == 0 ]] || { echo "# run_peer: atlas train failed (exit $rc), see $OUT/atlas_mb$MB.log"; status=1; }

# ---- the peer, each mode ----
for mode in $MODES; do
  case "$mode" in
    fp32) flags=(--precision fp32 --attention manual);;
    tf32) flags=(--precision tf32 --attention manual);;
    bf16) flags=(--precision bf16 --attention sdpa --fused-adamw);;
    compile) flags=(--precision bf16 --attention sdpa --fused-adamw --compile);;
    *) echo "run_peer.sh: unknown mode '$mode' (fp32, tf32, bf16, compile)" >&2; status=1; continue;;
  esac
  py "$HERE/gpt_peer.py" --deck "$DECK" --micro-batch "$MB" --steps "$STEPS" "${flags[@]}" \
     --json "$OUT/peer_${mode}_mb$MB.json" > "$OUT/peer_${mode}_mb$MB.log" 2>&1
  rc=$?
  tail -n 1 "$OUT/peer_${mode}_mb$MB.log"
  [[ $rc == 0 ]] || { echo "# run_peer: gpt_peer.py $mode failed (exit $rc), see $OUT/peer_${mode}_mb$MB.log"; status=1; }
done

# ---- the table: every figure measured in this one go ----
py - "$OUT" "$MB" "$OUT/$name/run.json" $MODES <<'PY'
import json, os, sys
out, mb, run_json, modes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
GIB = 2.0 ** 30
rows = []
try:
    r = json.load(open(run_json))
    tok_s = r["tokens_per_step"] / (r["mean_step_ms"] / 1e3)
    peak = max(r.get("peak_memory_bytes") or [0])
    rows.append(("atlas (cuda)", tok_s, r["mean_step_ms"], r.get("mfu"), peak))
except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
    print(f"# run_peer: no atlas figures ({run_json}: {e})")
for m in modes:
    try:
        p = json.load(open(os.path.join(out, f"peer_{m}_mb{mb}.json")))
        rows.append((f"torch {m}", p["tokens_per_s"], p["step_ms"], p["mfu"], p["peak_memory_bytes"]))
    except (OSError, ValueError, KeyError):
        pass
print(f"# micro-batch {mb}: MFU = 6N + 12LTC FLOPs per token over the dense peak of each side's precision (docs/gpu.md)")
print(f"  {'who':<14} {'tokens/s':>10} {'step_ms':>9} {'mfu%':>6} {'peak_GiB':>9} {'atlas/this':>10}")
atlas = rows[0] if rows and rows[0][0].startswith("atlas") else None
for who, t, ms, mfu, peak in rows:
    ratio = f"{atlas[1] / t:.2f}x" if atlas and t > 0 else "-"
    mfu_s = f"{100 * mfu:.1f}" if mfu is not None else "-"
    print(f"  {who:<14} {t:>10.0f} {ms:>9.1f} {mfu_s:>6} {peak / GIB:>9.2f} {ratio:>10}")
PY
exit $status
