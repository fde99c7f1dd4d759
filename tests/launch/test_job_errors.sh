#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Errors that only some ranks see, a diverged model and a full disk each end the whole job within
# seconds with their documented exit code and message, and never cost what was already written:
#   - resuming with another run.seed: only the ranks holding a data loader can tell; every rank
#     ends with exit 2 (it hung in a barrier before mpi::agree);
#   - a config error raised on one rank alone (ATLAS_FAULT_CONFIG_ERROR) ends the job with exit 2
#     within the agreement timeout (the top level's safety net), not a hang;
#   - model.init_std = 1e308 (NaN losses from step 0): exit 7, no checkpoint, run.json "diverged";
#     log.txt holds the ERROR line, as it does for the seed's error;
#   - a parameter turned NaN at step 3 (ATLAS_FAULT_NAN): exit 7, the good checkpoints of steps
#     1-3 are kept and none of step 4 is written;
#   - a NaN loss alone (ATLAS_FAULT_NAN_LOSS): stopped before the checkpoint that follows it, or at
#     the next logged step (the progress row's sum carries it; a logged step does not wait);
#   - metrics.csv on a full disk (/dev/full): exit 5 naming the file, not "OK";
#   - cluster.bind_hosts with an address this host lacks: exit 2 naming it, with the fix;
#   - ranks given different decks (MPMD overrides): exit 2 naming the groups, not a hang;
#   - a layout that breaks cluster.may_hold_data (the data-reading first stage in a DC marked 0):
#     exit 2 before anything runs (it started silently).
# Loopback only; removes its temp dir.
# usage: test_job_errors.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_job_errors.sh job-errors "$@"
# 4 ranks: 2 DCs x 2 stages, dp 1 (ranks 0 and 3 hold the data loaders).
COMMON=(inputs/default.deck parallel.dp_size=1 run.log_every_steps=1 train.eval_every_steps=0
        run.out_dir="$T" wan.recv_timeout_s=60)
MPI=(mpirun -np 4 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
run_job() { # NAME GUARD_S ARGS... -> exit status in $T/NAME.rc, seconds in $T/NAME.s, output in $T/NAME.out
  local name=$1 guard=$2; shift 2
  local t0=$SECONDS
  timeout "$guard" "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name="$name" "$@" > "$T/$name.out" 2>&1
  echo $? > "$T/$name.rc"
  echo $((SECONDS - t0)) > "$T/$name.s"
}
rc() { cat "$T/$1.rc"; }

# ---- resume with another run.seed ----
run_job seed 120 run.steps=2 ckpt.every_steps=2
check "the first run finished" grep -q "^# OK: 2 steps" "$T/seed.out"
run_job seed 60 run.steps=4 ckpt.every_steps=2 run.resume=latest run.seed=99
check "a resume with another run.seed ends with exit 2 (got $(rc seed), $(cat "$T/seed.s") s)" test "$(rc seed)" -eq 2
check "... naming the seed and the checkpoint" \
  grep -qE "ERROR: resuming from .*step-000002\.h5: the saved data position was drawn with run.seed = [0-9]+, this run uses 99" "$T/seed.out"
check "... printed once (rank 0 speaks for all)" test "$(grep -c 'this run uses 99' "$T/seed.out")" -eq 1

# ---- a config error on one rank alone ----
ATLAS_FAULT_CONFIG_ERROR=1:2 run_job lone 60 run.steps=4 ckpt.every_steps=0
check "... and log.txt holds it" grep -qE '^ERROR: resuming from .*this run uses 99' "$T/seed/log.txt"

check "a config error on rank 1 alone ends the job with exit 2 (got $(rc lone), $(cat "$T/lone.s") s)" test "$(rc lone)" -eq 2
check "... within seconds" test "$(cat "$T/lone.s")" -le 30
check "... and rank 1 reports it, saying that the others did not stop" \
  grep -q "rank 1 .*raised on some ranks only" "$T/lone.out"

# ---- divergence from the start ----
run_job nan0 60 run.steps=4 ckpt.every_steps=1 model.init_std=1e308
check "model.init_std = 1e308 ends with exit 7 (got $(rc nan0))" test "$(rc nan0)" -eq 7
check "... saying the training diverged at step 0" grep -q "ERROR: training diverged at step 0: loss nan" "$T/nan0.out"
check "... without a checkpoint" bash -c "! ls '$T/nan0/ckpt/'step-*.h5 2> /dev/null"
check "... without an OK footer" bash -c "! grep -q '^# OK' '$T/nan0.out'"
check "... and run.json says diverged" grep -q '"status":"diverged","step":0,"exit_code":7' "$T/nan0/run.json"
check "... and log.txt holds the error (the run directory says why it ended)" \
  grep -q '^ERROR: training diverged at step 0: loss nan' "$T/nan0/log.txt"

# ---- divergence after good checkpoints ----
ATLAS_FAULT_NAN=0:3 run_job nan3 60 run.steps=6 ckpt.every_steps=1 ckpt.keep_last=3
check "a parameter turned NaN at step 3 ends with exit 7 (got $(rc nan3))" test "$(rc nan3)" -eq 7
check "... at step 3" grep -q "ERROR: training diverged at step 3" "$T/nan3.out"
check "... keeping the good checkpoints of steps 1-3" \
  test "$(cd "$T/nan3/ckpt" && ls step-*.h5 | tr '\n' ' ')" = "step-000001.h5 step-000002.h5 step-000003.h5 "
check "... and the metrics of steps 0-3" \
  test "$(awk -F, 'NR > 1 { print $1 }' "$T/nan3/metrics.csv" | tr '\n' ' ')" = "0 1 2 3 "

# ---- a one-off NaN loss on a step that is not logged (gradients finite) ----
# A non-finite gradient norm at a logged step that neither evaluates nor checkpoints: its row's
# job-wide sum (started, not waited for) completes and the row is printed before the error.
ATLAS_FAULT_NAN=0:3 run_job nanrow 60 run.steps=6 run.log_every_steps=2 ckpt.every_steps=0 ckpt.final=false
check "a NaN gradient norm at logged step 3 without a checkpoint ends with exit 7 (got $(rc nanrow))" test "$(rc nanrow)" -eq 7
check "... after printing step 3's row" grep -qE "^ +3 +nan " "$T/nanrow.out"

ATLAS_FAULT_NAN_LOSS=0:1 run_job nanloss 60 run.steps=6 run.log_every_steps=3 ckpt.every_steps=3
check "a NaN loss at unlogged step 1 ends with exit 7 at step 2 (got $(rc nanloss))" test "$(rc nanloss)" -eq 7
check "... naming step 1" grep -q "ERROR: training diverged at step 2: .*(the first non-finite loss was at step 1)" "$T/nanloss.out"
check "... before the checkpoint of step 2" bash -c "! ls '$T/nanloss/ckpt/'step-*.h5 2> /dev/null"

# ---- a NaN loss on a logged step (gradients finite): found one logged step later, by the
# progress row's job-wide sum, which nobody waits for (a logged step does not synchronise the job)
ATLAS_FAULT_NAN_LOSS=0:1 run_job nanlog 60 run.steps=6 run.log_every_steps=1 ckpt.every_steps=0
check "a NaN loss at logged step 1 ends with exit 7 (got $(rc nanlog))" test "$(rc nanlog)" -eq 7
check "... at the next logged step, naming step 1" \
  grep -q "ERROR: training diverged at step 2: .*(the first non-finite loss was at step 1)" "$T/nanlog.out"
check "... before the final checkpoint" bash -c "! ls '$T/nanlog/ckpt/'step-*.h5 2> /dev/null"

# ---- a full disk under metrics.csv ----
mkdir -p "$T/full"
ln -s /dev/full "$T/full/metrics.csv"
run_job full 60 run.steps=3 ckpt.every_steps=0
check "metrics.csv on a full disk ends with exit 5 (got $(rc full))" test "$(rc full)" -eq 5
check "... naming the file and the reason" grep -q "writing $T/full/metrics.csv failed: No space left on device" "$T/full.out"
check "... without an OK footer" bash -c "! grep -q '^# OK' '$T/full.out'"

# cluster.bind_hosts naming an address this host does not have: a config error (exit 2) with the
# fix, not a transport failure. 192.0.2.1 is RFC 5737's documentation range: bind(2) refuses it
# here, so nothing is ever sent to it.
run_job badbind 60 run.steps=2 ckpt.every_steps=0 cluster.bind_hosts=192.0.2.1
check "a bind host not on this machine: exit 2 (got $(cat "$T/badbind.rc"))" test "$(cat "$T/badbind.rc")" -eq 2
check "... naming the address and the fix" bash -c "grep -q 'cannot bind the WAN listener to 192.0.2.1:0 (cluster.bind_hosts): .*192.0.2.1 is not an address of this host' '$T/badbind.out' && grep -q 'hint: give cluster.bind_hosts an address' '$T/badbind.out'"

# Ranks given different decks (an MPMD launch with per-rank overrides): the pre-flight check names
# the groups of ranks (they deadlocked: one side on wan.transport = mpi, the other on multirail).
timeout 60 mpirun --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  -np 2 "$ATLAS_BIN" train "${COMMON[@]}" run.name=mpmd run.steps=2 ckpt.every_steps=0 wan.transport=mpi : \
  -np 2 "$ATLAS_BIN" train "${COMMON[@]}" run.name=mpmd run.steps=2 ckpt.every_steps=0 > "$T/mpmd.out" 2>&1
rc=$?
check "ranks with different decks: exit 2 (got $rc)" test "$rc" -eq 2
check "... naming the groups of ranks and the fix" bash -c "grep -q 'ERROR: the ranks resolved 2 different decks (hash [0-9a-f]* on ranks 0-1; hash [0-9a-f]* on ranks 2-3)' '$T/mpmd.out' && grep -q 'hint: give every rank the same deck' '$T/mpmd.out'"

# A checkpoint on a full file system (a 1 MiB tmpfs in a private mount namespace: gone with the
# job): exit 5, saying so (how much is free, the fix, that earlier checkpoints are intact) above
# HDF5's error stack. Skipped where this shell may not make a mount namespace.
if unshare -m true 2>/dev/null; then
  mkdir -p "$T/fullck"
  # The listing of the tmpfs is taken inside the namespace, after the job (outside it the tmpfs is
  # not there: the directory below would be empty whatever the job left).
  timeout 120 unshare -m sh -c "mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs '$T/fullck' && \
    { \"\$@\"; rc=\$?; ls -a '$T/fullck' > '$T/fullck.ls'; exit \$rc; }" sh "${MPI[@]}" "$ATLAS_BIN" train \
    "${COMMON[@]}" run.name=fullck run.steps=2 ckpt.every_steps=1 ckpt.dir="$T/fullck" > "$T/fullck.out" 2>&1
  rc=$?
  check "a checkpoint on a full file system: exit 5 (got $rc)" test "$rc" -eq 5
  check "... leaving no partial .tmp on it" bash -c "test -s '$T/fullck.ls' && ! grep -q 'step-000001.h5.tmp' '$T/fullck.ls'"
  check "... saying so, with the fix" bash -c "grep -Eq \"ERROR: writing checkpoint '$T/fullck/step-000001.h5.tmp' failed \\([0-9.]+ [KMGT]?i?B free on its file system\\)\" '$T/fullck.out' && grep -q 'a full file system is the usual one: free space or point ckpt.dir elsewhere' '$T/fullck.out'"
else
  echo "skipped: a checkpoint on a full file system (unshare -m is not allowed here)"
fi

# ---- data residency: the first stage (it reads the data) in a DC marked 0 ----
run_job residency 120 'cluster.may_hold_data=0 1'
check "cluster.may_hold_data broken: exit 2 (got $(rc residency))" test "$(rc residency)" -eq 2
check "... naming the DC, the stage and the fix" grep -q \
  "DC east holds the pipeline's first stage, but cluster.may_hold_data marks it 0" "$T/residency.out"
check "... before the run wrote its directory" test ! -e "$T/residency/metrics.csv"

check "no rank of any job is left running" bash -c "! pgrep -f '[r]un.out_dir=$T' > /dev/null"
launch_finish
