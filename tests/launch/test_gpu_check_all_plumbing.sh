#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/gpu/check_all.sh's plumbing without a GPU, with a stand-in bundle (an atlas and a test
# binary that only record their calls): steps named on the command line run alone ("tests" = every
# test binary), each step's start and verdict reach stdout, $OUT holds at most the 8 files the
# device tool brings back (gpu.log, the profile copy, results.tgz with the runs' files) while the
# work stays in ATLAS_GPU_WORK, and a bundle without an atlas binary stops before any step (exit 2).
# usage: test_gpu_check_all_plumbing.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_gpu_check_all_plumbing.sh gpucheck "$@"

B=$T/bundle
mkdir -p "$B/bin" "$T/out" "$T/work"
cat > "$B/bin/atlas" <<'STUB'
#!/usr/bin/env bash
echo "atlas $*" >> "$STUB_LOG"
for a in "$@"; do [[ $a == run.out_dir=* ]] && dir=${a#run.out_dir=}; [[ $a == run.name=* ]] && name=${a#run.name=}; done
if [[ -n ${dir:-} && -n ${name:-} ]]; then mkdir -p "$dir/$name"; echo '{"final_loss": 1.0, "mean_step_ms": 1.0}' > "$dir/$name/run.json"; fi
STUB
cat > "$B/bin/test_cuda_stub" <<'STUB'
#!/usr/bin/env bash
echo "test_cuda_stub $*" >> "$STUB_LOG"
STUB
chmod +x "$B/bin/atlas" "$B/bin/test_cuda_stub"
export STUB_LOG=$T/calls ATLAS_SOURCE_DIR=$ROOT ATLAS_GPU_WORK=$T/work

(cd "$ROOT" && ATLAS_BUNDLE=$B OUT=$T/out bash scripts/gpu/check_all.sh train_gpt2_124m tests > "$T/run.out" 2>&1)
echo $? > "$T/rc"
check "exit 0 (exit $(cat "$T/rc"))" test "$(cat "$T/rc")" = 0
check "the named step ran" grep -q "^atlas train inputs/gpt2_124m_gpu.deck run.steps=3" "$T/calls"
check "'tests' ran the test binary" grep -q "^test_cuda_stub" "$T/calls"
check "no other step ran" test "$(grep -c . "$T/calls")" = 2
check "the step's start on stdout" grep -q "^=== train_gpt2_124m (timeout 200 s, [0-9]* s in)" "$T/run.out"
check "its verdict on stdout" grep -q "^=== PASS train_gpt2_124m, [0-9]* s" "$T/run.out"
check "the summary" grep -q "^  PASS  test_cuda_stub, [0-9]* s" "$T/run.out"
check "the run wrote to the work directory" test -f "$T/work/gpt2_124m/run.json"
check "gpu.log in OUT" test -s "$T/out/gpu.log"
check "results.tgz in OUT holds the run.json" bash -c "tar -tzf '$T/out/results.tgz' | grep -q 'gpt2_124m/run.json'"
check "at most 8 files in OUT, none below it" test "$(find "$T/out" -type f | wc -l)" -le 8 -a -z "$(find "$T/out" -mindepth 1 -type d)"
rm "$B/bin/atlas"
(cd "$ROOT" && ATLAS_BUNDLE=$B OUT=$T/out2 bash scripts/gpu/check_all.sh > "$T/nobin.out" 2>&1)
echo $? > "$T/rc2"
check "no atlas in the bundle: exit 2 (exit $(cat "$T/rc2"))" test "$(cat "$T/rc2")" = 2
check "and says so" grep -q "check_all.sh: the atlas binary cannot start here:" "$T/nobin.out"
launch_finish
