# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Sourced by atlas-run-restart.sh and scripts/slurm/common.sh: the one way they wait for a
# background child while their signal traps may run.
#
# atlas_wait_child PID: waits until child PID has exited; returns its exit status. A wait that a
# trapped signal cuts short returns early (> 128): waited again while the child lives, and once
# more after, since bash keeps a finished child's status and the cut-short wait said 128 + signal.
atlas_wait_child() {
  local pid=$1 status
  wait "$pid"
  status=$?
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
    status=$?
  done
  wait "$pid"
  status=$?
  return "$status"
}
