# SPDX-License-Identifier: MIT
# Tests of bubbletea/: the inference model (bitwise split/handoff equivalence), requests and the
# bubble map, the budget learner, the decode worker over loopback sockets, and the service inside
# real training.
atlas_unit_test(test_bubbletea_model unit/test_bubbletea_model.cpp)
atlas_unit_test(test_bubbletea_requests unit/test_bubbletea_requests.cpp)
atlas_unit_test(test_bubbletea_budget unit/test_bubbletea_budget.cpp)
atlas_unit_test(test_bubbletea_emulated unit/test_bubbletea_emulated.cpp)
atlas_unit_test(test_bubbletea_decode unit/test_bubbletea_decode.cpp)
add_dependencies(test_bubbletea_decode atlas-decode-worker)
target_compile_definitions(test_bubbletea_decode PRIVATE ATLAS_DECODE_WORKER_EXE="$<TARGET_FILE:atlas-decode-worker>")

# Needs the decode worker program (started per DC by the service) and the corpus (training).
atlas_mpi_test(test_bubbletea_service SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_bubbletea_service.cpp
  NP 1 2 3 4 TIMEOUT 120)
add_dependencies(test_bubbletea_service atlas-decode-worker)
target_compile_definitions(test_bubbletea_service PRIVATE
  ATLAS_DECODE_WORKER_EXE="$<TARGET_FILE:atlas-decode-worker>")
foreach(np 1 2 3 4)
  set_tests_properties(test_bubbletea_service_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
# `atlas bench bubbletea` with device.backend = emulated: no loss to compare (every run's is NaN, and
# NaN != NaN made the bench report "DIFFERENT" and exit 6); it says n/a and exits 0 (issue 24). It
# also prints training's rate (the job's time per step) and its slowdown per off/on pair.
add_test(NAME cli_bench_bubbletea_emulated
  COMMAND bash -c "set -u; rc=0; out=$(timeout 120 ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> bench bubbletea inputs/bubbletea_loopback.deck device.backend=emulated ckpt.final=false run.steps=3 --repeats 1 --warmup 1 2>&1) || rc=$?; echo \"$out (exit $rc)\"; [[ $rc == 0 ]] && grep -q '^# losses with BubbleTea on and off: n/a (emulated compute: no loss)$' <<<\"$out\" && grep -q 'final loss n/a (emulated compute)' <<<\"$out\" && grep -Eq '^# training rate .*: off [0-9.]+ ms, on [0-9.]+ ms: slowdown [-+][0-9.]+% \\(per pair: mean [-+][0-9.]+%, sd [0-9.]+%, 1 pairs; goal <= 1%\\)$' <<<\"$out\" && ! grep -q DIFFERENT <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bench_bubbletea_emulated PROPERTIES LABELS mpi TIMEOUT 150 PROCESSORS 2
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")
# With no request at all nothing is prefilled: the time-to-first-token quantiles are null in
# bubbletea_bench.json (they were nan, which no JSON reader takes), and a deck path with a quote
# is escaped.
add_test(NAME cli_bench_bubbletea_no_requests_json
  COMMAND bash -c "set -u; d=$(mktemp -d); trap 'rm -rf $d' EXIT; cp inputs/bubbletea_loopback.deck \"$d/a\\\"b.deck\"; rc=0; out=$(timeout 120 ${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe $<TARGET_FILE:atlas> bench bubbletea \"$d/a\\\"b.deck\" device.backend=emulated ckpt.final=false run.steps=3 bubbletea.requests=0 run.out_dir=$d run.name=nr --repeats 1 --warmup 1 2>&1) || rc=$?; echo \"$out (exit $rc)\"; [[ $rc == 0 ]] && /usr/bin/python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j); assert j[\"ttft_p50_ms\"] is None and j[\"ttft_p99_ms\"] is None and j[\"served\"] == 0 and j[\"deck\"].endswith(chr(34) + \"b.deck\")' \"$d/nr/bubbletea_bench.json\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bench_bubbletea_no_requests_json PROPERTIES LABELS mpi TIMEOUT 150 PROCESSORS 2
  ENVIRONMENT "${ATLAS_MPIEXEC_ENV}" FIXTURES_REQUIRED brown_corpus)
# A trace brings its own requests: the generator's prompt and max_new_tokens keys are not checked
# against bubbletea.context (the trace's reader checks each request).
add_test(NAME cli_bubbletea_trace_ignores_generator_keys
  COMMAND $<TARGET_FILE:atlas> schedule inputs/bubbletea_loopback.deck bubbletea.trace=inputs/traces/example.csv
          bubbletea.context=96 bubbletea.prompt_tokens_max=200
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bubbletea_trace_ignores_generator_keys PROPERTIES LABELS unit TIMEOUT 60)

# bubbletea.max_in_flight: a negative count is refused by the deck (a ConfigError naming the key).
add_test(NAME cli_bubbletea_max_in_flight_negative
  COMMAND bash -c "out=$($<TARGET_FILE:atlas> schedule inputs/ablation_2dc_16.deck bubbletea.max_in_flight=-1 2>&1); rc=$?; echo \"$out (exit $rc)\"; [[ $rc != 0 ]] && grep -q 'bubbletea.max_in_flight' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bubbletea_max_in_flight_negative PROPERTIES LABELS unit TIMEOUT 30)
# A decode worker killed mid-run: training finishes, the loss is reported once per pipeline.
add_test(NAME test_bubbletea_worker_killed
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_bubbletea_worker_killed.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_bubbletea_worker_killed PROPERTIES LABELS slow TIMEOUT 200 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
