#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/wan/run_emulated.sh reports an emulation it could not remove, tested with a stand-in
# for netns.sh (a copy of run_emulated.sh in a scratch tree, so no namespace is made): when
# `netns.sh down` fails, its message reaches the user (it was sent to /dev/null) and the script
# fails even though the job itself succeeded; when `down` succeeds, the job's status stands.
# usage: test_run_emulated_teardown.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_run_emulated_teardown.sh rundown "$@"

S=$T/tree
mkdir -p "$S/scripts/wan"
cp "$ROOT/scripts/wan/run_emulated.sh" "$S/scripts/wan/run_emulated.sh"
cat > "$S/scripts/wan/netns.sh" <<'STUB'
#!/usr/bin/env bash
case "$1" in
  rtt) echo 1 ;;
  addr) echo "10.77.0.$(($3 + 1))" ;;
  up) mkdir -p "$ATLAS_WAN_STATE/$2" ;;
  exec) echo "job ran" >&2; exit "$STUB_JOB_RC" ;;  # the job: mpirun inside the first DC
  down)
    if [[ $STUB_DOWN_RC != 0 ]]; then
      echo "netns.sh: could not delete namespace(s) $2-dc0 of emulation '$2'; run: ip netns del NAME" >&2
    fi
    exit "$STUB_DOWN_RC" ;;
  *) exit 0 ;;  # check, up, cost
esac
STUB
chmod +x "$S/scripts/wan/netns.sh"
export ATLAS_BIN=$(dirname "$ATLAS_BIN") ATLAS_WAN_STATE=$T/state ATLAS_WAN_AUTOGROUP=keep ATLAS_WAN_RTT_TOLERANCE=1000

run_case() {  # JOB_RC DOWN_RC: output in $T/case.out, status in $T/rc
  # The default deck (host backend, 8 ranks): nothing runs, so no memory or descriptor need of an
  # emulated-compute deck stands in the way.
  STUB_JOB_RC=$1 STUB_DOWN_RC=$2 bash "$S/scripts/wan/run_emulated.sh" "$ROOT/inputs/default.deck" 8 \
    -- true > "$T/case.out" 2>&1
  echo $? > "$T/rc"
}

run_case 0 1
check "the job ran" grep -q "^job ran" "$T/case.out"
check "down fails after a good job: exit 1" test "$(cat "$T/rc")" = 1
check "down's own message is shown" grep -q "could not delete namespace(s) aw.*-dc0 .*run: ip netns del NAME" "$T/case.out"
check "the script says the emulation is left" grep -q "run_emulated.sh: ERROR: emulation aw[0-9]* was not fully removed" "$T/case.out"
run_case 3 1
check "down fails after a failed job: the job's status" test "$(cat "$T/rc")" = 3
run_case 0 0
check "down succeeds: the job's status (0)" test "$(cat "$T/rc")" = 0
check "no teardown error then" bash -c "! grep -q 'not fully removed' '$T/case.out'"
launch_finish
