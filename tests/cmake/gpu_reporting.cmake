# SPDX-License-Identifier: MIT
# Issue #22's reporting and GPU tooling, checked on any machine: MFU and the runtime's device
# profile (unit), the run footer's peak memory, `atlas bench bubbletea` with device.backend = cuda,
# the PyTorch peer benchmark (bench/, skipped where torch is missing) and the GPU host's one script.
atlas_unit_test(test_gpu_reporting ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_gpu_reporting.cpp)

# A short host run: the footer names every rank's peak memory, run.json carries it (and no MFU:
# that column is a GPU run's).
add_test(NAME cli_train_peak_memory
  COMMAND bash -c "set -u; d=$(mktemp -d); trap 'rm -rf $d' EXIT; out=$(timeout 120 $<TARGET_FILE:atlas> train inputs/default.deck 'parallel.stages_per_dc=1 0' 'cluster.gpus_per_dc=1 0' parallel.dp_size=1 model.layers=1 model.hidden=32 model.heads=2 model.seq_len=16 run.steps=2 ckpt.every_steps=0 ckpt.final=false train.eval_every_steps=0 profile.enabled=false run.out_dir=$d run.name=peak 2>&1) || { echo \"$out\"; exit 1; }; echo \"$out\"; grep -Eq '^# peak memory per rank \\(the rank.s peak resident set\\): r0 [0-9.]+ (MiB|GiB)$' <<<\"$out\" && ! grep -q 'mfu%' <<<\"$out\" && grep -Eq '\"mfu\":null,\"peak_memory_bytes\":\\[[1-9][0-9]+\\]' $d/peak/run.json"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_train_peak_memory PROPERTIES LABELS unit TIMEOUT 150 FIXTURES_REQUIRED brown_corpus)

# Issue #22: `atlas bench bubbletea` validates the deck knowing whether the binary carries CUDA: a
# CPU build refuses device.backend = cuda with the rebuild hint; a CUDA build gets past the deck
# (to "no CUDA device" on a machine without one, or to the benchmark on a GPU).
add_test(NAME cli_bench_bubbletea_cuda
  COMMAND bash -c "set -u; rc=0; out=$(timeout 120 $<TARGET_FILE:atlas> bench bubbletea inputs/bubbletea_loopback.deck device.backend=cuda parallel.stages_per_dc='1 0' cluster.gpus_per_dc='1 0' run.steps=3 --repeats 1 --warmup 1 2>&1) || rc=$?; echo \"$out (exit $rc)\"; if $<TARGET_FILE:atlas> bench gemm --reps 1 device.backend=cuda 2>&1 | grep -q 'built without CUDA'; then [[ $rc == 2 ]] && grep -q 'device.backend = cuda, but this binary was built without CUDA' <<<\"$out\" && grep -q 'hint: rebuild with the cuda-release preset' <<<\"$out\"; else ! grep -q 'built without CUDA' <<<\"$out\"; fi"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bench_bubbletea_cuda PROPERTIES LABELS unit TIMEOUT 150)

# bench/: the peer script's usage and a 2-step CPU run (skipped, exit 77, without torch); the
# shell scripts parse.
add_test(NAME bench_gpt_peer
  COMMAND bash -c "set -u; python3 bench/gpt_peer.py --help | grep -q 'usage: gpt_peer.py' || exit 1; python3 -c 'import torch' 2>/dev/null || { echo 'torch is missing: the smoke run is skipped'; exit 77; }; python3 bench/gpt_peer.py --deck inputs/default.deck --device cpu --steps 2 --layers 1 --hidden 32 --heads 2 --seq-len 16 --micro-batch 2 --json /dev/stdout | grep -q '\"tokens_per_s\"'"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(bench_gpt_peer PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
add_test(NAME gpu_scripts_parse
  COMMAND bash -c "set -e; bash -n scripts/gpu/check_all.sh; bash -n bench/run_peer.sh; python3 -c \"import ast; ast.parse(open('bench/gpt_peer.py').read())\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu_scripts_parse PROPERTIES LABELS unit TIMEOUT 30)
# check_all.sh outside a checkout with a bundle: exit 2 and the fix named, nothing run.
add_test(NAME gpu_check_all_no_bundle
  COMMAND bash -c "d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && cd \"$d\" && env -u ATLAS_BUNDLE OUT=\"$d/out\" bash ${PROJECT_SOURCE_DIR}/scripts/gpu/check_all.sh > \"$d/log\" 2>&1; rc=$?; cat \"$d/log\"; [ $rc -eq 2 ] && grep -q 'no .gpu/env.sh here and ATLAS_BUNDLE unset' \"$d/log\" && [ ! -e \"$d/out/work\" ]")
set_tests_properties(gpu_check_all_no_bundle PROPERTIES LABELS unit TIMEOUT 30)
# check_all.sh's plumbing with a stand-in bundle (no GPU): named steps alone, "tests", progress on
# stdout, at most 8 files in $OUT (what the device tool brings back), exit 2 without an atlas binary.
add_test(NAME gpu_check_all_plumbing
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/launch/test_gpu_check_all_plumbing.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(gpu_check_all_plumbing PROPERTIES LABELS unit TIMEOUT 60)
