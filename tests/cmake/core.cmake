# SPDX-License-Identifier: MIT
# Tests of core/, deck/, topo/ and sched/.
atlas_unit_test(test_deck ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_deck.cpp)
atlas_unit_test(test_core_file ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_file.cpp)
atlas_unit_test(test_core_signals ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_signals.cpp)
atlas_unit_test(test_core_error ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_error.cpp)
atlas_unit_test(test_core_env ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_env.cpp)
atlas_unit_test(test_bench_harness ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_bench_harness.cpp)
# Every `atlas bench X` goes through the harness: the list, a bench's usage, the header; a
# behaviour switch is a deck key (device.backend = cuda reaches make_backend: refused on a CPU build).
add_test(NAME cli_bench_harness
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; out=$($b bench 2>&1); [[ $? == 1 ]] || exit 1; for n in wan latency gemm step schedules profile overlap ckpt sim fidelity validate bubbletea ablation; do grep -q \"^  $n \" <<<\"$out\" || { echo \"$out\"; exit 1; }; grep -q \"^  bench .*[ ,]$n\\(,\\|$\\)\" <<<\"$($b --help)\" || { $b --help; exit 1; }; done; for h in --help -h; do $b bench $h 2>/dev/null | grep -q '^  ablation ' || exit 1; done; out=$($b bench gemm --help) && grep -q 'usage: atlas bench gemm .*--reps N' <<<\"$out\" || exit 1; rc=0; out=$($b bench gemm --hidden 64 --seq-len 8 --batch 1 --vocab 64 --reps 1 device.threads=1 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 0 || $rc == 2 ]] && grep -q '^# command: atlas bench gemm --hidden 64' <<<\"$out\" && grep -q '^# build: atlas' <<<\"$out\" && grep -q '^# machine: ' <<<\"$out\" && grep -q '^# atlas bench gemm: host backend gemm' <<<\"$out\" || exit 1; rc=0; out=$($b bench gemm --reps 1 device.backend=cuda 2>&1) || rc=$?; echo \"$out\"; grep -qE 'built without CUDA|no CUDA device is visible|^# atlas bench gemm: cuda backend' <<<\"$out\" || exit 1; rc=0; out=$($b bench gemm --reps 1 model.hidden=64 2>&1) || rc=$?; [[ $rc == 2 ]] && grep -q 'only device.\\* keys apply' <<<\"$out\" || exit 1; rc=0; out=$($b bench wan --latency --variants foo 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 2 ]] && grep -q \"atlas bench latency: unknown variant 'foo'\" <<<\"$out\"")
set_tests_properties(cli_bench_harness PROPERTIES LABELS unit TIMEOUT 120 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
atlas_unit_test(test_layout ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_layout.cpp)
atlas_unit_test(test_schedule ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_schedule.cpp)
# The atlas search over the in-flight depth under the device's memory: never slower than gpipe or
# 1f1b at equal or lower memory (every example deck, a seeded sweep); memory per GPU of a table.
atlas_unit_test(test_schedule_depth ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_schedule_depth.cpp)
# The zero-bubble split of the backward (schedule.split_backward): the slot contract for every kind
# on every example deck, B + W = the backward, W filling WAN waits, memory held until W.
atlas_unit_test(test_schedule_split ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_schedule_split.cpp)
atlas_mpi_test(test_communicators SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_communicators.cpp NP 1 2 4 8)
atlas_unit_test(test_core_stats ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_core_stats.cpp)
atlas_unit_test(test_mpi_tags ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_mpi_tags.cpp)
atlas_mpi_test(test_agree SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_agree.cpp NP 1 2 3)
# mpi::Environment starting MPI itself: the MPI_T read-back of btl_tcp_flags keeps the thread
# level, and put is off where atlas set the flags (its own main).
atlas_mpi_test(test_mpi_environment SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_mpi_environment.cpp NP 2)
# Deck fuzzer: 1,200 seeded mutants of the decks in inputs/ through what atlas schedule runs (a
# forked child each, time-limited) and a sample through the binary (schedule, simulate, plan): no
# signal, exit 0/1/2, every config error naming its key. ATLAS_FUZZ_SEED / ATLAS_FUZZ_MUTANTS.
atlas_unit_test(test_deck_fuzz ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_deck_fuzz.cpp)
set_property(TEST test_deck_fuzz APPEND PROPERTY ENVIRONMENT "ATLAS_BIN=$<TARGET_FILE:atlas>")
set_tests_properties(test_deck_fuzz PROPERTIES TIMEOUT 300 PROCESSORS 2)
# A deck that is a device or a FIFO is a config error within seconds (it was bad_alloc, or a hang),
# offline and in a launched job (rank 0 reads, every rank reports the same error).
add_test(NAME cli_deck_not_a_file
  COMMAND bash -c "set -u; d=$(mktemp -d); trap 'rm -rf $d' EXIT; mkfifo $d/deck.fifo; for p in /dev/zero $d/deck.fifo $d; do rc=0; out=$(timeout 10 $<TARGET_FILE:atlas> schedule $p 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 2 ]] && grep -q \"cannot read deck '$p': it is a .*, expected a regular file\" <<<\"$out\" || exit 1; done"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_deck_not_a_file PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME mpi_deck_not_a_file
  COMMAND bash -c "set -u; d=$(mktemp -d); trap 'rm -rf $d' EXIT; mkfifo $d/deck.fifo; for p in /dev/zero $d/deck.fifo; do rc=0; out=$(timeout 60 ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> train $p 2>&1) || rc=$?; echo \"$out (exit $rc)\"; [[ $rc == 2 ]] && grep -q \"cannot read deck '$p': it is a\" <<<\"$out\" || exit 1; done"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(mpi_deck_not_a_file PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 2
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")
# The device profiles travel with the deck: rank 0 reads plan.profiles once and every rank raises
# its error alike (a config error, exit 2), before any communicator or table is built.
add_test(NAME mpi_deck_profile_not_a_file
  COMMAND bash -c "set -u; rc=0; out=$(timeout 60 ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> train inputs/default.deck parallel.stages_per_dc='1 0' cluster.gpus_per_dc='2 0' parallel.dp_size=2 plan.profiles=/dev/zero 2>&1) || rc=$?; echo \"$out (exit $rc)\"; [[ $rc == 2 ]] && grep -q \"plan.profiles: cannot read device profile '/dev/zero': it is a\" <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(mpi_deck_profile_not_a_file PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 2
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")
# An integer option is range-checked before it is narrowed to int (4294967396 would be 100).
add_test(NAME cli_int_option_beyond_int
  COMMAND bash -c "rc=0; out=$($<TARGET_FILE:atlas> schedule inputs/default.deck --width 4294967396 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 1 ]] && grep -q \"\\-\\-width expects an integer in \\[10, 1000\\], got '4294967396'\" <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_int_option_beyond_int PROPERTIES LABELS unit TIMEOUT 60)
# --name=value is --name value; a flag given a value, and an integer option given a word, say so
# (they were "unknown option --quiet=3" and the whole int range for --rows abc).
add_test(NAME cli_option_forms
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; out=$($b plan inputs/plan_13b_deadline.deck --rows=2 --quiet 2>&1) || { echo \"$out\"; exit 1; }; rc=0; out=$($b plan inputs/plan_13b_deadline.deck --quiet=3 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 1 ]] && grep -q \"\\-\\-quiet is a flag and takes no value, got '\\-\\-quiet=3'\" <<<\"$out\" || exit 1; rc=0; out=$($b plan inputs/plan_13b_deadline.deck --rows abc 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 1 ]] && grep -q \"\\-\\-rows expects an integer >= 1, got 'abc'\" <<<\"$out\" || exit 1; rc=0; out=$($b plan inputs/plan_13b_deadline.deck --nosuch=1 2>&1) || rc=$?; [[ $rc == 1 ]] && grep -q 'unknown option \\-\\-nosuch' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_option_forms PROPERTIES LABELS unit TIMEOUT 60)
# `atlas COMMAND --help` lists the command's options and exits 0 (it was "unknown option --help",
# with a hint to run that very command), and so does -h; an unknown option still exits 1.
add_test(NAME cli_command_help
  COMMAND bash -c "set -u; for c in schedule simulate plan report train profile export import tokenize sample eval; do for h in --help -h; do rc=0; out=$($<TARGET_FILE:atlas> $c $h 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 0 ]] && grep -q \"usage: atlas $c \" <<<\"$out\" || exit 1; done; done; $<TARGET_FILE:atlas> report --help | grep -q 'usage: atlas report RUN_DIR' || exit 1; $<TARGET_FILE:atlas> export --help | grep -q 'usage: atlas export CKPT --format hf --out DIR' || exit 1; out=$($<TARGET_FILE:atlas> schedule --help); grep -q -- '--json FILE ' <<<\"$out\" && grep -q -- '--quiet' <<<\"$out\" || exit 1; out=$($<TARGET_FILE:atlas> sample --help); grep -Eq -- '^  --top-p P +keep the fewest most likely tokens reaching P \\(1 = all\\)$' <<<\"$out\" && grep -Eq -- '^  --ignore-eot +go on past' <<<\"$out\" || exit 1; rc=0; $<TARGET_FILE:atlas> schedule --nosuch 2>/dev/null || rc=$?; [[ $rc == 1 ]]"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_command_help PROPERTIES LABELS unit TIMEOUT 60)
# The offline commands start without MPI (Open MPI's singleton start-up took ~0.5 s of each): with
# MPI unable to start (a PML that does not exist), train fails while schedule, plan, simulate (and
# its profile.h5), report, tokenize and the help texts (each command's too) work.
add_test(NAME cli_offline_without_mpi
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; export OMPI_MCA_pml=nosuch; d=$(mktemp -d); trap 'rm -rf $d' EXIT; rc=0; timeout 60 $b train inputs/default.deck run.steps=1 run.out_dir=$d >/dev/null 2>&1 || rc=$?; [[ $rc != 0 ]] || { echo 'train ran although MPI cannot start: the test proves nothing'; exit 1; }; $b schedule inputs/default.deck >/dev/null && $b plan inputs/plan_13b_deadline.deck >/dev/null && $b simulate inputs/default.deck --profile $d/sim.h5 >/dev/null && $b report $d/sim.h5 >/dev/null && $b tokenize README.md --out $d/tok >/dev/null && $b --help >/dev/null && $b schedule --help-deck >/dev/null || { echo 'an offline command needed MPI'; exit 1; }; for c in train 'train inputs/default.deck' bench 'bench ablation' 'bench wan' profile export import sample eval; do timeout 60 $b $c --help >/dev/null && timeout 60 $b $c -h >/dev/null || { echo \"atlas $c --help needed MPI\"; exit 1; }; done"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_offline_without_mpi PROPERTIES LABELS unit TIMEOUT 120)
# schedule, simulate and plan model a GPU deck (device.backend = cuda) on a build without CUDA
# (they refused it: "built without CUDA"); train on that build still refuses it.
add_test(NAME cli_offline_cuda_deck
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; for c in schedule simulate plan; do out=$($b $c inputs/gpt2_124m_gpu.deck --quiet 2>&1) || { echo \"$out\"; echo \"atlas $c of a cuda deck failed\"; exit 1; }; grep -q 'costed with the h100 device profile' <<<\"$out\" || { echo \"$out\"; exit 1; }; done; $b simulate inputs/gpt2_124m_gpu.deck 2>/dev/null | grep -q 'profile h100' || exit 1; $b train --help >/dev/null || exit 1; if ! $b bench gemm --reps 1 device.backend=cuda 2>&1 | grep -qE 'cuda backend'; then rc=0; out=$($b train inputs/gpt2_124m_gpu.deck run.steps=1 2>&1) || rc=$?; echo \"$out\"; [[ $rc != 0 ]] && grep -qE 'built without CUDA|no CUDA device' <<<\"$out\"; fi"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_offline_cuda_deck PROPERTIES LABELS unit TIMEOUT 120)
# The build info's git SHA is HEAD's at build time (cmake/AtlasGitSha.cmake): in a scratch
# repository the script writes HEAD's SHA, "-dirty" once a tracked file changes, the new SHA after
# a commit, and leaves the file untouched (same mtime) when nothing changed.
add_test(NAME build_git_sha
  COMMAND bash -c "set -eu; d=$(mktemp -d); trap 'rm -rf $d' EXIT; git -C $d init -q; git -C $d config user.email t@t; git -C $d config user.name t; echo a > $d/f; git -C $d add f; git -C $d commit -qm one; run() { ${CMAKE_COMMAND} -DSOURCE_DIR=$d -DOUT=$d/sha.cpp -P ${PROJECT_SOURCE_DIR}/cmake/AtlasGitSha.cmake; }; run; s1=$(git -C $d rev-parse --short=12 HEAD); grep -q \"kGitSha\\[\\] = \\\"$s1\\\";\" $d/sha.cpp; t1=$(stat -c %Y.%y $d/sha.cpp); sleep 1; run; [[ $(stat -c %Y.%y $d/sha.cpp) == $t1 ]]; echo b > $d/f; run; grep -q \"kGitSha\\[\\] = \\\"$s1-dirty\\\";\" $d/sha.cpp; git -C $d commit -qam two; run; s2=$(git -C $d rev-parse --short=12 HEAD); [[ $s2 != $s1 ]]; grep -q \"kGitSha\\[\\] = \\\"$s2\\\";\" $d/sha.cpp; echo ok")
set_tests_properties(build_git_sha PROPERTIES LABELS unit TIMEOUT 60 PASS_REGULAR_EXPRESSION "ok")
# `atlas --help` lists the exit codes, 8 (stopped on request) included (docs/architecture.md).
add_test(NAME cli_help_exit_codes COMMAND $<TARGET_FILE:atlas> --help)
set_tests_properties(cli_help_exit_codes PROPERTIES LABELS unit TIMEOUT 30
  PASS_REGULAR_EXPRESSION "exit codes: 0 ok, 1 usage, 2 config, 3 comm, 4 device, 5 I/O, 6 internal, 7 diverged,\n  8 stopped on request")
# Shapes whose sizes pass an int or the machine's memory are refused before anything is allocated
# (seq-len x batch wrapped to 0 and the bench printed "OK").
add_test(NAME cli_bench_gemm_too_big COMMAND $<TARGET_FILE:atlas> bench gemm --seq-len 65536 --batch 65536 --hidden 8)
set_tests_properties(cli_bench_gemm_too_big PROPERTIES LABELS unit TIMEOUT 30
  PASS_REGULAR_EXPRESSION "--seq-len 65536 x --batch 65536 = 4294967296 tokens: more than a GEMM dimension holds")
add_test(NAME cli_bench_gemm_too_much_memory COMMAND $<TARGET_FILE:atlas> bench gemm --seq-len 65536 --batch 64 --vocab 50257)
set_tests_properties(cli_bench_gemm_too_much_memory PROPERTIES LABELS unit TIMEOUT 30
  PASS_REGULAR_EXPRESSION "the largest matrix \\(4194304 tokens x 50257\\) would take 785 GiB \\(at most 64 GiB\\)")
