#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Summarises `atlas simulate inputs/sim_grid.deck --grid --planner --out DIR` for
docs/simulator.md: the dp = 16 excerpt and the min / max / paper-figure table.

usage: python3 scripts/sim_grid_summary.py docs/sim_grid/sim_grid.csv
"""
import collections
import csv
import sys


def by_latency(counter):
    """A Counter keyed by latency (text) as a dict in ascending numeric order."""
    return dict(sorted(counter.items(), key=lambda kv: int(kv[0])))


def main(path):
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    f = lambda r, k: float(r[k])  # noqa: E731
    ca = [f(r, "speedup_c_over_a") for r in rows]
    cacap = [f(r, "speedup_c_over_a_cap") for r in rows]
    cb = [f(r, "speedup_c_over_b") for r in rows]
    pacap = [f(r, "speedup_plan_over_a_cap") for r in rows]
    pb = [f(r, "speedup_plan_over_b") for r in rows]
    uc = [f(r, "util_c") for r in rows]
    ud = [f(r, "util_d") for r in rows]

    print("Excerpt, dp = 16 (step times in seconds; `plan` = tp x pp x dp and the DCs the planner used):\n")
    print("| model | DCs | lat ms | GPUs (tp x pp x dp) | (a) s | (a') s | (b) s | (c) s | (c\\*) s, plan "
          "| c/a | c/a' | c/b | c\\*/b | util c | util d |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["dp"] != "16" or r["latency_ms"] not in ("5", "20", "100") or r["dcs"] not in ("2", "5"):
            continue
        def s(k):
            v = f(r, k)
            return f"{v:.0f}" if v >= 10 else f"{v:.2f}"
        print(f"| {r['model']} | {r['dcs']} | {r['latency_ms']} | {r['gpus']} ({r['tp']} x {r['pp']} x {r['dp']}) "
              f"| {s('step_a_s')} | {s('step_a_cap_s')} | {s('step_b_s')} | {s('step_c_s')} "
              f"| {f(r, 'step_plan_s'):.2f}, {r['plan_layout']} | {f(r, 'speedup_c_over_a'):.0f}x "
              f"| {f(r, 'speedup_c_over_a_cap'):.2f}x | {f(r, 'speedup_c_over_b'):.2f}x "
              f"| {f(r, 'speedup_plan_over_b'):.2f}x | {100 * f(r, 'util_c'):.0f}% | {100 * f(r, 'util_d'):.0f}% |")

    n = len(rows)
    slower = [r for r in rows if f(r, "speedup_c_over_a_cap") < 1]
    slow_desc = collections.Counter((r["model"], r["dcs"], r["latency_ms"]) for r in slower)
    best_c = max(rows, key=lambda r: f(r, "util_c"))
    d94 = [r for r in rows if f(r, "util_d") >= 0.94]
    pb17 = [r for r in rows if f(r, "speedup_plan_over_b") >= 17]
    print("\nOver the whole grid:\n")
    print("| ratio / figure | min | max | the paper's figure reached? |")
    print("|---|---:|---:|---|")
    print(f"| (c) over (a), DP with one TCP flow | {min(ca):.0f}x | {max(ca):,.0f}x | 17x passed at "
          f"**{sum(x >= 17 for x in ca)} of {n}** points |")
    print(f"| (c) over (a'), DP at full link capacity | {min(cacap):.2f}x | {max(cacap):.1f}x | no; (c) is "
          f"*slower* than (a') at {len(slower)} points "
          f"({', '.join(f'{m} {d} DCs {l} ms' for (m, d, l) in sorted(slow_desc))}) |")
    print(f"| (c\\*) planner over (a') | {min(pacap):.2f}x | {max(pacap):.1f}x | no; slower at "
          f"{sum(x < 1 for x in pacap)} points |")
    print(f"| (c) over (b), PP 1F1B with one flow per transfer | {min(cb):.2f}x | {max(cb):.1f}x | 17x at "
          f"{sum(x >= 17 for x in cb)} points |")
    lat = collections.Counter(r["latency_ms"] for r in pb17)
    mod = collections.Counter(r["model"] for r in pb17)
    print(f"| (c\\*) planner over (b) | {min(pb):.2f}x | {max(pb):.1f}x | 17x reached at **{len(pb17)}** points "
          f"(by latency: {by_latency(lat)}; by model: {dict(mod)}) |")
    print(f"| utilization (c) ATLAS | {100 * min(uc):.0f}% | {100 * max(uc):.0f}% | 94%: no; best "
          f"{100 * max(uc):.0f}% ({best_c['model']}, {best_c['dcs']} DCs, {best_c['latency_ms']} ms, dp {best_c['dp']}) |")
    dm = collections.Counter(r["model"] for r in d94)
    dl = collections.Counter(r["latency_ms"] for r in d94)
    print(f"| utilization (d) ATLAS + modelled BubbleTea | {100 * min(ud):.0f}% | {100 * max(ud):.0f}% | 94% reached "
          f"at **{len(d94)}** points (by model: {dict(dm)}; by latency: "
          f"{by_latency(dl)}) |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
