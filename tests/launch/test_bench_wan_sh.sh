#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/wan/bench_wan.sh with stand-ins for atlas-wan-bench and run_emulated.sh (a copy in a
# scratch tree; nothing real runs): the loopback check (step 1) is skipped with --no-loopback, a
# step 1 whose output has none of the filtered lines still goes on to the emulated bench (step 2;
# grep's "no match" under pipefail ended the script without a word), and a step 1 that fails
# stops it with the bench's status.
# usage: test_bench_wan_sh.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_bench_wan_sh.sh benchwan "$@"

S=$T/tree
mkdir -p "$S/scripts/wan" "$T/bin"
cp "$ROOT/scripts/wan/bench_wan.sh" "$S/scripts/wan/bench_wan.sh"
touch "$S/scripts/wan/bench_2dc.deck"
cat > "$S/scripts/wan/run_emulated.sh" <<'STUB'
#!/usr/bin/env bash
echo "step2 $*" >> "$STUB_LOG"
STUB
cat > "$T/bin/atlas-wan-bench" <<'STUB'
#!/usr/bin/env bash
echo "step1 $*" >> "$STUB_LOG"
echo "some other line"
[[ $STUB_MATCH == 1 ]] && echo "# loopback: 9.9 Gbit/s"
exit "$STUB_RC"
STUB
chmod +x "$S/scripts/wan/run_emulated.sh" "$T/bin/atlas-wan-bench"
export ATLAS_BIN=$T/bin STUB_LOG=$T/calls

run_case() {  # RC MATCH ARGS...: output in $T/case.out, status in $T/rc, calls in $T/calls
  : > "$T/calls"
  STUB_RC=$1 STUB_MATCH=$2 bash "$S/scripts/wan/bench_wan.sh" -- "${@:3}" > "$T/case.out" 2>&1
  echo $? > "$T/rc"
}

run_case 0 0 --seconds 1
check "no filtered line: exit 0" test "$(cat "$T/rc")" = 0
check "no filtered line: step 2 still runs" grep -q "^step2 .* -- .*atlas-wan-bench .* --seconds 1" "$T/calls"
run_case 0 1 --seconds 1
check "step 1's filtered line is shown" grep -q "^# loopback: 9.9 Gbit/s" "$T/case.out"
check "and not the others" bash -c "! grep -q 'some other line' '$T/case.out'"
run_case 0 0 --no-loopback
check "--no-loopback: step 1 skipped" bash -c "! grep -q '^step1' '$T/calls'"
check "--no-loopback: step 2 runs" grep -q "^step2 .* --no-loopback" "$T/calls"
run_case 5 1 --seconds 1
check "step 1 fails: the bench's status" test "$(cat "$T/rc")" = 5
check "step 1 fails: no step 2" bash -c "! grep -q '^step2' '$T/calls'"
launch_finish
