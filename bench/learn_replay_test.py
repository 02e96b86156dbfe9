"""bench/learn_replay on the recorded GPT-2 step (h200_issue47/gpt2_fused_step.csv.gz):
the tool runs, its JSON has every step of every device part, and the core it
drives (learn_step:1 on the host backend) never fails an allocation, moves
no more than it sent away back, and makes a plan. No torch or GPU needed."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STEP = os.path.join(HERE, "results", "h200_issue47", "gpt2_fused_step.csv.gz")


def tool():
    for root in (os.environ.get("TEST_SRCDIR", ""), os.getcwd()):
        for rel in ("_main/bench/learn_replay", "bench/learn_replay", "learn_replay"):
            path = os.path.join(root, rel)
            if os.path.exists(path):
                return path
    raise FileNotFoundError("learn_replay binary")


class LearnReplayTest(unittest.TestCase):
    def run_tool(self, *args):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            p = subprocess.run([tool(), "--step=" + STEP, "--json=" + out, *args],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                return json.load(f), p.stdout

    def test_every_part_and_step(self):
        doc, text = self.run_tool("--steps=3", "--fractions=0.6667,0.3333")
        self.assertEqual([round(p["fraction"], 4) for p in doc["parts"]], [0.6667, 0.3333])
        self.assertIn("lower bound", text)
        for part in doc["parts"]:
            self.assertEqual(len(part["steps"]), 3)
            self.assertGreater(part["bound"]["h2d"], 0)
            self.assertGreater(sum(s["plans"] for s in part["steps"]), 0)
            brought = sum(s["brought"] for s in part["steps"])
            sent = sum(s["sent"] for s in part["steps"])
            self.assertLessEqual(brought, sent)
            for s in part["steps"]:
                self.assertEqual(s["failed_allocations"], 0)

    def test_no_stamp_is_lost(self):
        # Every allocation stamped when made and at each use, the stamps
        # checked at each use and free: the host backend zeroes what a
        # discard drops, so a discard that reached live data would show.
        doc, text = self.run_tool("--steps=3", "--fractions=0.5", "--check_data")
        self.assertIn("data!", text)
        steps = doc["parts"][0]["steps"]
        self.assertGreater(sum(s["sent"] for s in steps), 0)
        self.assertEqual([s["data_errors"] for s in steps], [0, 0, 0])

    def test_bad_input_is_refused_by_name(self):
        p = subprocess.run([tool(), "--step=" + STEP, "--steps=1"], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--steps", p.stderr)
        p = subprocess.run([tool(), "--step=" + STEP, "--fractions=0.5,x"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--fractions", p.stderr)


if __name__ == "__main__":
    sys.exit(unittest.main())
