#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks `atlas sample --json FILE` against GPT-2's forward pass written out in python
# (gpt2_reference.py, on the same checkpoint exported with atlas export --format hf): at every
# generated token, the reference logits over the window atlas's sampler saw (the sequence so far,
# and past the context the last context / 2 tokens from position 0, as `atlas sample` documents)
# must give the chosen token the logit atlas saw (within TOL: the JSON's chosen_logits) and make
# it the greedy one (temperature 0 or top-k 1: its logit within TOL of the largest) or one of
# the top k (top-k k > 1). Nothing of atlas is used but the JSON's ids and logits.
# usage: check_sample.py HF_DIR SAMPLE_JSON [TOL]     exit 0 = every token as it should be
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference  # noqa: E402

hf_dir, sample_json = sys.argv[1], sys.argv[2]
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
model = gpt2_reference.load(hf_dir)
context = model["cfg"]["n_positions"]
keep = max(1, context // 2)
s = json.load(open(sample_json))
greedy = float(s["temperature"]) == 0.0 or s["top_k"] == 1
top_k = s["top_k"]
prompt = s["prompt_ids"]
bad = 0
checked = 0
slid = 0
worst = 0.0
for n, gen in enumerate(s["samples"]):
    seq = prompt + gen
    seen = s["chosen_logits"][n]
    assert len(seen) == len(gen), "sample %d: %d ids, %d logits" % (n, len(gen), len(seen))
    # Windows: predicting seq[j] uses seq[w:j]; the window slides when j - w would pass the context.
    w, start = 0, len(prompt)
    windows = []  # (w, first j, last j)
    for j in range(len(prompt), len(seq)):
        if j - w > context:
            windows.append((w, start, j - 1))
            w, start = j - keep, j
            slid += 1
        if j == len(seq) - 1:
            windows.append((w, start, j))
    for (w, j0, j1) in windows:
        rows = gpt2_reference.logits(model, seq[w:j1])  # row r predicts seq[w + r + 1]
        for j in range(j0, j1 + 1):
            row = rows[j - 1 - w]
            chosen = row[seq[j]]
            checked += 1
            err = abs(chosen - seen[j - len(prompt)])
            worst = max(worst, err)
            ok = err <= tol
            if greedy:
                ok = ok and chosen >= max(row) - tol
            elif top_k > 0:
                ok = ok and sum(1 for v in row if v > chosen + tol) < top_k
            if not ok:
                bad += 1
                if bad <= 5:
                    print("sample %d, token %d (id %d): reference logit %.7g, atlas's %.7g; max logit %.7g, rank %d"
                          % (n, j - len(prompt), seq[j], chosen, seen[j - len(prompt)], max(row),
                             sum(1 for v in row if v > chosen)))
mode = "greedy" if greedy else "top-%d" % top_k if top_k > 0 else "sampled"
print("%d samples, %d tokens checked (%s; the window slid %d times; max |logit difference| %.3g): %d wrong: %s"
      % (len(s["samples"]), checked, mode, slid, worst, bad, "ok" if bad == 0 else "FAIL"))
sys.exit(0 if bad == 0 else 1)
