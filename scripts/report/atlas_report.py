#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Reads a run's profile.h5 (format "atlas-profile" v1, docs/profile-format.md) and prints where
# each rank's time went, what each WAN link achieved, and measured vs predicted; draws a Gantt
# chart (one row per rank and per WAN link) of one step. Also draws a *predicted* Gantt chart
# from `atlas schedule --json` output. Reads files only; never changes a run directory except
# for the PNG/JSON it is asked to write. Runs under Debian's /usr/bin/python3 (h5py, matplotlib).
"""atlas report: summary and Gantt chart of an atlas run's profile.

usage:
  atlas_report.py RUN_DIR [--step N] [--out PNG] [--json FILE] [--skip-steps K] [--no-png] [--against PROFILE]
  atlas_report.py --schedule-json FILE --out PNG [--kind gpipe|1f1b|atlas]

exit status: 0 ok; 1 usage error or a missing Python package; 2 the file is not a readable
atlas profile v1 (wrong format/version, missing or inconsistent datasets, wrong types, values
that are not finite, negative durations); 5 a missing input file or an output that cannot be
written; 6 an internal error (a bug: the message says what failed, never a traceback).
"""

import argparse
import json
import os
import sys

EXIT_USAGE = 1
EXIT_FORMAT = 2
EXIT_IO = 5
EXIT_INTERNAL = 6

FORMAT_NAME = "atlas-profile"
MAX_GANTT_RANKS = 128  # rows of a measured Gantt chart; a larger job shows a selection
FORMAT_VERSION = 1

# The slot kinds in sched::SlotKind order (also stored in the file as slot_kind_names).
SLOT_KINDS = ["forward", "backward", "wan_send", "wan_recv", "local_send", "local_recv",
              "all_reduce", "optimizer", "prefill", "idle", "backward_input", "backward_weight"]
# Where each kind's time goes in the per-rank summary.
CATEGORY_OF_KIND = {
    "forward": "compute", "backward": "compute", "optimizer": "compute",
    "backward_input": "compute", "backward_weight": "compute",  # a split backward's B and W
    "local_recv": "intra_dc", "all_reduce": "intra_dc",
    "wan_recv": "wan_wait",
    "idle": "idle",
    "prefill": "prefill",
    "wan_send": "send_post", "local_send": "send_post",
}
CATEGORIES = ["compute", "intra_dc", "wan_wait", "idle", "prefill", "send_post"]
KIND_COLORS = {
    "forward": "#4C72B0", "backward": "#DD8452", "wan_send": "#C44E52", "wan_recv": "#F2B8B8",
    "local_send": "#55A868", "local_recv": "#B5DFC0", "all_reduce": "#8172B3",
    "optimizer": "#937860", "prefill": "#DA8BC3", "idle": "#E5E5E5",
    "backward_input": "#DD8452", "backward_weight": "#8C613C",
}
LINK_COLOR = "#C44E52"

EVENT_COLUMNS = ["world_rank", "step", "slot_index", "kind", "micro", "peer", "link", "request",
                 "bytes", "start_s", "end_s", "complete_s", "predicted_start_ms", "predicted_ms"]
# Added within version 1 (a run's waits inside a slot, docs/profile-format.md): zeros where absent.
EVENT_OPTIONAL_COLUMNS = ["wan_wait_s", "intra_wait_s"]
EVENT_INT_COLUMNS = ["world_rank", "step", "slot_index", "kind", "micro", "peer", "link", "request",
                     "bytes"]
# /exchanges (added within version 1, optional): each rank's half of the tied-embedding exchange
# across the WAN, once a step; no slot of the table holds it.
EXCHANGE_COLUMNS = ["world_rank", "step", "peer", "src_dc", "dst_dc", "bytes", "start_s", "complete_s"]
EXCHANGE_INT_COLUMNS = ["world_rank", "step", "peer", "src_dc", "dst_dc", "bytes"]
ROOT_ATTRS = ["format", "version", "run_name", "schedule_kind", "world_size", "predicted_step_ms",
              "dc_names", "slot_kind_names", "deck"]
RANK_COLUMNS = ["dc", "stage", "dp", "tp", "host"]
STEP_COLUMNS = ["step", "loss", "step_time_s", "tokens_per_s", "bubble_fraction", "prefill_tokens"]


class ReportError(Exception):
    """A failure with a message for the user and the exit status it maps to."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def import_or_explain(module, package):
    try:
        return __import__(module)
    except ImportError as e:
        raise ReportError(
            EXIT_USAGE,
            f"Python module '{module}' is missing ({e}): install the Debian package {package} "
            f"(apt-get install {package}) and run with /usr/bin/python3 (a pyenv or venv python "
            f"does not see Debian's packages); running: {sys.executable}") from None


def pyplot():
    matplotlib = import_or_explain("matplotlib", "python3-matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
    return plt


# ---- reading ----------------------------------------------------------------------------------

def _text(value):
    """An HDF5 string (bytes, numpy bytes, str, or a 0-d array of those) as str."""
    if hasattr(value, "shape") and value.shape == () and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8")
    return str(value)


def _texts(values):
    return [_text(v) for v in list(values)]


def _short(value, limit=60):
    """A value for an error message, cut to one short line."""
    text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _why_no_profile(path):
    """Why a run directory has no profile.h5, from its run.json: a run writes the profile when it
    ends, so a run that is still going, was killed or interrupted has none yet."""
    status = None
    try:
        with open(os.path.join(os.path.dirname(path) or ".", "run.json"), encoding="utf-8") as f:
            status = json.load(f).get("status")
    except (OSError, ValueError, AttributeError):
        pass
    if status in ("running", "interrupted", "failed", "diverged"):
        return (f"its run.json says the run is {status}: a run writes profile.h5 when it ends; resume it "
                f"with run.resume=latest, or report a run that finished")
    return "a run writes profile.h5 into its run directory when it ends, with profile.enabled = true"


class Profile:
    """Everything in one profile.h5, as numpy arrays and Python values."""

    def __init__(self, path):
        h5py = import_or_explain("h5py", "python3-h5py")  # first: it is the one users lack
        np = import_or_explain("numpy", "python3-numpy")
        self.path = path
        if not os.path.exists(path):
            raise ReportError(EXIT_IO, f"{path}: no such file ({_why_no_profile(path)})")
        if os.path.isdir(path):
            raise ReportError(EXIT_IO, f"{path}: is a directory, expected a profile.h5 file")
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise ReportError(EXIT_FORMAT, f"{path}: not a readable HDF5 file ({e})") from None
        with f:
            try:
                self._read(f, np)
            except ReportError:
                raise
            except (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
                # h5py on a damaged file (a cut dataset, a wrong object type): one line, no trace.
                raise ReportError(EXIT_FORMAT, f"{path}: not a readable atlas profile ("
                                               f"{type(e).__name__}: {e})") from None

    def _fail(self, what):
        raise ReportError(EXIT_FORMAT, f"{self.path}: {what}")

    def _read(self, f, np):
        if "format" not in f.attrs:
            self._fail(f"no root attribute 'format': not an atlas profile (expected "
                       f"format = '{FORMAT_NAME}')")
        fmt = _text(f.attrs["format"])
        if fmt != FORMAT_NAME:
            self._fail(f"root attribute format = '{fmt}': not an atlas profile (expected "
                       f"'{FORMAT_NAME}')")
        version = self._scalar(f.attrs.get("version", -1), "root attribute version", np, integer=True)
        if version != FORMAT_VERSION:
            self._fail(f"format version {version} is not supported: this report reads version "
                       f"{FORMAT_VERSION} (docs/profile-format.md)")
        missing = [a for a in ROOT_ATTRS if a not in f.attrs]
        if missing:
            self._fail(f"missing root attribute(s): {', '.join(missing)}")
        a = f.attrs
        self.run_name = _text(a["run_name"])
        self.schedule_kind = _text(a["schedule_kind"])
        self.world_size = self._scalar(a["world_size"], "root attribute world_size", np, integer=True)
        if self.world_size < 1:
            self._fail(f"root attribute world_size = {self.world_size}: expected at least 1 rank")
        self.predicted_step_ms = self._scalar(a["predicted_step_ms"], "root attribute predicted_step_ms", np)
        if self.predicted_step_ms < 0:
            self._fail(f"root attribute predicted_step_ms = {self.predicted_step_ms}: expected a "
                       f"time >= 0")
        self.dc_names = _texts(np.asarray(a["dc_names"]).reshape(-1))
        self.kind_names = _texts(np.asarray(a["slot_kind_names"]).reshape(-1))
        self.deck = _text(a["deck"])
        # Optional (added within version 1): "measured" (a run) or "simulated" (atlas simulate).
        self.source = _text(a["source"]) if "source" in a else "measured"

        self.events = self._columns(f, "events", EVENT_COLUMNS, np, EVENT_OPTIONAL_COLUMNS)
        self.ranks = self._columns(f, "ranks", RANK_COLUMNS, np)
        self.links = self._columns(f, "links", ["src_dc", "dst_dc"], np)
        self.steps = self._columns(f, "steps", STEP_COLUMNS, np)
        if "exchanges" in f:
            self.exchanges = self._columns(f, "exchanges", EXCHANGE_COLUMNS, np)
        else:
            self.exchanges = {c: np.zeros(0, dtype=np.int64 if c in EXCHANGE_INT_COLUMNS else np.float64)
                              for c in EXCHANGE_COLUMNS}
        if "schedule_json" not in f:
            self._fail("missing dataset /schedule_json")
        try:
            self.schedule = json.loads(_text(f["schedule_json"][()]))
        except ValueError as e:
            self._fail(f"/schedule_json is not valid JSON ({e})")
        if isinstance(self.schedule, list):  # tolerate the CLI's list form
            self.schedule = self.schedule[0] if self.schedule else {}
        self._check_schedule()

        self.ranks["host"] = _texts(self.ranks["host"])
        for col in ("dc", "stage", "dp", "tp"):
            if len(self.ranks[col]) != self.world_size:
                self._fail(f"/ranks/{col} has {len(self.ranks[col])} entries, expected "
                           f"world_size = {self.world_size}")
        n = len(self.events["kind"])
        if n == 0:
            self._fail("/events is empty: the run recorded no slots")
        self._check_values(np)
        kinds = self.events["kind"]
        if kinds.min() < 0 or kinds.max() >= len(self.kind_names):
            self._fail(f"/events/kind holds {int(kinds.min())}..{int(kinds.max())}, outside the "
                       f"{len(self.kind_names)} slot_kind_names")
        ranks = self.events["world_rank"]
        if ranks.min() < 0 or ranks.max() >= self.world_size:
            self._fail(f"/events/world_rank holds {int(ranks.min())}..{int(ranks.max())}, outside "
                       f"0..{self.world_size - 1}")
        links = self.events["link"]
        if links.max() >= len(self.links["src_dc"]):
            self._fail(f"/events/link holds {int(links.max())} but /links has "
                       f"{len(self.links['src_dc'])} links")

    def _scalar(self, value, what, np, integer=False):
        """A numeric attribute as int or float; a clear error if it is text, empty or not finite."""
        arr = np.asarray(value).reshape(-1)
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.integer) or
                                 (not integer and np.issubdtype(arr.dtype, np.floating))):
            self._fail(f"{what} = {_short(value)}: expected {'an integer' if integer else 'a number'}")
        v = arr[0].item()
        if not integer and not np.isfinite(v):
            self._fail(f"{what} = {v}: expected a finite number")
        return int(v) if integer else float(v)

    def _check_values(self, np):
        """Types and ranges of every column the report computes with: a corrupt value ends the
        report with its name, never a row of nan/inf."""
        def numeric(group, cols, name, integer):
            col = cols[name]
            ok = np.issubdtype(col.dtype, np.integer) or (
                not integer and np.issubdtype(col.dtype, np.floating))
            if not ok:
                self._fail(f"/{group}/{name} has type {col.dtype}: expected "
                           f"{'integers' if integer else 'numbers'}")
            if not integer:
                bad = ~np.isfinite(col.astype(np.float64))
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    self._fail(f"/{group}/{name}[{i}] = {col[i]}: expected a finite number "
                               f"({int(bad.sum())} of {len(col)} entries are not)")

        for c in EVENT_COLUMNS + EVENT_OPTIONAL_COLUMNS:
            numeric("events", self.events, c, c in EVENT_INT_COLUMNS)
        for c in ("dc", "stage", "dp", "tp"):
            numeric("ranks", self.ranks, c, True)
        for c in ("src_dc", "dst_dc"):
            numeric("links", self.links, c, True)
        numeric("steps", self.steps, "step", True)
        numeric("steps", self.steps, "step_time_s", False)
        ev = self.events

        def first_bad(mask, what):
            if mask.any():
                i = int(np.flatnonzero(mask)[0])
                self._fail(f"/events row {i} (rank {int(ev['world_rank'][i])}, step "
                           f"{int(ev['step'][i])}): {what} ({int(mask.sum())} rows like it)")

        first_bad(ev["end_s"] < ev["start_s"] - 1e-9,
                  "end_s is before start_s: a negative duration")
        first_bad(ev["complete_s"] < ev["start_s"] - 1e-9,
                  "complete_s is before start_s: a negative transfer time")
        first_bad(ev["bytes"] < 0, "bytes is negative")
        first_bad(ev["predicted_ms"] < 0, "predicted_ms is negative")
        first_bad((ev["wan_wait_s"] < 0) | (ev["intra_wait_s"] < 0), "wan_wait_s or intra_wait_s is negative")
        for c in EXCHANGE_COLUMNS:
            numeric("exchanges", self.exchanges, c, c in EXCHANGE_INT_COLUMNS)
        x = self.exchanges
        for i in range(len(x["bytes"])):
            what = None
            if not (0 <= x["world_rank"][i] < self.world_size and 0 <= x["peer"][i] < self.world_size):
                what = "world_rank or peer is not a rank of the job"
            elif not (0 <= x["src_dc"][i] < len(self.dc_names) and 0 <= x["dst_dc"][i] < len(self.dc_names)):
                what = "src_dc or dst_dc is not a DC of dc_names"
            elif (x["src_dc"][i] != self.ranks["dc"][x["world_rank"][i]] or
                  x["dst_dc"][i] != self.ranks["dc"][x["peer"][i]]):
                what = "src_dc / dst_dc are not the DCs of world_rank / peer in /ranks"
            elif x["src_dc"][i] == x["dst_dc"][i]:
                what = "src_dc = dst_dc: an exchange inside a DC does not cross the WAN"
            elif x["bytes"][i] < 0:
                what = "bytes is negative"
            elif x["complete_s"][i] < x["start_s"][i] - 1e-9:
                what = "complete_s is before start_s: a negative transfer time"
            if what:
                self._fail(f"/exchanges row {i} (rank {int(x['world_rank'][i])}, step {int(x['step'][i])}): {what}")
        bad = self.steps["step_time_s"] < 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self._fail(f"/steps/step_time_s[{i}] = {self.steps['step_time_s'][i]}: expected a "
                       f"time >= 0")

    def _check_schedule(self):
        """The table rows the summary reads (stage, dp, bubble_fraction)."""
        if not isinstance(self.schedule, dict):
            self._fail(f"/schedule_json holds a {type(self.schedule).__name__}, expected a "
                       f"schedule table (a JSON object)")
        rows = self.schedule.get("rows", [])
        if not isinstance(rows, list):
            self._fail("/schedule_json 'rows' is not a list")
        for i, row in enumerate(rows):
            ok = isinstance(row, dict) and all(
                isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                for k in ("stage", "dp", "bubble_fraction"))
            if ok:
                ok = row["bubble_fraction"] == row["bubble_fraction"] and \
                     abs(row["bubble_fraction"]) != float("inf")
            if not ok:
                self._fail(f"/schedule_json row {i} = {_short(row)}: expected an object with "
                           f"numbers stage, dp and bubble_fraction")

    def _columns(self, f, group, names, np, optional=()):
        """The datasets `names` of /group (each required) and `optional` (zeros where absent), all
        of one length."""
        if group not in f:
            self._fail(f"missing group /{group}")
        g = f[group]
        if not hasattr(g, "keys"):
            self._fail(f"/{group} is a dataset, expected a group of datasets")
        missing = [c for c in names if c not in g]
        if missing:
            self._fail(f"missing dataset(s) in /{group}: {', '.join(missing)}")
        cols = {c: np.asarray(g[c][()]).reshape(-1) for c in list(names) + [c for c in optional if c in g]}
        lengths = {len(v) for v in cols.values()}
        if len(lengths) > 1:
            sizes = ", ".join(f"{c}={len(v)}" for c, v in cols.items())
            self._fail(f"the datasets of /{group} differ in length ({sizes})")
        for c in optional:
            if c not in cols:
                cols[c] = np.zeros(len(cols[names[0]]))
        return cols

    def kind_name(self, k):
        return self.kind_names[int(k)]

    def rank_label(self, r):
        dc = int(self.ranks["dc"][r])
        dc_name = self.dc_names[dc] if 0 <= dc < len(self.dc_names) else str(dc)
        return (f"r{r} {dc_name} s{int(self.ranks['stage'][r])} d{int(self.ranks['dp'][r])} "
                f"t{int(self.ranks['tp'][r])}")

    def link_pairs(self, exchanges):
        """(src_dc, dst_dc) of every link of /links, in order, then of every other DC pair that the
        /exchanges rows selected by the mask `exchanges` use (first and last stage two DCs apart),
        sorted."""
        pairs = [(int(a), int(b)) for a, b in zip(self.links["src_dc"], self.links["dst_dc"])]
        x = self.exchanges
        return pairs + sorted({(int(a), int(b)) for a, b in zip(x["src_dc"][exchanges], x["dst_dc"][exchanges])}
                              - set(pairs))

    def link_label(self, link):
        return self.dc_pair_label(int(self.links["src_dc"][link]), int(self.links["dst_dc"][link]))

    def dc_pair_label(self, s, d):
        name = lambda i: self.dc_names[i] if 0 <= i < len(self.dc_names) else str(i)  # noqa: E731
        return f"WAN {name(s)}>{name(d)}"


# ---- the numbers ------------------------------------------------------------------------------

def union_length(intervals):
    """Total length covered by a list of (start, end) intervals (overlaps counted once)."""
    total = 0.0
    cur_start = cur_end = None
    for s, e in sorted(intervals):
        if e < s:
            s, e = e, s
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def nest_prefill(p):
    """BubbleTea records its prefill chunks with step -1 inside the training slot that let them run
    (an Idle slot, or the WAN wait of an all_reduce / optimizer). Returns (step, nested): each
    event's step (a prefill chunk recorded with step -1 takes its container's) and the seconds
    of prefill inside each training event."""
    import numpy as np
    ev = p.events
    step = ev["step"].astype(np.int64).copy()
    nested = np.zeros(len(step))
    names = p.kind_names
    prefill = names.index("prefill") if "prefill" in names else -1
    wan_send = names.index("wan_send") if "wan_send" in names else -1
    is_pre = ev["kind"] == prefill
    if not is_pre.any():
        return step, nested
    for r in np.unique(ev["world_rank"][is_pre]):
        mine = ev["world_rank"] == r
        cont = np.flatnonzero(mine & ~is_pre & (ev["kind"] != wan_send) & (ev["step"] >= 0))
        if len(cont) == 0:
            continue
        cont = cont[np.argsort(ev["start_s"][cont], kind="stable")]
        starts = ev["start_s"][cont]
        for i in np.flatnonzero(mine & is_pre):
            k = np.searchsorted(starts, ev["start_s"][i], side="right") - 1
            if k < 0:
                continue
            c = cont[k]
            if ev["end_s"][c] + 1e-9 < ev["end_s"][i]:
                continue  # between slots, not inside one
            if step[i] < 0:
                step[i] = ev["step"][c]
            nested[c] += ev["end_s"][i] - ev["start_s"][i]
    return step, nested


def summarize(p, skip_steps=0):
    """The report's numbers as a dict (also what --json writes)."""
    import numpy as np
    ev = p.events
    ev_step, nested = nest_prefill(p)
    steps_all = sorted({int(s) for s in ev["step"] if s >= 0})
    if not steps_all:
        raise ReportError(EXIT_FORMAT, f"{p.path}: no event of /events belongs to a step (every "
                                       f"/events/step is negative)")
    steps = steps_all[skip_steps:]
    if not steps:
        raise ReportError(EXIT_USAGE, f"{p.path}: --skip-steps {skip_steps} leaves no step (the profile has "
                                      f"{len(steps_all)}: {steps_all[0]}..{steps_all[-1]})")
    sel = np.isin(ev_step, steps)
    dur = ev["end_s"] - ev["start_s"] - nested  # prefill inside a slot counts as prefill
    kind_names = [p.kind_name(k) for k in range(len(p.kind_names))]
    cat_of = np.array([CATEGORY_OF_KIND.get(n, "other") for n in kind_names])

    row_of_rank = {}
    for row in p.schedule.get("rows", []):
        row_of_rank[(row["stage"], row["dp"])] = row

    ranks = []
    for r in range(p.world_size):
        m = sel & (ev["world_rank"] == r)
        out = {"rank": r, "label": p.rank_label(r), "host": p.ranks["host"][r],
               "dc": int(p.ranks["dc"][r]), "stage": int(p.ranks["stage"][r]),
               "dp": int(p.ranks["dp"][r]), "tp": int(p.ranks["tp"][r])}
        for c in CATEGORIES:
            out[c] = 0.0
        cats = cat_of[ev["kind"][m]]
        # A slot's waits the run counted apart (the gradient-norm sum in an optimizer slot, the
        # tied-embedding exchange in an all-reduce) go where its footer puts them; the rest of the
        # slot to its kind's category.
        wan_part, intra_part = ev["wan_wait_s"][m], ev["intra_wait_s"][m]
        rest = dur[m] - wan_part - intra_part
        for c in CATEGORIES:
            out[c] = float(rest[cats == c].sum())
        out["wan_wait"] += float(wan_part.sum())
        out["intra_dc"] += float(intra_part.sum())
        wall = 0.0
        for s in steps:
            ms = m & (ev_step == s)
            if ms.any():
                wall += float(ev["end_s"][ms].max() - ev["start_s"][ms].min())
        out["wall"] = wall
        out["other"] = wall - sum(out[c] for c in CATEGORIES)
        out["events"] = int(m.sum())
        out["utilization"] = (out["compute"] + out["prefill"]) / wall if wall > 0 else 0.0
        out["idle_fraction"] = out["idle"] / wall if wall > 0 else 0.0
        row = row_of_rank.get((out["stage"], out["dp"]))
        out["predicted_idle_fraction"] = float(row["bubble_fraction"]) if row else None
        ranks.append(out)

    wan_send = kind_names.index("wan_send") if "wan_send" in kind_names else -1
    # Per link: its wan_send slots, and the tied-embedding exchanges between its two DCs
    # (/exchanges; a DC pair the table has no link for gets a row of its own).
    x = p.exchanges
    xsel = np.isin(x["step"], steps)
    links = []
    for link, (a, b) in enumerate(p.link_pairs(xsel)):
        m = sel & (ev["kind"] == wan_send) & (ev["link"] == link) if link < len(p.links["src_dc"]) \
            else np.zeros(len(ev["kind"]), dtype=bool)
        mx = xsel & (x["src_dc"] == a) & (x["dst_dc"] == b)
        slot_bytes, exchange_bytes = int(ev["bytes"][m].sum()), int(x["bytes"][mx].sum())
        nbytes = slot_bytes + exchange_bytes
        busy = union_length(list(zip(ev["start_s"][m], ev["complete_s"][m])) +
                            list(zip(x["start_s"][mx], x["complete_s"][mx])))
        links.append({"link": link if link < len(p.links["src_dc"]) else None,
                      "label": p.dc_pair_label(a, b),
                      "src_dc": a, "dst_dc": b,
                      "transfers": int(m.sum()) + int(mx.sum()), "bytes": nbytes,
                      "exchange_bytes": exchange_bytes, "busy_s": busy,
                      "bytes_per_s": nbytes / busy if busy > 0 else 0.0})

    # Measured step time: rank 0's /steps rows when present, else the span of each step's events.
    step_ms = []
    if len(p.steps["step"]):
        for s, t in zip(p.steps["step"], p.steps["step_time_s"]):
            if int(s) in steps:
                step_ms.append(1e3 * float(t))
    source = "/steps/step_time_s"
    if not step_ms:
        source = "event span per step"
        for s in steps:
            ms = sel & (ev_step == s)
            step_ms.append(1e3 * float(ev["end_s"][ms].max() - ev["start_s"][ms].min()))
    mean_step = sum(step_ms) / len(step_ms)

    kinds = []
    for k, name in enumerate(kind_names):
        m = sel & (ev["kind"] == k)
        count = int(m.sum())
        if count == 0:
            continue
        measured = 1e3 * float(dur[m].mean())
        predicted = float(ev["predicted_ms"][m].mean())
        kinds.append({"kind": name, "count": count, "measured_ms": measured,
                      "predicted_ms": predicted,
                      "ratio": measured / predicted if predicted > 0 else None})

    return {
        "run_name": p.run_name, "source": p.source, "path": p.path,
        "schedule_kind": p.schedule_kind, "world_size": p.world_size,
        "dc_names": p.dc_names, "steps": steps, "skipped_steps": steps_all[:skip_steps],
        "ranks": ranks, "links": links,
        "step_time": {"measured_mean_ms": mean_step, "measured_min_ms": min(step_ms),
                      "measured_max_ms": max(step_ms), "source": source, "count": len(step_ms),
                      "predicted_ms": p.predicted_step_ms,
                      "ratio": mean_step / p.predicted_step_ms if p.predicted_step_ms > 0 else None},
        "kinds": kinds,
    }


def _z(x):
    """x, with float noise around zero printed as 0 (not -0.0000)."""
    return 0.0 if abs(x) < 5e-10 else x


def print_summary(s, out=None):
    w = (out or sys.stdout).write
    steps = s["steps"]
    src = "" if s.get("source", "measured") == "measured" else f" ({s['source']})"
    w(f"# atlas report: run {s['run_name']}{src}, schedule {s['schedule_kind']}, {s['world_size']} ranks, "
      f"DCs {' '.join(s['dc_names'])}; steps {steps[0]}..{steps[-1]} ({len(steps)} analysed")
    w(f", {len(s['skipped_steps'])} skipped)\n" if s["skipped_steps"] else ")\n")
    w("# per rank, seconds summed over the analysed steps; wall = sum of each step's first start to "
      "last end;\n# util = (compute + prefill) / wall; pred_idle = the schedule table's bubble "
      "fraction for the rank's row\n")
    w(f"{'rank':<22} {'compute':>9} {'intra_dc':>9} {'wan_wait':>9} {'idle':>9} {'prefill':>9} "
      f"{'send':>9} {'other':>9} {'wall':>9} {'util_%':>7} {'idle_%':>7} {'pred_idle_%':>11}\n")
    for r in s["ranks"]:
        pred = r["predicted_idle_fraction"]
        pred_txt = f"{100 * pred:.1f}" if pred is not None else "-"
        w(f"{r['label']:<22} {r['compute']:>9.4f} {r['intra_dc']:>9.4f} {r['wan_wait']:>9.4f} "
          f"{r['idle']:>9.4f} {r['prefill']:>9.4f} {r['send_post']:>9.4f} {_z(r['other']):>9.4f} "
          f"{r['wall']:>9.4f} {100 * r['utilization']:>7.1f} {100 * r['idle_fraction']:>7.1f} "
          f"{pred_txt:>11}\n")
    silent = [str(r["rank"]) for r in s["ranks"] if r.get("events", 1) == 0]
    if silent:
        w(f"# note: rank(s) {', '.join(silent)} recorded no event in the analysed steps: their rows are zeros, "
          f"not measurements (a rank that died, or a damaged profile)\n")
    w("\n# per WAN link: wan_send transfers and tied-embedding exchanges (exch_bytes of bytes), post "
      "to completion;\n# busy = time with >= 1 transfer in flight\n")
    w(f"{'link':<20} {'transfers':>9} {'bytes':>14} {'exch_bytes':>12} {'busy_s':>10} {'MB/s':>10} "
      f"{'Gbit/s':>8}\n")
    for link in s["links"]:
        w(f"{link['label']:<20} {link['transfers']:>9} {link['bytes']:>14} {link['exchange_bytes']:>12} "
          f"{link['busy_s']:>10.4f} {link['bytes_per_s'] / 1e6:>10.2f} {link['bytes_per_s'] * 8 / 1e9:>8.3f}\n")
    st = s["step_time"]
    ratio = f"{st['ratio']:.3f}" if st["ratio"] is not None else "-"
    w(f"\n# measured vs predicted (schedule table)\nstep time: measured mean {st['measured_mean_ms']:.3f} "
      f"ms (min {st['measured_min_ms']:.3f}, max {st['measured_max_ms']:.3f}, {st['count']} steps, "
      f"from {st['source']}) vs predicted {st['predicted_ms']:.3f} ms: ratio {ratio}\n")
    if not s.get("skipped_steps") and st["count"] > 1:
        w("  (every recorded step; a run's footer and run.json leave its first step out: --skip-steps 1 "
          "gives their mean)\n")
    w(f"{'kind':<12} {'count':>7} {'measured_ms':>12} {'predicted_ms':>13} {'ratio':>7}\n")
    for k in s["kinds"]:
        ratio = f"{k['ratio']:.3f}" if k["ratio"] is not None else "-"
        w(f"{k['kind']:<12} {k['count']:>7} {k['measured_ms']:>12.4f} {k['predicted_ms']:>13.4f} "
          f"{ratio:>7}\n")


def compare(a, b):
    """Two summaries side by side (a run and its simulation, or two runs): per step means, so the
    profiles may hold different numbers of steps. Returns a dict (also what --json writes)."""
    if a["world_size"] != b["world_size"]:
        raise ReportError(EXIT_USAGE, f"--against: {b['path']} has {b['world_size']} ranks, "
                                      f"{a['path']} has {a['world_size']}: not the same job")
    # Ranks are paired by their place in the layout, not by number: the same rank count in
    # another layout (2 stages x dp 2 against 4 stages) is another job.
    def place(r):
        return (r["dc"], r["stage"], r["dp"], r["tp"])
    b_at = {place(r): r for r in b["ranks"]}
    missing = [r for r in a["ranks"] if place(r) not in b_at]
    if missing:
        raise ReportError(EXIT_USAGE, f"--against: {b['path']} has no rank at (dc, stage, dp, tp) = "
                                      f"{place(missing[0])} where {a['path']} has {missing[0]['label']}: "
                                      f"another layout, not the same job")
    na, nb = len(a["steps"]), len(b["steps"])
    cats = ["compute", "intra_dc", "wan_wait", "idle", "prefill", "wall"]
    ranks = []
    for ra in a["ranks"]:
        rb = b_at[place(ra)]
        row = {"rank": ra["rank"], "label": ra["label"]}
        for c in cats:
            row[c] = (1e3 * ra[c] / na, 1e3 * rb[c] / nb)
        ranks.append(row)
    kb = {k["kind"]: k for k in b["kinds"]}
    kinds = []
    for k in a["kinds"]:
        other = kb.get(k["kind"])
        kinds.append({"kind": k["kind"], "a_ms": k["measured_ms"],
                      "b_ms": other["measured_ms"] if other else None,
                      "a_per_step": k["count"] / na, "b_per_step": other["count"] / nb if other else 0})
    sa, sb = a["step_time"]["measured_mean_ms"], b["step_time"]["measured_mean_ms"]
    return {"a": {"path": a["path"], "source": a["source"], "steps": na},
            "b": {"path": b["path"], "source": b["source"], "steps": nb},
            "step_ms": (sa, sb), "ratio": sa / sb if sb > 0 else None, "ranks": ranks, "kinds": kinds}


def print_comparison(c, out=None):
    w = (out or sys.stdout).write
    a, b = c["a"], c["b"]
    w(f"\n# against: A = {a['path']} ({a['source']}, {a['steps']} steps), B = {b['path']} "
      f"({b['source']}, {b['steps']} steps); ms per step, A / B\n")
    ratio = f"{c['ratio']:.3f}" if c["ratio"] is not None else "-"
    w(f"step time: A {c['step_ms'][0]:.3f} ms vs B {c['step_ms'][1]:.3f} ms: ratio {ratio}\n")
    cats = ["compute", "intra_dc", "wan_wait", "idle", "prefill", "wall"]
    w(f"{'rank':<22}" + "".join(f" {x + ' A/B':>19}" for x in cats) + "\n")
    for r in c["ranks"]:
        w(f"{r['label']:<22}" + "".join(f" {r[x][0]:>9.2f}/{r[x][1]:<9.2f}" for x in cats) + "\n")
    w(f"{'kind':<12} {'A_ms':>10} {'B_ms':>10} {'A/B':>7} {'A_per_step':>11} {'B_per_step':>11}\n")
    for k in c["kinds"]:
        b_ms = k["b_ms"]
        r = f"{k['a_ms'] / b_ms:.3f}" if b_ms else "-"
        b_txt = f"{b_ms:.4f}" if b_ms is not None else "-"
        w(f"{k['kind']:<12} {k['a_ms']:>10.4f} {b_txt:>10} {r:>7} {k['a_per_step']:>11.1f} "
          f"{k['b_per_step']:>11.1f}\n")


# ---- drawing ----------------------------------------------------------------------------------

def draw_gantt(ax, rows, link_rows, title, kind_order):
    """rows: [(label, [(start_ms, dur_ms, kind_name)])]; link_rows: [(label, [(start_ms, dur_ms)])].
    Zero-length slots (send posts, recv markers) are drawn as thin ticks."""
    labels = [r[0] for r in rows] + [r[0] for r in link_rows]
    n = len(labels)
    ticks = []
    xmax = 0.0
    for i, (_, slots) in enumerate(rows):
        y = n - 1 - i
        ticks.append(y)
        by_kind = {}
        for start, dur, kind in slots:
            by_kind.setdefault(kind, []).append((start, dur))
            xmax = max(xmax, start + dur)
        for kind, spans in by_kind.items():
            color = KIND_COLORS.get(kind, "#999999")
            bars = [(s, d) for s, d in spans if d > 0]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolor="white",
                               linewidth=0.3)
            marks = [s for s, d in spans if d <= 0]
            if marks:
                ax.vlines(marks, y - 0.4, y + 0.4, colors=color, linewidth=1.2)
    for j, (_, spans) in enumerate(link_rows):
        y = n - 1 - len(rows) - j
        ticks.append(y)
        bars = [(s, max(d, 0.0)) for s, d in spans]
        for s, d in bars:
            xmax = max(xmax, s + d)
        if bars:
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=LINK_COLOR, alpha=0.55,
                           edgecolor="black", linewidth=0.4)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, xmax * 1.01 if xmax > 0 else 1.0)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    if link_rows:
        ax.axhline(len(link_rows) - 0.5, color="black", linewidth=0.6)
    return [k for k in kind_order if any(k == s[2] for _, sl in rows for s in sl)]


def add_legend(fig, kinds_used, with_links):
    import matplotlib.patches as mpatches
    handles = [mpatches.Patch(color=KIND_COLORS.get(k, "#999999"), label=k) for k in kinds_used]
    if with_links:
        handles.append(mpatches.Patch(color=LINK_COLOR, alpha=0.55, label="WAN transfer"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8,
               frameon=False)


def save(fig, path):
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise ReportError(EXIT_IO, f"cannot write {path}: {e}") from None


def measured_gantt(p, step, out_path):
    import numpy as np
    plt = pyplot()
    ev = p.events
    ev_step, _ = nest_prefill(p)
    steps = sorted({int(s) for s in ev_step if s >= 0})
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise ReportError(EXIT_USAGE, f"--step {step}: the profile holds {len(steps)} step(s), "
                                      f"{steps[0]}..{steps[-1]}" + ("" if len(steps) == steps[-1] - steps[0] + 1
                                                                    else f" with gaps ({steps[:8]}...)"))
    m = ev_step == step
    t0 = float(ev["start_s"][m].min())
    # A chart has room for some hundred rows (matplotlib refuses a figure past 2^16 pixels): of a
    # larger job (a simulated 4,608-rank profile) the dp 0, tp 0 rank of each stage, then every
    # k-th of those.
    shown = list(range(p.world_size))
    note = ""
    if len(shown) > MAX_GANTT_RANKS:
        shown = [r for r in shown if int(p.ranks["dp"][r]) == 0 and int(p.ranks["tp"][r]) == 0]
        stride = max(1, -(-len(shown) // MAX_GANTT_RANKS))
        shown = shown[::stride]
        note = (f"; {len(shown)} of {p.world_size} ranks: dp 0, tp 0" +
                (f", every {stride}th stage" if stride > 1 else ""))
    rows = []
    for r in shown:
        mr = m & (ev["world_rank"] == r)
        slots = [(1e3 * (s - t0), 1e3 * (e - s), p.kind_name(k))
                 for s, e, k in zip(ev["start_s"][mr], ev["end_s"][mr], ev["kind"][mr])]
        slots.sort(key=lambda x: x[2] == "prefill")  # prefill on top of the slot it ran in
        rows.append((p.rank_label(r), slots))
    wan_send = p.kind_names.index("wan_send") if "wan_send" in p.kind_names else -1
    link_rows = []
    x = p.exchanges
    mx_step = x["step"] == step
    for link, (a, b) in enumerate(p.link_pairs(mx_step)):
        spans = []
        if link < len(p.links["src_dc"]):
            ml = m & (ev["kind"] == wan_send) & (ev["link"] == link)
            spans = [(1e3 * (s - t0), 1e3 * (c - s)) for s, c in zip(ev["start_s"][ml], ev["complete_s"][ml])]
        mx = mx_step & (x["src_dc"] == a) & (x["dst_dc"] == b)  # the tied-embedding exchanges
        spans += [(1e3 * (s - t0), 1e3 * (c - s)) for s, c in zip(x["start_s"][mx], x["complete_s"][mx])]
        link_rows.append((p.dc_pair_label(a, b), spans))
    span_ms = 1e3 * (max(float(np.max(np.maximum(ev["end_s"][m], ev["complete_s"][m]))),
                         float(np.max(x["complete_s"][mx_step], initial=-np.inf))) - t0)
    fig, ax = plt.subplots(figsize=(13, 0.32 * (len(rows) + len(link_rows)) + 1.8))
    used = draw_gantt(ax, rows, link_rows,
                      f"{p.run_name}: step {step} as measured ({p.schedule_kind}; {span_ms:.1f} ms "
                      f"vs predicted {p.predicted_step_ms:.1f} ms{note})", p.kind_names)
    ax.set_xlabel("time since the step's first slot (ms)")
    add_legend(fig, used, bool(link_rows))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, out_path)
    plt.close(fig)
    return step


def load_schedule_tables(path):
    if not os.path.exists(path):
        raise ReportError(EXIT_IO, f"{path}: no such file (write one with atlas schedule DECK "
                                   f"--json {path})")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(EXIT_FORMAT, f"{path}: not a schedule JSON file ({e})") from None
    tables = data if isinstance(data, list) else [data]
    for i, t in enumerate(tables):
        if not isinstance(t, dict) or "rows" not in t or "kind" not in t:
            raise ReportError(EXIT_FORMAT, f"{path}: table {i} has no 'kind'/'rows': not the "
                                           f"output of atlas schedule --json")
    return tables


def schedule_rows(t):
    dcs = t.get("dcs", [])
    name = lambda i: dcs[i] if 0 <= i < len(dcs) else str(i)  # noqa: E731
    rows = []
    for row in t["rows"]:
        slots = [(s["start_ms"], s["duration_ms"], s["kind"]) for s in row["slots"]]
        rows.append((f"{name(row['dc'])} s{row['stage']} d{row['dp']}", slots))
    link_rows = []
    for link in t.get("links", []):
        spans = [(x["start_ms"], x["end_ms"] - x["start_ms"]) for x in link["transfers"]]
        link_rows.append((f"WAN {name(link['src_dc'])}>{name(link['dst_dc'])}", spans))
    return rows, link_rows


def predicted_gantt(path, out_path, kind=None):
    tables = load_schedule_tables(path)
    if kind:
        tables = [t for t in tables if t["kind"] == kind]
        if not tables:
            raise ReportError(EXIT_USAGE, f"{path} holds no '{kind}' table")
    plt = pyplot()
    heights = [0.32 * (len(t["rows"]) + len(t.get("links", []))) + 0.9 for t in tables]
    fig, axes = plt.subplots(len(tables), 1, figsize=(13, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    used = []
    xmax = 0.0
    for ax, t in zip(axes[:, 0], tables):
        rows, link_rows = schedule_rows(t)
        title = (f"{t['kind']} (predicted): step {t['step_ms']:.1f} ms, mean bubble "
                 f"{100 * t.get('mean_bubble_fraction', 0):.1f}%")
        for k in draw_gantt(ax, rows, link_rows, title, SLOT_KINDS):
            if k not in used:
                used.append(k)
        xmax = max(xmax, ax.get_xlim()[1])
    for ax in axes[:, 0]:
        ax.set_xlim(0, xmax)  # one time scale, so schedules compare by eye
    axes[-1, 0].set_xlabel("time in step (ms)")
    add_legend(fig, [k for k in SLOT_KINDS if k in used],
               any(t.get("links") for t in tables))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, out_path)
    plt.close(fig)
    return [t["kind"] for t in tables]


# ---- command line -----------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):  # atlas's usage errors exit 1 (argparse's default is 2)
        self.print_usage(sys.stderr)
        sys.stderr.write(f"ERROR: {message}\n")
        sys.exit(EXIT_USAGE)


def main(argv=None):
    ap = Parser(prog="atlas report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", nargs="?", help="run directory (runs/NAME) or a profile.h5 path")
    ap.add_argument("--step", type=int, help="step drawn in the Gantt chart (default: the last)")
    ap.add_argument("--out", help="PNG to write (default: RUN_DIR/gantt.png)")
    ap.add_argument("--json", help="also write the summary's numbers to this JSON file")
    ap.add_argument("--skip-steps", type=int, default=0,
                    help="leave the first K recorded steps (warm-up) out of the summary")
    ap.add_argument("--no-png", action="store_true", help="print the summary only")
    ap.add_argument("--against", metavar="PROFILE",
                    help="also compare with another profile.h5 or run directory, per step (e.g. "
                         "the simulation: atlas simulate DECK --profile sim.h5)")
    ap.add_argument("--schedule-json", help="draw the predicted table(s) of this atlas schedule "
                                            "--json file instead of reading a run")
    ap.add_argument("--kind", choices=["gpipe", "1f1b", "atlas"],
                    help="with --schedule-json: only this schedule's table")
    args = ap.parse_args(argv)
    try:
        if args.schedule_json:
            if args.run_dir:
                ap.error("give a run directory or --schedule-json, not both")
            if not args.out:
                ap.error("--schedule-json needs --out PNG")
            kinds = predicted_gantt(args.schedule_json, args.out, args.kind)
            print(f"# wrote {args.out} (predicted: {' '.join(kinds)})")
            return 0
        if not args.run_dir:
            ap.error("give a run directory (runs/NAME) or --schedule-json FILE --out PNG")
        if args.skip_steps < 0:
            ap.error("--skip-steps must be >= 0")
        # A file is a profile whatever its name (atlas simulate --profile takes any); else a run directory.
        if not os.path.isfile(args.run_dir):
            if not os.path.exists(args.run_dir):
                raise ReportError(EXIT_IO, f"{args.run_dir}: no such run directory (atlas train writes "
                                           f"runs/<run.name>/ under run.out_dir; give that directory or its "
                                           f"profile.h5)")
            run_dir, profile_path = args.run_dir, os.path.join(args.run_dir, "profile.h5")
        else:  # a profile file named directly
            run_dir, profile_path = os.path.dirname(args.run_dir) or ".", args.run_dir
        p = Profile(profile_path)
        s = summarize(p, args.skip_steps)
        print_summary(s)
        if args.against:
            other = args.against
            if not os.path.isfile(other):
                other = os.path.join(other, "profile.h5")
            q = Profile(other)
            # A simulated profile has no warm-up to leave out: --skip-steps is the run's.
            skip_other = 0 if q.source == "simulated" else args.skip_steps
            s["against"] = compare(s, summarize(q, skip_other))
            print_comparison(s["against"])
        if args.json:
            try:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(s, f, indent=1)
            except OSError as e:
                raise ReportError(EXIT_IO, f"cannot write {args.json}: {e}") from None
            print(f"# wrote {args.json}")
        if not args.no_png:
            out = args.out or os.path.join(run_dir, "gantt.png")
            step = measured_gantt(p, args.step, out)
            print(f"# wrote {out} (step {step})")
        return 0
    except BrokenPipeError:
        # The reader went (`atlas report RUN | head`): stop quietly, as other tools do (SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except ReportError as e:
        sys.stdout.flush()
        sys.stderr.write(f"ERROR: {e}\n")
        return e.code
    except Exception as e:  # noqa: BLE001  a bug: one line with what failed, not a traceback
        sys.stdout.flush()
        sys.stderr.write(f"ERROR: internal error in atlas report ({type(e).__name__}: {e})\n"
                         f"  hint: set ATLAS_REPORT_TRACEBACK=1 for the Python traceback\n")
        if os.environ.get("ATLAS_REPORT_TRACEBACK"):
            raise
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
