# SPDX-License-Identifier: MIT
# io/ tests: HDF5 wrappers (unit), checkpoint write/read/reshard/checksums/atomicity (MPI), the
# documented h5py snippet / h5dump (MPI np 1, needs /usr/bin/python3 with h5py, else skips), the
# run-directory lock, and damaged checkpoints and a second job end to end with the binary.
atlas_unit_test(test_io_hdf5 unit/test_io_hdf5.cpp)
set_tests_properties(test_io_hdf5 PROPERTIES TIMEOUT 30)

atlas_mpi_test(test_io_checkpoint SOURCES mpi/test_io_checkpoint.cpp NP 1 2 4 TIMEOUT 90)

atlas_mpi_test(test_io_formats SOURCES mpi/test_io_formats.cpp NP 1 TIMEOUT 60)

atlas_mpi_test(test_io_bench SOURCES mpi/test_io_bench.cpp NP 1 2 TIMEOUT 60)

# One job per run directory (io::DirLock): a second job is a config error at once, a stale lock
# file does not block.
atlas_mpi_test(test_io_dir_lock SOURCES mpi/test_io_dir_lock.cpp NP 1 2 TIMEOUT 60)
# The same with the binary: a held lock, a stale lock file, two real jobs with one run.name.
add_test(NAME test_run_dir_lock
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_run_dir_lock.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_run_dir_lock PROPERTIES LABELS mpi TIMEOUT 240 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2)
# Damaged checkpoints with the binary: a flipped bit in a tensor, a moment, adam_t or the loader
# position of run.resume = PATH ends with exit code 5 naming file and dataset; latest skips it.
add_test(NAME test_ckpt_bitflip
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_ckpt_bitflip.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_ckpt_bitflip PROPERTIES LABELS mpi TIMEOUT 240 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2 SKIP_RETURN_CODE 77)
# Hugging Face export and import with the binary: an independent safetensors reader (python3
# struct/json, h5dump for the checkpoint) checks every tensor; import then export is bitwise; a
# run fine-tunes from an import; damaged safetensors headers, a missing config.json, non-GPT-2
# configs and checkpoints are config errors naming the file and the fix. Needs h5dump (77 = skip).
add_test(NAME test_hf_export
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_hf_export.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_hf_export PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus
  PROCESSORS 2 SKIP_RETURN_CODE 77)
# atlas sample (greedy, temperature, top-k, top-p; the cache restart past the context): every chosen
# token's logit against GPT-2's forward pass in python on the exported checkpoint; the gpt2
# tokenizer on an imported model with the real vocabulary; bad input.
add_test(NAME test_sample
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_sample.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_sample PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
# atlas eval: a checkpoint's validation loss is the one its run logged (dp 2, pp 2), the same on
# token shards of the same text, ln(50257) for a random imported GPT-2-vocabulary model; bad input.
add_test(NAME test_eval
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_eval.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(test_eval PROPERTIES LABELS mpi TIMEOUT 300 FIXTURES_REQUIRED brown_corpus PROCESSORS 2)
