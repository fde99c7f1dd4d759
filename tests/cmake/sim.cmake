# SPDX-License-Identifier: MIT
# Tests of sim/ (profiles, cost model, simulator) and plan/ (planner, designs).
atlas_unit_test(test_sim_profile ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_profile.cpp)
atlas_unit_test(test_sim_simulator ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_simulator.cpp)
atlas_unit_test(test_sim_insitu ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_insitu.cpp)
atlas_unit_test(test_plan_planner ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_plan_planner.cpp)
atlas_unit_test(test_sim_scale ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_scale.cpp)

# The commands end to end on the example decks (wiring, output, error exit): one process each.
function(atlas_cli_test name regex)
  add_test(NAME ${name} COMMAND $<TARGET_FILE:atlas> ${ARGN} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT 60 PASS_REGULAR_EXPRESSION "${regex}")
endfunction()
atlas_cli_test(cli_simulate_cpu "step_ms +[0-9.]+.*east -> west.*wrote .*sim_two_dc_cpu.json"
               simulate inputs/sim_two_dc_cpu.deck --gantt --json ${CMAKE_BINARY_DIR}/sim_two_dc_cpu.json)
atlas_cli_test(cli_simulate_bubbletea
               "BubbleTea \\(predicted\\).*east +0 +[0-9.]+ +[0-9.]+.*utilization +off [0-9.]+% -> on [0-9.]+%.*prefill +[0-9]+ prompt tokens/s.*requests +[0-9]+ of [0-9]+ arrived.*TTFT p50 [0-9.]+ ms, p99 [0-9.]+ ms"
               simulate inputs/bubbletea_wan.deck)
# Words after the deck that are neither key=value nor --options are an error, not ignored.
atlas_cli_test(cli_simulate_stray_words
               "ERROR: atlas simulate takes one deck \\(inputs/default.deck\\), then key=value overrides and --options; 'train.micro_batches', '8' are neither\n  hint: an override is written key=value with no spaces"
               simulate inputs/default.deck train.micro_batches 8)
atlas_cli_test(cli_plan_second_deck "ERROR: atlas plan takes one deck .*'inputs/default.deck' is neither\n  hint: one deck per command"
               plan inputs/plan_70b_4dc.deck inputs/default.deck)
# A result file that cannot be written is refused before the work, naming the option.
atlas_cli_test(cli_plan_deck_out_no_dir
               "ERROR: atlas plan: --deck-out /nonexistent-atlas-dir/x.deck: its directory /nonexistent-atlas-dir does not exist\n  hint: create it first"
               plan inputs/plan_70b_4dc.deck --deck-out /nonexistent-atlas-dir/x.deck)
# atlas schedule checks --json and --png before it prints the tables (it printed them, then failed).
add_test(NAME cli_schedule_json_no_dir WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMAND bash -c "rc=0; out=$($<TARGET_FILE:atlas> schedule inputs/default.deck --json /nonexistent-atlas-dir/s.json 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 2 ]] && grep -q 'ERROR: atlas schedule: --json /nonexistent-atlas-dir/s.json: its directory /nonexistent-atlas-dir does not exist' <<<\"$out\" && ! grep -q '^  1f1b' <<<\"$out\"")
set_tests_properties(cli_schedule_json_no_dir PROPERTIES LABELS unit TIMEOUT 60)
# `--json /dev/stdout` (redirected to a file, or a pipe) and a shell's `>(cmd)`: written in place.
add_test(NAME cli_schedule_json_to_a_pipe
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/launch/test_json_to_stdout.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:atlas>)
set_tests_properties(cli_schedule_json_to_a_pipe PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_simulate_json_is_dir "ERROR: atlas simulate: --json inputs is a directory\n  hint: name a file"
               simulate inputs/default.deck --json inputs)
atlas_cli_test(cli_simulate_json_under_a_file
               "ERROR: atlas simulate: --trace README.md/t.json: README.md is not a directory\n  hint: name a file in a directory"
               simulate inputs/default.deck --trace README.md/t.json)
atlas_cli_test(cli_simulate_bad_compute_scale "ERROR: --compute-scale needs a number > 0"
               simulate inputs/default.deck --compute-scale -1)
atlas_cli_test(cli_simulate_profile_too_big "ERROR: --profile/--trace: .* events .* is more than 5e\\+07; use fewer --steps"
               simulate inputs/sim_gpt175b_4dc.deck --profile ${CMAKE_BINARY_DIR}/never_written.h5 --steps 1000)
# A table that does not fit the device's memory: refused, naming the memory, the limit and the fix;
# --ignore-memory times it anyway, flagged. train.zero_stage = 2 over dp 8: stage 3's 2,065,045,504
# parameters per GPU hold 2 + 14 / 8 bytes each instead of 16 (30.77 -> 7.21 GiB, by hand).
add_test(NAME cli_simulate_memory_too_big
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; rc=0; out=$($b simulate inputs/plan_70b_4dc.deck schedule.kind=gpipe 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 2 ]] && grep -q 'ERROR: the gpipe schedule needs 118.8 GiB per GPU (stage 3: .* 64 micro-batches in flight), more than the 72.0 GiB usable on h100' <<<\"$out\" && grep -q 'hint: fewer micro-batches in flight' <<<\"$out\" && grep -q 'atlas simulate --ignore-memory' <<<\"$out\" && grep -q \"train.zero_stage = 1 (the optimizer state split over the stage's 8 DP replicas)\" <<<\"$out\" || exit 1; out=$($b simulate inputs/plan_70b_4dc.deck schedule.kind=gpipe --ignore-memory 2>&1) || exit 1; grep -q 'memory per GPU: 118.84 GiB (stage 3) of 72.00 GiB usable on h100: DOES NOT FIT' <<<\"$out\" || exit 1; out=$($b simulate inputs/plan_70b_4dc.deck schedule.kind=gpipe train.zero_stage=2 --ignore-memory 2>&1) || exit 1; grep -q 'memory per GPU: 95.28 GiB (stage 3)' <<<\"$out\" || exit 1; out=$($b simulate inputs/plan_70b_4dc.deck schedule.split_backward=off 2>&1) || exit 1; grep -q 'memory per GPU: 57.37 GiB (stage 0) of 72.00 GiB usable on h100$' <<<\"$out\"")
set_tests_properties(cli_simulate_memory_too_big PROPERTIES LABELS unit TIMEOUT 60 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
atlas_cli_test(cli_simulate_shared_host
               "shared hosts: 8 ranks per host on 2 cores \\(processor sharing\\); a waiting receiver's wake-up delay 1500 us per message while the cores are all busy.*; 4 ns of host CPU per WAN byte.*step_ms +[0-9.]+"
               simulate inputs/default.deck cluster.host_wake_us=1500 cluster.cores_per_host=2 cluster.host_net_ns_per_byte=4)
atlas_cli_test(cli_simulate_175b "4608 GPUs.*tokens_per_s" simulate inputs/sim_gpt175b_4dc.deck)
# A grid point that makes an invalid deck is the user's error, named with the point, before any
# point runs (it was an internal error after the points before it; their rows were lost).
atlas_cli_test(cli_simulate_grid_bad_point
               "ERROR: simulate --grid: the point model 7b, 2 DCs, 5 ms, dp 200000 is not a valid deck: .*hint: change --models, --dcs, --latencies or --dps"
               simulate inputs/sim_grid.deck --grid --models 7b --dcs 2 --latencies 5 --dps 2,200000 --out ${CMAKE_BINARY_DIR}/grid_bad_point)
set_tests_properties(cli_simulate_grid_bad_point PROPERTIES FAIL_REGULAR_EXPRESSION "dp +2: a ")
# The host's memory is shared by the ranks placed on it (default.deck: cluster.ranks_per_host = 8).
atlas_cli_test(cli_schedule_host_memory_shared
               "# memory limit: [0-9.]+ GiB usable per GPU \\(host, whose memory the cluster.ranks_per_host = 8 ranks share\\)"
               schedule inputs/default.deck)
# The planner checks the same memory per rank as schedule and simulate: the deck it writes always
# passes simulate's check (it planned against the whole host's memory and chose a 5.7 GiB plan that
# simulate then refused: 2.6 GiB a rank, 8 ranks sharing the host).
add_test(NAME cli_plan_deck_fits_simulate
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; d=${CMAKE_BINARY_DIR}/planned_shared_host.deck; $b plan inputs/default.deck model.hidden=1024 model.heads=16 model.layers=24 model.seq_len=512 --deck-out $d > /dev/null || exit 1; out=$($b simulate $d 2>&1) || { echo \"$out\"; exit 1; }; grep -q 'usable on host, whose memory the cluster.ranks_per_host = 8 ranks share' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_plan_deck_fits_simulate PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_simulate_compare "\\(a\\) DP across DCs.*\\(b\\) PP across DCs.*\\(c\\) ATLAS.*\\(c\\*\\).*\\(d\\)"
               simulate inputs/sim_two_dc_cpu.deck --compare)
# A design whose table does not fit the device's memory is flagged on its row (design (b) was
# timed and shown 4x faster than ATLAS, which had fitted its depth to the memory).
atlas_cli_test(cli_simulate_compare_misfit
               "\\(b\\) PP across DCs, 1F1B, 1 TCP flow per transfer, shared +[0-9.]+ +[0-9.]+% +[0-9.]+x   DOES NOT FIT: 115.8 GiB per GPU, 72.0 GiB usable on h100\n  \\(c\\) ATLAS: 16 rails, temporal sharing, heuristic placement +[0-9.]+ +[0-9.]+% +1.00x\n"
               simulate inputs/plan_70b_4dc.deck train.micro_batch_size=16 --compare)
# parallel.dp_across_dcs = true: the planner's own decks keep DP inside a DC (it was an internal
# error in --compare, and `atlas plan` named the planner's probe layout as the deck's problem).
atlas_cli_test(cli_simulate_compare_dp_across_dcs "\\(c\\*\\) ATLAS planner's fastest plan"
               simulate inputs/ablation_2dc_16.deck parallel.dp_across_dcs=true --compare)
atlas_cli_test(cli_plan_dp_across_dcs "# atlas plan of inputs/ablation_2dc_16.deck: [0-9]+ GPUs, predicted step"
               plan inputs/ablation_2dc_16.deck parallel.dp_across_dcs=true)
# ... and says it does not search that layout, nor another schedule.kind (both were replaced
# without a word: a user who asked for 1F1B got an ATLAS deck).
atlas_cli_test(cli_plan_dp_across_dcs_note "note: atlas plan keeps each stage's DP replicas inside a DC: parallel.dp_across_dcs = true is not searched"
               plan inputs/ablation_2dc_16.deck parallel.dp_across_dcs=true)
atlas_cli_test(cli_plan_schedule_kind_note "note: atlas plan searches ATLAS schedules: schedule.kind = 1f1b is not searched"
               plan inputs/ablation_2dc_16.deck schedule.kind=1f1b)
# The deck's own simulation refuses the other modes' options, and --width/--rows/--steps/--skip-steps
# without the option they shape (--dps 4,8 --out DIR ran a plain simulation; --width 3 passed).
atlas_cli_test(cli_simulate_plain_refuses_grid_options "ERROR: --dps does not apply to atlas simulate \\(it reads"
               simulate inputs/sim_two_dc_cpu.deck --dps 4,8)
atlas_cli_test(cli_simulate_width_needs_gantt "ERROR: --width applies to --gantt only"
               simulate inputs/sim_two_dc_cpu.deck --width 3)
atlas_cli_test(cli_simulate_steps_needs_profile "ERROR: --steps applies to --profile or --trace only"
               simulate inputs/sim_two_dc_cpu.deck --steps 5)
# The plan chosen under a deadline does not depend on plan.top (the rows shown): the split backward
# was tried only on the top rows, and a plan outside them whose split beat the choice on both step
# and cost was never tried (the choice moved with plan.top = 3, 10, 40).
add_test(NAME cli_plan_choice_independent_of_top WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMAND bash -c "set -u; prev=''; for top in 3 10 40; do out=$($<TARGET_FILE:atlas> plan inputs/plan_13b_deadline.deck plan.top=$top --quiet 2>&1) || { echo \"$out\"; exit 1; }; row=$(grep 'cheapest within deadline' <<<\"$out\" | sed 's/^ *[0-9]* *//; s/  */ /g') || { echo \"$out\"; exit 1; }; echo \"plan.top=$top: $row\"; [[ -z $prev || $row == \"$prev\" ]] || exit 1; prev=$row; done")
set_tests_properties(cli_plan_choice_independent_of_top PROPERTIES LABELS unit TIMEOUT 300)
# A DC's latency to itself is no WAN link: a value there was ignored without a word.
atlas_cli_test(cli_deck_latency_diagonal "cluster.latency_ms entry \\(east, east\\) is 500: the diagonal is a DC to itself"
               simulate inputs/sim_two_dc_cpu.deck "cluster.latency_ms=500 20 20 0")
# Per-DC power budgets in the deck: --compare keeps them with each design's DCs (it was an internal
# error), and simulate names a DC whose layout needs more than its budget and prints what the
# layout draws (GPUs x board power x PUE, energy a step and for run.steps).
atlas_cli_test(cli_simulate_compare_power "\\(a\\) DP across DCs.*\\(b\\) PP across DCs.*\\(c\\) ATLAS"
               simulate inputs/plan_70b_4dc.deck "cluster.power_mw=1 1 1 1" "cluster.carbon_g_per_kwh=400 300 200 100" --compare)
add_test(NAME cli_simulate_power
  COMMAND bash -c "set -u; out=$($<TARGET_FILE:atlas> simulate inputs/plan_70b_4dc.deck 'cluster.power_mw=0.1 0.1 0.1 0.1' run.steps=1000 2>&1) || exit 1; echo \"$out\"; grep -Eq 'WARNING: DC [a-z0-9-]+ runs [0-9]+ GPUs, but its budget cluster.power_mw = 0.1 MW powers [0-9]+ ' <<<\"$out\" && grep -Eq '^# power: [0-9]+ GPUs draw [0-9.]+ kW \\(GPUs x board power x PUE\\): [0-9.]+ kWh a step; run.steps = 1000: [0-9]+ kWh' <<<\"$out\" || exit 1; out=$($<TARGET_FILE:atlas> simulate inputs/plan_70b_4dc.deck 2>&1) || exit 1; ! grep -q 'budget' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_simulate_power PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_simulate_residency "WARNING: DC us-east-1 holds the pipeline's first and last stage, but cluster.may_hold_data marks it 0"
               simulate inputs/plan_70b_4dc.deck "cluster.may_hold_data=0 1 1 1")
atlas_cli_test(cli_simulate_compare_over_power "WARNING: DC us-east-1 runs 256 GPUs, but its budget cluster.power_mw = 0.1 MW powers 119.*\\(c\\*\\) ATLAS planner's fastest plan, same batch, within power"
               simulate inputs/plan_70b_4dc.deck "cluster.power_mw=0.1 0.1 0.1 0.1" --compare)
atlas_cli_test(cli_simulate_wan "us-east-1 -> eu-west-1"
               simulate inputs/sim_gpt175b_4dc.deck --wan profiles/wan/aws_2017.profile "parallel.stages_per_dc=8 0 8 0")
atlas_cli_test(cli_plan_deadline "cheapest within deadline.*the plan as a deck.*parallel.stages_per_dc"
               plan inputs/plan_13b_deadline.deck)
atlas_cli_test(cli_plan_70b "fastest" plan inputs/plan_70b_4dc.deck --quiet)
# Issue #25: the planner tries the zero-bubble split backward (schedule.split_backward = auto) and says so.
atlas_cli_test(cli_plan_split "us-east-1:12 .*fastest.*split backward.*the chosen plan's atlas table splits the backward into B \\+ W \\(zero-bubble\\) \\(schedule.split_backward = auto: the split won\\)"
               plan inputs/plan_70b_4dc.deck --quiet)
# The chosen plan's row is what `atlas simulate` of its --deck-out deck prints (its GiB/GPU was the
# split pass's quick table: 31.2 against simulate's 47.0 GiB, and 2.332 against 2.324 s).
add_test(NAME cli_plan_row_is_its_deck_simulated
  COMMAND bash -c "set -u; b=$<TARGET_FILE:atlas>; d=$(mktemp -d); trap 'rm -rf $d' EXIT; out=$($b plan inputs/plan_70b_4dc.deck 'cluster.gpus_per_dc=384 0 0 0' --deck-out $d/p.deck 2>&1) || { echo \"$out\"; exit 1; }; row=$(grep -E '^ +1 ' <<<\"$out\"); echo \"$row\"; gib=$(awk '{print $9}' <<<\"$row\"); step=$(awk '{print $10}' <<<\"$row\"); sim=$($b simulate $d/p.deck 2>&1) || { echo \"$sim\"; exit 1; }; sgib=$(sed -n 's/.*memory per GPU: \\([0-9.]*\\) GiB.*/\\1/p' <<<\"$sim\"); sstep=$(awk '/^step_ms/ {printf \"%.3f\", $2 / 1000}' <<<\"$sim\"); echo \"plan $gib GiB $step s; simulate $sgib GiB $sstep s\"; awk -v a=$gib -v b=$sgib -v s=$step -v t=$sstep 'BEGIN { exit !(a - b < 0.051 && b - a < 0.051 && s == t) }'"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_plan_row_is_its_deck_simulated PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_plan_split_off "the chosen plan's atlas table does not split the backward \\(schedule.split_backward = off\\)"
               plan inputs/plan_70b_4dc.deck --quiet schedule.split_backward=off)
atlas_cli_test(cli_plan_no_fit "ERROR: no plan fits: the model .* needs .* GiB per GPU"
               plan inputs/plan_70b_4dc.deck "cluster.gpus_per_dc=8 8 0 0" model.layers=96 model.hidden=12288 model.heads=96)
# A model whose state fits only split over DP: the no-fit hint offers train.zero_stage (over the
# replicas the largest tp x pp leaves room for), and with it the plan fits.
atlas_cli_test(cli_plan_no_fit_zero_hint "hint: set train.zero_stage = 2 \\(the optimizer state and the gradients split over up to 64 DP replicas\\)"
               plan inputs/plan_70b_4dc.deck model.layers=2 model.hidden=65536 model.heads=64)
# ... and does not offer it where the shape would not fit even then (1.66T parameters: the bf16
# weights alone need 194 GiB a GPU at tp 8 x pp 2).
add_test(NAME cli_plan_no_fit_no_zero_hint
  COMMAND bash -c "set -u; out=$($<TARGET_FILE:atlas> plan inputs/plan_70b_4dc.deck model.layers=2 model.hidden=262144 model.heads=256 2>&1); echo \"$out\"; grep -q 'ERROR: no plan fits' <<<\"$out\" && grep -q 'hint: use a larger-memory plan.gpu' <<<\"$out\" && ! grep -q 'zero_stage' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_plan_no_fit_no_zero_hint PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_plan_fits_with_zero "us-east-1:2 .* fastest"
               plan inputs/plan_70b_4dc.deck model.layers=2 model.hidden=65536 model.heads=64 train.zero_stage=2 --quiet)
# GQA: the planner's tensor-parallel sizes keep model.kv_heads dividing into or divided by tp (a
# plan with tp 2, 4 or 8 and 5 key/value heads made an invalid deck: an internal error).
atlas_cli_test(cli_plan_gqa "fastest"
               plan inputs/plan_13b_deadline.deck parallel.tp_size=1 model.kv_heads=5 --quiet)
# An interleaved deck (schedule.virtual_stages = 2): the planner searches v = 1, says so, and plans
# (it refused: "virtual_stages = 2 needs more than one pipeline stage, but the layout has 1").
atlas_cli_test(cli_plan_interleaved_deck
               "note: atlas plan searches schedules without model chunks: schedule.virtual_stages = 2 is not searched.*fastest"
               plan inputs/validate/llama3_405b_16384.deck --quiet)
# A bad --rows is refused before the search, not after it.
add_test(NAME cli_plan_bad_rows
  COMMAND bash -c "set -u; rc=0; out=$($<TARGET_FILE:atlas> plan inputs/plan_13b_deadline.deck --rows=0 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 1 ]] && grep -q 'expects an integer >= 1' <<<\"$out\" && ! grep -q '^# deck' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_plan_bad_rows PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_profile_show "device profile h100.*datasheet" profile --show profiles/device/h100.profile)
# --compute-from: a simulated profile (every compute slot exactly the table's cost) fed back as
# in-situ costs times the same step; a run of another layout, or a file that is no profile, are
# clear errors.
add_test(NAME cli_simulate_compute_from
  COMMAND bash -c "set -e; p=${CMAKE_BINARY_DIR}/compute_from.h5; a=$($<TARGET_FILE:atlas> simulate inputs/sim_two_dc_cpu.deck --profile $p --steps 3 | awk '$1 == \"step_ms\" {print $2}'); out=$($<TARGET_FILE:atlas> simulate inputs/sim_two_dc_cpu.deck --compute-from $p); echo \"$out\"; b=$(awk '$1 == \"step_ms\" {print $2}' <<<\"$out\"); echo \"step $a -> $b\"; [[ -n $a && $a == $b ]]; grep -Eq 'stage +1: forward [0-9.]+ ms \\([0-9]+ slots\\), backward' <<<\"$out\"; rc=0; err=$($<TARGET_FILE:atlas> simulate inputs/default.deck --compute-from $p 2>&1) || rc=$?; echo \"$err\"; [[ $rc == 2 ]] && grep -q 'the run has 2 pipeline stages, the deck 4' <<<\"$err\"; rc=0; err=$($<TARGET_FILE:atlas> simulate inputs/default.deck --compute-from inputs/default.deck 2>&1) || rc=$?; echo \"$err\"; [[ $rc != 0 ]] && grep -q 'HDF5\\|not an atlas profile' <<<\"$err\"; rm -f $p"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_simulate_compute_from PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_simulate_bad_skip_steps "ERROR: --skip-steps must be >= 0"
               simulate inputs/sim_two_dc_cpu.deck --compute-from inputs --skip-steps -1)
atlas_cli_test(cli_bench_fidelity_bad_warmup "ERROR: --warmup-steps 1: the in-situ warm-up run needs at least 2 steps"
               bench fidelity inputs/bubbletea_wan.deck --warmup-steps 1)
# Inside a WAN emulation (ATLAS_WAN_DC), a deck whose layout puts ranks in other DCs than their
# namespaces is skipped by bench fidelity, not a job-ending error of its transport.
add_test(NAME cli_bench_fidelity_emulated_dc
  COMMAND bash -c "out=$(${MPIEXEC_EXECUTABLE} -np 2 --oversubscribe -x ATLAS_WAN_DC=0 $<TARGET_FILE:atlas> bench fidelity inputs/bubbletea_loopback.deck 2>&1); rc=$?; echo \"$out\"; [[ $rc -eq 0 ]] && grep -q 'skipped: it puts ranks in other DCs than the emulation' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bench_fidelity_emulated_dc PROPERTIES LABELS mpi TIMEOUT 60 ENVIRONMENT "${ATLAS_MPIEXEC_ENV}")

# atlas bench validate: the published runs simulated (figures held by test_sim_validate).
atlas_unit_test(test_sim_validate ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sim_validate.cpp)
atlas_cli_test(cli_bench_validate
               "megatron21_t1_1008b +3072 +102.63 +[0-9.]+ +[-+][0-9.]+.*validate: published: 15 rows, mean \\|error\\| [0-9.]+%, max [0-9.]+%; other: 11 rows"
               bench validate)
# atlas profile measures this machine: a key=value (as other commands take) is refused, not ignored.
add_test(NAME cli_profile_no_overrides
  COMMAND bash -c "out=$($<TARGET_FILE:atlas> profile device.threads=8 2>&1); rc=$?; echo \"$out\"; [[ $rc -ne 0 ]] && grep -q \"atlas profile takes no key=value overrides (got 'device.threads=8')\" <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_profile_no_overrides PROPERTIES LABELS unit TIMEOUT 30)

# atlas profile --gemm: the GEMM efficiency curve timed on the host backend and written into a profile.
add_test(NAME cli_profile_gemm_curve
  COMMAND bash -c "set -e; f=${CMAKE_BINARY_DIR}/gemm_curve.profile; cp profiles/device/h100.profile $f; out=$($<TARGET_FILE:atlas> profile --gemm --threads 1 --repeat 1 --update $f); echo \"$out\"; grep -Eq '^ +256 +256 +256 +[0-9.]+ +[0-9.e+-]+$' <<<\"$out\"; grep -q '^gemm_min_dim *= 16 32 64 128 256$' $f; grep -q 'measured by .atlas profile --gemm --backend host' $f; $<TARGET_FILE:atlas> profile --show $f | grep -q 'device profile h100'; rc=0; err=$($<TARGET_FILE:atlas> profile --gemm --backend tpu 2>&1) || rc=$?; echo \"$err\"; [[ $rc == 2 ]] && grep -q 'backend must be host or cuda' <<<\"$err\"; rm -f $f"
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_profile_gemm_curve PROPERTIES LABELS unit TIMEOUT 60)
# The host measures fp32 only (its bf16 is fp32 rounded, no bf16 hardware); --show and --wan
# measure nothing, so another option with them is refused, not ignored.
atlas_cli_test(cli_profile_gemm_host_precision
               "ERROR: --precision bf16 on the host backend: the host emulates bf16 by rounding fp32"
               profile --gemm --precision bf16)
atlas_cli_test(cli_profile_gemm_bad_precision "ERROR: --precision must be fp32, tf32 or bf16, not 'fp8'"
               profile --gemm --precision fp8)
atlas_cli_test(cli_profile_show_alone "ERROR: --threads does not apply to atlas profile --show"
               profile --show profiles/device/h100.profile --threads 2)
# Issue #25: a progress line on stderr for long work (--progress-after 0: from the start), and a
# warning when a prediction cannot be real (1.27e15 parameters, a step of hours).
atlas_cli_test(cli_plan_progress "atlas plan: .*\\([0-9]+ s\\).*atlas plan: done \\([0-9.]+ s\\)"
               plan inputs/plan_13b_deadline.deck --quiet --progress-after 0)
atlas_cli_test(cli_simulate_bad_progress_after "ERROR: --progress-after needs seconds in \\[0, 1e6\\]"
               simulate inputs/sim_two_dc_cpu.deck --progress-after -1)
atlas_cli_test(cli_simulate_absurd
               "WARNING: the model has 1.27e\\+15 parameters .*WARNING: a predicted step of 1.52e\\+04 s \\(4.2 h.*DOES NOT FIT"
               simulate inputs/sim_gpt175b_4dc.deck model.hidden=1048576 model.heads=1024 schedule.kind=1f1b --ignore-memory)
# Issue #25: a data-residency constraint no plan can meet is a config error naming it.
atlas_cli_test(cli_plan_residency_impossible
               "ERROR: no plan meets the data-residency constraint cluster.may_hold_data: .*a DC marked 1 \\(eu-west-1\\)"
               plan inputs/plan_70b_4dc.deck --quiet "cluster.may_hold_data=0 0 0 1" "cluster.gpus_per_dc=384 256 256 8")
atlas_unit_test(test_dp_across_dcs ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_dp_across_dcs.cpp)
# --compute-from with --search where the deck charges host CPU per WAN byte: the searched tables
# with and without that charge differ in order and split (an internal error before: their compute
# slots were compared by position); slots are matched by kind, micro-batch and chunk.
add_test(NAME cli_simulate_compute_from_search_net_share
  COMMAND bash -c "set -e; p=${CMAKE_BINARY_DIR}/compute_from_search.h5; trap 'rm -f $p' EXIT; b=$<TARGET_FILE:atlas>; $b simulate inputs/sim_two_dc_cpu.deck --profile $p --steps 3 schedule.kind=atlas > /dev/null; for split in on auto; do out=$($b simulate inputs/sim_two_dc_cpu.deck --search --compute-from $p schedule.kind=atlas schedule.split_backward=$split cluster.ranks_per_host=2 cluster.cores_per_host=1 cluster.host_net_ns_per_byte=200 2>&1); echo \"$out\"; grep -q 'compute in situ from' <<<\"$out\"; grep -Eq '^step_ms +[0-9.]+' <<<\"$out\"; done")
set_tests_properties(cli_simulate_compute_from_search_net_share PROPERTIES LABELS unit TIMEOUT 60 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# atlas schedule warns of an implausible step as simulate and plan do (a 1-byte flow window on a
# WAN of 100 s latency printed a step of two years without a word), and a flow window that asks
# for more link slots than an int holds is clamped (it overflowed the cast).
atlas_cli_test(cli_schedule_absurd_step_warns
               "atlas +[0-9.]+.*WARNING: a predicted step of [0-9.e+]+ s .*wan.flow_window_bytes"
               schedule inputs/default.deck --quiet wan.flow_window_bytes=1 "cluster.latency_ms=0 1e5 1e5 0"
               "cluster.bandwidth_gbps=0 1e5 1e5 0")
# An option written with one dash is named as an unknown option (it was taken as the deck, and the
# real deck was blamed as a stray word); tokenize states --shard-tokens' real range; bench takes
# -h as --help.
atlas_cli_test(cli_single_dash_option "ERROR: unknown option -q\n  hint: atlas's options take two dashes \\(--q\\)"
               schedule -q inputs/default.deck)
atlas_cli_test(cli_tokenize_shard_tokens_range "ERROR: --shard-tokens expects an integer >= 1, got '0'"
               tokenize inputs --out ${CMAKE_BINARY_DIR}/never --shard-tokens 0)
# An empty --out is the usage error a missing one is (it was an internal error, exit 6).
add_test(NAME cli_tokenize_empty_out WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMAND bash -c "rc=0; out=$($<TARGET_FILE:atlas> tokenize inputs --out '' 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 1 ]] && grep -q 'ERROR: atlas tokenize needs --out DIR (where the shards go)' <<<\"$out\"")
set_tests_properties(cli_tokenize_empty_out PROPERTIES LABELS unit TIMEOUT 60)
atlas_cli_test(cli_bench_dash_h "usage: atlas bench sim" bench sim -h)
# Options a mode does not read are refused, not ignored: simulate --compare --json (wrote nothing),
# --prefill-tokens below 1, profile --backend cuda without --gemm (measured the host into the
# named file), export's key=value words, a second deck to bench step.
atlas_cli_test(cli_compare_rejects_other_options "ERROR: --json does not apply to atlas simulate --compare"
               simulate inputs/default.deck --compare --json ${CMAKE_BINARY_DIR}/never.json)
atlas_cli_test(cli_compare_prefill_tokens_range "ERROR: --prefill-tokens expects an integer >= 1, got '-5'"
               simulate inputs/default.deck --compare --prefill-tokens -5)
atlas_cli_test(cli_profile_backend_needs_gemm "ERROR: --backend does not apply to atlas profile \\(it reads --out"
               profile --backend cuda --out ${CMAKE_BINARY_DIR}/never.profile)
atlas_cli_test(cli_export_no_overrides "ERROR: atlas export takes no key=value overrides \\(got 'model.layers=2'\\)"
               export missing.h5 --format hf --out ${CMAKE_BINARY_DIR}/never_export model.layers=2)
atlas_cli_test(cli_bench_one_deck "ERROR: atlas bench step: unknown argument 'inputs/gpt2_bpe.deck' \\(one DECK at most\\)"
               bench step inputs/default.deck inputs/gpt2_bpe.deck)
# bench fidelity without decks from outside a source or install tree (a copy of the binary with no
# share/atlas beside it): a config error naming the fix, not "internal error: filesystem error".
add_test(NAME cli_bench_fidelity_no_inputs
  COMMAND bash -c "d=$(mktemp -d); trap 'rm -rf $d' EXIT; mkdir $d/bin; cp $<TARGET_FILE:atlas> $d/bin/; cd $d; rc=0; out=$(OMPI_MCA_rmaps_base_oversubscribe=1 $d/bin/atlas bench fidelity 2>&1) || rc=$?; echo \"$out\"; [[ $rc == 2 ]] && grep -q 'ERROR: atlas bench fidelity: no DECK given and no example decks found (inputs/ here or beside the atlas binary)' <<<\"$out\" && grep -q 'hint: name the decks' <<<\"$out\"")
set_tests_properties(cli_bench_fidelity_no_inputs PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
# bench step --steps 1 times its only step and says 1 timed step (it said 0).
add_test(NAME cli_bench_step_one_step
  COMMAND bash -c "out=$($<TARGET_FILE:atlas> bench step inputs/default.deck --steps 1 'parallel.stages_per_dc=1 0' parallel.dp_size=1 'cluster.gpus_per_dc=1 0' model.layers=2 model.hidden=64 2>&1) || exit 1; echo \"$out\"; grep -q '^# atlas bench step: the same model and global batch (.* tokens/step), 1 timed steps' <<<\"$out\""
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_bench_step_one_step PROPERTIES LABELS unit TIMEOUT 120 FIXTURES_REQUIRED brown_corpus
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
