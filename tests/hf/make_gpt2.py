#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a tiny GPT-2 with the real vocabulary (50,257 ids) as a Hugging Face directory
# (config.json + model.safetensors, GPT2LMHeadModel's names and layouts), random weights from a
# fixed seed, for tests of atlas import / atlas sample with the gpt2 tokenizer.
# KIND "random": N(0, 0.02) matrices, LayerNorm weights 1, biases 0.
# KIND "eot": the same, but the final LayerNorm's weight is 0 and its bias b, with wte's row of
# <|endoftext|> (50256) 8 b / |b|: every position's largest logit is <|endoftext|>'s.
# KIND "nan": "random" with one NaN in the final LayerNorm's bias: every logit is NaN.
# usage: make_gpt2.py OUT_DIR KIND
import json
import math
import os
import random
import struct
import sys

out, kind = sys.argv[1], sys.argv[2]
assert kind in ("random", "eot", "nan"), kind
L, C, H, P, V = 1, 16, 2, 16, 50257
rnd = random.Random(2026)
tensors = {}


def normal(n, std=0.02):
    return [rnd.gauss(0.0, std) for _ in range(n)]


tensors["wte.weight"] = ([V, C], normal(V * C))
tensors["wpe.weight"] = ([P, C], normal(P * C))
for l in range(L):
    h = "h.%d." % l
    tensors[h + "ln_1.weight"] = ([C], [1.0] * C)
    tensors[h + "ln_1.bias"] = ([C], [0.0] * C)
    tensors[h + "attn.c_attn.weight"] = ([C, 3 * C], normal(C * 3 * C))
    tensors[h + "attn.c_attn.bias"] = ([3 * C], [0.0] * (3 * C))
    tensors[h + "attn.c_proj.weight"] = ([C, C], normal(C * C))
    tensors[h + "attn.c_proj.bias"] = ([C], [0.0] * C)
    tensors[h + "ln_2.weight"] = ([C], [1.0] * C)
    tensors[h + "ln_2.bias"] = ([C], [0.0] * C)
    tensors[h + "mlp.c_fc.weight"] = ([C, 4 * C], normal(C * 4 * C))
    tensors[h + "mlp.c_fc.bias"] = ([4 * C], [0.0] * (4 * C))
    tensors[h + "mlp.c_proj.weight"] = ([4 * C, C], normal(4 * C * C))
    tensors[h + "mlp.c_proj.bias"] = ([C], [0.0] * C)
tensors["ln_f.weight"] = ([C], [1.0] * C)
tensors["ln_f.bias"] = ([C], [0.0] * C)
if kind == "eot":
    b = normal(C, 1.0)
    norm = math.sqrt(sum(v * v for v in b))
    tensors["ln_f.weight"] = ([C], [0.0] * C)
    tensors["ln_f.bias"] = ([C], b)
    tensors["wte.weight"][1][50256 * C:50257 * C] = [8.0 * v / norm for v in b]

if kind == "nan":
    tensors["ln_f.bias"][1][0] = float("nan")

header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
for name in sorted(tensors):
    shape, vals = tensors[name]
    raw = struct.pack("<%df" % len(vals), *vals)
    header["transformer." + name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
    blobs.append(raw)
    offset += len(raw)
hjson = json.dumps(header).encode()
hjson += b" " * (-len(hjson) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "model.safetensors"), "wb") as fh:
    fh.write(struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs))
config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "bos_token_id": 50256,
          "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
          "n_ctx": P, "n_embd": C, "n_head": H, "n_inner": None, "n_layer": L, "n_positions": P,
          "tie_word_embeddings": True, "vocab_size": V}
with open(os.path.join(out, "config.json"), "w") as fh:
    json.dump(config, fh, indent=2)
