#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Tests scripts/report/compute_overlap.py on a hand-made trace whose overlaps and stretches are
# known, and its failure paths (unreadable file, no compute slot, bad --cores).
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("ATLAS_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(SRC, "scripts", "report", "compute_overlap.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import compute_overlap  # noqa: E402


def x(name, pid, tid, ts_ms, dur_ms, step=3):
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3,
            "args": {"step": step}}


# Rank 0: forward 0-10 ms (rank 1 computes all of it beside it) and 20-25 ms (alone); rank 1:
# forward 0-10, backward 30-50 (alone). A WAN transfer, a receive and a warm-up step's slot are
# not compute slots of the analysed steps.
EVENTS = [x("forward m0", 0, 0, 0, 10), x("forward m1", 0, 0, 20, 5), x("forward m0", 0, 1, 0, 10),
          x("backward m0", 0, 1, 30, 20), x("m0 r0->r1", 1000, 0, 0, 40), x("wan_recv m1", 0, 1, 10, 20),
          x("forward m0", 0, 0, 30, 1, step=0)]


class ComputeOverlap(unittest.TestCase):
    def test_concurrency_stretch_and_sharing_per_row(self):
        rows = compute_overlap.overlap_table(compute_overlap.compute_slots(EVENTS, 2), 2.0)
        self.assertEqual([r[0] for r in rows], [1.0, 2.0])
        alone, pair = rows
        # Alone: rank 0's 5 ms forward (its shortest: stretch 1) and rank 1's backward; 25 of 45 ms.
        self.assertEqual(alone[1], 2)
        self.assertAlmostEqual(alone[2], 25 / 45)
        self.assertAlmostEqual(alone[3], 1.0)
        self.assertAlmostEqual(alone[4], 1.0)
        # Side by side: rank 0's 10 ms forward is twice its shortest, rank 1's is its shortest.
        self.assertEqual(pair[1], 2)
        self.assertAlmostEqual(pair[2], 20 / 45)
        self.assertAlmostEqual(pair[3], 1.5)
        self.assertAlmostEqual(pair[4], 1.0)  # two ranks on two cores: no sharing
        one_core = compute_overlap.overlap_table(compute_overlap.compute_slots(EVENTS, 2), 1.0)
        self.assertAlmostEqual(one_core[1][4], 2.0)

    def test_the_command_prints_the_rows_and_fails_clearly(self):
        with tempfile.TemporaryDirectory(prefix="atlas-overlap-test.") as tmp:
            good = os.path.join(tmp, "trace.json")
            with open(good, "w", encoding="utf-8") as f:
                json.dump({"traceEvents": EVENTS}, f)
            r = subprocess.run([sys.executable, SCRIPT, good, "--cores", "2"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("4 compute slots", r.stdout)
            self.assertRegex(r.stdout, r"2\.0\s+2\s+44%\s+1\.50\s+1\.00")
            r = subprocess.run([sys.executable, SCRIPT, os.path.join(tmp, "missing.json")], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 5)
            self.assertIn("cannot read", r.stderr)
            r = subprocess.run([sys.executable, SCRIPT, good, "--skip-steps", "9"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("no forward/backward slot past step 9", r.stderr)
            r = subprocess.run([sys.executable, SCRIPT, good, "--cores", "0"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)


if __name__ == "__main__":
    unittest.main()
