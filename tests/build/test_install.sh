#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `cmake --install` gives a relocatable tree: install into a scratch prefix, copy nothing else,
# then from an empty directory run the installed atlas on the installed decks. `atlas schedule` and
# `atlas simulate` (which needs profiles/device/host.profile, found via <prefix>/share/atlas) must
# print exactly what the build-tree binary prints in the checkout, and the installed binary must
# not contain the checkout's path.  Usage: test_install.sh SOURCE_DIR BUILD_DIR CMAKE_COMMAND
set -euo pipefail
src="$(cd "$1" && pwd)"
build="$2"
cmake_cmd="$3"
prefix="$(mktemp -d)"
empty="$(mktemp -d)"
ref="$(mktemp -d)"
trap 'rm -rf "$prefix" "$empty" "$ref"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake_cmd" --install "$build" --prefix "$prefix" > "$ref/install.log" \
  || { cat "$ref/install.log" >&2; fail "cmake --install"; }
for f in bin/atlas bin/atlas-decode-worker share/atlas/profiles/device/host.profile \
         share/atlas/profiles/device/h100.profile share/atlas/scripts/report/atlas_report.py \
         share/atlas/inputs/default.deck share/atlas/inputs/sim_two_dc_cpu.deck; do
  [[ -e "$prefix/$f" ]] || fail "$f is not installed"
done
if grep -qF "$src" "$prefix/bin/atlas"; then fail "bin/atlas contains the source path $src"; fi

# Each case: atlas COMMAND inputs/DECK, installed (from the empty directory) vs build tree (from
# the checkout). The deck path differs, so it is written the same way in both.
run_case() {
  local cmd="$1" deck="$2"
  shift 2
  (cd "$src" && "$build/bin/atlas" "$cmd" "inputs/$deck" "$@") > "$ref/want" 2>&1 \
    || { cat "$ref/want" >&2; fail "build-tree atlas $cmd inputs/$deck"; }
  mkdir -p "$empty/inputs" && ln -sf "$prefix/share/atlas/inputs/$deck" "$empty/inputs/$deck"
  (cd "$empty" && "$prefix/bin/atlas" "$cmd" "inputs/$deck" "$@") > "$ref/got" 2>&1 \
    || { cat "$ref/got" >&2; fail "installed atlas $cmd inputs/$deck (from an empty directory)"; }
  # The profile's path is printed: the checkout's (found in the working directory) vs the
  # installed one. Everything else must be the same.
  sed "s|$src/|<data>/|g" "$ref/want" > "$ref/want.n"
  sed "s|$prefix/share/atlas/|<data>/|g" "$ref/got" > "$ref/got.n"
  diff -u "$ref/want.n" "$ref/got.n" || fail "installed atlas $cmd inputs/$deck differs from the build tree's"
  rm -rf "$empty/inputs" "$empty/runs"
}
run_case schedule default.deck
run_case simulate sim_two_dc_cpu.deck     # plan.gpu = host: the installed profile, not the built-in one
grep -qF "profile $prefix/share/atlas/profiles/device/host.profile" "$ref/got" \
  || fail "installed atlas simulate did not use <prefix>/share/atlas/profiles/device/host.profile"
run_case simulate sim_two_dc_cpu.deck plan.gpu=h100
grep -qF "profile $prefix/share/atlas/profiles/device/h100.profile" "$ref/got" \
  || fail "installed atlas simulate plan.gpu=h100 did not use <prefix>/share/atlas/profiles/device/h100.profile"
# The installed decks by their installed path, too.
(cd "$empty" && "$prefix/bin/atlas" schedule "$prefix/share/atlas/inputs/default.deck") > /dev/null \
  || fail "installed atlas schedule <prefix>/share/atlas/inputs/default.deck"
# `atlas report` finds the installed report script (a python3 stand-in that accepts anything: only
# the search is tested here; tests/report runs the script itself).
(cd "$empty" && ATLAS_PYTHON=/bin/true "$prefix/bin/atlas" report "$empty") \
  || fail "installed atlas report did not find <prefix>/share/atlas/scripts/report/atlas_report.py"
echo "OK: installed tree at a scratch prefix runs from an empty directory"
