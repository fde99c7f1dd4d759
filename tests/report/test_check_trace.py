#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Tests scripts/report/check_trace.py on the real writer's output (atlas::runtime::
# chrome_trace_json through tests/report/write_trace.cpp, events from the deck's schedule
# table) and on broken traces, each of which must be rejected with a message naming the problem.
# Environment: ATLAS_SOURCE_DIR, ATLAS_WRITE_TRACE (the write_trace binary). Exit 77 = skipped.
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("ATLAS_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WRITE_TRACE = os.environ.get("ATLAS_WRITE_TRACE", os.path.join(SRC, "build", "tests",
                                                               "write_trace"))
CHECK = os.path.join(SRC, "scripts", "report", "check_trace.py")
DECK = os.path.join(SRC, "inputs", "three_dc_cpu.deck")

if importlib.util.find_spec("jsonschema") is None:
    print(f"SKIP: {sys.executable} has no module jsonschema (apt-get install python3-jsonschema)")
    sys.exit(77)


sys.path.insert(0, os.path.dirname(CHECK))
import check_trace  # noqa: E402


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


class CheckTrace(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="atlas-trace-test.")
        cls.trace = os.path.join(cls.tmp.name, "trace.json")
        r = run([WRITE_TRACE, DECK, cls.trace, "schedule.kind=atlas"])
        if r.returncode != 0:
            raise RuntimeError(f"write_trace failed ({r.returncode}): {r.stderr}")
        with open(cls.trace, encoding="utf-8") as f:
            cls.good = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, path, *flags):
        return run([sys.executable, CHECK, path, *flags])

    def write(self, name, obj=None, text=None):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text if text is not None else json.dumps(obj))
        return path

    def test_writer_output_is_valid(self):
        r = self.check(self.trace, "--strict")
        self.assertEqual(r.returncode, 0, r.stderr)
        events = self.good["traceEvents"]
        # Every slot of every rank's table row, 2 steps, plus one WAN-track event per wan_send.
        # The rows come from the schedule table itself (atlas schedule --json).
        table_json = os.path.join(self.tmp.name, "table.json")
        r2 = run([os.environ.get("ATLAS_BIN", os.path.join(SRC, "build", "bin", "atlas")), "schedule", DECK,
                  "--kind", "atlas", "--quiet", "--json", table_json])
        self.assertEqual(r2.returncode, 0, r2.stderr)
        with open(table_json, encoding="utf-8") as f:
            table = json.load(f)[0]
        slots = sum(len(row["slots"]) for row in table["rows"])
        x_rank = [e for e in events if e["ph"] == "X" and e["pid"] != 1000]
        x_link = [e for e in events if e["ph"] == "X" and e["pid"] == 1000]
        self.assertEqual(len(x_rank), 2 * slots)
        self.assertEqual(len(x_link), 2 * 4 * 12)  # 4 links x 12 transfers per step
        self.assertIn(f"{len(events)} events", r.stdout)
        names = {e["args"]["name"] for e in events if e["ph"] == "M"}
        self.assertTrue({"DC east", "DC west", "DC south", "WAN links"} <= names, names)

    def test_other_schedules_and_escaped_labels(self):
        for kind in ("gpipe", "1f1b"):
            path = os.path.join(self.tmp.name, f"trace_{kind}.json")
            r = run([WRITE_TRACE, DECK, path, f"schedule.kind={kind}",
                     "--dc-name-suffix", ' "q" \\b'])
            self.assertEqual(r.returncode, 0, r.stderr)
            r = self.check(path)  # shared links may overlap: warnings allowed, errors not
            self.assertEqual(r.returncode, 0, f"{kind}: {r.stderr}")
            with open(path, encoding="utf-8") as f:
                names = {e["args"]["name"] for e in json.load(f)["traceEvents"] if e["ph"] == "M"}
            self.assertIn('DC east "q" \\b', names)

    def broken(self, mutate):
        t = copy.deepcopy(self.good)
        mutate(t)
        return t

    def first_x(self, t):
        return next(e for e in t["traceEvents"] if e["ph"] == "X")

    def test_broken_traces_fail(self):
        cases = {
            "no traceEvents": (lambda t: t.pop("traceEvents"),
                               "(root): 'traceEvents' is a required property"),
            "traceEvents not a list": (lambda t: t.update(traceEvents={}),
                                       "traceEvents: {} is not of type 'array'"),
            "unknown phase": (lambda t: self.first_x(t).update(ph="Q"), "'Q' is not one of"),
            "X without dur": (lambda t: self.first_x(t).pop("dur"),
                              "'dur' is a required property"),
            "negative dur": (lambda t: self.first_x(t).update(dur=-1.0),
                             "-1.0 is less than the minimum of 0"),
            "string ts": (lambda t: self.first_x(t).update(ts="12"), "'12' is not of type 'number'"),
            "string pid": (lambda t: self.first_x(t).update(pid="0"),
                           "'0' is not of type 'integer'"),
            "missing name": (lambda t: self.first_x(t).pop("name"),
                             "'name' is a required property"),
            "bad metadata name": (lambda t: t["traceEvents"][0].update(name="dc_name"),
                                  "'dc_name' is not one of"),
            "unnamed track": (lambda t: self.first_x(t).update(tid=99),
                              "pid 0 tid 99 has no thread_name"),
        }
        for what, (mutate, message) in cases.items():
            with self.subTest(what):
                errors, _ = check_trace.problems_of(self.broken(mutate))
                self.assertTrue(any(message in e for e in errors), f"{what}: {errors}")
        # The command line reports them and exits 2 (one case through the script itself).
        path = self.write("broken.json", self.broken(cases["X without dur"][0]))
        r = self.check(path)
        self.assertEqual(r.returncode, 2, f"{r.stdout} {r.stderr}")
        self.assertIn("'dur' is a required property", r.stderr)

    def test_truncated_and_missing_files(self):
        with open(self.trace, encoding="utf-8") as f:
            text = f.read()
        r = self.check(self.write("truncated.json", text=text[: len(text) // 2]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not JSON", r.stderr)
        r = self.check(os.path.join(self.tmp.name, "absent.json"))
        self.assertEqual(r.returncode, 5)
        self.assertIn("cannot read", r.stderr)

    def test_overlap_is_a_warning_and_strict_makes_it_an_error(self):
        t = copy.deepcopy(self.good)
        xs = [e for e in t["traceEvents"] if e["ph"] == "X" and e["dur"] > 0]
        a = xs[0]
        b = next(e for e in xs[1:] if (e["pid"], e["tid"]) == (a["pid"], a["tid"]))
        b["ts"] = a["ts"] + a["dur"] / 2  # starts inside a, ends after it
        b["dur"] = a["dur"]
        path = self.write("overlap.json", t)
        r = self.check(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("WARNING", r.stderr)
        self.assertIn("without nesting", r.stderr)
        r = self.check(path, "--strict")
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
