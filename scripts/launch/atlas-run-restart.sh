#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a launch command (srun/mpirun ... atlas train DECK ...) and restarts it from the newest
# checkpoint (run.resume=latest) when it fails for a reason a restart can cure: a comm, device,
# I/O or internal error, a killed rank or an MPI abort. Usage and config errors, a diverged
# model (exit 7: resuming would diverge again) and a run stopped on request (exit 8) are not
# retried. A SIGUSR1 is passed on to the attempt (srun and mpirun pass it to the ranks: atlas
# train then writes a checkpoint and stops with exit 8), and no restart follows it.
# Not a scheduler: one command, a bounded number of attempts, a short backoff between them.
#
# usage: atlas-run-restart.sh [--log FILE] -- COMMAND [ARG ...]
#   --log FILE   also append the attempt log to FILE (common.sh passes RUN_DIR/restarts.log)
# environment:
#   ATLAS_MAX_RESTARTS        restarts after the first attempt (default 3; 0 = never restart)
#   ATLAS_RESTART_BACKOFF_S   seconds before restart k is k * this (default 5)
#   ATLAS_NO_RESTART_CODES    exit codes never retried (default "1 2 7 8 126 127": usage, config,
#                             diverged, stopped on request, not executable, not found)
#   ATLAS_RESTART_READY_FILE  created once the loop's signal traps are set (common.sh waits for it
#                             before passing a SIGUSR1 on)
# exit status: the last attempt's (0 when an attempt succeeded).
set -uo pipefail
# shellcheck source=wait_child.sh
source "$(dirname "${BASH_SOURCE[0]}")/wait_child.sh"

log_file=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --log) log_file=${2:?--log needs a file}; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "usage: atlas-run-restart.sh [--log FILE] -- COMMAND [ARG ...]" >&2
  exit 1
fi

max_restarts=${ATLAS_MAX_RESTARTS:-3}
backoff_s=${ATLAS_RESTART_BACKOFF_S:-5}
no_restart_codes=${ATLAS_NO_RESTART_CODES:-"1 2 7 8 126 127"}
if ! [[ $max_restarts =~ ^[0-9]+$ ]]; then
  echo "atlas-run-restart: ATLAS_MAX_RESTARTS='$max_restarts': expected a non-negative integer" >&2
  exit 1
fi
if ! [[ $backoff_s =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "atlas-run-restart: ATLAS_RESTART_BACKOFF_S='$backoff_s': expected a number of seconds" >&2
  exit 1
fi

# One line per event, to stderr and to the log file, with a UTC time stamp.
say() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) atlas-run-restart: $*"
  echo "$line" >&2
  if [[ -n $log_file ]]; then echo "$line" >>"$log_file"; fi
}

# What an exit status means (atlas's ExitCode, a signal, or something the launcher chose).
describe() {
  case "$1" in
    0) echo "ok" ;;
    1) echo "usage error" ;;
    2) echo "config error" ;;
    3) echo "comm error" ;;
    4) echo "device error" ;;
    5) echo "io error" ;;
    6) echo "internal error" ;;
    7) echo "training diverged (non-finite loss or gradient norm)" ;;
    8) echo "stopped on request after a checkpoint; resume with run.resume=latest" ;;
    126) echo "command not executable: check ATLAS_BIN and the launcher" ;;
    127) echo "command not found: check PATH (a failed module load?), ATLAS_BIN and the launcher" ;;
    *)
      if (($1 > 128 && $1 < 160)); then
        echo "killed by signal $(($1 - 128)) (SIG$(kill -l $(($1 - 128)) 2>/dev/null || echo '?'))"
      else
        echo "launcher or MPI abort code"
      fi
      ;;
  esac
}

# A scancel or Ctrl-C stops the loop: terminate the attempt and do not restart. (SIGTERM, not
# the signal received: a background job of a non-interactive shell ignores SIGINT.)
child=""
stopping=0
on_signal() {
  stopping=1
  say "received SIG$1: stopping attempt (pid ${child:-none}) and not restarting"
  if [[ -n $child ]]; then kill -TERM "$child" 2>/dev/null; fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
# A SIGUSR1 asks the running attempt for a checkpoint and a clean stop (Slurm's --signal); the
# loop then ends with the attempt's status, whatever it is.
stop_requested=0
on_usr1() {
  stop_requested=1
  say "received SIGUSR1: asking the attempt (pid ${child:-none}) to write a checkpoint and stop; not restarting"
  if [[ -n $child ]]; then kill -USR1 "$child" 2>/dev/null; fi
}
trap on_usr1 USR1
# Whoever started the loop may wait for this before signalling it (a SIGUSR1 before the trap above
# would end the loop: the signal's default action).
if [[ -n ${ATLAS_RESTART_READY_FILE:-} ]]; then : >"$ATLAS_RESTART_READY_FILE"; fi

# run.resume=latest replaces any run.resume the caller gave (the newest checkpoint wins); a
# checkpoint the caller named (a fine-tune's start) becomes run.resume_fallback, which atlas
# takes while the run has no checkpoint of its own: a restart before the first one must not
# start from random weights.
# A caller's run.resume= (empty: start fresh, over a deck's run.resume = PATH) stays "no
# fallback" (run.resume_fallback=), or atlas would take the deck's PATH as the fallback.
cmd=("$@")
resume_cmd=()
fallback=""
cleared=0
for a in "${cmd[@]}"; do
  case "$a" in
    run.resume=latest) ;;
    run.resume=) cleared=1 fallback="" ;;
    run.resume=*) cleared=0 fallback=${a#run.resume=} ;;
    run.resume_fallback=) cleared=1 fallback="" ;;  # "no fallback" said outright (a requeued fresh start)
    run.resume_fallback=*) cleared=0 fallback=${a#run.resume_fallback=} ;;
    *) resume_cmd+=("$a") ;;
  esac
done
resume_cmd+=("run.resume=latest")
if [[ -n $fallback ]]; then resume_cmd+=("run.resume_fallback=$fallback"); elif ((cleared)); then resume_cmd+=("run.resume_fallback="); fi

attempt=0
status=0
while :; do
  attempt=$((attempt + 1))
  if ((attempt == 1)); then this=("${cmd[@]}"); else this=("${resume_cmd[@]}"); fi
  # A stop asked for between attempts (during the backoff, or before the first started): no
  # attempt to ask, so none is started; 8 says "stopped on request" to the caller (a requeue).
  if ((stopping)); then exit $((attempt == 1 ? 143 : status)); fi
  if ((stop_requested)); then
    say "not starting attempt $attempt: a stop was requested (SIGUSR1); run.resume=latest resumes from the newest checkpoint"
    exit 8
  fi
  say "attempt $attempt/$((max_restarts + 1)): ${this[*]}"
  start=$(date +%s)
  "${this[@]}" &
  child=$!
  # A signal that came while the attempt was being started found no child to pass it to.
  if ((stopping)); then kill -TERM "$child" 2>/dev/null; fi
  if ((stop_requested)); then kill -USR1 "$child" 2>/dev/null; fi
  atlas_wait_child "$child"
  status=$?
  child=""
  say "attempt $attempt exited with status $status ($(describe "$status")) after $(($(date +%s) - start)) s"

  if ((status == 0)); then exit 0; fi
  if ((status == 8)); then
    say "not restarting: the run stopped on request; run.resume=latest resumes it from its checkpoint"
    exit "$status"
  fi
  if ((stopping || stop_requested)); then exit "$status"; fi
  for c in $no_restart_codes; do
    if ((status == c)); then
      say "not restarting: $(describe "$status") is not cured by a restart; fix the command or deck"
      exit "$status"
    fi
  done
  if ((attempt > max_restarts)); then
    say "giving up after $attempt attempts (ATLAS_MAX_RESTARTS=$max_restarts); last status $status"
    exit "$status"
  fi
  delay=$(awk -v b="$backoff_s" -v k="$attempt" 'BEGIN { print b * k }')
  say "restarting in ${delay} s with run.resume=latest"
  sleep "$delay" &
  wait $! || true
done
