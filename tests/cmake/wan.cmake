# SPDX-License-Identifier: MIT
# WAN transport tests (room wan/): framing and multirail on loopback (unit), make_transport over
# MPI with ranks split into two DCs (mpi), and the network-namespace emulation (netns, root only).
atlas_unit_test(test_wan_framing unit/test_wan_framing.cpp)
set_tests_properties(test_wan_framing PROPERTIES TIMEOUT 30)
atlas_unit_test(test_wan_keys unit/test_wan_keys.cpp)
set_tests_properties(test_wan_keys PROPERTIES TIMEOUT 30)

# One binary, two ctest entries so each stays a few seconds: payload integrity, then faults.
atlas_unit_test(test_wan_multirail unit/test_wan_multirail.cpp)
set_tests_properties(test_wan_multirail PROPERTIES TIMEOUT 60)
set_property(TEST test_wan_multirail APPEND PROPERTY ENVIRONMENT
  "GTEST_FILTER=RailsAndChunks/*:WanMultirail.*")
add_test(NAME test_wan_multirail_faults COMMAND test_wan_multirail --gtest_filter=Quiet.*
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_wan_multirail_faults PROPERTIES LABELS unit TIMEOUT 60)
# Lowers RLIMIT_NOFILE and floods a listener from a forked child: a process of its own.
add_test(NAME test_wan_multirail_descriptors COMMAND test_wan_multirail --gtest_filter=WanDescriptors.*
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_wan_multirail_descriptors PROPERTIES LABELS unit TIMEOUT 60)

atlas_mpi_test(test_wan_transport SOURCES mpi/test_wan_transport.cpp NP 2 4 TIMEOUT 90)
# MPI forced over TCP on lo, captured there (root): the job's traffic must not hold its secrets.
add_test(NAME test_wan_transport_capture_np_2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --mca pml ob1
          --mca btl self,tcp --mca btl_tcp_if_include lo $<TARGET_FILE:test_wan_transport>
          --gtest_filter=WanSecret.*
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_wan_transport_capture_np_2 PROPERTIES LABELS mpi TIMEOUT 60 PROCESSORS 1
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV};ATLAS_WAN_CAPTURE_REQUIRED=1;${ATLAS_MPI_SANITIZER_ENV}")

# The emulated WAN (root, network namespaces): skipped with the reason printed where not allowed.
add_test(NAME test_wan_netns
  COMMAND ${PROJECT_SOURCE_DIR}/scripts/wan/netns_selftest.sh $<TARGET_FILE:test_wan_transport>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_wan_netns PROPERTIES LABELS "netns" TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "ATLAS_BIN=${CMAKE_BINARY_DIR}/bin;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  DEPENDS test_wan_transport)
# run_emulated.sh refuses a bad ATLAS_WAN_AUTOGROUP before it sets anything up (no root needed).
add_test(NAME test_run_emulated_bad_autogroup
  COMMAND bash -c "out=$(ATLAS_WAN_AUTOGROUP=sometimes ${PROJECT_SOURCE_DIR}/scripts/wan/run_emulated.sh ${PROJECT_SOURCE_DIR}/inputs/bubbletea_loopback.deck 2 -- true 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 1 ]] && grep -q \"ATLAS_WAN_AUTOGROUP must be off or keep, not 'sometimes'\" <<<\"$out\"")
set_tests_properties(test_run_emulated_bad_autogroup PROPERTIES LABELS unit TIMEOUT 30)
add_test(NAME test_run_emulated_bad_single_copy
  COMMAND bash -c "out=$(ATLAS_WAN_SINGLE_COPY=xpmem ${PROJECT_SOURCE_DIR}/scripts/wan/run_emulated.sh ${PROJECT_SOURCE_DIR}/inputs/bubbletea_loopback.deck 2 -- true 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 1 ]] && grep -q \"ATLAS_WAN_SINGLE_COPY must be cma or none, not 'xpmem'\" <<<\"$out\"")
set_tests_properties(test_run_emulated_bad_single_copy PROPERTIES LABELS unit TIMEOUT 30)
# netns.sh refuses an unknown place to shape the links before it creates anything (no root needed).
add_test(NAME test_netns_bad_shape
  COMMAND bash -c "out=$(ATLAS_WAN_SHAPE=nowhere ${PROJECT_SOURCE_DIR}/scripts/wan/netns.sh up zzshape --dcs 2 --latency-ms '0 1 1 0' --bandwidth-gbps '0 1 1 0' 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 1 ]] && grep -q \"ATLAS_WAN_SHAPE must be router or sender, not 'nowhere'\" <<<\"$out\" && ! ip netns list 2>/dev/null | grep -q '^zzshape'")
set_tests_properties(test_netns_bad_shape PROPERTIES LABELS unit TIMEOUT 30)
# bench wan refuses an unknown frame protection mode before it starts anything (exit 2).
add_test(NAME test_bench_wan_bad_auth
  COMMAND bash -c "out=$($<TARGET_FILE:atlas> bench wan --auth mac,foo 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 2 ]] && grep -q \"\\-\\-auth needs a list of mac, encrypt, crc (e.g. mac,crc), got 'mac,foo'\" <<<\"$out\"")
set_tests_properties(test_bench_wan_bad_auth PROPERTIES LABELS unit TIMEOUT 30
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
# 4 DCs, 16 ranks, emulated compute inside the emulated WAN (root): RTTs of all pairs, the
# emulation's CPU cost stated, everything removed afterwards. Skipped (77) where not possible.
add_test(NAME test_wan_emulated_4dc
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/launch/test_wan_emulated_4dc.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_wan_emulated_4dc PROPERTIES LABELS "netns" TIMEOUT 300 SKIP_RETURN_CODE 77 PROCESSORS 2
  DEPENDS test_wan_netns)
# run_emulated.sh refuses a job whose ranks do not fit this machine (descriptors per rank against
# ulimit -n) before it sets anything up (no root needed).
add_test(NAME test_run_emulated_does_not_fit
  COMMAND bash -c "out=$(ulimit -n 100; ATLAS_BIN=${CMAKE_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR}/scripts/wan/run_emulated.sh ${PROJECT_SOURCE_DIR}/scripts/wan/emulated_4dc.deck 64 parallel.dp_size=16 -- true 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 1 ]] && grep -q \"the job's ranks do not fit this machine's emulation: 64 ranks with wan.rails = 4 need about 152 open files per rank .* but ulimit -n is 100\" <<<\"$out\" && grep -q 'hint: raise it (ulimit -n 152) or run fewer ranks' <<<\"$out\"")
set_tests_properties(test_run_emulated_does_not_fit PROPERTIES LABELS unit TIMEOUT 30)
# ATLAS_BIN naming the atlas executable (as the Slurm scripts take it) names the WAN tools' directory
# to the emulation scripts (it fell back to loopback: "atlas-wan-delay ... not found").
add_test(NAME test_netns_atlas_bin_file
  COMMAND bash -c "out=$(ATLAS_BIN=$<TARGET_FILE:atlas> scripts/wan/netns.sh check 2>&1); echo \"$out\"; if grep -qE 'needs root|is not installed' <<<\"$out\"; then exit 77; fi; ! grep -q 'not found in' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_netns_atlas_bin_file PROPERTIES LABELS unit TIMEOUT 30 SKIP_RETURN_CODE 77)
# netns.sh down refuses a NAME up would refuse: "" removed the whole state root (every live
# emulation's record) and "../x" a directory beside it.
add_test(NAME test_netns_down_bad_name
  COMMAND bash -c "d=$(mktemp -d); mkdir -m 700 $d/state $d/state/zzkeep $d/x; ok=1; for n in '' ../x; do out=$(ATLAS_WAN_STATE=$d/state scripts/wan/netns.sh down \"$n\" 2>&1) && ok=0; echo \"$out\"; grep -q \"NAME must be 1-10 lowercase letters/digits, not '$n'\" <<<\"$out\" || ok=0; done; [[ -d $d/state/zzkeep && -d $d/x ]] || ok=0; rm -rf $d; [[ $ok == 1 ]]"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_netns_down_bad_name PROPERTIES LABELS unit TIMEOUT 30)
# The emulation's state directory must be the user's own: a symbolic link (or another user's
# directory in a shared /tmp, whose files root would run) is refused before anything is set up.
add_test(NAME test_netns_state_root_link
  COMMAND bash -c "d=$(mktemp -d); ln -s $d/elsewhere $d/state; mkdir $d/elsewhere $d/open; chmod 777 $d/open; out=$(ATLAS_WAN_STATE=$d/state scripts/wan/netns.sh up zzlink --dcs 2 --latency-ms '0 1 1 0' --bandwidth-gbps '0 1 1 0' 2>&1); rc=$?; out2=$(ATLAS_WAN_STATE=$d/open scripts/wan/netns.sh up zzlink --dcs 2 --latency-ms '0 1 1 0' --bandwidth-gbps '0 1 1 0' 2>&1); rc2=$?; echo \"$out\"; echo \"$out2\"; rm -rf $d; [[ $rc -eq 1 && $rc2 -eq 1 ]] && grep -q 'is a symbolic link: refusing it' <<<\"$out\" && grep -q 'is writable by other users: refusing it' <<<\"$out2\" && ! ip netns list 2>/dev/null | grep -q '^zzlink'"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(test_netns_state_root_link PROPERTIES LABELS unit TIMEOUT 30)
# scripts/wan/bench_wan.sh's loopback step with stand-ins (no root): --no-loopback skips it, no
# filtered line is not an error, a failing bench stops the script with its status.
add_test(NAME test_bench_wan_sh
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/launch/test_bench_wan_sh.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_bench_wan_sh PROPERTIES LABELS unit TIMEOUT 60)
# bench wan bounds its iperf3 client (15 s past its test) and server: an iperf3 that never ends (a
# stand-in that records its pid and sleeps, first on PATH; --noprefix keeps mpiexec from putting
# /usr/bin first) is killed and its row says failed; none of the stand-ins is left running.
add_test(NAME test_bench_wan_iperf_bounded
  COMMAND bash -c "d=$(mktemp -d); trap 'for p in $(cat $d/pids 2>/dev/null); do kill -9 $p 2>/dev/null; done; rm -rf $d' EXIT; { echo '#!/bin/sh'; echo \"echo \\$\\$ >> $d/pids\"; echo 'exec sleep 300'; } > $d/iperf3; chmod +x $d/iperf3; out=$(PATH=$d:$PATH timeout 100 ${MPIEXEC_EXECUTABLE} --noprefix -np 2 --oversubscribe -x PATH $<TARGET_FILE:atlas> bench wan --rails 1 --auth crc --no-mpi --no-loopback --seconds 1 --warmup 0.1 2>&1) || exit 1; echo \"$out\"; grep -q 'WARNING: bench wan: iperf3 -c .* did not finish within 15 s of its 1 s test: killed, counted as failed' <<<\"$out\" && grep -Eq '^  iperf3 -P 1 +1 +0.0 .*failed' <<<\"$out\" && [[ -s $d/pids ]] && for p in $(cat $d/pids); do ! kill -0 $p 2>/dev/null || { echo \"iperf3 stand-in $p left running\"; exit 1; }; done")
set_tests_properties(test_bench_wan_iperf_bounded PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 2
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
# Open MPI's put protocol left out of its TCP transport by default, the header and the warning
# when a user turns it on (docs/wan.md, "Open MPI's put protocol").
add_test(NAME test_mpi_tcp_protocol
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_mpi_tcp_protocol.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_mpi_tcp_protocol PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2)
