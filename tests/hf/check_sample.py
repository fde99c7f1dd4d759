#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks `atlas sample --json FILE` against GPT-2's forward pass written out in python
# (gpt2_reference.py, on the same checkpoint exported with atlas export --format hf). At every
# generated token, over the window atlas's sampler saw (the sequence so far; past the context,
# the cache restarts from the last context / 2 tokens at position 0, as `atlas sample` documents):
# - the chosen token's reference logit equals the one atlas saw (the JSON's chosen_logits) within TOL;
# - temperature 0: the chosen token is the greedy one (its logit within TOL of the largest);
# - otherwise the choice is rebuilt from the reference logits and the JSON's uniform draw with the
#   documented rule (temperature, then top-k with ties to the k-th kept, then top-p; the kept
#   tokens in descending probability, lower id first on ties, laid end to end) and must be the
#   token atlas chose, unless the draw falls within a hair of the edge between two tokens
#   (counted as "at an edge"; at most 2 allowed).
# Nothing of atlas is used but the JSON's ids, logits and draws.
# usage: check_sample.py HF_DIR SAMPLE_JSON [TOL]     exit 0 = every token as it should be
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference  # noqa: E402

hf_dir, sample_json = sys.argv[1], sys.argv[2]
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
model = gpt2_reference.load(hf_dir)
s = json.load(open(sample_json))
context = model["cfg"]["n_positions"]
assert s["context"] == context, "the JSON's context %d, config.json's %d" % (s["context"], context)
keep = max(1, context // 2)
temperature, top_k, top_p = float(s["temperature"]), int(s["top_k"]), float(s["top_p"])
tok_vocab = 256 if s["tokenizer"] == "byte" else 50257


def rebuild(row, u):
    """The documented choice over `row` with draw u, and the distance of u * mass to the nearest
    edge between two kept tokens (as a share of the mass)."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))
    if 0 < top_k < len(order):
        kth = row[order[top_k - 1]]
        order = [i for i in order if row[i] >= kth]
    top = row[order[0]]
    w = [math.exp((row[i] - top) / temperature) for i in order]
    mass = sum(w)
    if top_p < 1.0:
        acc, n = 0.0, 0
        while n < len(w):
            acc += w[n]
            n += 1
            if acc >= top_p * mass:
                break
        w, mass = w[:n], acc
    target, acc, pick, edges = u * mass, 0.0, None, []
    for n, wn in enumerate(w):
        acc += wn
        if n < len(w) - 1:
            edges.append(acc)
        if pick is None and target < acc:
            pick = order[n]
    if pick is None:  # u * mass rounded up to the total
        pick = order[len(w) - 1]
    edge = min((abs(target - e) / mass for e in edges), default=float("inf"))
    return pick, edge


prompt = s["prompt_ids"]
bad = at_edge = checked = slid = 0
worst = 0.0
for n, gen in enumerate(s["samples"]):
    seq = prompt + gen
    seen, draws = s["chosen_logits"][n], s["draws"][n]
    assert len(seen) == len(gen) == len(draws), "sample %d: %d ids, %d logits, %d draws" % (
        n, len(gen), len(seen), len(draws))
    # Windows: predicting seq[j] uses seq[w:j]; the cache restarts when j - w would pass the context.
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
            row = rows[j - 1 - w][:tok_vocab]
            i = j - len(prompt)
            chosen = row[seq[j]]
            checked += 1
            err = abs(chosen - seen[i])
            worst = max(worst, err)
            ok = err <= tol
            why = ""
            if temperature == 0.0:
                ok = ok and chosen >= max(row) - tol
            else:
                pick, edge = rebuild(row, draws[i])
                if pick != seq[j]:
                    if edge < 1e-4:
                        at_edge += 1
                    else:
                        ok = False
                        why = "; the rule picks id %d (draw %.9g, %.2g of the mass from an edge)" % (
                            pick, draws[i], edge)
            if not ok:
                bad += 1
                if bad <= 5:
                    print("sample %d, new token %d (id %d): reference logit %.7g, atlas's %.7g; max logit %.7g%s"
                          % (n, i, seq[j], chosen, seen[i], max(row), why))
mode = "greedy" if temperature == 0.0 else "temperature %g, top-k %d, top-p %g" % (temperature, top_k, top_p)
ok = bad == 0 and at_edge <= 2
print("%d samples, %d tokens checked (%s; the cache restarted %d times; max |logit difference| %.3g; "
      "%d draws at an edge): %d wrong: %s" % (len(s["samples"]), checked, mode, slid, worst, at_edge, bad,
                                             "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
