#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a damaged copy of a Hugging Face model directory for the bad-input tests of
# `atlas import --format hf`. usage: make_bad.py SRC_DIR DST_DIR KIND
#   long_header   header length beyond the end of the file
#   overlap       two tensors share bytes (the second tensor's range moved back by 4)
#   dtype         an unknown dtype (F33)
#   truncated     the last 100 bytes cut off
#   relu          config.json: activation_function "relu"
#   untied        config.json: tie_word_embeddings false
#   extra         one more tensor the model does not have
#   huge_layers   config.json: n_layer 2,000,000,000 (no tensor list is built for it)
#   value_flood   a tensor's shape of 400,000 zeros (a header of far more JSON values than
#                 a safetensors header of its length holds)
#   hub           (good) the layout of the published gpt2 files: GPT2Model names without the
#                 "transformer." prefix, the causal-mask buffers h.N.attn.bias, an lm_head.weight
#                 equal to wte
#   hub_untied    the same with an lm_head.weight that differs from wte
#   hub_head_twice  the hub layout with lm_head.weight also as transformer.lm_head.weight
#   hub_bool_masks  (good) the hub layout with the mask buffers stored as BOOL and masked_bias as
#                 F32 (as some transformers versions saved them)
#   i64_weight    a weight stored as I64 (a dtype atlas does not read)
#   bf16, f16     (good) every tensor stored as BF16 / F16 (BF16: the top 16 bits; F16: rounded)
#   bf16_ref, f16_ref   (good) the same values stored as F32: import must give the same model
import json
import os
import shutil
import struct
import sys

src, dst, kind = sys.argv[1:4]
shutil.copytree(src, dst)
st = os.path.join(dst, "model.safetensors")
with open(st, "rb") as fh:
    blob = fh.read()
(hlen,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + hlen])
data = blob[8 + hlen:]


def write(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(st, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + data)


def config_value(key):
    with open(os.path.join(dst, "config.json")) as fh:
        return json.load(fh)[key]


def config(key, value):
    p = os.path.join(dst, "config.json")
    with open(p) as fh:
        c = json.load(fh)
    c[key] = value
    with open(p, "w") as fh:
        json.dump(c, fh, indent=2)


names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
if kind == "long_header":
    with open(st, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob) + 10) + blob[8:])
elif kind == "overlap":
    b, e = header[names[1]]["data_offsets"]
    header[names[1]]["data_offsets"] = [b - 4, e - 4]
    write(header, data)
elif kind == "dtype":
    header[names[0]]["dtype"] = "F33"
    write(header, data)
elif kind == "truncated":
    with open(st, "wb") as fh:
        fh.write(blob[:-100])
elif kind == "relu":
    config("activation_function", "relu")
elif kind == "untied":
    config("tie_word_embeddings", False)
elif kind == "huge_layers":
    config("n_layer", 2000000000)
elif kind == "value_flood":
    header[names[0]]["shape"] = [0] * 400000
    write(header, data)
elif kind == "string_width":
    config("n_embd", str(config_value("n_embd")))
elif kind == "extra":
    end = len(data)
    header["transformer.h.0.attn.q_norm.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
    write(header, data + struct.pack("<f", 1.0))
elif kind in ("hub", "hub_untied", "hub_head_twice", "hub_bool_masks"):
    cfg = json.load(open(os.path.join(dst, "config.json")))
    T, L = cfg["n_positions"], cfg["n_layer"]
    new, out, at = {"__metadata__": header["__metadata__"]}, b"", 0

    def add(name, shape, raw, dtype="F32"):
        global at, out
        new[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        out += raw
        at += len(raw)

    for k in names:
        b, e = header[k]["data_offsets"]
        add(k[len("transformer."):], header[k]["shape"], data[b:e])
    mask = b"".join(struct.pack("<f", 1.0 if j <= i else 0.0) for i in range(T) for j in range(T))
    bool_mask = bytes(1 if j <= i else 0 for i in range(T) for j in range(T))
    for l in range(L):
        if kind == "hub_bool_masks":
            add("h.%d.attn.bias" % l, [1, 1, T, T], bool_mask, "BOOL")
            add("h.%d.attn.masked_bias" % l, [], struct.pack("<f", -1e4))
        else:
            add("h.%d.attn.bias" % l, [1, 1, T, T], mask)
    b, e = header["transformer.wte.weight"]["data_offsets"]
    wte = data[b:e]
    if kind == "hub_untied":
        wte = struct.pack("<f", 0.5) + wte[4:]
    add("lm_head.weight", header["transformer.wte.weight"]["shape"], wte)
    if kind == "hub_head_twice":
        add("transformer.lm_head.weight", header["transformer.wte.weight"]["shape"], wte)
    write(new, out)
elif kind == "i64_weight":
    k = "transformer.wpe.weight"
    b, e = header[k]["data_offsets"]
    vals = struct.unpack("<%df" % ((e - b) // 4), data[b:e])
    raw = struct.pack("<%dq" % len(vals), *[int(v) for v in vals])
    new, out, at = {"__metadata__": header["__metadata__"]}, b"", 0
    for name in names:
        bb, ee = header[name]["data_offsets"]
        chunk, dtype = (raw, "I64") if name == k else (data[bb:ee], header[name]["dtype"])
        new[name] = {"dtype": dtype, "shape": header[name]["shape"], "data_offsets": [at, at + len(chunk)]}
        out += chunk
        at += len(chunk)
    write(new, out)
elif kind in ("bf16", "f16", "bf16_ref", "f16_ref"):
    new, out, at = {"__metadata__": header["__metadata__"]}, b"", 0
    for k in names:
        b, e = header[k]["data_offsets"]
        vals = struct.unpack("<%df" % ((e - b) // 4), data[b:e])
        if kind.startswith("bf16"):
            words = [w >> 16 for w in struct.unpack("<%dI" % len(vals), data[b:e])]
            raw = struct.pack("<%dH" % len(words), *words) if kind == "bf16" else \
                struct.pack("<%dI" % len(words), *[w << 16 for w in words])
        else:
            half = struct.pack("<%de" % len(vals), *vals)
            raw = half if kind == "f16" else struct.pack("<%df" % len(vals), *struct.unpack("<%de" % len(vals), half))
        dtype = {"bf16": "BF16", "f16": "F16"}.get(kind, "F32")
        new[k] = {"dtype": dtype, "shape": header[k]["shape"], "data_offsets": [at, at + len(raw)]}
        out += raw
        at += len(raw)
    write(new, out)
else:
    sys.exit("unknown kind " + kind)
