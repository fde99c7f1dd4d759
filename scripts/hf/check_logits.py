#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The transformers check of `atlas export --format hf` (issue #26, "Done when"): loads DIR with
# transformers' GPT2LMHeadModel and compares its logits on the same tokens with atlas's: the
# logits atlas itself computed (`atlas export ... --logits FILE`: the host backend's forward pass
# on model.seq_len fixed tokens), and an independent float64 reference of atlas's model
# computed from the atlas checkpoint itself (read with h5py, in atlas's own layouts: weights
# [output, input], qkv [3, C, C]; the forward pass of include/atlas/model/gpt.hpp and
# device/backend.hpp: LayerNorm eps 1e-5, tanh GELU, attention scaled by 1/sqrt(head size),
# causal, tied LM head), in float64. A wrong name, transpose, q|k|v order or config key makes the
# logits differ by far more than the tolerance.
#
# Needs a machine with python3, numpy, h5py, torch and transformers (not CI; see
# ../shared/gpu/README.md for one). CPU torch is enough:
#   pip install torch transformers h5py numpy      (in a venv)
#   build/bin/atlas export runs/NAME/ckpt/step-000020.h5 --format hf --out /tmp/hf --logits /tmp/atlas_logits.safetensors
#   python3 scripts/hf/check_logits.py runs/NAME/ckpt/step-000020.h5 /tmp/hf /tmp/atlas_logits.safetensors [--tol 1e-4]
# Prints the largest absolute logit differences and exits 0 when both are within --tol, else 1.
import argparse
import json
import struct
import sys

import h5py
import numpy as np


def atlas_logits(ckpt, tokens):
    with h5py.File(ckpt, "r") as f:
        m = f["model"].attrs
        L, C, H = int(m["layers"]), int(m["hidden"]), int(m["heads"])
        P = {k: np.asarray(v[...], dtype=np.float64) for k, v in f["params"].items()}
    D = C // H
    T = len(tokens)

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    x = P["wte"][tokens] + P["wpe"][:T]
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = lambda n: P["h.%d.%s" % (l, n)]  # noqa: E731
        h = ln(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = h @ p("attn.qkv.weight").reshape(3 * C, C).T + p("attn.qkv.bias").reshape(3 * C)
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D)
        s[:, mask] = -np.inf
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        y = (s @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ p("attn.proj.weight").T + p("attn.proj.bias")
        h = ln(x, p("ln_2.weight"), p("ln_2.bias"))
        f = gelu(h @ p("mlp.fc.weight").T + p("mlp.fc.bias"))
        x = x + f @ p("mlp.proj.weight").T + p("mlp.proj.bias")
    x = ln(x, P["ln_f.weight"], P["ln_f.bias"])
    return x @ P["wte"].T


def read_atlas_logits(path):
    with open(path, "rb") as fh:
        blob = fh.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]

    def get(name):
        e = header[name]
        b, end = e["data_offsets"]
        return np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])

    return get("tokens").astype(np.int64), get("logits").astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("ckpt")
    ap.add_argument("hf_dir")
    ap.add_argument("atlas_logits", help="the file of atlas export --logits FILE")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(a.hf_dir, torch_dtype=torch.float32).eval()
    cfg = model.config
    tokens, atlas = read_atlas_logits(a.atlas_logits)
    T = len(tokens)
    with torch.no_grad():
        hf = model(torch.tensor(tokens[None, :], dtype=torch.long)).logits[0].double().numpy()
    ref = atlas_logits(a.ckpt, tokens)
    d_atlas = float(np.abs(hf - atlas).max())
    d_ref = float(np.abs(hf - ref).max())
    print("tokens %d, vocab %d: max |logit(transformers) - logit(atlas binary)| = %.3g, "
          "- logit(float64 reference of atlas's model) = %.3g (tolerance %g)"
          % (T, cfg.vocab_size, d_atlas, d_ref, a.tol))
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    print("lm_head tied to wte:", tied)
    ok = d_atlas <= a.tol and d_ref <= a.tol and tied
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
