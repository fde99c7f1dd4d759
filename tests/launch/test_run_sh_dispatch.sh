#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/run.sh (`make run`) picks the emulated WAN, plain loopback or a stop from what
# `netns.sh check` says, tested with stand-ins for netns.sh, run_emulated.sh and mpirun that only
# record how they were called (a copy of run.sh in a scratch tree, so nothing real is started):
#   check exits 0          -> run_emulated.sh with the deck, NP and the overrides
#   check exits 77         -> loopback mpirun (ATLAS_EMULATE=1: exit 77, nothing run)
#   check exits otherwise  -> exit 1 naming the check's message and ATLAS_EMULATE=0, nothing run
#   ATLAS_EMULATE=0        -> loopback mpirun without asking the check
# usage: test_run_sh_dispatch.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_run_sh_dispatch.sh runsh "$@"

S=$T/tree
mkdir -p "$S/scripts/wan" "$T/bin"
cp "$ROOT/scripts/run.sh" "$S/scripts/run.sh"
cat > "$S/scripts/wan/netns.sh" <<'STUB'
#!/usr/bin/env bash
echo "check called" >> "$STUB_LOG"
echo "stub check says: $STUB_WHY"
exit "$STUB_RC"
STUB
cat > "$S/scripts/wan/run_emulated.sh" <<'STUB'
#!/usr/bin/env bash
echo "run_emulated $*" >> "$STUB_LOG"
STUB
cat > "$T/bin/mpirun" <<'STUB'
#!/usr/bin/env bash
echo "mpirun $*" >> "$STUB_LOG"
STUB
chmod +x "$S/scripts/wan/netns.sh" "$S/scripts/wan/run_emulated.sh" "$T/bin/mpirun"
export PATH="$T/bin:$PATH" ATLAS=/stub/atlas STUB_LOG=$T/calls

# run_case RC EMULATE: runs run.sh with the check exiting RC; its output in $T/out, calls in $T/calls
run_case() {
  : > "$T/calls"
  STUB_RC=$1 STUB_WHY="reason-$1" ATLAS_EMULATE=$2 bash "$S/scripts/run.sh" d.deck 3 a.b=1 > "$T/out" 2>&1
  echo $? > "$T/rc"
}
rc_is() { [[ $(<"$T/rc") == "$1" ]]; }
called() { grep -q -- "$1" "$T/calls"; }
not_called() { ! grep -q -- "$1" "$T/calls"; }
said() { grep -q -- "$1" "$T/out"; }

run_case 0 auto
check "check 0: emulated run with deck, NP and overrides" called "run_emulated d.deck 3 a.b=1 -- /stub/atlas train d.deck a.b=1"
check "check 0: no loopback mpirun" not_called "mpirun"
run_case 77 auto
check "check 77: loopback mpirun" called "mpirun -np 3 .*btl_tcp_if_include lo.*/stub/atlas train d.deck a.b=1"
check "check 77: says why" said "no WAN emulation here (stub check says: reason-77)"
run_case 77 1
check "check 77 with ATLAS_EMULATE=1: exit 77" rc_is 77
check "check 77 with ATLAS_EMULATE=1: nothing run" not_called "mpirun"
run_case 1 auto
check "check 1: exit 1" rc_is 1
check "check 1: names the check's message" said "the WAN emulation check failed (exit 1): stub check says: reason-1"
check "check 1: names the way to loopback" said "ATLAS_EMULATE=0"
check "check 1: no loopback fallback" not_called "mpirun"
check "check 1: no emulated run" not_called "run_emulated"
run_case 1 0
check "ATLAS_EMULATE=0: the check is not asked" not_called "check called"
check "ATLAS_EMULATE=0: loopback mpirun" called "mpirun -np 3"
launch_finish
