#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The latency benchmark on an emulated 2-DC link: one 128 KiB message at a time after an idle gap
# (a pipeline boundary tensor between compute slots), over multirail (1 and 4 rails, 32 KiB and
# 256 KiB chunks, and 4 x 32 KiB with the system's TCP congestion control), Open MPI and one plain
# TCP socket (the rails' congestion control and the system's), side by side. The default deck
# (scripts/wan/latency_2dc.deck) is the WAN of inputs/default.deck: 10 ms each way, 1 Gbit/s.
# Sets up the namespaces, checks the RTT, runs atlas-wan-bench --latency (the same code as
# `atlas bench wan --latency`) with one rank per DC, and removes everything afterwards.
# usage: scripts/wan/bench_latency.sh [DECK] [key=value ...] [-- BENCH_ARGS ...]
#   e.g. scripts/wan/bench_latency.sh -- --gap-ms 50 --count 100 --load 3
#        scripts/wan/bench_latency.sh wan.tcp_congestion=system wan.warmup_bytes=0
#        (the transport as it was before the latency fixes: the system's bbr, cold rails)
set -Eeuo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export ATLAS_BIN="${ATLAS_BIN:-$REPO/build/bin}"
# The tools' directory; the atlas executable itself (as the Slurm scripts take ATLAS_BIN) names its directory.
[[ -f $ATLAS_BIN ]] && ATLAS_BIN=$(dirname "$ATLAS_BIN")
DECK="$HERE/latency_2dc.deck"
if [[ $# -gt 0 && $1 != -- && $1 != *=* ]]; then DECK="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift; fi
OVERRIDES=()
while [[ $# -gt 0 && $1 != -- ]]; do OVERRIDES+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
[[ -x $ATLAS_BIN/atlas-wan-bench ]] || { echo "bench_latency.sh: $ATLAS_BIN/atlas-wan-bench missing (build first)" >&2; exit 1; }
exec "$HERE/run_emulated.sh" "$DECK" 2 ${OVERRIDES[@]+"${OVERRIDES[@]}"} -- \
  "$ATLAS_BIN/atlas-wan-bench" "$DECK" ${OVERRIDES[@]+"${OVERRIDES[@]}"} --latency "$@"
