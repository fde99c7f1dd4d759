#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# transformers' GPT-2 forward pass, written out from its definition (modeling_gpt2: Conv1D is
# x @ weight + bias with weight [in, out]; c_attn's outputs split q | k | v, then heads; gelu_new;
# LayerNorm eps from config.json; logits = ln_f(x) @ wte^T), in plain python3 floats (numpy when
# present), reading DIR/model.safetensors and DIR/config.json and nothing of atlas. Compares its
# logits with the ones `atlas export ... --logits FILE` computed with atlas's own forward pass.
# Without transformers in CI, this is what says the exported layout means the same model.
# usage: gpt2_reference.py HF_DIR ATLAS_LOGITS_FILE [TOL]      exit 0 = within TOL (1e-4)
# As a module (tests/hf/check_sample.py): load(HF_DIR) and logits(model, tokens).
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    np = None


def read_st(path):
    with open(path, "rb") as fh:
        blob = fh.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        assert e["dtype"] == "F32", k
        b, end = e["data_offsets"]
        flat = list(struct.unpack("<%df" % ((end - b) // 4), data[b:end]))
        out[k] = (e["shape"], flat)
    return out


def load(hf_dir):
    """config.json and model.safetensors of HF_DIR, as the dict logits() takes."""
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    assert cfg["activation_function"] == "gelu_new"
    return {"cfg": cfg, "W": read_st(os.path.join(hf_dir, "model.safetensors"))}


if np is not None:
    def conv1d(x, w, b):  # x [T, in], w [in, out]
        return (np.array(x) @ np.array(w) + np.array(b)).tolist()
else:
    def conv1d(x, w, b):
        cols = list(zip(*w))
        return [[sum(a * bb for a, bb in zip(row, col)) + bias for col, bias in zip(cols, b)] for row in x]


def gelu_new(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def logits(model, tokens):
    """GPT-2's logits [T][V] for `tokens` (positions 0 .. T-1)."""
    cfg, W = model["cfg"], model["W"]
    C, H, L, V = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["vocab_size"]
    eps = cfg["layer_norm_epsilon"]
    D = C // H
    T = len(tokens)

    def mat(name):
        """[rows, cols] as a list of rows."""
        shape, flat = W["transformer." + name]
        if len(shape) == 1:
            return flat
        r, c = shape
        return [flat[i * c:(i + 1) * c] for i in range(r)]

    def layernorm(x, w, b):
        out = []
        for row in x:
            mu = sum(row) / len(row)
            var = sum((v - mu) ** 2 for v in row) / len(row)
            s = 1.0 / math.sqrt(var + eps)
            out.append([(v - mu) * s * ww + bb for v, ww, bb in zip(row, w, b)])
        return out

    wte, wpe = mat("wte.weight"), mat("wpe.weight")
    x = [[a + b for a, b in zip(wte[t], wpe[i])] for i, t in enumerate(tokens)]
    for l in range(L):
        p = lambda n: mat("h.%d.%s" % (l, n))  # noqa: E731
        h = layernorm(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = conv1d(h, p("attn.c_attn.weight"), p("attn.c_attn.bias"))
        y = [[0.0] * C for _ in range(T)]
        for hd in range(H):
            q = [row[hd * D:(hd + 1) * D] for row in qkv]
            k = [row[C + hd * D:C + (hd + 1) * D] for row in qkv]
            v = [row[2 * C + hd * D:2 * C + (hd + 1) * D] for row in qkv]
            for i in range(T):
                s = [sum(a * b for a, b in zip(q[i], k[j])) / math.sqrt(D) for j in range(i + 1)]
                m = max(s)
                e = [math.exp(z - m) for z in s]
                z = sum(e)
                for d in range(D):
                    y[i][hd * D + d] = sum(e[j] * v[j][d] for j in range(i + 1)) / z
        a = conv1d(y, p("attn.c_proj.weight"), p("attn.c_proj.bias"))
        x = [[u + w for u, w in zip(r1, r2)] for r1, r2 in zip(x, a)]
        h = layernorm(x, p("ln_2.weight"), p("ln_2.bias"))
        f = [[gelu_new(v) for v in row] for row in conv1d(h, p("mlp.c_fc.weight"), p("mlp.c_fc.bias"))]
        m = conv1d(f, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"))
        x = [[u + w for u, w in zip(r1, r2)] for r1, r2 in zip(x, m)]
    x = layernorm(x, mat("ln_f.weight"), mat("ln_f.bias"))
    wte_t = [list(col) for col in zip(*wte)]  # [C, V]: the tied head
    return conv1d(x, wte_t, [0.0] * V)


def main():
    hf_dir, logits_file = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    model = load(hf_dir)
    A = read_st(logits_file)
    tokens = [int(t) for t in A["tokens"][1]]
    atlas_logits = A["logits"][1]
    V, T = model["cfg"]["vocab_size"], len(tokens)
    ref = logits(model, tokens)
    diff = max(abs(ref[i][j] - atlas_logits[i * V + j]) for i in range(T) for j in range(V))
    ok = diff <= tol
    print("tokens %d, vocab %d: max |logit(reference GPT-2 on model.safetensors) - logit(atlas)| = %.3g "
          "(tolerance %g): %s" % (T, V, diff, tol, "ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
