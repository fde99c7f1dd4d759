#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The WAN benchmark on an emulated 2-DC link: sets up the namespaces from the deck (default
# scripts/wan/bench_2dc.deck: 200 Mbit/s, 50 ms RTT, 256 KiB per-flow window), checks the RTT,
# runs atlas-wan-bench (the same code as `atlas bench wan`) with one rank per DC, and removes
# everything afterwards. First it runs the plain-loopback overhead check outside the namespaces.
# usage: scripts/wan/bench_wan.sh [DECK] [key=value ...] [-- BENCH_ARGS ...]
#   e.g. scripts/wan/bench_wan.sh cluster.bandwidth_gbps="0 0.4 0.4 0" -- --seconds 5 --rails 1,4,16
#   (key=value overrides change both the emulated link and what the bench reports)
set -Eeuo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export ATLAS_BIN="${ATLAS_BIN:-$REPO/build/bin}"
# The tools' directory; the atlas executable itself (as the Slurm scripts take ATLAS_BIN) names its directory.
[[ -f $ATLAS_BIN ]] && ATLAS_BIN=$(dirname "$ATLAS_BIN")
DECK="$HERE/bench_2dc.deck"
if [[ $# -gt 0 && $1 != -- && $1 != *=* ]]; then DECK="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift; fi
OVERRIDES=()
while [[ $# -gt 0 && $1 != -- ]]; do OVERRIDES+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
[[ -x $ATLAS_BIN/atlas-wan-bench ]] || { echo "bench_wan.sh: $ATLAS_BIN/atlas-wan-bench missing (build first)" >&2; exit 1; }
# 1. The plain-loopback overhead check, outside any namespace (one process, no MPI job; inside
#    the emulation the per-flow window would cap loopback sockets too).
#    Skipped with --no-loopback. A failing bench stops the script (its error is on stderr); lines
#    the filter does not find are not an error.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ " $* " != *" --no-loopback "* ]]; then
  loopback=$("$ATLAS_BIN/atlas-wan-bench" "$DECK" ${OVERRIDES[@]+"${OVERRIDES[@]}"} "$@" wan.emulate=none)
  grep -E '^# loopback|^  loopback|^loopback|^  frame protection' <<<"$loopback" || true
fi
# 2. Everything else on the emulated link (its last line is the "best:" verdict).
exec "$HERE/run_emulated.sh" "$DECK" 2 ${OVERRIDES[@]+"${OVERRIDES[@]}"} -- \
  "$ATLAS_BIN/atlas-wan-bench" "$DECK" ${OVERRIDES[@]+"${OVERRIDES[@]}"} "$@"
