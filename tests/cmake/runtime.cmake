# SPDX-License-Identifier: MIT
# Tests of runtime/ and the train command: parallel equivalence against a single-rank run, the
# same loss curve under every schedule and both WAN transports.
atlas_mpi_test(test_train_equivalence SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_equivalence.cpp
  NP 1 2 3 4 8 TIMEOUT 180)
foreach(np 1 2 3 4 8)
  set_tests_properties(test_train_equivalence_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
atlas_mpi_test(test_train_resume SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_resume.cpp
  NP 1 2 4 TIMEOUT 180)
foreach(np 1 2 4)
  set_tests_properties(test_train_resume_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
atlas_mpi_test(test_train_profile SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_profile.cpp NP 4 TIMEOUT 120)
set_tests_properties(test_train_profile_np_4 PROPERTIES FIXTURES_REQUIRED brown_corpus)
# Intra-DC boundary sends progress while their sender computes (issue 24): 2 ranks, emulated
# compute, GPipe; each gradient reaches the waiting stage within one backward slot (~2 s).
atlas_mpi_test(test_boundary_progress SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_boundary_progress.cpp NP 2 TIMEOUT 60)
# A rank killed mid-run (and mid-checkpoint) is restarted by the launcher from the latest
# checkpoint and ends with the uninterrupted run's loss curve.
# The same run.name again: a fresh start moves the earlier run's checkpoints aside; metrics.csv,
# run.json and resolved.deck stay right through a refused resume and a restart without checkpoint.
add_test(NAME test_run_dir_reuse
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_run_dir_reuse.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_run_dir_reuse PROPERTIES LABELS slow TIMEOUT 300 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
add_test(NAME test_kill_restart
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_kill_restart.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_kill_restart PROPERTIES LABELS slow TIMEOUT 300 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
# SIGUSR1 stops a running job after one agreed step with a checkpoint (exit 8), and the resumed
# run's losses equal an uninterrupted run's; SIGTERM leaves the interrupted note (core/signals).
add_test(NAME test_stop_signal
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_stop_signal.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_stop_signal PROPERTIES LABELS slow TIMEOUT 300 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
atlas_unit_test(test_runtime_fault ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_runtime_fault.cpp)
atlas_unit_test(test_profile_reader ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_profile_reader.cpp)
# The wake-up delay probe (the simulator's cluster.host_wake_us in atlas bench fidelity).
atlas_mpi_test(test_wake_probe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_wake_probe.cpp NP 1 3 TIMEOUT 60)
# A silent peer (alive, not answering) is named by the ranks waiting on it within
# wan.recv_timeout_s, and the job ends with the earlier steps' metrics kept.
add_test(NAME test_peer_hang
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_peer_hang.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_peer_hang PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# A benchmark given a missing deck fails on every rank with the config exit code (no rank waits
# for a broadcast that never comes).
add_test(NAME test_bench_missing_deck
  COMMAND bash -c "out=$(${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> bench schedules /nonexistent.deck 2>&1); rc=$?; echo \"$out\"; [[ $rc -ne 0 ]] && grep -q \"cannot read deck '/nonexistent.deck'\" <<<\"$out\"")
set_tests_properties(test_bench_missing_deck PROPERTIES LABELS mpi TIMEOUT 60 ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")
# atlas bench fidelity end to end on loopback: one deck run for real and simulated, one skipped
# with the reason; the printed ratios are measured / predicted of the same row (file profile,
# fresh block profile, in situ from the warm-up run, trace from the timed run), and each stage's
# in-situ forward/backward ms is printed beside the profile's.
add_test(NAME test_bench_fidelity
  COMMAND bash -c "out=$(${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> bench fidelity inputs/bubbletea_wan.deck inputs/default.deck --steps 4 --warmup-steps 3 2>&1) || exit 1; echo \"$out\"; grep -q 'default.deck *skipped: parallel layout needs' <<<\"$out\" && grep -q '^decks run: 1$' <<<\"$out\" && grep -Eq 'bubbletea_wan.deck +s0 [0-9.]+/[0-9.]+ \\([0-9.]+/[0-9.]+\\) +s1 [0-9.]+/[0-9.]+' <<<\"$out\" && awk '$1 == \"inputs/bubbletea_wan.deck\" && $2 == 2 { ok = $3 > 0 && $4 > 0 && $6 > 0 && $8 > 0 && $14 > 0; ok = ok && ($3 / $4 - $5)^2 < 1e-5 && ($3 / $6 - $7)^2 < 1e-5 && ($3 / $8 - $9)^2 < 1e-5 && ($3 / $14 - $15)^2 < 1e-5; ok = ok && $10 > 0 && $10 < 100 && $12 > 0 && $12 < 100; found = 1 } END { exit !(found && ok) }' <<<\"$out\"")
set_tests_properties(test_bench_fidelity PROPERTIES LABELS mpi TIMEOUT 120 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")
# Errors seen on some ranks only, a diverged model and a full disk end the job within seconds
# with their exit codes (2, 7, 5), keeping the checkpoints and metrics written before.
add_test(NAME test_job_errors
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_job_errors.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_job_errors PROPERTIES LABELS mpi TIMEOUT 400 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# 1,000 idle connections held against the WAN listeners of ranks limited to 256 descriptors leave
# training and its checkpoints unharmed (#27).
add_test(NAME test_wan_flood
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_wan_flood.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_wan_flood PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
atlas_unit_test(test_slot_marks ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_slot_marks.cpp)
# atlas bench ablation on loopback at 4 ranks: the five rows with every column, the footer, a valid
# PNG of the stated size; a 1-DC deck and unequal stage counts are clear config errors.
add_test(NAME test_bench_ablation
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_bench_ablation.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_bench_ablation PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# device.backend = emulated: 4 ranks on loopback within 15% of the table's step, memory that does
# not grow with the model (a 3.2 B-parameter deck below 256 MiB per rank), checkpoints refused.
add_test(NAME test_emulated
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_emulated.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_emulated PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2)
# The zero-bubble split of the backward end to end: split on gives bitwise the losses of off (np 2).
atlas_mpi_test(test_train_split SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_split.cpp NP 2 TIMEOUT 120)
set_tests_properties(test_train_split_np_2 PROPERTIES FIXTURES_REQUIRED brown_corpus)
# make run's script: emulated WAN, loopback, or a stop, from what netns.sh check says (stand-ins).
add_test(NAME test_run_sh_dispatch
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_run_sh_dispatch.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_run_sh_dispatch PROPERTIES LABELS unit TIMEOUT 60)
# A run the memory model says does not fit is told before it allocates (the allocator's failure
# came with no key named): the schedule's misfit message, then the allocation error (exit 4).
add_test(NAME cli_train_memory_misfit_warns
  COMMAND bash -c "set -u; d=$(mktemp -d); trap 'rm -rf $d' EXIT; rc=0; out=$(timeout 120 $<TARGET_FILE:atlas> train inputs/default.deck cluster.dcs=a cluster.gpus_per_dc=1 parallel.stages_per_dc=1 parallel.dp_size=1 'model.layers_per_stage=\"\"' cluster.latency_ms=0 cluster.bandwidth_gbps=0 model.hidden=1048576 model.heads=1 model.vocab=16777216 run.out_dir=$d 2>&1) || rc=$?; echo \"$out (exit $rc)\"; [[ $rc == 4 ]] && grep -q 'WARNING: the atlas schedule needs [0-9.]* GiB per GPU (stage 0' <<<\"$out\" && grep -q 'ERROR: host backend: cannot allocate' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_train_memory_misfit_warns PROPERTIES LABELS unit TIMEOUT 120)
# run_emulated.sh reports a teardown it could not finish (netns.sh down's message and a failing
# exit) instead of hiding it; tested with a stand-in netns.sh, no root needed.
add_test(NAME test_run_emulated_teardown
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_run_emulated_teardown.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_run_emulated_teardown PROPERTIES LABELS unit TIMEOUT 60)
