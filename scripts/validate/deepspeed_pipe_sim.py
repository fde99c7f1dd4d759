#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# What DeepSpeed's pipeline engine costs a 1F1B pipeline, for `atlas bench validate`'s MT-NLG rows
# (docs/bench.md, "MT-NLG 530B"): its TrainSchedule (deepspeed/runtime/pipe/schedule.py: even
# stages forward on even steps, odd stages on odd steps, each step's send/recv pairs before the
# step's compute) run with blocking, rendezvous transfers (p2p.send/recv: NCCL on the compute
# stream, neither side computes while a transfer is in progress). Not part of the build or tests.
import argparse


def step_to_micro_batch(step, stage, stages):
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step and even_stage:
        return step // 2 - stage // 2, True
    if not even_step and not even_stage:
        return (step - 1) // 2 - stage // 2, True
    if even_step and not even_stage:
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def stage_ops(stage, stages, micro_batches, fwd_ms, bwd_ms):
    ops, prev = [], -1
    valid = lambda m: 0 <= m < micro_batches
    for step in range(2 * (micro_batches + stages - 1)):
        mb, forward = step_to_micro_batch(step, stage, stages)
        if forward:
            if valid(mb) and stage > 0:
                ops.append(("recv", stage - 1, "act"))
            if valid(prev) and stage > 0:
                ops.append(("send", stage - 1, "grad"))
        else:
            if valid(prev) and stage < stages - 1:
                ops.append(("send", stage + 1, "act"))
            if valid(mb) and stage < stages - 1:
                ops.append(("recv", stage + 1, "grad"))
        if valid(mb):
            ops.append(("compute", fwd_ms[stage] if forward else bwd_ms[stage]))
        prev = mb
    return ops


def step_ms(stages, micro_batches, fwd_ms, bwd_ms, act_ms, grad_ms):
    ops = [stage_ops(s, stages, micro_batches, fwd_ms, bwd_ms) for s in range(stages)]
    at, now = [0] * stages, [0.0] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while at[s] < len(ops[s]):
                op = ops[s][at[s]]
                if op[0] == "compute":
                    now[s] += op[1]
                    at[s] += 1
                    moved = True
                    continue
                peer = op[1]
                if at[peer] == len(ops[peer]):
                    break
                q = ops[peer][at[peer]]
                if q[0] == "compute" or q[1] != s or q[2] != op[2] or q[0] == op[0]:
                    break
                end = max(now[s], now[peer]) + (act_ms if op[2] == "act" else grad_ms)
                now[s] = now[peer] = end
                at[s] += 1
                at[peer] += 1
                moved = True
    assert all(at[s] == len(ops[s]) for s in range(stages)), "deadlock"
    return max(now)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", type=int, default=35)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[240, 192, 160])
    # atlas simulate inputs/validate/mtnlg_530b_2240.deck: 41041.4 ms compute per stage over 240
    # micro-batches (42894.3 ms on the last stage: the LM head), backward = 3 x forward (full recompute)
    ap.add_argument("--stage-ms", type=float, default=41041.435 / 240, help="forward + backward of one micro-batch")
    ap.add_argument("--last-stage-ms", type=float, default=42894.251 / 240)
    ap.add_argument("--bwd-over-fwd", type=float, default=3.0)
    ap.add_argument("--act-mb", type=float, default=10.5 + 8.4, help="MB per TP rank per forward transfer")
    ap.add_argument("--grad-mb", type=float, default=84.0, help="MB per TP rank per backward transfer")
    ap.add_argument("--gbs", type=float, nargs="+", default=[24.0, 12.0], help="GB/s per transfer")
    ap.add_argument("--after-ms", type=float, default=300.0, help="DP all-reduce + optimizer after the pipeline")
    a = ap.parse_args()
    split = lambda total: (total / (1 + a.bwd_over_fwd), total * a.bwd_over_fwd / (1 + a.bwd_over_fwd))
    fwd, bwd = [split(a.stage_ms)[0]] * a.stages, [split(a.stage_ms)[1]] * a.stages
    fwd[-1], bwd[-1] = split(a.last_stage_ms)
    print(f"# {a.stages} stages, act {a.act_mb} MB, grad {a.grad_mb} MB per transfer; step [s] per micro-batch count")
    for gbs in [float("inf")] + a.gbs:
        act_ms, grad_ms = a.act_mb / gbs, a.grad_mb / gbs
        row = [(step_ms(a.stages, m, fwd, bwd, act_ms, grad_ms) + a.after_ms) / 1e3 for m in a.micro_batches]
        label = "no transfer time" if gbs == float("inf") else f"{gbs:g} GB/s"
        print(f"{label:>18}: " + "  ".join(f"m={m}: {t:.2f}" for m, t in zip(a.micro_batches, row)))


if __name__ == "__main__":
    main()
