#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# How much each compute slot of a run was slowed by the ranks computing beside it, from the run's
# trace.json (profile.trace_json = true). For CPU jobs whose ranks share a host's cores: compares
# each forward/backward slot's length with the shortest of its kind on its rank ("stretch") and
# with what processor sharing of CORES cores predicts for the ranks that computed during it.
"""usage: compute_overlap.py TRACE.json [--cores N] [--skip-steps K]

Per compute slot (forward/backward events of the ranks' tracks): c = 1 + the time-averaged
number of other ranks in a compute slot during it; stretch = its length over the shortest slot
of the same kind on the same rank. Slots are grouped by c rounded to 0.5; each row prints the
slots, their share of all compute time, the mean stretch and max(1, c / N), what processor
sharing predicts. The clocks of all ranks must agree (atlas traces of one machine do: one t0).
exit status: 0 ok; 1 usage error; 2 no compute slot in the trace; 5 the file cannot be read."""

import argparse
import collections
import json
import sys

COMPUTE = ("forward", "backward", "backward_input", "backward_weight")


def compute_slots(events, skip_steps):
    """(rank, kind, start_us, end_us) of every forward/backward slot of the ranks' tracks."""
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid", 0) >= 1000:  # pid 1000: the WAN link tracks
            continue
        kind = str(e.get("name", "")).split(" ")[0]
        if kind not in COMPUTE or e.get("args", {}).get("step", 0) < skip_steps:
            continue
        out.append((e["tid"], kind, float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


def overlap_table(slots, cores):
    """Rows (c, slots, share of compute time, mean stretch, processor-sharing prediction)."""
    by_rank = collections.defaultdict(list)
    shortest = {}
    for r, kind, s, t in slots:
        by_rank[r].append((s, t))
        shortest[(r, kind)] = min(shortest.get((r, kind), float("inf")), t - s)
    bins = collections.defaultdict(list)
    total = sum(t - s for _, _, s, t in slots)
    for r, kind, s, t in slots:
        if t <= s:
            continue
        others = 0.0
        for r2, intervals in by_rank.items():
            if r2 == r:
                continue
            for a, b in intervals:
                if b > s and a < t:
                    others += min(b, t) - max(a, s)
        c = 1.0 + others / (t - s)
        bins[round(c * 2) / 2].append(((t - s) / max(shortest[(r, kind)], 1e-9), t - s))
    rows = []
    for c in sorted(bins):
        v = bins[c]
        rows.append((c, len(v), sum(d for _, d in v) / total, sum(x for x, _ in v) / len(v), max(1.0, c / cores)))
    return rows


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--cores", type=float, default=2.0, help="cores the ranks share (default 2)")
    ap.add_argument("--skip-steps", type=int, default=2, help="warm-up steps left out (default 2)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 1 if e.code else 0
    if a.cores <= 0:
        print("compute_overlap: --cores must be > 0", file=sys.stderr)
        return 1
    try:
        with open(a.trace, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"compute_overlap: cannot read {a.trace}: {e}", file=sys.stderr)
        return 5
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    slots = compute_slots(events, a.skip_steps)
    if not slots:
        print(f"compute_overlap: no forward/backward slot past step {a.skip_steps} in {a.trace}", file=sys.stderr)
        return 2
    print(f"# {a.trace}: {len(slots)} compute slots, {a.cores:g} cores; c = ranks computing (itself included)")
    print(f"# {'c':>4} {'slots':>6} {'time%':>6} {'stretch':>8} {'sharing':>8}")
    for c, n, share, stretch, fluid in overlap_table(slots, a.cores):
        print(f"  {c:>4.1f} {n:>6} {100 * share:>5.0f}% {stretch:>8.2f} {fluid:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
