#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# THE one script for the GPU host (issue #22; how to get there: docs/gpu.md): every GPU check and
# benchmark that belong together, in one go, the issue's figures first. Each step is bounded with
# `timeout` (never beyond what is left of ATLAS_CHECK_BUDGET_S, default 450 s, so a device call of
# 500 s leaves time to rerun: a step that cannot start in time is SKIPped). Its verdict line goes
# to stdout as it ends; every step's output to $OUT/gpu.log. The device tool brings back at most 8
# files from $OUT, 2 folders down, so $OUT holds only: gpu.log, peer_mb8.txt, peer_mb16.txt,
# peer_fp32_mb8.txt, the measured GPU profile, and results.tgz (every run's run.json, logs and
# the peer's JSON, from the work directory ATLAS_GPU_WORK, default /tmp/atlas_gpu_work, which stays
# on a warm machine for a rerun of single steps).
#   Steps, in order: the PyTorch peer at micro-batch 8 (atlas bf16 vs torch fp32/bf16/compile),
#   atlas train inputs/gpt2_124m_gpu.deck (3 steps; again with device.cuda_graphs), atlas at fp32
#   beside the peer's fp32, the peer at micro-batch 16, a 2-rank 2-DC pipeline on the GPU, atlas
#   bench bubbletea with cuda (2 ranks), atlas profile --gemm --backend cuda --update (a copy of
#   profiles/device/h100.profile or h200.profile, by the GPU's name), the Hugging Face logits check
#   of issue #26 on the pipeline's checkpoint, then every gpu test binary (test_cuda*, test_nccl*;
#   the MPI ones at np 1 and 2). In one 500 s call the tests may be SKIPped: a second call
#   `scripts/gpu/check_all.sh tests` runs just them.
# usage, from the checkout root on the GPU host (after `make cuda && ../shared/gpu/bundle.sh
# build-cuda .gpu` on a development machine, and the checkout + .gpu/ carried over), with the
# device tool's own $OUT:
#   scripts/gpu/check_all.sh [STEP ...]   (STEP: a name of the summary, or "tests" for every test
#                                          binary; default all)
# Exit status: 0 when every step that ran passed, 1 when one failed, 2 when the script cannot start
# (no .gpu/env.sh here and ATLAS_BUNDLE unset, or the atlas binary's libraries do not load).
set -uo pipefail
CHECKOUT=$(pwd)
OUT=${OUT:-/tmp/atlas_gpu_check}
mkdir -p "$OUT"
LOG=$OUT/gpu.log
: > "$LOG"
BUDGET=${ATLAS_CHECK_BUDGET_S:-450}
START=$SECONDS
if [[ -z ${ATLAS_BUNDLE:-} ]]; then
  [[ -f .gpu/env.sh ]] || { echo "check_all.sh: no .gpu/env.sh here and ATLAS_BUNDLE unset: run from the checkout root (docs/gpu.md)" | tee -a "$LOG" >&2; exit 2; }
  # shellcheck disable=SC1091
  source .gpu/env.sh >> "$LOG" 2>&1
fi
ATLAS=$ATLAS_BUNDLE/bin/atlas
# Before any step: a binary that cannot load (a library the bundle lacks, e.g. libnccl.so.2) would
# fail every step and waste the call.
missing=$( { [[ -x $ATLAS ]] || echo "$ATLAS is missing"; ldd "$ATLAS" 2>&1 | grep 'not found'; } )
if [[ $missing == *libnccl* ]]; then
  # No system NCCL (env.sh looks outside Python's site-packages): PyTorch's pip wheel
  # (nvidia-nccl-cu13) has one.
  nccl_dir=$(dirname "$(find / -path '*site-packages/nvidia/nccl/lib/libnccl.so.2*' 2>/dev/null | head -1)")
  if [[ $nccl_dir != . ]]; then
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl_dir
    echo "# libnccl.so.2 from $nccl_dir (PyTorch's wheel; no system NCCL found)" | tee -a "$LOG"
    missing=$(ldd "$ATLAS" 2>&1 | grep 'not found')
  fi
fi
if [[ -n $missing ]]; then
  echo "check_all.sh: the atlas binary cannot start here:" | tee -a "$LOG"
  echo "$missing" | tee -a "$LOG"
  echo "  hint: put the directories of the missing libraries on LD_LIBRARY_PATH (.gpu/env.sh looks in /usr/local, /usr/lib and /opt)" | tee -a "$LOG"
  exit 2
fi
SRC=${ATLAS_SOURCE_DIR:-$CHECKOUT}
# The work directory is outside $OUT (only 8 files come back from there) and survives on a warm
# machine, so a rerun of one step still finds what earlier steps wrote.
T=${ATLAS_GPU_WORK:-/tmp/atlas_gpu_work}
mkdir -p "$T"
# PyTorch must not see the bundle's libraries (what env.sh's atlas_python does).
py() { LD_LIBRARY_PATH="${ATLAS_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" python3 "$@"; }
export -f py 2>/dev/null || true
MPIRUN=(mpirun -np 2 --oversubscribe)
ONLY=("$@")
declare -a SUMMARY=()
failed=0

{
  echo "# check_all.sh $(date -u +%FT%TZ) on $(hostname); checkout $CHECKOUT ($(git -C "$CHECKOUT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  [[ -d $SRC/data/brown ]] || echo "# WARNING: $SRC/data/brown is missing (bundle.sh copies data/: a symbolic link there is copied as a link): the training steps will fail"
} >> "$LOG" 2>&1

# step NAME SECONDS COMMAND...: runs COMMAND (in $SRC) under timeout, logs it, records the verdict.
step() {
  local name=$1 bound=$2; shift 2
  if [[ ${#ONLY[@]} -gt 0 && ! " ${ONLY[*]} " == *" $name "* ]] &&
    ! [[ " ${ONLY[*]} " == *" tests "* && $name == test_* ]]; then return 0; fi
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < 15)); then
    SUMMARY+=("SKIP  $name (the ${BUDGET} s budget is spent)")
    echo "=== $name: SKIP (budget spent)" | tee -a "$LOG"
    return 0
  fi
  ((bound > left)) && bound=$left
  echo "=== $name (timeout ${bound} s): $*" >> "$LOG"
  echo "=== $name (timeout ${bound} s, $((SECONDS - START)) s in)"
  local t0=$SECONDS rc=0
  (cd "$SRC" && timeout -k 10 "$bound" "$@") >> "$LOG" 2>&1 || rc=$?
  local dt=$((SECONDS - t0)) verdict=PASS
  if ((rc == 124 || rc == 137)); then verdict=FAIL; name="$name (timed out after ${bound} s)"
  elif ((rc != 0)); then verdict=FAIL; name="$name (exit $rc)"; fi
  [[ $verdict == FAIL ]] && failed=1
  SUMMARY+=("$(printf '%-5s %s, %d s' "$verdict" "$name" "$dt")")
  echo "=== $verdict $name, $dt s" | tee -a "$LOG"
}

# ---- 1. the PyTorch peer, side by side, micro-batch 8 (tables in $OUT/peer_mb*.txt) ----
peer() {
  set -o pipefail  # the step's status is run_peer.sh's, not tee's (bash -c does not inherit it)
  local mb=$1 modes=$2 tag=${3:-} keys=${4:-}
  "$CHECKOUT/bench/run_peer.sh" --micro-batch "$mb" --steps 15 --modes "$modes" --out "$T/peer$tag" \
    ${keys:+--atlas-keys "$keys"} | tee "$OUT/peer${tag}_mb$mb.txt"
}
export -f peer
export CHECKOUT OUT T
step peer_mb8 200 bash -c 'peer 8 "fp32 bf16 compile"'

# ---- 2. atlas train on the GPU: GPT-2 124M (3 steps of llm.c's 524,288-token batch) ----
step train_gpt2_124m 200 "$ATLAS" train inputs/gpt2_124m_gpu.deck run.steps=3 train.eval_every_steps=0 \
  ckpt.every_steps=0 ckpt.final=false run.out_dir="$T" run.name=gpt2_124m

# ---- 2b. the same with every block pass as a CUDA graph (device.cuda_graphs): the footer's graph
# counts, and the mean step and final loss beside step 2's ----
graphs_check() {
  "$ATLAS" train inputs/gpt2_124m_gpu.deck run.steps=3 train.eval_every_steps=0 ckpt.every_steps=0 \
    ckpt.final=false device.cuda_graphs=true run.out_dir="$T" run.name=gpt2_124m_graphs | tee "$T/graphs.out"
  ((PIPESTATUS[0] == 0)) || return 1
  py - "$T/gpt2_124m/run.json" "$T/gpt2_124m_graphs/run.json" "$T/graphs.out" <<'PY'
import json, re, sys
try:
    eager, graphs = (json.load(open(p)) for p in sys.argv[1:3])
except OSError as e:
    sys.exit(f"graphs_124m: no run.json to compare ({e}); run the train_gpt2_124m step first")
m = re.search(r"# cuda graphs \(all ranks\): (\d+) recorded, (\d+) block passes launched as graphs, (\d+) eager"
              r" \(warm-up(?:, (\d+) refused)?\)", open(sys.argv[3]).read())
if not m:
    sys.exit("graphs_124m: the footer has no '# cuda graphs' line")
recorded, launched, refused = int(m[1]), int(m[2]), int(m[4] or 0)
loss_diff = abs(graphs["final_loss"] - eager["final_loss"]) / abs(eager["final_loss"])
print(f"# cuda graphs: mean step {graphs['mean_step_ms']:.1f} ms, eager {eager['mean_step_ms']:.1f} ms "
      f"(graphs / eager {graphs['mean_step_ms'] / eager['mean_step_ms']:.3f}; 3 steps each, the means over "
      f"steps 1-2, the graphs recorded in step 1); final loss {graphs['final_loss']} vs {eager['final_loss']} (relative difference {loss_diff:.2e}); "
      f"{recorded} recorded, {launched} launched, {refused} refused")
problems = []
if refused > 0: problems.append(f"{refused} recordings refused (the log's warning says why)")
if launched == 0: problems.append("no graph launched")
if loss_diff > 1e-3: problems.append(f"final loss {loss_diff:.2e} relative from the eager run's (at most 1e-3: only atomics differ)")
if problems:
    sys.exit("graphs_124m FAILED: " + "; ".join(problems))
PY
}
export -f graphs_check
export ATLAS T
step graphs_124m 200 bash -c graphs_check

# ---- 2c. atlas at fp32 (device.precision=fp32) beside the peer's fp32 (#22's bf16 vs fp32) and
# the peer at micro-batch 16 ----
step peer_fp32_mb8 150 bash -c 'peer 8 "fp32" _fp32 device.precision=fp32'
step peer_mb16 150 bash -c 'peer 16 "bf16 compile"'

# ---- 3. a 2-rank 2-DC pipeline on the GPU (ranks share it); its checkpoint feeds step 6 ----
step pipeline_2dc 120 "${MPIRUN[@]}" "$ATLAS" train inputs/default.deck device.backend=cuda \
  "parallel.stages_per_dc=1 1" "cluster.gpus_per_dc=1 1" parallel.dp_size=1 run.steps=20 \
  train.eval_every_steps=10 ckpt.every_steps=0 ckpt.final=true run.out_dir="$T" run.name=pipeline_2dc

# ---- 4. BubbleTea's benchmark with the CUDA backend ----
step bench_bubbletea_cuda 150 "${MPIRUN[@]}" "$ATLAS" bench bubbletea inputs/bubbletea_loopback.deck \
  device.backend=cuda run.steps=12 --repeats 1 --warmup 2 run.out_dir="$T"

# ---- 5. a GPU profile measured: the GEMM curve of cuBLAS into a copy of this GPU's profile ----
gpu_profile=h200
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H100 && gpu_profile=h100
cp "$SRC/profiles/device/$gpu_profile.profile" "$OUT/$gpu_profile.profile"
step profile_gemm_cuda 90 "$ATLAS" profile --gemm --backend cuda --update "$OUT/$gpu_profile.profile"

# ---- 6. issue #26: the exported model's logits in transformers (the pipeline run's checkpoint) ----
hf_check() {
  local ckpt
  ckpt=$(ls "$T"/pipeline_2dc/ckpt/step-*.h5 2>/dev/null | tail -1)
  [[ -n $ckpt ]] || { echo "no checkpoint of the pipeline_2dc step in $T/pipeline_2dc/ckpt"; return 1; }
  "$ATLAS" export "$ckpt" --format hf --out "$T/hf" --logits "$T/logits.safetensors" &&
    py scripts/hf/check_logits.py "$ckpt" "$T/hf" "$T/logits.safetensors"
}
export -f hf_check
export ATLAS
step hf_logits 90 bash -c hf_check

# ---- 6b. atlas sample with the CUDA backend: every greedy token and its logit against GPT-2's
# forward pass in python on step 6's export (tests/hf/check_sample.py), and the host's tokens ----
sample_check() {
  local ckpt
  ckpt=$(ls "$T"/pipeline_2dc/ckpt/step-*.h5 2>/dev/null | tail -1)
  [[ -n $ckpt && -f $T/hf/model.safetensors ]] || { echo "run the pipeline_2dc and hf_logits steps first"; return 1; }
  "$ATLAS" sample "$ckpt" --prompt "The jury said" --tokens 150 --temperature 0 --device cuda --json "$T/sample_cuda.json" &&
    "$ATLAS" sample "$ckpt" --prompt "The jury said" --tokens 150 --temperature 0 --json "$T/sample_host.json" &&
    py tests/hf/check_sample.py "$T/hf" "$T/sample_cuda.json" 1e-3 &&
    py - "$T/sample_cuda.json" "$T/sample_host.json" <<'PY'
import json, sys
c, h = (json.load(open(p))["samples"][0] for p in sys.argv[1:3])
same = next((i for i, (a, b) in enumerate(zip(c, h)) if a != b), len(c))
print(f"# atlas sample greedy: cuda and host agree on the first {same} of {len(c)} tokens")
PY
}
export -f sample_check
step sample_cuda 60 bash -c sample_check

# ---- 7. every GPU test binary (the MPI ones of tests/cmake/gpu.cmake at np 1 and 2) ----
mpi_tests=" $(sed -n 's/^ *atlas_mpi_test(\(test_[a-z_]*\).*LABELS gpu.*/\1/p' "$SRC/tests/cmake/gpu.cmake" 2>/dev/null | tr '\n' ' ') "
[[ $mpi_tests == "  " ]] && mpi_tests=" test_nccl_comm test_cuda_train "
for t in "$ATLAS_BUNDLE"/bin/test_cuda* "$ATLAS_BUNDLE"/bin/test_nccl*; do
  [[ -x $t ]] || continue
  n=$(basename "$t")
  step "$n" 180 "$t"
  [[ $mpi_tests == *" $n "* ]] && step "${n}_np2" 240 "${MPIRUN[@]}" "$t"
done

# ---- summary ----
# Everything else the steps wrote, in one file (the run.json files, logs, the peer's JSON).
(cd "$T" && find . \( -name run.json -o -name '*.log' -o -name '*.json' -o -name graphs.out -o -name log.txt \
  -o -name metrics.csv \) -size -4M -print0 | tar -czf "$OUT/results.tgz" --null -T -) 2>> "$LOG" || true
{
  echo "# summary ($((SECONDS - START)) s of a ${BUDGET} s budget; log $LOG):"
  for s in "${SUMMARY[@]}"; do echo "  $s"; done
  for mb in 8 16; do [[ -f $OUT/peer_mb$mb.txt ]] && grep -A8 '^# micro-batch' "$OUT/peer_mb$mb.txt"; done
} | tee -a "$LOG"
exit $failed
