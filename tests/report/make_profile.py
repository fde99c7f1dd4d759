#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Writes synthetic profile.h5 files in the atlas-profile v1 layout (docs/profile-format.md) for
# the report's tests: a hand-made two-rank run whose summary numbers are worked out by hand in
# the docstring of handmade(), and a realistic run made from an `atlas schedule --json` table
# by turning every predicted slot into an event, with all times stretched by `scale`.
"""usage: make_profile.py handmade OUT.h5
       make_profile.py from-schedule SCHEDULE.json OUT.h5 [--steps N] [--scale S]"""

import json
import sys

import h5py
import numpy as np

SLOT_KINDS = ["forward", "backward", "wan_send", "wan_recv", "local_send", "local_recv",
              "all_reduce", "optimizer", "prefill", "idle", "backward_input", "backward_weight"]
K = {name: i for i, name in enumerate(SLOT_KINDS)}
INT_COLUMNS = ["world_rank", "step", "slot_index", "kind", "micro", "peer", "link", "request"]
FLOAT_COLUMNS = ["start_s", "end_s", "complete_s", "predicted_start_ms", "predicted_ms"]


def event(rank, step, slot, kind, start, end, *, micro=-1, peer=-1, link=-1, nbytes=0,
          complete=None, pred_start_ms=0.0, pred_ms=0.0, request=-1):
    return {"world_rank": rank, "step": step, "slot_index": slot, "kind": K[kind], "micro": micro,
            "peer": peer, "link": link, "request": request, "bytes": nbytes, "start_s": start,
            "end_s": end, "complete_s": end if complete is None else complete,
            "predicted_start_ms": pred_start_ms, "predicted_ms": pred_ms}


def write(path, *, run_name, schedule_kind, predicted_step_ms, dc_names, events, ranks, links,
          steps, schedule, deck="# synthetic\n", attrs_override=None, drop=(), exchanges=None):
    """Writes one profile. `attrs_override` replaces root attributes (tests of bad files);
    `drop` names datasets/attributes to leave out ("events/bytes", "attr:deck"); `exchanges`, a
    list of dicts with the /exchanges columns, writes that optional group."""
    vlen = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        attrs = {"format": "atlas-profile", "version": np.int32(1), "run_name": run_name,
                 "schedule_kind": schedule_kind, "world_size": np.int32(len(ranks["dc"])),
                 "predicted_step_ms": float(predicted_step_ms), "deck": deck}
        attrs.update(attrs_override or {})
        for k, v in attrs.items():
            if f"attr:{k}" not in drop:
                f.attrs[k] = v
        f.attrs.create("dc_names", np.array(dc_names, dtype=object), dtype=vlen)
        f.attrs.create("slot_kind_names", np.array(SLOT_KINDS, dtype=object), dtype=vlen)

        g = f.create_group("events")
        for c in INT_COLUMNS:
            if f"events/{c}" not in drop:
                g.create_dataset(c, data=np.array([e[c] for e in events], dtype=np.int32))
        if "events/bytes" not in drop:
            g.create_dataset("bytes", data=np.array([e["bytes"] for e in events], dtype=np.int64))
        for c in FLOAT_COLUMNS:
            if f"events/{c}" not in drop:
                g.create_dataset(c, data=np.array([e[c] for e in events], dtype=np.float64))

        g = f.create_group("ranks")
        for c in ("dc", "stage", "dp", "tp"):
            g.create_dataset(c, data=np.array(ranks[c], dtype=np.int32))
        g.create_dataset("host", data=np.array(ranks["host"], dtype=object), dtype=vlen)
        g = f.create_group("links")
        for c in ("src_dc", "dst_dc"):
            g.create_dataset(c, data=np.array(links[c], dtype=np.int32))
        g = f.create_group("steps")
        g.create_dataset("step", data=np.array(steps["step"], dtype=np.int32))
        for c in ("loss", "step_time_s", "tokens_per_s", "bubble_fraction"):
            g.create_dataset(c, data=np.array(steps[c], dtype=np.float64))
        g.create_dataset("prefill_tokens", data=np.array(steps["prefill_tokens"], dtype=np.int64))
        if exchanges is not None:
            g = f.create_group("exchanges")
            for c in ("world_rank", "step", "peer", "src_dc", "dst_dc"):
                g.create_dataset(c, data=np.array([x[c] for x in exchanges], dtype=np.int32))
            g.create_dataset("bytes", data=np.array([x["bytes"] for x in exchanges], dtype=np.int64))
            for c in ("start_s", "complete_s"):
                g.create_dataset(c, data=np.array([x[c] for x in exchanges], dtype=np.float64))
        if "schedule_json" not in drop:
            f.create_dataset("schedule_json", data=json.dumps(schedule), dtype=vlen)


def handmade(path, nested_prefill=False, **kw):
    """Two DCs (east, west), one stage each, dp 1, tp 1: rank 0 in east, rank 1 in west; WAN link
    0 = east>west, link 1 = west>east. Two steps, step s starts at 10 s * s. Per step:

      rank 0: forward [0,2]; wan_send 1e9 B at 2, complete 3.5; forward [2,3]; wan_send 0.5e9 B
              at 3, complete 4.5; idle [3,4]; wan_recv [4,5.5]; backward [5.5,7.5]; optimizer
              [7.5,8].  compute 2+1+2+0.5 = 5.5, wan_wait 1.5, idle 1, wall 8: util 0.6875.
      rank 1: wan_recv [0,3.5]; forward [3.5,4.5]; backward [4.5,5]; wan_send 2e8 B at 5,
              complete 5.5; prefill [5,6]; idle [6,7.5]; optimizer [7.5,8].
              compute 1+0.5+0.5 = 2, prefill 1, wan_wait 3.5, idle 1.5, wall 8: util 0.375.
      link 0: 1.5e9 B per step, busy = [2,3.5] u [3,4.5] = 2.5 s: 6e8 B/s.
      link 1: 2e8 B per step, busy 0.5 s: 4e8 B/s.
    /steps says 8.2 s per step; predicted_step_ms = 8000: ratio 1.025. Every forward is
    predicted at 1000 ms: measured forward mean = (2 + 1 + 1) / 3 s = 1333.33 ms.
    """
    events = []
    for step in range(2):
        t = 10.0 * step
        r0 = [("forward", 0, 2, {"micro": 0}),
              ("wan_send", 2, 2, {"micro": 0, "peer": 1, "link": 0, "nbytes": 10**9, "complete": 3.5}),
              ("forward", 2, 3, {"micro": 1}),
              ("wan_send", 3, 3, {"micro": 1, "peer": 1, "link": 0, "nbytes": 5 * 10**8,
                                  "complete": 4.5}),
              ("idle", 3, 4, {}),
              ("wan_recv", 4, 5.5, {"micro": 0, "peer": 1, "link": 1}),
              ("backward", 5.5, 7.5, {"micro": 0}),
              ("optimizer", 7.5, 8, {})]
        r1 = [("wan_recv", 0, 3.5, {"micro": 0, "peer": 0, "link": 0}),
              ("forward", 3.5, 4.5, {"micro": 0}),
              ("backward", 4.5, 5, {"micro": 0}),
              ("wan_send", 5, 5, {"micro": 0, "peer": 0, "link": 1, "nbytes": 2 * 10**8,
                                  "complete": 5.5}),
              ("prefill", 5, 6, {"request": 7}),
              ("idle", 6, 7.5, {}),
              ("optimizer", 7.5, 8, {})]
        for rank, slots in ((0, r0), (1, r1)):
            for i, (kind, s, e, extra) in enumerate(slots):
                complete = extra.pop("complete", None)
                events.append(event(rank, step, i, kind, t + s, t + e,
                                    complete=None if complete is None else t + complete,
                                    pred_start_ms=1e3 * s,
                                    pred_ms=1000.0 if kind == "forward" else 1e3 * (e - s),
                                    **extra))
        if nested_prefill:
            # As BubbleTea records its chunks: step -1, inside the slot they ran in (r0's idle
            # [3, 4], r1's optimizer [7.5, 8], i.e. the optimizer's WAN wait).
            events.append(event(0, -1, -1, "prefill", t + 3.2, t + 3.8, request=8))
            events.append(event(1, -1, -1, "prefill", t + 7.6, t + 7.9, request=9))
    schedule = {"kind": "1f1b", "pp": 2, "dp": 1, "tp": 1, "micro_batches": 2, "step_ms": 8000.0,
                "mean_bubble_fraction": 0.25, "dcs": ["east", "west"],
                "rows": [{"stage": 0, "dp": 0, "dc": 0, "bubble_fraction": 0.125, "slots": []},
                         {"stage": 1, "dp": 0, "dc": 1, "bubble_fraction": 0.1875, "slots": []}],
                "links": []}
    args = dict(run_name="handmade", schedule_kind="1f1b", predicted_step_ms=8000.0,
                dc_names=["east", "west"], events=events,
                ranks={"dc": [0, 1], "stage": [0, 1], "dp": [0, 0], "tp": [0, 0],
                       "host": ["hostA", "hostA"]},
                links={"src_dc": [0, 1], "dst_dc": [1, 0]},
                steps={"step": [0, 1], "loss": [5.5, 5.25], "step_time_s": [8.2, 8.2],
                       "tokens_per_s": [100.0, 100.0], "bubble_fraction": [0.12, 0.12],
                       "prefill_tokens": [16, 16]},
                schedule=schedule)
    args.update(kw)
    write(path, **args)


def from_schedule(schedule_path, path, steps=3, scale=1.0, gap_s=0.05):
    """Every slot of the schedule table (the first table in the file) becomes one event per TP
    lane, at its predicted time stretched by `scale`; steps follow each other after `gap_s`."""
    with open(schedule_path, encoding="utf-8") as f:
        data = json.load(f)
    t = data[0] if isinstance(data, list) else data
    pp, dp, tp = t["pp"], t["dp"], t["tp"]
    stage_dc = {row["stage"]: row["dc"] for row in t["rows"]}

    def world_rank(stage, d, lane):  # ranks ordered (dc, stage, dp, tp); stages contiguous per DC
        return (stage * dp + d) * tp + lane

    period = scale * t["step_ms"] / 1e3 + gap_s
    events = []
    for step in range(steps):
        t0 = step * period
        for row in t["rows"]:
            for lane in range(tp):
                rank = world_rank(row["stage"], row["dp"], lane)
                for i, sl in enumerate(row["slots"]):
                    start = t0 + scale * sl["start_ms"] / 1e3
                    end = start + scale * sl["duration_ms"] / 1e3
                    complete = end
                    if sl["kind"] == "wan_send":
                        # As the runtime records it: the send starts when the link order lets it
                        # (the table's transfer start), completes at the transfer's end.
                        x = t["links"][sl["link"]]["transfers"][sl["link_pos"]]
                        start = end = t0 + scale * x["start_ms"] / 1e3
                        complete = t0 + scale * x["end_ms"] / 1e3
                    peer = sl.get("peer_stage", -1)
                    events.append(event(
                        rank, step, i, sl["kind"], start, end, complete=complete,
                        micro=sl["micro"], link=sl.get("link", -1), nbytes=sl.get("bytes", 0),
                        peer=world_rank(peer, row["dp"], lane) if peer >= 0 else -1,
                        request=sl.get("request", -1), pred_start_ms=sl["start_ms"],
                        pred_ms=sl["duration_ms"]))
    ranks = {"dc": [], "stage": [], "dp": [], "tp": [], "host": []}
    for stage in range(pp):
        for d in range(dp):
            for lane in range(tp):
                ranks["dc"].append(stage_dc[stage])
                ranks["stage"].append(stage)
                ranks["dp"].append(d)
                ranks["tp"].append(lane)
                ranks["host"].append("localhost")
    write(path, run_name="from_schedule", schedule_kind=t["kind"], predicted_step_ms=t["step_ms"],
          dc_names=t["dcs"], events=events, ranks=ranks,
          links={"src_dc": [x["src_dc"] for x in t["links"]],
                 "dst_dc": [x["dst_dc"] for x in t["links"]]},
          steps={"step": list(range(steps)), "loss": [6.0 - 0.1 * s for s in range(steps)],
                 "step_time_s": [scale * t["step_ms"] / 1e3] * steps,
                 "tokens_per_s": [1000.0] * steps,
                 "bubble_fraction": [t["mean_bubble_fraction"]] * steps,
                 "prefill_tokens": [0] * steps},
          schedule=t)
    return t


def main(argv):
    if len(argv) >= 2 and argv[0] == "handmade":
        handmade(argv[1])
    elif len(argv) >= 3 and argv[0] == "from-schedule":
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 3
        scale = float(argv[argv.index("--scale") + 1]) if "--scale" in argv else 1.0
        from_schedule(argv[1], argv[2], steps, scale)
    else:
        sys.stderr.write(__doc__ + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
