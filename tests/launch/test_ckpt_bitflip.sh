#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Damaged checkpoints end the way docs/formats.md ("Checksums") says, with the binary: a bit
# flipped (with h5py, so the file stays valid HDF5) in a tensor, in /state/adam_t or in the
# loader position of the file named by run.resume ends the job within seconds with exit code 5
# and a message naming the file, the dataset and "checksum mismatch"; with run.resume = latest
# the damaged newest file is skipped with the reason and the job resumes from the one before.
# Needs /usr/bin/python3 with h5py (exit 77 = skipped otherwise). Loopback only.
# usage: test_ckpt_bitflip.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_ckpt_bitflip.sh bitflip-test "$@"
if ! /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 cannot import h5py (apt-get install python3-h5py)"
  exit 77
fi
# 2 ranks: 2 DCs x 1 stage, dp 1; a checkpoint after every step.
COMMON=(inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 run.log_every_steps=1
        ckpt.every_steps=1 ckpt.keep_last=5 train.eval_every_steps=0 run.out_dir="$T")
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
train() { timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" "$@"; }
flip() { # FILE DATASET: flips bit 4 of the dataset's element 0 (as unsigned words)
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1], "r+") as f:
    d = f[sys.argv[2]]
    a = d[...]
    words = a.view("u%d" % a.dtype.itemsize).reshape(-1)
    words[0] ^= words.dtype.type(1 << 4)
    d[...] = a
PY
}

train run.name=src run.steps=2 > "$T/src.out" 2>&1
check "the source run wrote two checkpoints" test -f "$T/src/ckpt/step-000002.h5" -a -f "$T/src/ckpt/step-000001.h5"

for dataset in /params/h.0.attn.qkv.weight /adam_m/wte /state/adam_t /state/loader; do
  name=$(tr -c 'a-z0-9\n' _ <<<"${dataset#/}")
  cp "$T/src/ckpt/step-000002.h5" "$T/$name.h5"
  check "$dataset: one bit flipped" flip "$T/$name.h5" "$dataset"
  start=$SECONDS
  train run.name="$name" run.steps=3 run.resume="$T/$name.h5" > "$T/$name.out" 2>&1
  rc=$?
  check "$dataset damaged: exit code 5 (got $rc)" test "$rc" -eq 5
  check "$dataset damaged: within seconds ($((SECONDS - start)) s)" test $((SECONDS - start)) -le 20
  check "$dataset damaged: the message names the file, the dataset, checksum mismatch" \
    grep -q "ERROR: checkpoint '$T/$name.h5': dataset $dataset.*: checksum mismatch" "$T/$name.out"
done

# latest: the newest file damaged in place (a tensor), the one before resumed.
cp -r "$T/src/ckpt" "$T/latest_ckpt"
check "/params/wpe of the newest file: one bit flipped" flip "$T/latest_ckpt/step-000002.h5" /params/wpe
train run.name=latest run.steps=3 ckpt.dir="$T/latest_ckpt" run.resume=latest > "$T/latest.out" 2>&1
check "latest skips the damaged file with the reason" \
  grep -q "run.resume = latest: skipping '$T/latest_ckpt/step-000002.h5': checkpoint .*dataset /params/wpe .*checksum mismatch" "$T/latest.out"
check "and resumes from step-000001.h5" grep -q "# resumed from $T/latest_ckpt/step-000001.h5 at step 1" "$T/latest.out"
check "the resumed run ends OK" grep -q "^# OK: 2 steps" "$T/latest.out"
check "it warns that run.steps changed the learning rate at the resume step" \
  grep -q "resuming from $T/latest_ckpt/step-000001.h5 at step 1: the learning-rate schedule differs from the checkpoint's deck (run.steps 2 -> 3); the learning rate at step 1 is" "$T/latest.out"

# run.resume_fallback: latest with no checkpoint of the run's own yet (a restart before its first
# one, as atlas-run-restart.sh passes a fine-tune's run.resume=PATH on) starts from the fallback.
train run.name=fallback run.steps=3 ckpt.dir="$T/fallback_ckpt" run.resume=latest \
  run.resume_fallback="$T/src/ckpt/step-000001.h5" > "$T/fallback.out" 2>&1
check "latest with no checkpoint yet starts from run.resume_fallback" \
  grep -q "run.resume = latest: no checkpoint in '$T/fallback_ckpt' yet; starting from run.resume_fallback = $T/src/ckpt/step-000001.h5" "$T/fallback.out"
check "and resumes at its step" grep -q "# resumed from $T/src/ckpt/step-000001.h5 at step 1" "$T/fallback.out"
train run.name=fallback2 run.resume=latest run.resume_fallback=latest > "$T/fallback2.out" 2>&1
check "run.resume_fallback = latest is a config error naming the key" \
  grep -q "run.resume_fallback = latest: it names the checkpoint file" "$T/fallback2.out"

# A finished run resumed again (the same command twice, a Slurm requeue): nothing to train, exit 0,
# and the results its steps wrote (run.json, profile.h5) are left as they were.
cp "$T/src/run.json" "$T/src_run.json"
[[ -f $T/src/profile.h5 ]] && cp "$T/src/profile.h5" "$T/src_profile.h5"
train run.name=src run.steps=2 run.resume=latest > "$T/again.out" 2>&1
rc=$?
check "a finished run resumed again: exit 0 (got $rc)" test "$rc" -eq 0
check "it says there is nothing to train" \
  grep -q "# nothing to train: the checkpoint is at step 2, which is run.steps = 2" "$T/again.out"
check "its run.json is left as it was" cmp -s "$T/src/run.json" "$T/src_run.json"
check "the same schedule: no warning about it" bash -c "! grep -q 'learning-rate schedule differs' '$T/again.out'"
[[ -f $T/src_profile.h5 ]] && check "its profile.h5 is left as it was" cmp -s "$T/src/profile.h5" "$T/src_profile.h5"
# ... and when the job that ran the last steps was killed before its summary (run.json "running"),
# run.json says "finished" with the checkpoint's step.
printf '{"run":"src","status":"running","first_step":0,"steps":2}\n' > "$T/src/run.json"
train run.name=src run.steps=2 run.resume=latest > "$T/again2.out" 2>&1
check "a run killed after its last checkpoint, resumed: run.json says finished" \
  grep -q '"status":"finished","checkpoint_step":2,"steps":2' "$T/src/run.json"
train run.name=past run.steps=1 run.resume="$T/src/ckpt/step-000002.h5" > "$T/past.out" 2>&1
rc=$?
check "a checkpoint past run.steps: exit 0 (got $rc)" test "$rc" -eq 0
check "and it says so" grep -q "# nothing to train: the checkpoint is at step 2, past run.steps = 1" "$T/past.out"

launch_finish
