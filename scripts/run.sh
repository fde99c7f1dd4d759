#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make run`: `atlas train DECK` with NP ranks on this host. When the machine allows network
# namespaces (root, iproute2, iptables NFQUEUE) the DCs run inside the emulated WAN
# (scripts/wan/run_emulated.sh: one namespace per DC, the deck's latency and bandwidth); otherwise
# on plain loopback, after saying why. ATLAS_EMULATE=0 forces loopback, =1 requires emulation. A
# check that fails for another reason (exit other than 77: e.g. an unsafe state directory) stops.
# Extra arguments are deck overrides (key=value).
set -euo pipefail
DECK=${1:?usage: scripts/run.sh DECK NP [key=value ...]}
NP=${2:?usage: scripts/run.sh DECK NP [key=value ...]}
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ATLAS=${ATLAS:-$ROOT/build/bin/atlas}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# OpenMP's default busy-wait makes ranks that share cores 10-20x slower: wait passively.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

mode=${ATLAS_EMULATE:-auto}
if [[ $mode != 0 ]]; then
  rc=0
  reason=$("$ROOT/scripts/wan/netns.sh" check 2>&1) || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "# run.sh: running inside the emulated WAN (one network namespace per DC)"
    exec "$ROOT/scripts/wan/run_emulated.sh" "$DECK" "$NP" "$@" -- "$ATLAS" train "$DECK" "$@"
  fi
  # Only "this machine cannot emulate" (exit 77) falls back; any other failure of the check (an
  # unsafe state directory, an emulation left behind that cannot be removed) is the user's to fix.
  if [[ $rc -ne 77 ]]; then
    echo "run.sh: the WAN emulation check failed (exit $rc): $reason" >&2
    echo "run.sh: fix that, or set ATLAS_EMULATE=0 to run on plain loopback" >&2
    exit 1
  fi
  if [[ $mode == 1 ]]; then
    echo "run.sh: ATLAS_EMULATE=1 but this machine cannot emulate the WAN: $reason" >&2
    exit 77
  fi
  echo "# run.sh: no WAN emulation here ($reason); running on plain loopback"
fi
# Keep Open MPI off the machine's real interfaces: loopback only.
exec mpirun -np "$NP" --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo -x OMP_WAIT_POLICY "$ATLAS" train "$DECK" "$@"
