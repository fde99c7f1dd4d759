#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# The report on corrupted profile.h5 files (issue 27, item 12): each variant of a good profile
# (missing datasets, wrong types and shapes, a cut or overwritten file, NaN/inf values, negative
# durations, empty tables, not HDF5 at all) must end in one clear "ERROR:" line with a non-zero
# exit status and no traceback, or in a correct report; never exit 0 with rows of nan/inf.
# Every variant runs through atlas_report.main in this process (an exception escaping it is a
# traceback); a few also through `atlas report` (the C++ command passes the script's status on).
# Environment: ATLAS_SOURCE_DIR (checkout), ATLAS_BIN (the atlas binary). Exit 77 = skipped.
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("ATLAS_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ATLAS_BIN = os.environ.get("ATLAS_BIN", os.path.join(SRC, "build", "bin", "atlas"))
REPORT = os.environ.get("ATLAS_REPORT_SCRIPT", os.path.join(SRC, "scripts", "report", "atlas_report.py"))

for module, package in (("h5py", "python3-h5py"), ("numpy", "python3-numpy")):
    if importlib.util.find_spec(module) is None:
        print(f"SKIP: {sys.executable} has no module {module} (apt-get install {package})")
        sys.exit(77)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(SRC, "tests", "report"))
import make_profile  # noqa: E402

NONFINITE = re.compile(r"\b(nan|inf)\b", re.IGNORECASE)


# ---- the variants: each takes the path of a good profile and damages it ----

def replace(group, name, data, **kw):
    def edit(path):
        with h5py.File(path, "r+") as f:
            g = f[group] if group else f
            del g[name]
            g.create_dataset(name, data=data, **kw)
    return edit


def set_values(group, name, index, value):
    def edit(path):
        with h5py.File(path, "r+") as f:
            d = f[group][name]
            a = d[()]
            a[index] = value
            d[...] = a
    return edit


def set_attr(name, value):
    def edit(path):
        with h5py.File(path, "r+") as f:
            f.attrs[name] = value
    return edit


def delete(name):
    def edit(path):
        with h5py.File(path, "r+") as f:
            if name.startswith("attr:"):
                del f.attrs[name[5:]]
            else:
                del f[name]
    return edit


def truncate(fraction):
    def edit(path):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(int(size * fraction))
    return edit


def overwrite(offset_fraction, nbytes):
    def edit(path):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(int(size * offset_fraction))
            f.write(bytes((i * 37 + 11) % 256 for i in range(nbytes)))
    return edit


def write_bytes(data):
    def edit(path):
        with open(path, "wb") as f:
            f.write(data)
    return edit


def all_events(name, value):
    def edit(path):
        with h5py.File(path, "r+") as f:
            d = f["events"][name]
            d[...] = np.full(d.shape, value, dtype=d.dtype)
    return edit


def events_as_dataset(path):
    with h5py.File(path, "r+") as f:
        del f["events"]
        f.create_dataset("events", data=np.zeros(4))


def schedule_json(text):
    def edit(path):
        with h5py.File(path, "r+") as f:
            del f["schedule_json"]
            f.create_dataset("schedule_json", data=text, dtype=h5py.string_dtype("utf-8"))
    return edit


def empty_tables(path):
    with h5py.File(path, "r+") as f:
        for group in ("events",):
            for name in list(f[group].keys()):
                dtype = f[group][name].dtype
                del f[group][name]
                f[group].create_dataset(name, data=np.zeros(0, dtype=dtype))


VARIANTS = {
    "not_hdf5_text": write_bytes(b"this is not an HDF5 file\n" * 10),
    "empty_file": write_bytes(b""),
    "garbage_bytes": write_bytes(bytes((i * 131 + 7) % 256 for i in range(4096))),
    "truncated_half": truncate(0.5),
    "truncated_tail": truncate(0.9),
    "overwritten_middle": overwrite(0.45, 2048),
    "overwritten_head": overwrite(0.0, 512),
    "no_format_attr": delete("attr:format"),
    "version_text": set_attr("version", "one"),
    "world_size_text": set_attr("world_size", "two"),
    "world_size_zero": set_attr("world_size", np.int32(0)),
    "world_size_empty": set_attr("world_size", np.zeros(0, dtype=np.int32)),
    "predicted_step_nan": set_attr("predicted_step_ms", float("nan")),
    "predicted_step_inf": set_attr("predicted_step_ms", float("inf")),
    "predicted_step_negative": set_attr("predicted_step_ms", -5.0),
    "no_events_group": delete("events"),
    "events_is_dataset": events_as_dataset,
    "no_events_bytes": delete("events/bytes"),
    "events_length_mismatch": replace("events", "end_s", np.zeros(3)),
    "events_empty": empty_tables,
    "start_nan": set_values("events", "start_s", 3, float("nan")),
    "end_inf": set_values("events", "end_s", 2, float("inf")),
    "complete_nan": set_values("events", "complete_s", 1, float("nan")),
    "predicted_ms_nan": set_values("events", "predicted_ms", 0, float("nan")),
    "predicted_ms_inf": all_events("predicted_ms", float("inf")),
    "negative_duration": set_values("events", "end_s", 0, -100.0),
    "negative_bytes": set_values("events", "bytes", 1, -10**9),
    "kind_out_of_range": set_values("events", "kind", 0, 99),
    "kind_float": replace("events", "kind", np.linspace(0.5, 3.5, 30)),
    "kind_text": replace("events", "kind", np.array([b"forward"] * 30)),
    "rank_out_of_range": set_values("events", "world_rank", 0, 7),
    "link_out_of_range": set_values("events", "link", 1, 9),
    "steps_all_negative": all_events("step", -1),
    "events_2d": replace("events", "start_s", np.zeros((2, 2))),
    "ranks_short": replace("ranks", "dc", np.zeros(1, dtype=np.int32)),
    "step_time_nan": set_values("steps", "step_time_s", 0, float("nan")),
    "step_time_negative": set_values("steps", "step_time_s", 1, -8.2),
    "schedule_not_json": schedule_json("{not json"),
    "schedule_rows_not_objects": schedule_json(json.dumps({"kind": "1f1b", "rows": [1, 2]})),
    "schedule_bubble_nan": schedule_json(json.dumps(
        {"kind": "1f1b", "rows": [{"stage": 0, "dp": 0, "bubble_fraction": float("nan")}]})),
    "schedule_number": schedule_json("42"),
    "no_schedule_json": delete("schedule_json"),
    # /exchanges (optional, the tied-embedding exchanges)
    "exchange_dc_out_of_range": set_values("exchanges", "dst_dc", 0, 5),
    "exchange_dc_not_the_ranks": set_values("exchanges", "src_dc", 0, 1),
    "exchange_peer_out_of_range": set_values("exchanges", "peer", 1, 9),
    "exchange_negative_bytes": set_values("exchanges", "bytes", 0, -4),
    "exchange_complete_nan": set_values("exchanges", "complete_s", 1, float("nan")),
    "exchange_backwards": set_values("exchanges", "complete_s", 0, -1.0),
    "exchange_length_mismatch": replace("exchanges", "start_s", np.zeros(5)),
    "exchange_bytes_float": replace("exchanges", "bytes", np.array([0.5, 1.5])),
}

# The good profile's exchanges (rank 0 east > west, rank 1 back, step 0).
GOOD_EXCHANGES = [
    {"world_rank": 0, "step": 0, "peer": 1, "src_dc": 0, "dst_dc": 1, "bytes": 4096, "start_s": 7.5,
     "complete_s": 7.9},
    {"world_rank": 1, "step": 0, "peer": 0, "src_dc": 1, "dst_dc": 0, "bytes": 4096, "start_s": 7.5,
     "complete_s": 7.9}]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def load_report_module():
    spec = importlib.util.spec_from_file_location("atlas_report_under_test", REPORT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT_MODULE = load_report_module()


def report(*args):
    """atlas_report.main in this process, as a CompletedProcess; an exception that escapes main
    is what the user would see as a traceback."""
    import contextlib
    import io
    import traceback
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = REPORT_MODULE.main(list(args))
        except SystemExit as e:
            status = e.code
        except Exception:  # noqa: BLE001
            err.write(traceback.format_exc())
            status = 1
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


class CorruptProfiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="atlas-report-corrupt.")
        cls.good = os.path.join(cls.tmp.name, "good.h5")
        make_profile.handmade(cls.good, exchanges=GOOD_EXCHANGES)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def variant(self, name):
        d = os.path.join(self.tmp.name, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "profile.h5")
        shutil.copyfile(self.good, path)
        VARIANTS[name](path)
        return d, path

    def check(self, name, result, label):
        where = f"{label} on variant '{name}' (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        self.assertNotIn("Traceback", result.stderr, where)
        self.assertGreaterEqual(result.returncode, 0, "killed by a signal: " + where)
        if result.returncode == 0:
            self.assertIsNone(NONFINITE.search(result.stdout), "nan/inf in a report that exit 0: " + where)
        else:
            self.assertIn(result.returncode, (2, 5), where)
            lines = [x for x in result.stderr.splitlines() if x.strip()]
            self.assertEqual(len(lines), 1, "expected one error line: " + where)
            self.assertTrue(lines[0].startswith("ERROR: "), where)
            self.assertIn("profile.h5", lines[0], "the message names the file: " + where)

    def test_good_profile_reports(self):
        r = run([sys.executable, REPORT, self.good, "--no-png"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("# atlas report: run handmade", r.stdout)

    def test_every_variant_through_the_script(self):
        self.assertGreaterEqual(len(VARIANTS), 28)
        for name in VARIANTS:
            with self.subTest(variant=name):
                d, _ = self.variant(name)
                self.check(name, report(d, "--no-png"), "atlas_report.py")

    def test_nonfinite_and_negative_values_are_errors(self):
        # These used to print rows of nan/inf (or negative times) and exit 0.
        for name, pattern in (("predicted_step_nan", r"predicted_step_ms = nan: expected a finite number"),
                              ("start_nan", r"/events/start_s\[3\] = nan: expected a finite number"),
                              ("predicted_ms_inf", r"/events/predicted_ms\[0\] = inf"),
                              ("step_time_nan", r"/steps/step_time_s\[0\] = nan"),
                              ("negative_duration", r"end_s is before start_s: a negative duration"),
                              ("negative_bytes", r"bytes is negative"),
                              ("kind_float", r"/events/kind has type float64: expected integers"),
                              ("version_text", r"root attribute version = .*: expected an integer"),
                              ("schedule_rows_not_objects", r"/schedule_json row 0 = 1: expected an object")):
            with self.subTest(variant=name):
                d, _ = self.variant(name)
                r = report(d, "--no-png")
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertRegex(r.stderr, pattern)

    def test_atlas_report_passes_the_status_on(self):
        if not os.access(ATLAS_BIN, os.X_OK):
            self.skipTest(f"no atlas binary at {ATLAS_BIN}")
        for name in ("garbage_bytes", "truncated_half", "start_nan", "kind_text", "schedule_number"):
            with self.subTest(variant=name):
                d, _ = self.variant(name)
                r = run([ATLAS_BIN, "report", d, "--no-png"])
                self.check(name, r, "atlas report")
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
