#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs an MPI job on an emulated WAN: one network namespace per DC of DECK (scripts/wan/netns.sh),
# with the deck's latency and bandwidth matrices and its per-flow window (wan.flow_window_bytes),
# and each DC's ranks inside its namespace under its own hostname (so Open MPI's shared memory
# stays inside a DC and TCP crosses the emulated links). The RTT of every emulated DC pair is
# checked before the job starts; everything created is removed on exit, failure or Ctrl-C.
#
# usage: scripts/wan/run_emulated.sh DECK NP [key=value ...] -- COMMAND [ARGS ...]
#   e.g. scripts/wan/run_emulated.sh inputs/two_dc_cpu.deck 4 -- build/bin/atlas train inputs/two_dc_cpu.deck
# Each rank sees ATLAS_WAN_DC (its DC index), ATLAS_WAN_BIND_HOST (its DC's emulated address,
# used by the WAN transport instead of cluster.bind_hosts), ATLAS_WAN_EMULATED=1 and
# ATLAS_HOST_RANKS=NP (every rank shares this machine's cores: the host backend's thread default).
# Environment: ATLAS_BIN (tools dir, default build/bin; the atlas executable names its directory), ATLAS_WAN_MPIRUN_ARGS (extra mpirun
# arguments), ATLAS_WAN_BTL (default self,vader,tcp), ATLAS_WAN_BIND (mpirun --bind-to, default
# none: the emulated DCs share one machine, and a rank's threads should not share one core),
# ATLAS_WAN_RTT_TOLERANCE (fraction, 0.25), ATLAS_WAN_AUTOGROUP (off: default, keep),
# ATLAS_WAN_SINGLE_COPY (Open MPI's btl_vader_single_copy_mechanism inside a DC: cma where this
# shell may use process_vm_readv (no seccomp filter, Yama ptrace_scope absent or 0), else none).
# ATLAS_WAN_SHAPE (where netns.sh shapes each link: router, the default, or sender).
# Single copy: a DC is one node here, and without it every intra-DC message above 4 KiB went as
# 32 KiB fragments that move only while both ranks call MPI; ranks that poll with back-off (and
# wait for a core) then took 25-75 ms for a 0.8 MB DP sum the cost model gives 0.1 ms
# (issue 24: default.deck emulated, gpipe 1.46-2.1x its prediction; with cma 1.00-1.07x).
# Scheduler: with kernel.sched_autogroup_enabled = 1 every session is a scheduling group of its
# own, and Open MPI starts each DC's ranks in their own; a group's weight on a core follows its
# load there, so a rank's helper threads (WAN progress, sender) woken on a core where another
# rank computes waited 50-94 ms for it (perf sched timehist; BubbleTea overload: training +7.9%,
# a few steps 60-100 ms late, fidelity ratios 1.14-1.19). The emulated DCs share this machine's
# cores, so the script turns autogrouping off for the run and restores it at exit (unless
# ATLAS_WAN_AUTOGROUP=keep); two emulations at once: the first to end restores it.
# Exit status: the job's; 77 when this machine cannot emulate (reason printed); 1 on setup errors,
# and 1 after a job that succeeded when the emulation could not be fully removed (netns.sh down's
# message names what is left and the fix).
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export ATLAS_BIN="${ATLAS_BIN:-$REPO/build/bin}"
# The tools' directory; the atlas executable itself (as the Slurm scripts take ATLAS_BIN) names its directory.
[[ -f $ATLAS_BIN ]] && ATLAS_BIN=$(dirname "$ATLAS_BIN")
NETNS="$HERE/netns.sh"

usage() { sed -n '2,/^set -Eeuo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 1; }
[[ $# -ge 3 ]] || usage
DECK="$1"
NP="$2"
shift 2
OVERRIDES=()
while [[ $# -gt 0 && $1 != -- ]]; do OVERRIDES+=("$1"); shift; done
[[ ${1:-} == -- ]] || usage
shift
[[ $# -gt 0 ]] || usage
[[ -r $DECK ]] || { echo "run_emulated.sh: cannot read deck '$DECK'" >&2; exit 1; }
[[ $NP =~ ^[0-9]+$ && $NP -ge 1 ]] || { echo "run_emulated.sh: NP must be a positive integer" >&2; exit 1; }
AUTOGROUP_MODE="${ATLAS_WAN_AUTOGROUP:-off}"
SINGLE_COPY="${ATLAS_WAN_SINGLE_COPY:-}"
if [[ -z $SINGLE_COPY ]]; then
  SINGLE_COPY=none  # containers' seccomp profiles (Docker's default) refuse process_vm_readv
  if awk '/^Seccomp:/ { exit !($2 == 0) }' /proc/self/status 2>/dev/null &&
    [[ $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0) == 0 ]]; then SINGLE_COPY=cma; fi
fi
[[ $SINGLE_COPY == cma || $SINGLE_COPY == none ]] ||
  { echo "run_emulated.sh: ATLAS_WAN_SINGLE_COPY must be cma or none, not '$SINGLE_COPY'" >&2; exit 1; }
[[ $AUTOGROUP_MODE == off || $AUTOGROUP_MODE == keep ]] ||
  { echo "run_emulated.sh: ATLAS_WAN_AUTOGROUP must be off or keep, not '$AUTOGROUP_MODE'" >&2; exit 1; }

# ---- the deck's WAN ----
[[ -x $ATLAS_BIN/atlas-wan-deck ]] || { echo "run_emulated.sh: $ATLAS_BIN/atlas-wan-deck missing (build first)" >&2; exit 1; }
DECK_VARS=$("$ATLAS_BIN/atlas-wan-deck" "$DECK" --np "$NP" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
eval "$DECK_VARS"
N=$WAN_DC_COUNT
[[ $N -ge 2 ]] || { echo "run_emulated.sh: the deck has $N DC; emulation needs at least 2" >&2; exit 1; }
LAT=""
BW=""
for ((a = 0; a < N; a++)); do
  for ((b = 0; b < N; b++)); do
    v="WAN_LATENCY_MS_${a}_${b}"; LAT+="${!v} "
    v="WAN_BANDWIDTH_GBPS_${a}_${b}"; BW+="${!v} "
  done
done
read -r -a PER_DC <<<"$WAN_RANKS_PER_DC"

# ---- do the deck's ranks fit this machine? (before anything is set up; no root needed) ----
# Address plan: one address per DC on 10.77.0.0/24 (.1-.253; the bridge has none), every rank of a
# DC on its DC's address with ports of its own. Descriptors: a rank holds up to one MPI TCP socket
# per rank of the other DCs, wan.rails sockets each way per WAN peer (at most 3: two pipeline
# neighbours and the tied-embedding partner) and about 64 more (shared memory, files, listeners).
# Memory: an emulated-compute rank peaks near 40 MiB (test_emulated), counted as 96 MiB with
# Open MPI's shared memory; a host-backend rank holds its model and is not estimated here.
fits() {
  local why=""
  if [[ $N -gt 253 ]]; then
    why="the deck has $N DCs, but the emulation's address plan (10.77.0.0/24, one address per DC) holds 253"
  fi
  local need_fd=$((64 + NP + 6 * WAN_RAILS)) have_fd
  have_fd=$(ulimit -n)
  if [[ -z $why && $have_fd != unlimited && $have_fd -lt $need_fd ]]; then
    why="$NP ranks with wan.rails = $WAN_RAILS need about $need_fd open files per rank ($NP MPI peers + 6 x $WAN_RAILS WAN sockets + 64), but ulimit -n is $have_fd
  hint: raise it (ulimit -n $need_fd) or run fewer ranks"
  fi
  if [[ -z $why && $WAN_DEVICE_BACKEND == emulated ]]; then
    local avail_kb need_kb
    avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    need_kb=$((NP * 96 * 1024))
    if [[ -n $avail_kb && $need_kb -gt $avail_kb ]]; then
      why="$NP emulated-compute ranks need about $((need_kb / 1024)) MiB (96 MiB each), but this machine has $((avail_kb / 1024)) MiB available
  hint: run fewer ranks, or spread the job over a Slurm allocation (docs/emulated.md)"
    fi
  fi
  if [[ -n $why ]]; then
    echo "run_emulated.sh: $DECK: the job's ranks do not fit this machine's emulation: $why" >&2
    exit 1
  fi
}
fits

# ---- can we? ----
set +e
"$NETNS" check >/dev/null
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  "$NETNS" check || true  # prints the reason
  exit "$rc"
fi

NAME="aw$$"
NAME="${NAME:0:10}"
JOB_PID=""
EMULATION_UP=0
AUTOGROUP_FILE=/proc/sys/kernel/sched_autogroup_enabled
AUTOGROUP_WAS=""
cleanup() {
  local rc=$?
  # A second Ctrl-C or TERM must not end the script before the emulation is down.
  trap - EXIT
  trap '' INT TERM
  if [[ -n $JOB_PID ]] && kill -0 "$JOB_PID" 2>/dev/null; then
    kill -TERM "$JOB_PID" 2>/dev/null || true  # mpirun stops its ranks
    for _ in $(seq 1 30); do kill -0 "$JOB_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$JOB_PID" 2>/dev/null || true
  fi
  # What the emulation itself cost this machine (its delayers' CPU per Gbit delayed), then remove it.
  if [[ $EMULATION_UP -eq 1 ]]; then "$NETNS" cost "$NAME" >/dev/null || true; fi
  # Also stops anything left inside the namespaces. A namespace it cannot delete is reported with
  # its fix (netns.sh's message) and fails the script, whatever the job's status was.
  local removed=1
  if ! "$NETNS" down "$NAME"; then
    echo "run_emulated.sh: ERROR: emulation $NAME was not fully removed (see the line above)" >&2
    removed=0
    [[ $rc -ne 0 ]] || rc=1
  fi
  if [[ -n $AUTOGROUP_WAS ]]; then echo "$AUTOGROUP_WAS" >"$AUTOGROUP_FILE" 2>/dev/null || true; fi
  if [[ $rc -eq 130 || $rc -eq 143 ]]; then
    if [[ $removed -eq 1 ]]; then
      echo "run_emulated.sh: interrupted; emulation $NAME removed" >&2
    else
      echo "run_emulated.sh: interrupted" >&2
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ATLAS_WAN_OWNER_PID=$$ "$NETNS" up "$NAME" --dcs "$N" --latency-ms "$LAT" --bandwidth-gbps "$BW" --flow-window "$WAN_FLOW_WINDOW_BYTES"
EMULATION_UP=1

if [[ $AUTOGROUP_MODE == off && -w $AUTOGROUP_FILE && $(cat "$AUTOGROUP_FILE") == 1 ]]; then
  if echo 0 2>/dev/null >"$AUTOGROUP_FILE"; then
    AUTOGROUP_WAS=1
    # netns.sh down puts it back too, when it removes this emulation after this script died.
    echo 1 >"${ATLAS_WAN_STATE:-${TMPDIR:-/tmp}/atlas-wan}/$NAME/autogroup_restore" 2>/dev/null || true
    echo "run_emulated.sh: kernel.sched_autogroup_enabled 1 -> 0 for this run (restored at exit; ATLAS_WAN_AUTOGROUP=keep leaves it)" >&2
  else
    echo "run_emulated.sh: kernel.sched_autogroup_enabled = 1 and cannot be changed here: helper threads may wait for cores (see the header)" >&2
  fi
fi

# ---- check the emulated RTT of every pair before measuring anything ----
TOL="${ATLAS_WAN_RTT_TOLERANCE:-0.25}"
for ((a = 0; a < N; a++)); do
  for ((b = a + 1; b < N; b++)); do
    v="WAN_LATENCY_MS_${a}_${b}"; l1=${!v}
    v="WAN_LATENCY_MS_${b}_${a}"; l2=${!v}
    want=$(awk -v x="$l1" -v y="$l2" 'BEGIN { print x + y }')
    got=$("$NETNS" rtt "$NAME" "$a" "$b")
    ok=$(awk -v g="$got" -v w="$want" -v t="$TOL" 'BEGIN { d = g - w; if (d < 0) d = -d; print (d <= t * w + 2) ? 1 : 0 }')
    echo "run_emulated.sh: RTT DC $a <-> DC $b: measured $got ms, deck $want ms" >&2
    [[ $ok -eq 1 ]] || { echo "run_emulated.sh: emulated RTT is off by more than ${TOL} x + 2 ms: refusing to run" >&2; exit 1; }
  done
done

# ---- Open MPI across the namespaces ----
STATE="${ATLAS_WAN_STATE:-${TMPDIR:-/tmp}/atlas-wan}/$NAME"
HOSTFILE="$STATE/hostfile"
AGENT="$STATE/agent.sh"
: >"$HOSTFILE"
for ((d = 0; d < N; d++)); do
  [[ ${PER_DC[$d]} -gt 0 ]] && echo "$("$NETNS" addr "$d") slots=${PER_DC[$d]}" >>"$HOSTFILE"
done
# mpirun's rsh agent: "agent HOST COMMAND..." -> run COMMAND inside HOST's DC namespace.
{
  echo '#!/bin/sh'
  echo "# Generated by run_emulated.sh for emulation $NAME."
  echo 'host="$1"; shift'
  echo 'case "$host" in'
  for ((d = 0; d < N; d++)); do echo "  $("$NETNS" addr "$d")) d=$d ;;"; done
  echo '  *) echo "atlas WAN agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
  echo "exec \"$NETNS\" exec $NAME \"\$d\" /bin/sh -c \"\$*\""
} >"$AGENT"
chmod +x "$AGENT"

# Every DC namespace is a "node" of its own to Open MPI, with as many slots as ranks, so it never
# sees that all of them share this machine's cores, and its blocking waits (collective file
# opens, barriers) spin instead of yielding. Say so when the job has more ranks than cores:
# measured on the default deck, 8 ranks on 2 cores, 100 steps: mean step 213 vs 222 ms, checkpoint
# writes 0.5-0.6 s vs 1.5-3.3 s (3 runs each).
YIELD_ARGS=()
if [[ $NP -gt $(nproc) ]]; then YIELD_ARGS=(--mca mpi_yield_when_idle 1); fi
# For the same reason the host backend's default thread count (device.threads = 0: cores / ranks
# on the node) must count every rank on this machine, not those of one namespace.
export ATLAS_HOST_RANKS=${ATLAS_HOST_RANKS:-$NP}

first_dc=0
while [[ ${PER_DC[$first_dc]} -eq 0 ]]; do first_dc=$((first_dc + 1)); done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "run_emulated.sh: $NP ranks, per DC: ${PER_DC[*]}; intra-DC single copy: $SINGLE_COPY; command: $*" >&2
# In the background with `wait`, so Ctrl-C or a TERM reaches our trap at once (bash runs traps
# only between commands) and the trap stops mpirun before removing the namespaces.
# shellcheck disable=SC2086
"$NETNS" exec "$NAME" "$first_dc" mpirun --hostfile "$HOSTFILE" -np "$NP" --oversubscribe \
  --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
  --bind-to "${ATLAS_WAN_BIND:-none}" --mca btl "${ATLAS_WAN_BTL:-self,vader,tcp}" \
  --mca btl_tcp_if_include "10.77.0.0/24" --mca oob_tcp_if_include "10.77.0.0/24" \
  --mca btl_vader_single_copy_mechanism "$SINGLE_COPY" "${YIELD_ARGS[@]}" -x ATLAS_HOST_RANKS \
  ${ATLAS_WAN_MPIRUN_ARGS:-} "$@" <&0 &
JOB_PID=$!
set +e
wait "$JOB_PID"
rc=$?
set -e
JOB_PID=""
exit "$rc"
