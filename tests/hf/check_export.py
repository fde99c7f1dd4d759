#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Independent check of `atlas export --format hf`: reads DIR/model.safetensors with nothing but
# struct and json (numpy when present, only for speed), and the atlas checkpoint with h5dump (raw
# little-endian dumps of /params/<name>), then checks that the safetensors file is well formed
# and holds exactly the GPT2LMHeadModel tensors of the checkpoint's model: every name, shape,
# dtype and value (bitwise, after the documented layout change). Shares no code with atlas.
# usage: check_export.py HF_DIR CKPT.h5      exit 0 = all good, 1 = a mismatch (printed)
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np  # Debian's python3-numpy; optional
except ImportError:
    np = None

hf_dir, ckpt = sys.argv[1], sys.argv[2]
problems = []


def h5dump(*args):
    return subprocess.run(["h5dump", *args], check=True, capture_output=True, text=True).stdout


def model_attr(name):
    out = h5dump("-a", "/model/" + name, ckpt)
    m = re.search(r"DATA\s*\{\s*\(0\):\s*(-?\d+)", out)
    return int(m.group(1))


def param_bytes(name):
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "t.bin")
        h5dump("-d", "/params/" + name, "-b", "LE", "-o", f, ckpt)
        with open(f, "rb") as fh:
            return fh.read()


def param_shape(name):
    out = h5dump("-H", "-d", "/params/" + name, ckpt)
    m = re.search(r"DATASPACE\s+SIMPLE\s*\{\s*\(([^)]*)\)", out)
    return [int(x) for x in m.group(1).split(",")]


def transpose_bytes(raw, rows, cols):
    """Row-major float32 [rows, cols] -> [cols, rows], as bytes."""
    if np is not None:
        return np.frombuffer(raw, dtype="<f4").reshape(rows, cols).T.copy().tobytes()
    words = struct.unpack("<%dI" % (rows * cols), raw)
    out = [0] * (rows * cols)
    for r in range(rows):
        base = r * cols
        for c in range(cols):
            out[c * rows + r] = words[base + c]
    return struct.pack("<%dI" % (rows * cols), *out)


# ---- safetensors, read by the spec ----
path = os.path.join(hf_dir, "model.safetensors")
with open(path, "rb") as fh:
    blob = fh.read()
(hlen,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + hlen].decode("utf-8"))
data = blob[8 + hlen:]
if (8 + hlen) % 8:
    problems.append("data area does not start at a multiple of 8 bytes")
meta = header.pop("__metadata__", None)
if meta != {"format": "pt"}:
    problems.append("__metadata__ is %r, transformers needs {'format': 'pt'}" % (meta,))
spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
at = 0
for b, e, k in spans:
    if b != at:
        problems.append("tensor %s starts at %d, expected %d (hole or overlap)" % (k, b, at))
    at = e
if at != len(data):
    problems.append("tensors cover %d data bytes, the file has %d" % (at, len(data)))

with open(os.path.join(hf_dir, "config.json")) as fh:
    cfg = json.load(fh)

# ---- the model shape from the checkpoint, and the expected mapping ----
L, C, H, T, V = (model_attr(a) for a in ("layers", "hidden", "heads", "seq_len", "vocab"))
for key, want in (("n_layer", L), ("n_embd", C), ("n_head", H), ("n_positions", T), ("vocab_size", V),
                  ("activation_function", "gelu_new"), ("layer_norm_epsilon", 1e-5),
                  ("tie_word_embeddings", True), ("model_type", "gpt2")):
    if cfg.get(key) != want:
        problems.append("config.json %s is %r, expected %r" % (key, cfg.get(key), want))
if cfg.get("architectures") != ["GPT2LMHeadModel"]:
    problems.append("config.json architectures is %r" % (cfg.get("architectures"),))

# atlas name -> (transformers name, transformers shape, transposed?)
expect = {"wte": ("transformer.wte.weight", [V, C], False),
          "wpe": ("transformer.wpe.weight", [T, C], False),
          "ln_f.weight": ("transformer.ln_f.weight", [C], False),
          "ln_f.bias": ("transformer.ln_f.bias", [C], False)}
for l in range(L):
    a, h = "h.%d." % l, "transformer.h.%d." % l
    expect.update({
        a + "ln_1.weight": (h + "ln_1.weight", [C], False),
        a + "ln_1.bias": (h + "ln_1.bias", [C], False),
        a + "attn.qkv.weight": (h + "attn.c_attn.weight", [C, 3 * C], True),  # [in, q|k|v out]
        a + "attn.qkv.bias": (h + "attn.c_attn.bias", [3 * C], False),
        a + "attn.proj.weight": (h + "attn.c_proj.weight", [C, C], True),
        a + "attn.proj.bias": (h + "attn.c_proj.bias", [C], False),
        a + "ln_2.weight": (h + "ln_2.weight", [C], False),
        a + "ln_2.bias": (h + "ln_2.bias", [C], False),
        a + "mlp.fc.weight": (h + "mlp.c_fc.weight", [C, 4 * C], True),
        a + "mlp.fc.bias": (h + "mlp.c_fc.bias", [4 * C], False),
        a + "mlp.proj.weight": (h + "mlp.c_proj.weight", [4 * C, C], True),
        a + "mlp.proj.bias": (h + "mlp.c_proj.bias", [C], False),
    })

listing = h5dump("-n", ckpt)
stored = sorted(re.findall(r"dataset\s+/params/(\S+)", listing))
if stored != sorted(expect):
    problems.append("checkpoint tensors %s differ from GPT-2's %s" % (stored, sorted(expect)))
if sorted(header) != sorted(v[0] for v in expect.values()):
    problems.append("safetensors names differ: extra %s, missing %s" % (
        sorted(set(header) - {v[0] for v in expect.values()}),
        sorted({v[0] for v in expect.values()} - set(header))))

checked = 0
for name, (hf_name, hf_shape, transposed) in sorted(expect.items()):
    if hf_name not in header:
        continue
    e = header[hf_name]
    if e["dtype"] != "F32":
        problems.append("%s: dtype %s, expected F32" % (hf_name, e["dtype"]))
    if e["shape"] != hf_shape:
        problems.append("%s: shape %s, expected %s" % (hf_name, e["shape"], hf_shape))
        continue
    a_shape = param_shape(name)
    raw = param_bytes(name)
    if transposed:
        cols = a_shape[-1]
        raw = transpose_bytes(raw, len(raw) // 4 // cols, cols)
    b, end = e["data_offsets"]
    if data[b:end] != raw:
        problems.append("%s: values differ from the checkpoint's /params/%s" % (hf_name, name))
    checked += 1

for p in problems:
    print("FAIL:", p)
print("checked %d tensors (%d layers, hidden %d, vocab %d), numpy %s: %s" % (
    checked, L, C, V, "yes" if np is not None else "no (plain struct)", "FAIL" if problems else "ok"))
sys.exit(1 if problems else 0)
