#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Tests of the report (scripts/report/atlas_report.py and `atlas report`) on synthetic
# profile.h5 files from make_profile.py: summary numbers against hand-computed values and
# against values recomputed from the schedule table, the Gantt PNGs, and the error messages.
# Environment: ATLAS_SOURCE_DIR (checkout), ATLAS_BIN (the atlas binary). Exit 77 = skipped.
# usage: test_report.py [-k summary|schedule|cli]
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("ATLAS_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ATLAS_BIN = os.environ.get("ATLAS_BIN", os.path.join(SRC, "build", "bin", "atlas"))
REPORT = os.path.join(SRC, "scripts", "report", "atlas_report.py")
DECK = os.path.join(SRC, "inputs", "three_dc_cpu.deck")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

for module, package in (("h5py", "python3-h5py"), ("matplotlib", "python3-matplotlib")):
    if importlib.util.find_spec(module) is None:
        print(f"SKIP: {sys.executable} has no module {module} (apt-get install {package})")
        sys.exit(77)

sys.path.insert(0, os.path.join(SRC, "tests", "report"))
sys.path.insert(0, os.path.join(SRC, "scripts", "report"))
import atlas_report  # noqa: E402
import make_profile  # noqa: E402


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def assert_png(test, path):
    test.assertTrue(os.path.isfile(path), f"{path} was not written")
    with open(path, "rb") as f:
        head = f.read(24)
    test.assertEqual(head[:8], PNG_MAGIC, f"{path} is not a PNG")
    width = int.from_bytes(head[16:20], "big")
    height = int.from_bytes(head[20:24], "big")
    test.assertGreater(width, 200)
    test.assertGreater(height, 100)
    test.assertGreater(os.path.getsize(path), 5000)


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="atlas-report-test.")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def handmade_run(self, **kw):
        run_dir = os.path.join(self.dir, "runs", "handmade")
        os.makedirs(run_dir, exist_ok=True)
        make_profile.handmade(os.path.join(run_dir, "profile.h5"), **kw)
        return run_dir

    def report(self, *args):
        """atlas_report.main in this process; returns (status, stdout, stderr)."""
        import contextlib
        import io
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = atlas_report.main(list(args))
            except SystemExit as e:  # argparse usage errors
                status = e.code
        return status, out.getvalue(), err.getvalue()

    # ---- summary numbers against the hand computation in make_profile.handmade ----

    def test_summary_handmade_numbers(self):
        run_dir = self.handmade_run()
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        r0, r1 = s["ranks"]
        self.assertAlmostEqual(r0["utilization"], 5.5 / 8)   # 0.6875
        self.assertAlmostEqual(r1["utilization"], 3.0 / 8)   # 0.375
        self.assertAlmostEqual(r0["compute"], 2 * 5.5)
        self.assertAlmostEqual(r0["wan_wait"], 2 * 1.5)
        self.assertAlmostEqual(r0["idle"], 2 * 1.0)
        self.assertAlmostEqual(r0["wall"], 2 * 8.0)
        self.assertAlmostEqual(r0["other"], 0.0)
        self.assertAlmostEqual(r1["prefill"], 2 * 1.0)
        self.assertAlmostEqual(r1["wan_wait"], 2 * 3.5)
        self.assertAlmostEqual(r1["idle"], 2 * 1.5)
        self.assertAlmostEqual(r1["predicted_idle_fraction"], 0.1875)
        l0, l1 = s["links"]
        self.assertEqual(l0["label"], "WAN east>west")
        self.assertEqual(l0["bytes"], 2 * 1_500_000_000)
        self.assertEqual(l0["transfers"], 4)
        self.assertAlmostEqual(l0["busy_s"], 2 * 2.5)         # overlapping transfers count once
        self.assertAlmostEqual(l0["bytes_per_s"], 6e8)
        self.assertAlmostEqual(l1["bytes_per_s"], 4e8)
        self.assertAlmostEqual(s["step_time"]["measured_mean_ms"], 8200.0)
        self.assertAlmostEqual(s["step_time"]["ratio"], 1.025)
        fwd = next(k for k in s["kinds"] if k["kind"] == "forward")
        self.assertEqual(fwd["count"], 6)
        self.assertAlmostEqual(fwd["measured_ms"], 4000.0 / 3)
        self.assertAlmostEqual(fwd["predicted_ms"], 1000.0)
        # The text carries the same numbers.
        self.assertRegex(out, r"r0 east s0 d0 t0 .* 68\.8 +12\.5 +12\.5\n")
        self.assertRegex(out, r"r1 west s1 d0 t0 .* 37\.5 +18\.8 +18\.8\n")
        self.assertRegex(out, r"WAN east>west +4 +3000000000 +0 +5\.0000 +600\.00 +4\.800\n")
        self.assertIn("vs predicted 8000.000 ms: ratio 1.025", out)

    def test_summary_exchanges(self):
        # The tied-embedding exchanges (/exchanges, no slot of the table) count on their DC pair's
        # link: bytes, transfers and busy time (overlapping the slots' transfers counted once).
        run_dir = os.path.join(self.dir, "runs", "exch")
        os.makedirs(run_dir)
        xs = []
        for step in range(2):
            t = 10.0 * step
            xs.append({"world_rank": 0, "step": step, "peer": 1, "src_dc": 0, "dst_dc": 1,
                       "bytes": 10**8, "start_s": t + 4.0, "complete_s": t + 6.0})
            xs.append({"world_rank": 1, "step": step, "peer": 0, "src_dc": 1, "dst_dc": 0,
                       "bytes": 10**8, "start_s": t + 7.0, "complete_s": t + 7.5})
        make_profile.handmade(os.path.join(run_dir, "profile.h5"), exchanges=xs)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--json", js, "--no-png", "--skip-steps", "1")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        l0, l1 = s["links"]
        self.assertEqual(l0["bytes"], 1_500_000_000 + 10**8)   # step 1 only
        self.assertEqual(l0["exchange_bytes"], 10**8)
        self.assertEqual(l0["transfers"], 3)
        self.assertAlmostEqual(l0["busy_s"], 4.0)             # [2, 4.5] u [4, 6]
        self.assertEqual(l1["bytes"], 2 * 10**8 + 10**8)
        self.assertAlmostEqual(l1["busy_s"], 1.0)             # [5, 5.5] u [7, 7.5]
        self.assertRegex(out, r"WAN east>west +3 +1600000000 +100000000 +4\.0000 +400\.00 +3\.200\n")
        assert_png_from = self.report(run_dir, "--step", "1")
        self.assertEqual(assert_png_from[0], 0, assert_png_from[2])
        assert_png(self, os.path.join(run_dir, "gantt.png"))
        # A pair no link of the table joins (first and last stage two DCs apart) gets a row of its own.
        run3 = os.path.join(self.dir, "runs", "exch3")
        os.makedirs(run3)
        make_profile.handmade(os.path.join(run3, "profile.h5"), dc_names=["east", "west", "south"],
                              ranks={"dc": [0, 1, 2], "stage": [0, 1, 2], "dp": [0, 0, 0],
                                     "tp": [0, 0, 0], "host": ["h", "h", "h"]},
                              exchanges=[{"world_rank": 0, "step": 0, "peer": 2, "src_dc": 0,
                                          "dst_dc": 2, "bytes": 4096, "start_s": 1.0,
                                          "complete_s": 3.0}])
        status, out, err = self.report(run3, "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        extra = s["links"][-1]
        self.assertEqual((extra["label"], extra["link"], extra["bytes"], extra["exchange_bytes"]),
                         ("WAN east>south", None, 4096, 4096))
        self.assertAlmostEqual(extra["busy_s"], 2.0)

    def test_summary_nested_prefill(self):
        # Chunks recorded with step -1 inside an idle slot and inside an optimizer slot count as
        # prefill of the containing step, and only once: the slot keeps the rest of its time.
        run_dir = os.path.join(self.dir, "runs", "nested")
        os.makedirs(run_dir)
        make_profile.handmade(os.path.join(run_dir, "profile.h5"), nested_prefill=True)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--json", js)
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        r0, r1 = s["ranks"]
        self.assertAlmostEqual(r0["idle"], 2 * 0.4)
        self.assertAlmostEqual(r0["prefill"], 2 * 0.6)
        self.assertAlmostEqual(r0["compute"], 2 * 5.5)
        self.assertAlmostEqual(r0["utilization"], 6.1 / 8)
        self.assertAlmostEqual(r0["other"], 0.0)
        self.assertAlmostEqual(r1["compute"], 2 * 1.7)    # the optimizer keeps 0.2 of its 0.5
        self.assertAlmostEqual(r1["prefill"], 2 * 1.3)
        self.assertAlmostEqual(r1["utilization"], 3.0 / 8)  # moved from compute to prefill
        self.assertEqual(s["steps"], [0, 1])
        pre = next(k for k in s["kinds"] if k["kind"] == "prefill")
        self.assertEqual(pre["count"], 2 * 3)
        assert_png(self, os.path.join(run_dir, "gantt.png"))

    def test_summary_skip_steps(self):
        run_dir = self.handmade_run()
        js = os.path.join(self.dir, "s.json")
        status, _, err = self.report(run_dir, "--json", js, "--no-png", "--skip-steps", "1")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        self.assertEqual(s["steps"], [1])
        self.assertAlmostEqual(s["ranks"][0]["wall"], 8.0)
        self.assertAlmostEqual(s["ranks"][0]["utilization"], 0.6875)
        self.assertEqual(s["links"][0]["bytes"], 1_500_000_000)
        status, _, err = self.report(run_dir, "--no-png", "--skip-steps", "2")
        self.assertEqual(status, 1)
        self.assertIn("--skip-steps 2 leaves no step", err)

    def test_summary_gantt_png(self):
        run_dir = self.handmade_run()
        status, out, err = self.report(run_dir, "--step", "0")
        self.assertEqual(status, 0, err)
        assert_png(self, os.path.join(run_dir, "gantt.png"))
        self.assertIn("(step 0)", out)
        status, _, err = self.report(run_dir, "--step", "7")
        self.assertEqual(status, 1)
        self.assertIn("--step 7: the profile holds 2 step(s), 0..1", err)

    # ---- errors ----

    def test_summary_missing_file(self):
        # A run directory without its profile (profile.enabled = false), and no directory at all.
        empty = os.path.join(self.dir, "run_without_profile")
        os.makedirs(empty, exist_ok=True)
        status, _, err = self.report(empty)
        self.assertEqual(status, 5)
        self.assertIn("profile.h5: no such file", err)
        status, _, err = self.report(os.path.join(self.dir, "no_such_run"))
        self.assertEqual(status, 5)
        self.assertIn("no_such_run: no such run directory", err)

    def test_summary_not_hdf5(self):
        path = os.path.join(self.dir, "profile.h5")
        with open(path, "w", encoding="utf-8") as f:
            f.write("not hdf5\n")
        status, _, err = self.report(path)
        self.assertEqual(status, 2)
        self.assertIn("not a readable HDF5 file", err)

    def test_summary_wrong_format_attribute(self):
        run_dir = self.handmade_run(attrs_override={"format": "atlas-ckpt"})
        status, _, err = self.report(run_dir)
        self.assertEqual(status, 2)
        self.assertIn("root attribute format = 'atlas-ckpt': not an atlas profile "
                      "(expected 'atlas-profile')", err)

    def test_summary_wrong_version(self):
        run_dir = self.handmade_run(attrs_override={"version": 2})
        status, _, err = self.report(run_dir)
        self.assertEqual(status, 2)
        self.assertIn("format version 2 is not supported: this report reads version 1", err)

    def test_summary_missing_dataset_and_attribute(self):
        run_dir = self.handmade_run(drop=("events/complete_s",))
        status, _, err = self.report(run_dir)
        self.assertEqual(status, 2)
        self.assertIn("missing dataset(s) in /events: complete_s", err)
        run_dir = self.handmade_run(drop=("attr:deck",))
        status, _, err = self.report(run_dir)
        self.assertEqual(status, 2)
        self.assertIn("missing root attribute(s): deck", err)

    def test_summary_missing_python_package(self):
        # `python3 -S` does not add Debian's dist-packages: exactly what a pyenv python sees.
        r = run([sys.executable, "-S", REPORT, self.handmade_run()])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("Python module 'h5py' is missing", r.stderr)
        self.assertIn("install the Debian package python3-h5py", r.stderr)

    # ---- realistic profile from a real schedule table ----

    def schedule_json(self, kind="atlas"):
        path = os.path.join(self.dir, f"schedule_{kind}.json")
        r = run([ATLAS_BIN, "schedule", DECK, "--kind", kind, "--json", path, "--quiet"])
        if r.returncode != 0:
            self.fail(f"atlas schedule failed ({r.returncode}): {r.stderr}")
        return path

    def test_schedule_profile_matches_table(self):
        sched = self.schedule_json("atlas")
        run_dir = os.path.join(self.dir, "runs", "sched")
        os.makedirs(run_dir)
        scale = 1.25
        table = make_profile.from_schedule(sched, os.path.join(run_dir, "profile.h5"), steps=3,
                                           scale=scale)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--json", js)
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        # Every time was stretched by `scale`: measured / predicted = scale everywhere.
        self.assertAlmostEqual(s["step_time"]["ratio"], scale, places=6)
        for k in s["kinds"]:
            if k["predicted_ms"] > 0:
                self.assertAlmostEqual(k["ratio"], scale, places=6, msg=k["kind"])
        # Utilization of each rank, recomputed from the table's row: busy / the row's span.
        compute = {"forward", "backward", "backward_input", "backward_weight", "optimizer", "prefill"}
        self.assertEqual(len(s["ranks"]), table["pp"] * table["dp"] * table["tp"])
        for r in s["ranks"]:
            row = next(x for x in table["rows"] if x["stage"] == r["stage"] and x["dp"] == r["dp"])
            busy = sum(x["duration_ms"] for x in row["slots"] if x["kind"] in compute)
            span = (max(x["start_ms"] + x["duration_ms"] for x in row["slots"])
                    - min(x["start_ms"] for x in row["slots"]))
            self.assertAlmostEqual(r["utilization"], busy / span, places=9, msg=r["label"])
            self.assertAlmostEqual(r["wall"], 3 * scale * span / 1e3, places=9)
        # Each link carried its table's bytes three times, at the table's rate / scale.
        for link, t in zip(s["links"], table["links"]):
            self.assertEqual(link["bytes"], 3 * sum(x["bytes"] for x in t["transfers"]))
            busy_ms = atlas_report.union_length([(x["start_ms"], x["end_ms"])
                                                 for x in t["transfers"]])
            self.assertAlmostEqual(link["busy_s"], 3 * scale * busy_ms / 1e3, places=9)
        assert_png(self, os.path.join(run_dir, "gantt.png"))
        self.assertIn("(step 2)", out)

    def simulated(self, steps=2, name="sim"):
        """`atlas simulate DECK --json --profile --trace`: (table JSON dict, profile path, trace path)."""
        js, h5, trace = (os.path.join(self.dir, f"{name}.{x}") for x in ("json", "h5", "trace.json"))
        r = run([ATLAS_BIN, "simulate", DECK, "--json", js, "--profile", h5, "--trace", trace,
                 "--steps", str(steps)])
        if r.returncode != 0:
            self.fail(f"atlas simulate failed ({r.returncode}): {r.stderr}")
        self.assertIn(f"wrote {h5}", r.stdout)
        with open(js, encoding="utf-8") as f:
            tables = json.load(f)
        return (tables[0] if isinstance(tables, list) else tables), h5, trace

    def test_schedule_simulated_profile_is_the_table(self):
        table, h5, trace = self.simulated(steps=2)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(h5, "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("(simulated)", out)
        with open(js, encoding="utf-8") as f:
            s = json.load(f)
        self.assertEqual(s["source"], "simulated")
        self.assertEqual(s["steps"], [0, 1])
        self.assertAlmostEqual(s["step_time"]["measured_mean_ms"], table["step_ms"], places=6)
        self.assertAlmostEqual(s["step_time"]["ratio"], 1.0, places=9)
        compute = {"forward", "backward", "backward_input", "backward_weight", "optimizer", "prefill"}
        self.assertEqual(len(s["ranks"]), table["pp"] * table["dp"] * table["tp"])
        for r in s["ranks"]:
            row = next(x for x in table["rows"] if x["stage"] == r["stage"] and x["dp"] == r["dp"])
            busy = sum(x["duration_ms"] for x in row["slots"] if x["kind"] in compute)
            # (the JSON rounds times to the nanosecond; the profile holds them exactly)
            self.assertAlmostEqual(r["compute"], 2 * busy / 1e3, places=7, msg=r["label"])
            idle = sum(x["duration_ms"] for x in row["slots"] if x["kind"] == "idle")
            self.assertAlmostEqual(r["idle"], 2 * idle / 1e3, places=7, msg=r["label"])
        for link, t in zip(s["links"], table["links"]):
            self.assertEqual(link["transfers"], 2 * len(t["transfers"]))
            self.assertEqual(link["bytes"], 2 * sum(x["bytes"] for x in t["transfers"]))
            busy_ms = atlas_report.union_length([(x["start_ms"], x["end_ms"])
                                                 for x in t["transfers"]])
            self.assertAlmostEqual(link["busy_s"], 2 * busy_ms / 1e3, places=7)
        with open(trace, encoding="utf-8") as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        slots = sum(len(row["slots"]) for row in table["rows"]) * table["tp"] * 2
        self.assertGreaterEqual(len([e for e in events if e.get("ph") == "X"]), slots)

    def test_schedule_against_simulation(self):
        # A "run" 1.3x slower than the simulation everywhere: --against says so per rank and kind.
        table, h5, _ = self.simulated(steps=2)
        table_json = os.path.join(self.dir, "sim.json")
        run_dir = os.path.join(self.dir, "runs", "slow")
        os.makedirs(run_dir)
        make_profile.from_schedule(table_json, os.path.join(run_dir, "profile.h5"), steps=3,
                                   scale=1.3)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--against", h5, "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("against: A = ", out)
        with open(js, encoding="utf-8") as f:
            c = json.load(f)["against"]
        self.assertEqual((c["a"]["steps"], c["b"]["steps"]), (3, 2))
        self.assertAlmostEqual(c["ratio"], 1.3, places=6)
        for r in c["ranks"]:
            a, b = r["compute"]
            self.assertGreater(b, 0)
            self.assertAlmostEqual(a / b, 1.3, places=6, msg=r["label"])
        for k in c["kinds"]:
            self.assertEqual(k["a_per_step"], k["b_per_step"], k["kind"])
            if k["b_ms"]:
                self.assertAlmostEqual(k["a_ms"] / k["b_ms"], 1.3, places=6, msg=k["kind"])
        # Not the same job: a clear error.
        other = os.path.join(self.dir, "runs", "other")
        os.makedirs(other)
        make_profile.handmade(os.path.join(other, "profile.h5"))
        status, _, err = self.report(run_dir, "--against", other, "--no-png")
        self.assertNotEqual(status, 0)
        self.assertIn("not the same job", err)

    def test_schedule_against_pairs_ranks_by_layout_and_skips_in_both(self):
        # The same 6 ranks in another layout (tp 2 x dp 1 against dp 2): refused, not paired by
        # rank number. --skip-steps leaves the same steps out of both profiles: a profile against
        # itself reads 1.000 (it read 0.895 on a run whose first step was slow).
        _, h5, _ = self.simulated(steps=3)
        other = os.path.join(self.dir, "tp2.h5")
        r = run([ATLAS_BIN, "simulate", DECK, "parallel.dp_size=1", "parallel.tp_size=2", "--profile", other,
                 "--steps", "3"])
        self.assertEqual(r.returncode, 0, r.stderr)
        status, _, err = self.report(h5, "--against", other, "--no-png")
        self.assertEqual(status, 1, err)
        self.assertIn("has no rank at (dc, stage, dp, tp) = (0, 0, 1, 0)", err)
        self.assertIn("another layout, not the same job", err)
        run_dir = os.path.join(self.dir, "runs", "warm")
        os.makedirs(run_dir)
        table_json = os.path.join(self.dir, "sim.json")
        make_profile.from_schedule(table_json, os.path.join(run_dir, "profile.h5"), steps=3)
        js = os.path.join(self.dir, "s.json")
        status, out, err = self.report(run_dir, "--against", run_dir, "--skip-steps", "1", "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            c = json.load(f)["against"]
        self.assertEqual((c["a"]["steps"], c["b"]["steps"]), (2, 2))
        self.assertAlmostEqual(c["ratio"], 1.0, places=9)
        self.assertRegex(out, r"prefill A/B")

    def test_summary_profile_file_of_any_name(self):
        # atlas simulate --profile takes any file name: a profile named x.hdf5 is read as a file,
        # not looked for as x.hdf5/profile.h5.
        run_dir = self.handmade_run()
        other = os.path.join(self.dir, "copy.hdf5")
        with open(os.path.join(run_dir, "profile.h5"), "rb") as a, open(other, "wb") as b:
            b.write(a.read())
        status, out, err = self.report(other, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("# atlas report: run handmade", out)
        status, out, err = self.report(run_dir, "--against", other, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("against: A = ", out)

    def test_summary_rank_without_events_is_noted(self):
        # A rank with no event (a rank that died, a damaged file) reads zeros: the summary says so.
        import h5py
        import numpy as np
        run_dir = self.handmade_run()
        path = os.path.join(run_dir, "profile.h5")
        with h5py.File(path, "r+") as f:
            ev = f["events"]
            keep = np.asarray(ev["world_rank"]) != 1
            for name in list(ev.keys()):
                col = np.asarray(ev[name])[keep]
                del ev[name]
                ev.create_dataset(name, data=col)
        status, out, err = self.report(run_dir, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("# note: rank(s) 1 recorded no event in the analysed steps: their rows are zeros", out)
        status, out, err = self.report(self.handmade_run(), "--no-png")
        self.assertNotIn("recorded no event", out)

    def test_schedule_against_a_simulation_keeps_its_steps(self):
        # --skip-steps leaves a run's warm-up out; a simulated profile has none: a 1-step
        # simulation still compares (it failed with "leaves no step").
        _, h5, _ = self.simulated(steps=1)
        run_dir = os.path.join(self.dir, "runs", "warm1")
        os.makedirs(run_dir)
        make_profile.from_schedule(os.path.join(self.dir, "sim.json"), os.path.join(run_dir, "profile.h5"), steps=3)
        js = os.path.join(self.dir, "k.json")
        status, out, err = self.report(run_dir, "--against", h5, "--skip-steps", "1", "--json", js, "--no-png")
        self.assertEqual(status, 0, err)
        with open(js, encoding="utf-8") as f:
            c = json.load(f)["against"]
        self.assertEqual((c["a"]["steps"], c["b"]["steps"]), (2, 1))
        # A profile that --skip-steps empties is named.
        status, _, err = self.report(h5, "--skip-steps", "1", "--no-png")
        self.assertEqual(status, 1)
        self.assertIn(f"{h5}: --skip-steps 1 leaves no step", err)

    def test_schedule_large_job_gantt_shows_a_selection(self):
        # 160 ranks (4 stages x dp 40): the measured chart draws the dp 0, tp 0 rank of each stage
        # (a 4,608-rank profile made a figure matplotlib refused: an internal error).
        h5 = os.path.join(self.dir, "big.h5")
        r = run([ATLAS_BIN, "simulate", os.path.join(SRC, "inputs", "default.deck"), "cluster.gpus_per_dc=80 80",
                 "parallel.dp_size=40", "--profile", h5, "--steps", "1"])
        self.assertEqual(r.returncode, 0, r.stderr)
        png = os.path.join(self.dir, "big.png")
        status, out, err = self.report(h5, "--out", png)
        self.assertEqual(status, 0, err)
        assert_png(self, png)
        with open(png, "rb") as f:
            height = int.from_bytes(f.read(24)[20:24], "big")
        self.assertLess(height, 1200, "the chart drew every one of the 160 ranks")

    def test_summary_footer_note_and_broken_pipe(self):
        run_dir = self.handmade_run()
        status, out, err = self.report(run_dir, "--no-png")
        self.assertEqual(status, 0, err)
        self.assertIn("--skip-steps 1 gives their mean", out)
        # `atlas report RUN | head -1`: no "internal error", the SIGPIPE status.
        r = subprocess.run(f"set -o pipefail; {ATLAS_BIN} report {run_dir} --no-png | true",
                           shell=True, capture_output=True, text=True, timeout=60, executable="/bin/bash")
        self.assertNotIn("internal error", r.stderr)
        self.assertIn(r.returncode, (0, 141), r.stderr)

    def test_summary_profile_of_a_run_that_did_not_end(self):
        run_dir = os.path.join(self.dir, "runs", "killed")
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "run.json"), "w", encoding="utf-8") as f:
            f.write('{"run":"killed","status":"running","first_step":0,"steps":8}\n')
        status, _, err = self.report(run_dir, "--no-png")
        self.assertEqual(status, 5)
        self.assertIn("its run.json says the run is running: a run writes profile.h5 when it ends", err)

    def test_schedule_predicted_gantt(self):
        path = os.path.join(self.dir, "all.json")
        r = run([ATLAS_BIN, "schedule", DECK, "--json", path, "--quiet"])
        self.assertEqual(r.returncode, 0, r.stderr)
        png = os.path.join(self.dir, "predicted.png")
        status, out, err = self.report("--schedule-json", path, "--out", png)
        self.assertEqual(status, 0, err)
        self.assertIn("predicted: gpipe 1f1b atlas", out)
        assert_png(self, png)
        png1 = os.path.join(self.dir, "atlas.png")
        status, out, err = self.report("--schedule-json", path, "--out", png1, "--kind", "atlas")
        self.assertEqual(status, 0, err)
        assert_png(self, png1)
        status, _, err = self.report("--schedule-json", path)
        self.assertEqual(status, 1)
        self.assertIn("--schedule-json needs --out PNG", err)
        status, _, err = self.report("--schedule-json", os.path.join(self.dir, "none.json"),
                                     "--out", png)
        self.assertEqual(status, 5)
        self.assertIn("none.json: no such file", err)

    # ---- the atlas binary: `atlas report` finds and runs the script ----

    def test_cli_atlas_report(self):
        run_dir = self.handmade_run()
        js = os.path.join(self.dir, "cli.json")
        env = dict(os.environ, ATLAS_ROOT=SRC)
        r = run([ATLAS_BIN, "report", run_dir, "--json", js, "--step", "1"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# atlas report: run handmade", r.stdout)
        assert_png(self, os.path.join(run_dir, "gantt.png"))
        with open(js, encoding="utf-8") as f:
            self.assertAlmostEqual(json.load(f)["ranks"][0]["utilization"], 0.6875)
        # Without ATLAS_ROOT it finds the script next to the binary or in its source tree.
        env.pop("ATLAS_ROOT")
        r = run([ATLAS_BIN, "report", run_dir, "--no-png"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_cli_python_must_be_a_path(self):
        # ATLAS_PYTHON=python3 named this directory's file; it is refused with the fix.
        run_dir = self.handmade_run()
        r = run([ATLAS_BIN, "report", run_dir, "--no-png"], env=dict(os.environ, ATLAS_ROOT=SRC, ATLAS_PYTHON="python3"))
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("ATLAS_PYTHON = python3 is not a path", r.stderr)
        self.assertIn("hint: set ATLAS_PYTHON to a python3's path, e.g. ATLAS_PYTHON=$(command -v python3)", r.stderr)

    def test_cli_errors(self):
        r = run([ATLAS_BIN, "report"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("atlas report needs one run directory", r.stderr)
        r = run([ATLAS_BIN, "report", os.path.join(self.dir, "missing")])
        self.assertEqual(r.returncode, 5)
        self.assertIn("missing: no such run directory", r.stderr)
        r = run([ATLAS_BIN, "report", self.handmade_run(), "--step", "x"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("--step expects an integer", r.stderr)
        env = dict(os.environ, ATLAS_PYTHON=os.path.join(self.dir, "no-python"))
        r = run([ATLAS_BIN, "report", self.handmade_run()], env=env)
        self.assertEqual(r.returncode, 5)
        self.assertIn("no-python is not an executable", r.stderr)
        self.assertIn("apt-get install python3 python3-h5py python3-matplotlib", r.stderr)
        r = run([ATLAS_BIN, "report", self.handmade_run(), "--no-png"],
                env=dict(os.environ, ATLAS_PYTHON=sys.executable, ATLAS_ROOT="/nonexistent"),
                cwd="/")
        # ATLAS_ROOT is wrong but the binary's own tree still has the script.
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
