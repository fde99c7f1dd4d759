// SPDX-License-Identifier: MIT
// Throughput of atlas's GPT-2 BPE beside tiktoken's gpt2 encoding on the same text (every Brown
// file, concatenated), each encoded once from a cold start (atlas: a fresh tokenizer, empty cache).
// Not a test: prints figures. Pin one core for both:
//   taskset -c 0 node tests/tokenizer/gpt2_bench.js build/bin/atlas-gpt2-encode data/npm data/gpt2 data/brown
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const [tool, npmDir, gpt2Dir, corpusDir] = process.argv.slice(2);
if (!corpusDir) {
  console.error('usage: node gpt2_bench.js ATLAS_GPT2_ENCODE NPM_DIR GPT2_DIR CORPUS_DIR');
  process.exit(2);
}
const files = fs.readdirSync(corpusDir).filter((f) => f.endsWith('.txt')).sort()
  .map((f) => path.join(corpusDir, f));
const atlas = execFileSync(tool, ['--dir', gpt2Dir, '--bench', ...files], { encoding: 'utf8' });
process.stdout.write(atlas);

const { get_encoding } = require(path.resolve(npmDir, 'node_modules', 'tiktoken'));
const enc = get_encoding('gpt2');
const text = files.map((f) => fs.readFileSync(f, 'utf8')).join('');
const t0 = process.hrtime.bigint();
const n = enc.encode_ordinary(text).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`tiktoken: ${Buffer.byteLength(text)} bytes, ${n} tokens in ${s.toFixed(3)} s = ` +
            `${Math.round(n / s)} tokens/s`);
enc.free();
