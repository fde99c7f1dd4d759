#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs `atlas train DECK` under mpirun with NP ranks on this host (loopback WAN), or inside the
# emulated WAN (one network namespace per DC) when the deck says wan.emulate = netns and the
# machine allows namespaces. Extra arguments are deck overrides (key=value).
set -euo pipefail
DECK=${1:?usage: scripts/run.sh DECK NP [key=value ...]}
NP=${2:?usage: scripts/run.sh DECK NP [key=value ...]}
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ATLAS=${ATLAS:-$ROOT/build/bin/atlas}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Keep Open MPI off the machine's real interfaces: loopback only.
exec mpirun -np "$NP" --oversubscribe --mca btl self,vader,tcp --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo "$ATLAS" train "$DECK" "$@"
