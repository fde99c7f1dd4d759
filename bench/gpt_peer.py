#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The PyTorch peer of `atlas train` (issue #22): the same GPT-2 model, shape and optimizer, timed.

The shape and the optimizer come from an atlas deck (model.layers, hidden, heads, seq_len, vocab,
init_std; train.micro_batch_size, micro_batches, lr, beta1, beta2, eps, weight_decay, grad_clip):
pre-LayerNorm blocks, GELU (tanh form), tied input/output embeddings, AdamW with decay on the
matrices and embeddings only (as atlas's decays_by_role), global-norm clipping, gradients summed
over train.micro_batches micro-batches per step. Tokens are random (speed only; the loss is
printed as a sanity check: it starts near ln(vocab)).

Modes: --precision fp32 (TF32 off, atlas's reference math) | tf32 | bf16 (autocast, fp32 master
weights); --attention manual (materialised B.H.T.T softmax, atlas's fp32 path) | sdpa
(torch's scaled_dot_product_attention); --fused-adamw; --compile (torch.compile).

Prints one line per timed step and a summary: tokens/s, step ms, MFU (6 N + 12 L T C model FLOPs
per token over --peak-tflops; docs/gpu.md) and peak memory (CUDA: torch.cuda.max_memory_allocated;
CPU: the process's peak RSS). --json FILE writes the summary. Not part of atlas's build; run it
with `atlas_python` on the GPU host (docs/gpu.md) or through bench/run_peer.sh.
"""
import argparse
import json
import math
import re
import resource
import sys
import time

# Dense peaks (TFLOP/s) of profiles/device/h200.profile, per precision: the MFU's divisor.
H200_PEAK = {"bf16": 989.0, "tf32": 494.5, "fp32": 67.0}


def read_deck(path):
    """key = value lines of an atlas deck ('#' starts a comment outside quotes; good enough here)."""
    keys = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = re.sub(r"\s+#.*$", "", line.strip())
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            keys[k.strip()] = v.strip().strip('"')
    return keys


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gpt_peer.py",
        description="PyTorch peer of `atlas train`: the deck's GPT-2 model and AdamW, timed (issue #22).")
    p.add_argument("--deck", default="inputs/default.deck", help="atlas deck giving the shape and optimizer")
    p.add_argument("--layers", type=int, help="override model.layers")
    p.add_argument("--hidden", type=int, help="override model.hidden")
    p.add_argument("--heads", type=int, help="override model.heads")
    p.add_argument("--seq-len", type=int, help="override model.seq_len")
    p.add_argument("--vocab", type=int, help="override model.vocab")
    p.add_argument("--micro-batch", type=int, help="override train.micro_batch_size")
    p.add_argument("--micro-batches", type=int, help="override train.micro_batches (gradient accumulation)")
    p.add_argument("--steps", type=int, default=20, help="steps to run (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="leading steps left out of the timing (default: 3, "
                   "fewer when --steps is small)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--attention", choices=["manual", "sdpa"], help="default: manual for fp32/tf32, sdpa for bf16")
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True) (CUDA)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--peak-tflops", type=float, help="device peak for the MFU (default: the H200's for --precision)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json", help="write the summary as JSON to this file")
    return p.parse_args(argv)


def shape_of(args):
    d = read_deck(args.deck)

    def pick(override, key, default, cast=int):
        return override if override is not None else cast(d.get(key, default))

    return {
        "layers": pick(args.layers, "model.layers", 0),
        "hidden": pick(args.hidden, "model.hidden", 0),
        "heads": pick(args.heads, "model.heads", 0),
        "seq_len": pick(args.seq_len, "model.seq_len", 0),
        "vocab": pick(args.vocab, "model.vocab", 256),
        "init_std": float(d.get("model.init_std", 0.02)),
        "micro_batch": pick(args.micro_batch, "train.micro_batch_size", 4),
        "micro_batches": pick(args.micro_batches, "train.micro_batches", 8),
        "lr": float(d.get("train.lr", 0.001)),
        "beta1": float(d.get("train.beta1", 0.9)),
        "beta2": float(d.get("train.beta2", 0.95)),
        "eps": float(d.get("train.eps", 1e-8)),
        "weight_decay": float(d.get("train.weight_decay", 0.1)),
        "grad_clip": float(d.get("train.grad_clip", 1.0)),
    }


def model_flops_per_token(s):
    """6 N + 12 L T C, N = every parameter (tied embeddings once): as atlas's sched/mfu.cpp."""
    c, l, t, v = s["hidden"], s["layers"], s["seq_len"], s["vocab"]
    n = v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c
    return 6.0 * n + 12.0 * l * t * c, n


def build(torch, s, attention):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            c = s["hidden"]
            self.ln_1 = nn.LayerNorm(c, eps=1e-5)
            self.qkv = nn.Linear(c, 3 * c)
            self.proj = nn.Linear(c, c)
            self.ln_2 = nn.LayerNorm(c, eps=1e-5)
            self.fc = nn.Linear(c, 4 * c)
            self.fc_proj = nn.Linear(4 * c, c)

        def attn(self, x):
            b, t, c = x.shape
            h = s["heads"]
            q, k, v = self.qkv(x).split(c, dim=2)
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
                y = att @ v
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(s["vocab"], s["hidden"])
            self.wpe = nn.Embedding(s["seq_len"], s["hidden"])
            self.blocks = nn.ModuleList(Block() for _ in range(s["layers"]))
            self.ln_f = nn.LayerNorm(s["hidden"], eps=1e-5)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, 0.0, s["init_std"])
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied output embedding
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpt_peer.py: PyTorch is not installed here (run it with atlas_python on the GPU host)", file=sys.stderr)
        return 77
    s = shape_of(args)
    if min(s["layers"], s["hidden"], s["heads"], s["seq_len"]) <= 0 or s["hidden"] % s["heads"]:
        print(f"gpt_peer.py: bad model shape from {args.deck}: {s}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpt_peer.py: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    attention = args.attention or ("sdpa" if args.precision == "bf16" else "manual")
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    model = build(torch, s, attention).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kw = {"lr": s["lr"], "betas": (s["beta1"], s["beta2"]), "eps": s["eps"]}
    if args.fused_adamw and args.device == "cuda":
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)
    step_fn = torch.compile(model) if args.compile else model
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    b, t, m = s["micro_batch"], s["seq_len"], s["micro_batches"]
    batches = [torch.randint(0, s["vocab"], (b, t + 1), generator=gen).to(dev) for _ in range(min(m, 4))]
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    warmup = args.warmup if args.warmup is not None else min(3, max(args.steps - 1, 0))
    flops_tok, n_params = model_flops_per_token(s)
    peak = (args.peak_tflops or H200_PEAK[args.precision]) * 1e12
    tokens_per_step = b * t * m
    print(f"# gpt_peer: {s['layers']} layers x {s['hidden']}, {s['heads']} heads, seq {t}, vocab {s['vocab']}, "
          f"{n_params:,} parameters; micro-batch {b} x {m}; {args.precision}, attention {attention}, "
          f"fused AdamW {bool(opt_kw.get('fused'))}, compile {args.compile}; torch {torch.__version__} on {dev}")
    times, loss_v = [], float("nan")
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for i in range(m):
            batch = batches[i % len(batches)]
            with autocast:
                loss = step_fn(batch[:, :-1], batch[:, 1:]) / m
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        opt.step()
        loss_v = float(loss.detach()) * m  # a sync too
        sync()
        dt = time.perf_counter() - t0
        if step >= warmup:
            times.append(dt)
        print(f"  step {step:4d} loss {loss_v:.4f} {dt * 1e3:9.1f} ms {tokens_per_step / dt:12.0f} tok/s")
    step_s = sum(times) / len(times) if times else float("nan")
    if args.device == "cuda":
        peak_bytes = int(torch.cuda.max_memory_allocated())
    else:
        peak_bytes = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    tok_s = tokens_per_step / step_s if times else 0.0
    out = {"precision": args.precision, "attention": attention, "fused_adamw": bool(opt_kw.get("fused")),
           "compile": args.compile, "micro_batch": b, "micro_batches": m, "tokens_per_step": tokens_per_step,
           "step_ms": step_s * 1e3, "tokens_per_s": tok_s, "flops_per_token": flops_tok,
           "mfu": tok_s * flops_tok / peak, "peak_tflops": peak / 1e12, "peak_memory_bytes": peak_bytes,
           "final_loss": loss_v, "timed_steps": len(times), "torch": torch.__version__}
    print(f"# gpt_peer: {tok_s:.0f} tokens/s, {step_s * 1e3:.1f} ms/step, MFU {100 * out['mfu']:.1f}% "
          f"(of {peak / 1e12:g} TFLOP/s), peak memory {peak_bytes / 2**30:.2f} GiB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
