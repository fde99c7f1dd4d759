#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A result file named /dev/stdout or a shell's `>(cmd)` is written in place (write_file_whole):
# a rename could not create /dev/stdout.tmp (and as root would replace the /dev/stdout link), and
# a FIFO cannot be replaced. With stdout redirected to a file the JSON follows the tables printed
# before it; into a pipe it reaches the reader whole.
# usage: test_json_to_stdout.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
# shellcheck source=tests/launch/lib.sh
source "$(dirname "$0")/lib.sh"
launch_setup test_json_to_stdout.sh jsonout "$@"

# The JSON after the tables: from the first line that starts with '[' to the line before "# wrote".
json_after_tables() { # FILE -> the number of tables, or a failure
  python3 - "$1" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("["))
end = next(i for i in range(start, len(lines)) if lines[i].startswith("# wrote"))
assert any("1f1b schedule" in l for l in lines[:start]), "the tables are not before the JSON"
tables = json.loads("\n".join(lines[start:end]))
assert len(tables) >= 2, tables
print(len(tables))
PY
}

"$ATLAS_BIN" schedule inputs/default.deck --json /dev/stdout >"$T/file.out" 2>"$T/file.err"
check "--json /dev/stdout redirected to a file: exit 0" test $? = 0
check "the JSON follows the tables in the file" json_after_tables "$T/file.out"
check "/dev/stdout is still a link" test -L /dev/stdout
if [[ ! -L /dev/stdout && $(id -u) == 0 ]]; then  # a regression replaced it: put it back
  rm -f /dev/stdout && ln -s /proc/self/fd/1 /dev/stdout
fi
check "no /dev/stdout.tmp left" test ! -e /dev/stdout.tmp

"$ATLAS_BIN" schedule inputs/default.deck --json /dev/stdout 2>"$T/pipe.err" | cat >"$T/pipe.out"
check "--json /dev/stdout into a pipe: exit 0" test "${PIPESTATUS[0]}" = 0
check "the JSON follows the tables through the pipe" json_after_tables "$T/pipe.out"

"$ATLAS_BIN" schedule inputs/default.deck --json >(python3 -c 'import json, sys; print(len(json.load(sys.stdin)))' \
  >"$T/subst.out") >/dev/null 2>"$T/subst.err"
check "--json >(cmd): exit 0" test $? = 0
for _ in $(seq 50); do [[ -s $T/subst.out ]] && break; sleep 0.2; done
check "--json >(cmd): the reader parsed the whole JSON" grep -qx '[0-9]*' "$T/subst.out"

launch_finish
