#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Open MPI's TCP transport with its put protocol sends a large message each way between two ranks
# one direction at a time (docs/wan.md, "Open MPI's put protocol"). atlas leaves put out of
# OMPI_MCA_btl_tcp_flags before MPI_Init where the variable is unset; the run's header says which
# protocol Open MPI took (read back through the MPI tool interface), and a DP ring across DCs with
# put on warns once. Two ranks over TCP on loopback, emulated compute, two steps.
# usage: test_mpi_tcp_protocol.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_mpi_tcp_protocol.sh tcpput "$@"
unset OMPI_MCA_btl_tcp_flags

K=("cluster.dcs=a b" "cluster.gpus_per_dc=1 1" "parallel.stages_per_dc=1 1" parallel.dp_size=2
  parallel.dp_across_dcs=true "cluster.latency_ms=0 0 0 0" 'model.layers_per_stage=""' run.steps=2
  "run.out_dir=$T/runs")
MPI=(mpirun -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
run() { # NAME [VAR=VALUE ...] [-- MPIRUN_ARGS ...] -> $T/NAME.out
  local name=$1 vars=() extra=(); shift
  while (($#)) && [[ $1 != -- ]]; do vars+=("$1"); shift; done
  (($#)) && { shift; extra=("$@"); }
  env "${vars[@]}" timeout 60 "${MPI[@]}" "${extra[@]}" "$ATLAS_BIN" train inputs/ablation_2dc_16.deck "${K[@]}" \
    "run.name=$name" >"$T/$name.out" 2>&1
}
warnings() { grep -c "WARNING: parallel.dp_across_dcs over Open MPI's TCP transport with its put protocol on" "$1"; }

run default
check "unset: the run succeeds" test $? = 0
check "unset: the header says put is off, atlas's default" \
  grep -q "^# Open MPI's TCP transport: put protocol off (OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum,hetero-rdma, atlas's default" "$T/default.out"
check "unset: no warning" test "$(warnings "$T/default.out")" = 0

run put OMPI_MCA_btl_tcp_flags=send,put,inplace,need-ack,need-csum,hetero-rdma
check "put on by the user: the run succeeds" test $? = 0
check "put on by the user: the header says so and names the fix" \
  grep -q "^# Open MPI's TCP transport: put protocol ON (OMPI_MCA_btl_tcp_flags=send,put,.*leave put out of btl_tcp_flags" "$T/put.out"
check "put on by the user: one warning (rank 0)" test "$(warnings "$T/put.out")" = 1

run mca -- --mca btl_tcp_flags send,put,inplace,need-ack,need-csum,hetero-rdma
check "put on through mpirun --mca: the run succeeds" test $? = 0
check "put on through mpirun --mca: the header says so" \
  grep -q "^# Open MPI's TCP transport: put protocol ON (OMPI_MCA_btl_tcp_flags=send,put," "$T/mca.out"
check "put on through mpirun --mca: one warning" test "$(warnings "$T/mca.out")" = 1

run own OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum
check "the user's own value without put: the run succeeds" test $? = 0
check "the user's own value is kept (not atlas's)" \
  grep -q "^# Open MPI's TCP transport: put protocol off (OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum: " "$T/own.out"
check "the user's own value without put: no warning" test "$(warnings "$T/own.out")" = 0

launch_finish
