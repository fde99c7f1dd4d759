#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Plots the paper-reproduction grid written by `atlas simulate DECK --grid`: the speedup of
# ATLAS (c) over DP across DCs (a) and over PP with 1F1B (b) (and of the planner's plan (c*) over
# (b) when the grid ran with --planner), and the utilization of (c) and
# (d), against the one-way WAN latency; one panel per model, one line per DC count (dp = the
# largest in the grid). Usage: /usr/bin/python3 scripts/plot_sim_grid.py GRID.csv OUT.png
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: plot_sim_grid.py GRID.csv OUT.png", file=sys.stderr)
        return 1
    with open(sys.argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"{sys.argv[1]}: no rows", file=sys.stderr)
        return 1
    models = list(dict.fromkeys(r["model"] for r in rows))
    dcs = sorted({int(r["dcs"]) for r in rows})
    dp = max(int(r["dp"]) for r in rows)
    fig, axes = plt.subplots(3, len(models), figsize=(4.2 * len(models), 10), squeeze=False, sharex=True)
    for col, model in enumerate(models):
        for i, n in enumerate(dcs):
            color = f"C{i}"
            pts = sorted((float(r["latency_ms"]), r) for r in rows
                         if r["model"] == model and int(r["dcs"]) == n and int(r["dp"]) == dp)
            if not pts:
                continue
            lat = [p[0] for p in pts]
            axes[0][col].plot(lat, [float(p[1]["speedup_c_over_a"]) for p in pts], marker="o", color=color, label=f"{n} DCs")
            axes[1][col].plot(lat, [float(p[1]["speedup_c_over_b"]) for p in pts], marker="o", color=color,
                              label=f"(c) {n} DCs")
            planned = [float(p[1].get("speedup_plan_over_b") or 0) for p in pts]
            if any(v > 0 for v in planned):
                axes[1][col].plot(lat, planned, marker="^", linestyle="--", color=color, label=f"(c*) {n} DCs")
            axes[2][col].plot(lat, [100 * float(p[1]["util_c"]) for p in pts], marker="o", color=color,
                              label=f"(c) {n} DCs")
            axes[2][col].plot(lat, [100 * float(p[1]["util_d"]) for p in pts], marker="x", linestyle="--",
                              color=color, label=f"(d) {n} DCs")
        axes[0][col].set_title(f"{model}, dp {dp}")
        axes[0][col].set_yscale("log")
        axes[0][col].axhline(17, color="grey", linestyle=":", linewidth=1)
        axes[1][col].axhline(17, color="grey", linestyle=":", linewidth=1)
        axes[2][col].axhline(94, color="grey", linestyle=":", linewidth=1)
        axes[2][col].set_ylim(0, 100)
        axes[2][col].set_xlabel("one-way WAN latency (ms)")
    axes[0][0].set_ylabel("(c) over (a) DP across DCs")
    axes[1][0].set_ylabel("(c), (c*) over (b) PP 1F1B")
    axes[1][0].legend(fontsize=7, ncol=2)
    axes[2][0].set_ylabel("utilization % (c), (d)")
    axes[0][0].legend(fontsize=8)
    axes[2][0].legend(fontsize=7, ncol=2)
    fig.suptitle("atlas simulate --grid (dotted: the paper's 17x and 94%)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
