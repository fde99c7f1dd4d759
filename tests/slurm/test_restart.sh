#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tests scripts/launch/atlas-run-restart.sh with a fake launch command whose exit statuses are
# scripted: restarts with run.resume=latest after comm errors and a killed rank, never after a
# config error, gives up after ATLAS_MAX_RESTARTS, and stops (no restart) on SIGTERM; passes a
# SIGUSR1 on to the attempt and does not restart a run that stopped on request (exit 8).
# usage: test_restart.sh [SOURCE_DIR]
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH="$ROOT/scripts/launch/atlas-run-restart.sh"
T=$(mktemp -d /tmp/atlas-restart-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
export ATLAS_RESTART_BACKOFF_S=0

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
expect_eq() { # what expected actual
  if [[ "$2" != "$3" ]]; then fail "$1: expected '$2', got '$3'"; else echo "ok: $1 = '$3'"; fi
}

# The fake command: exits with the next status from $T/statuses (one per line) and records its
# arguments, one attempt per line, in $T/calls.
cat >"$T/fake.sh" <<'EOF'
#!/usr/bin/env bash
dir=$(dirname "$0")
echo "$*" >>"$dir/calls"
n=$(wc -l <"$dir/calls")
code=$(sed -n "${n}p" "$dir/statuses")
if [[ $code == kill ]]; then kill -KILL $$; fi
if [[ $code == sleep ]]; then exec sleep 30; fi
# usr1: a job that stops on request: exit 8 once a SIGUSR1 reaches it (atlas train's answer).
if [[ $code == usr1 ]]; then
  trap 'echo got-usr1 >>"$dir/calls.usr1"; exit 8' USR1
  touch "$dir/usr1.ready"
  for _ in $(seq 300); do sleep 0.1; done
  exit 9
fi
exit "${code:-0}"
EOF
chmod +x "$T/fake.sh"

run_case() { # statuses... ; runs the launcher, sets $rc
  rm -f "$T/calls" "$T/log"
  printf '%s\n' "$@" >"$T/statuses"
  "$LAUNCH" --log "$T/log" -- "$T/fake.sh" train deck.deck run.steps=4 2>"$T/stderr"
  rc=$?
}

# ---- fails twice (comm error, then a rank killed by SIGKILL), then succeeds ----
run_case 3 kill 0
expect_eq "exit status after two failures and a success" 0 "$rc"
expect_eq "attempts" 3 "$(wc -l <"$T/calls")"
expect_eq "attempt 1 args" "train deck.deck run.steps=4" "$(sed -n 1p "$T/calls")"
expect_eq "attempt 2 args" "train deck.deck run.steps=4 run.resume=latest" "$(sed -n 2p "$T/calls")"
expect_eq "attempt 3 args" "train deck.deck run.steps=4 run.resume=latest" "$(sed -n 3p "$T/calls")"
grep -q "attempt 1 exited with status 3 (comm error)" "$T/log" || fail "log lacks attempt 1 status 3"
grep -q "attempt 2 exited with status 137 (killed by signal 9 (SIGKILL))" "$T/log" ||
  fail "log lacks attempt 2 killed by SIGKILL: $(cat "$T/log")"
grep -q "attempt 3 exited with status 0 (ok)" "$T/log" || fail "log lacks attempt 3 ok"
cmp -s <(grep -o 'atlas-run-restart: .*' "$T/log") <(grep -o 'atlas-run-restart: .*' "$T/stderr") ||
  fail "stderr and log file differ"

# ---- a config error is not retried ----
run_case 3 2 0
expect_eq "exit status on config error" 2 "$rc"
expect_eq "attempts when the 2nd is a config error" 2 "$(wc -l <"$T/calls")"
grep -q "not restarting: config error" "$T/log" || fail "log lacks 'not restarting: config error'"

# ---- gives up after ATLAS_MAX_RESTARTS restarts ----
ATLAS_MAX_RESTARTS=2 run_case 5 5 5 5 0
expect_eq "exit status after giving up" 5 "$rc"
expect_eq "attempts with ATLAS_MAX_RESTARTS=2" 3 "$(wc -l <"$T/calls")"
grep -q "giving up after 3 attempts" "$T/log" || fail "log lacks 'giving up after 3 attempts'"

# ---- a run.resume given by the caller is replaced, not duplicated ----
rm -f "$T/calls"
printf '%s\n' 6 0 >"$T/statuses"
"$LAUNCH" -- "$T/fake.sh" train d.deck run.resume=runs/x/ckpt/step-000002.h5 2>/dev/null
expect_eq "restart replaces run.resume, keeping the named checkpoint as the fallback" \
  "train d.deck run.resume=latest run.resume_fallback=runs/x/ckpt/step-000002.h5" "$(sed -n 2p "$T/calls")"
# A caller's run.resume= (start fresh, over a deck's run.resume = PATH) stays "no fallback":
# without run.resume_fallback= atlas would take the deck's PATH as the fallback.
rm -f "$T/calls"
printf '%s\n' 6 0 >"$T/statuses"
"$LAUNCH" -- "$T/fake.sh" train d.deck run.resume= 2>/dev/null
expect_eq "restart after run.resume= passes an empty fallback" \
  "train d.deck run.resume=latest run.resume_fallback=" "$(sed -n 2p "$T/calls")"
# The same "no fallback" as the requeue of such a job passes it (run.resume=latest
# run.resume_fallback=, scripts/slurm/common.sh): kept on every restart (the empty fallback was
# taken for a path and dropped, and atlas fell back to the deck's PATH).
rm -f "$T/calls"
printf '%s\n' 6 6 0 >"$T/statuses"
"$LAUNCH" -- "$T/fake.sh" train d.deck run.resume= run.resume=latest run.resume_fallback= 2>/dev/null
expect_eq "a requeued fresh start keeps its empty fallback on restart" \
  "train d.deck run.resume=latest run.resume_fallback=" "$(sed -n 2p "$T/calls")"
expect_eq "... and on the next" "train d.deck run.resume=latest run.resume_fallback=" "$(sed -n 3p "$T/calls")"

# ---- SIGTERM (scancel) stops the attempt and does not restart ----
rm -f "$T/calls"
printf '%s\n' sleep 0 >"$T/statuses"
"$LAUNCH" --log "$T/log" -- "$T/fake.sh" train d.deck 2>/dev/null &
launcher=$!
for _ in $(seq 50); do [[ -s $T/calls ]] && break; sleep 0.1; done
sleep 0.2
t0=$(date +%s)
kill -TERM "$launcher"
wait "$launcher"
rc=$?
expect_eq "attempts after SIGTERM" 1 "$(wc -l <"$T/calls")"
[[ $rc -ne 0 ]] || fail "launcher returned 0 after SIGTERM"
(($(date +%s) - t0 < 10)) || fail "launcher took >= 10 s to stop after SIGTERM"
grep -q "received SIGTERM" "$T/log" || fail "log lacks 'received SIGTERM'"

# ---- a run stopped on request (exit 8) is not restarted ----
run_case 8 0
expect_eq "exit status of a run stopped on request" 8 "$rc"
expect_eq "attempts when the run stopped on request" 1 "$(wc -l <"$T/calls")"
grep -q "attempt 1 exited with status 8 (stopped on request" "$T/log" || fail "log lacks status 8's meaning: $(cat "$T/log")"
grep -q "not restarting: the run stopped on request" "$T/log" || fail "log lacks 'not restarting: the run stopped on request'"

# ---- SIGUSR1 (Slurm's --signal) reaches the attempt, which stops; no restart follows ----
rm -f "$T/calls" "$T/calls.usr1" "$T/log" "$T/usr1.ready"
printf '%s\n' usr1 0 >"$T/statuses"
"$LAUNCH" --log "$T/log" -- "$T/fake.sh" train d.deck 2>/dev/null &
launcher=$!
for _ in $(seq 100); do [[ -e $T/usr1.ready ]] && break; sleep 0.1; done
kill -USR1 "$launcher"
wait "$launcher"
rc=$?
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; rc=$?; done
expect_eq "exit status after SIGUSR1" 8 "$rc"
expect_eq "the attempt received the SIGUSR1" got-usr1 "$(cat "$T/calls.usr1" 2>/dev/null)"
expect_eq "attempts after SIGUSR1" 1 "$(wc -l <"$T/calls")"
grep -q "received SIGUSR1: asking the attempt" "$T/log" || fail "log lacks 'received SIGUSR1'"

# ---- SIGUSR1 during the backoff after a failed attempt: no further attempt starts, and the
# loop says "stopped on request" (8), so a Slurm job requeues and resumes from the checkpoint ----
rm -f "$T/calls" "$T/log"
printf '%s\n' 3 0 >"$T/statuses"
ATLAS_RESTART_BACKOFF_S=5 "$LAUNCH" --log "$T/log" -- "$T/fake.sh" train d.deck 2>/dev/null &
launcher=$!
for _ in $(seq 100); do grep -q "restarting in" "$T/log" 2>/dev/null && break; sleep 0.1; done
kill -USR1 "$launcher"
wait "$launcher"
rc=$?
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; rc=$?; done
expect_eq "exit status after SIGUSR1 in the backoff" 8 "$rc"
expect_eq "attempts after SIGUSR1 in the backoff" 1 "$(wc -l <"$T/calls")"
grep -q "not starting attempt 2: a stop was requested (SIGUSR1)" "$T/log" || fail "log lacks 'not starting attempt 2': $(cat "$T/log")"

# ---- a command that is not found is not restarted ----
rm -f "$T/log"
"$LAUNCH" --log "$T/log" -- "$T/no-such-launcher" train d.deck 2>/dev/null
expect_eq "exit status of a command not found" 127 "$?"
grep -q "attempt 1 exited with status 127 (command not found" "$T/log" || fail "log lacks status 127's meaning: $(cat "$T/log")"
grep -q "attempt 2/" "$T/log" && fail "a command not found was restarted"

# ---- scripts/slurm/common.sh: a multi-node job on the loopback interface stops at once ----
out=$(cd "$ROOT" && env -u NCCL_SOCKET_IFNAME -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include \
  SLURM_JOB_ID=1 SLURM_JOB_NUM_NODES=2 ATLAS_ROOT="$ROOT" ATLAS_NET_IFNAME=lo bash -c 'source scripts/slurm/common.sh; atlas_run inputs/three_dc_cpu.deck' 2>&1)
expect_eq "exit status of a 2-node job with ATLAS_NET_IFNAME=lo" 1 "$?"
grep -q "NCCL_SOCKET_IFNAME=lo (ATLAS_NET_IFNAME) but the job spans 2 nodes" <<<"$out" ||
  fail "no message naming the loopback interface and the 2 nodes: $out"

# ---- bad settings are rejected ----
ATLAS_MAX_RESTARTS=many "$LAUNCH" -- true 2>"$T/stderr"
expect_eq "exit status for ATLAS_MAX_RESTARTS=many" 1 "$?"
grep -q "ATLAS_MAX_RESTARTS='many'" "$T/stderr" || fail "no message naming ATLAS_MAX_RESTARTS"

if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all restart checks passed"
