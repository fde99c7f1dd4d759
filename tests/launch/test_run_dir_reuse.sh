#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A run directory used again (the same run.name), as users and restart loops do:
#   - a fresh start moves the earlier run's results (RUN/earlier-run-*/: run.json, metrics.csv,
#     resolved.deck, profile.h5, trace.json) and checkpoints (ckpt/earlier-run-*/) aside, nothing
#     deleted: run.resume = latest then resumes this run's own, and ckpt.keep_last counts and
#     prunes only this run's files;
#   - run.resume = latest that finds no checkpoint (a job killed before its first) starts at step
#     0 with metrics.csv holding each step once;
#   - a resume refused (another model.hidden) leaves the finished run's run.json and resolved.deck;
#   - a resumed run's run.json says where it started and how many steps it ran;
#   - a start from a checkpoint outside ckpt.dir (a fine-tune) twice: a new timeline each time;
#   - a roll-back (run.resume = an older file of ckpt.dir) moves the later steps aside, so
#     run.resume = latest continues it; a run.resume that does not exist moves nothing; a
#     linked step-*.h5 is moved aside by a fresh start.
# Cleans up its temp dir; no network beyond loopback.
# usage: test_run_dir_reuse.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_run_dir_reuse.sh rundir-reuse "$@"
COMMON=(inputs/default.deck parallel.dp_size=1 run.log_every_steps=1 train.eval_every_steps=0
        run.out_dir="$T" wan.recv_timeout_s=20 profile.enabled=false run.name=r)
MPI=(mpirun -np 4 --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
train() { local out=$1; shift; "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" "$@" >"$T/$out.out" 2>&1; }
steps_in() { awk -F, 'NR > 1 { printf "%s ", $1 }' "$1"; }
top_ckpts() { (cd "$T/r/ckpt" && ls step-*.h5 2>/dev/null | tr '\n' ' '); }

# ---- the earlier run: checkpoints at steps 2, 4, 6 ----
train first run.steps=6 ckpt.every_steps=2 ckpt.keep_last=5 train.weight_decay=0.1
check "the first run finished" grep -q "^# OK: 6 steps" "$T/first.out"
check "it left step 2, 4, 6" test "$(top_ckpts)" = "step-000002.h5 step-000004.h5 step-000006.h5 "

# ---- a fresh start in the same directory ----
train second run.steps=4 ckpt.every_steps=3 ckpt.keep_last=2 train.weight_decay=0.0
check "the fresh run finished" grep -q "^# OK: 4 steps" "$T/second.out"
check "it says it moved the earlier run's 3 checkpoints" \
  grep -q "^# a fresh start (run.resume = \"\"): moved 3 checkpoint file(s) ([0-9.]* [KM]iB) of an earlier run from .*/r/ckpt to .*/r/ckpt/earlier-run-" "$T/second.out"
aside=$(ls -d "$T"/r/ckpt/earlier-run-* 2>/dev/null | head -n 1)
check "they are kept in earlier-run-*/" test "$(cd "$aside" 2>/dev/null && ls | tr '\n' ' ')" = "step-000002.h5 step-000004.h5 step-000006.h5 "
results=$(ls -d "$T"/r/earlier-run-* 2>/dev/null | head -n 1)
check "the earlier run's results are kept in earlier-run-*/ (its run.json, metrics.csv, resolved.deck)" \
  bash -c "grep -q '\"status\":\"OK\",\"steps\":6,' '$results/run.json' && test \$(wc -l <'$results/metrics.csv') -eq 7 && grep -q '^train.weight_decay *= 0.1' '$results/resolved.deck'"
check "and it says so" grep -q "^# a fresh start (run.resume = \"\"): moved 3 result file(s) of an earlier run to .*/r/earlier-run-" "$T/second.out"
check "ckpt.keep_last = 2 kept this run's step 3 and 4 (no earlier file counted)" test "$(top_ckpts)" = "step-000003.h5 step-000004.h5 "
check "no warning about newer checkpoints of another run" bash -c "! grep -qi 'newer than the one just written' '$T/second.out'"
cp "$T/r/resolved.deck" "$T/second.deck"
cp "$T/r/run.json" "$T/second.json"

# ---- resuming it continues this run, not the earlier one's step 6 ----
train again run.steps=4 ckpt.every_steps=3 ckpt.keep_last=2 train.weight_decay=0.0 run.resume=latest
check "run.resume = latest found this run's step 4" grep -q "# nothing to train: the checkpoint is at step 4" "$T/again.out"

# ---- a resume refused leaves the finished run's files ----
train refused run.steps=4 ckpt.every_steps=3 run.resume=latest model.hidden=64
check "the resume with another model.hidden was refused" grep -q "model.hidden is 128 in the checkpoint but 64 in the deck" "$T/refused.out"
check "with a hint naming the value" grep -q "hint: set model.hidden = 128 as the run that wrote it had" "$T/refused.out"
check "run.json still says OK" cmp -s "$T/r/run.json" "$T/second.json"
check "resolved.deck is still the run's (model.hidden = 128)" cmp -s "$T/r/resolved.deck" "$T/second.deck"

# ---- a resumed run's run.json: where it started, how many steps it ran ----
train longer run.steps=6 ckpt.every_steps=3 ckpt.keep_last=2 train.weight_decay=0.0 run.resume=latest
check "the longer run resumed at step 4 and finished" grep -q "^# OK: 2 steps" "$T/longer.out"
check "run.json has first_step 4, steps_run 2" grep -q '"steps":6,"first_step":4,"steps_run":2,' "$T/r/run.json"

# ---- a start from a checkpoint outside ckpt.dir (a fine-tune) is a new timeline: run twice, the
# first one's rows and checkpoints are moved aside (they were dropped from metrics.csv) ----
cp "$T/r/ckpt/step-000006.h5" "$T/pre.h5"
train ft1 run.name=f run.steps=8 ckpt.every_steps=4 ckpt.keep_last=2 run.resume="$T/pre.h5"
check "the fine-tune from outside ckpt.dir ran steps 6-7" test "$(steps_in "$T/f/metrics.csv")" = "6 7 "
train ft2 run.name=f run.steps=8 ckpt.every_steps=4 ckpt.keep_last=2 run.resume="$T/pre.h5"
check "the second fine-tune says it moved the first one's files" \
  grep -q "^# a start from $T/pre.h5 (outside ckpt.dir): moved 3 result file(s) of an earlier run to " "$T/ft2.out"
check "... and its checkpoint, with the size" \
  grep -q "^# a start from $T/pre.h5 (outside ckpt.dir): moved 1 checkpoint file(s) ([0-9.]* [KM]iB) of an earlier run" "$T/ft2.out"
ft_aside=$(ls -d "$T"/f/earlier-run-* 2>/dev/null | head -n 1)
check "the first fine-tune's metrics are kept there" test "$(steps_in "$ft_aside/metrics.csv" 2>/dev/null)" = "6 7 "
check "metrics.csv holds the second one's steps once" test "$(steps_in "$T/f/metrics.csv")" = "6 7 "

# ---- run.resume = latest with no checkpoint yet: metrics.csv holds each step once ----
COMMON+=(run.name=k)
ATLAS_FAULT_KILL=1:3 train killed run.steps=5 ckpt.every_steps=5
check "the job was killed at step 3, before its first checkpoint" test ! -e "$T/k/ckpt/step-000005.h5"
check "metrics.csv had steps 0-2" test "$(steps_in "$T/k/metrics.csv")" = "0 1 2 "
train restarted run.steps=5 ckpt.every_steps=5 run.resume=latest
check "the restart found no checkpoint and finished from step 0" grep -q "^# OK: 5 steps" "$T/restarted.out"
check "metrics.csv has each step once" test "$(steps_in "$T/k/metrics.csv")" = "0 1 2 3 4 "

# ---- a roll-back: resuming from an older checkpoint of ckpt.dir moves its later steps aside, so
# run.resume = latest after a crash continues the new timeline, not the abandoned step 6 ----
COMMON+=(run.name=b)
bckpts() { (cd "$T/b/ckpt" && ls step-*.h5 2>/dev/null | tr '\n' ' '); }
train b1 run.steps=6 ckpt.every_steps=2 ckpt.keep_last=5
check "the run left step 2, 4, 6" test "$(bckpts)" = "step-000002.h5 step-000004.h5 step-000006.h5 "
# A run.resume with a typo fails before anything is moved.
train typo run.steps=6 ckpt.every_steps=2 run.resume="$T/b/ckpt/step-00002.h5"
check "a run.resume that does not exist: exit 2 naming it" grep -q "checkpoint '$T/b/ckpt/step-00002.h5' does not exist" "$T/typo.out"
check "... and nothing was moved" test "$(bckpts)" = "step-000002.h5 step-000004.h5 step-000006.h5 "
train typo_dir run.steps=6 ckpt.every_steps=2 run.resume="$T/b/ckpt"
check "a run.resume naming the directory: its newest checkpoint in the hint" grep -q "hint: its newest checkpoint is $T/b/ckpt/step-000006.h5" "$T/typo_dir.out"
# (A resumed run cannot be fault-killed: it stops at step 4, as a crash after its step 4 would.)
train rollback run.steps=4 ckpt.every_steps=3 ckpt.keep_last=5 run.resume="$T/b/ckpt/step-000002.h5"
check "the roll-back says it moved step 4 and 6 aside" \
  grep -q "^# a resume from $T/b/ckpt/step-000002.h5 (step 2: an earlier step of ckpt.dir): moved 2 checkpoint file(s) of later steps" "$T/rollback.out"
baside=$(ls -d "$T"/b/ckpt/earlier-run-* 2>/dev/null | head -n 1)
check "they are kept in earlier-run-*/" test "$(cd "$baside" 2>/dev/null && ls | tr '\n' ' ')" = "step-000004.h5 step-000006.h5 "
check "the roll-back wrote its step 3 and 4" test "$(bckpts)" = "step-000002.h5 step-000003.h5 step-000004.h5 "
train after_crash run.steps=6 ckpt.every_steps=3 ckpt.keep_last=5 run.resume=latest
check "run.resume = latest continues the roll-back from its step 4, not the abandoned step 6" \
  grep -q "run.resume = latest: resuming from '$T/b/ckpt/step-000004.h5' (step 4)" "$T/after_crash.out"
# A fresh start moves a linked step-*.h5 aside too (the link): latest never resumes it as this run's.
ln -s "$T/b/ckpt/step-000003.h5" "$T/b/ckpt/step-000900.h5"
train fresh_link run.steps=2 ckpt.every_steps=2 ckpt.keep_last=5
check "the linked step 900 moved aside with the run's files" bash -c "ls -d '$T'/b/ckpt/earlier-run-*/step-000900.h5 >/dev/null 2>&1 && test ! -e '$T/b/ckpt/step-000900.h5'"
train link_latest run.steps=2 ckpt.every_steps=2 run.resume=latest
check "run.resume = latest finds this run's step 2" grep -q "# nothing to train: the checkpoint is at step 2" "$T/link_latest.out"

launch_finish
