"""render_results.py on small synthetic results: tables have the rows and
columns of the data, and a comparison puts both files side by side."""
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render_results  # noqa: E402

CUDA = {"backend": "cuda", "device": "H200", "date": "d1",
        "latency": [{"bytes": 512, "cached_pair_ns": 100.0, "raw_pair_ns": 9000.0},
                    {"bytes": 1 << 20, "cached_pair_ns": 101.0, "raw_pair_ns": 9500.0}],
        "replay": [{"trace": "t.csv", "peak_requested": 10, "peak_reserved": 12, "ratio": 1.2,
                    "backend_allocs": 3, "ns_per_op": 50.0}],
        "migration": {"first_touch": [{"case": "fresh_segment", "policy": "on_alloc",
                                       "GBps": 231.4}], "move_h2d_GBps": 48.4},
        "symmetric": {"cached_alloc_ns": 78.0, "first_alloc_breakdown_us": {"VmmCreate": 1}}}
HIP = {"backend": "hip", "device": "MI300X", "date": "d2",
       "latency": [{"bytes": 512, "cached_pair_ns": 120.0, "raw_pair_ns": 7000.0}]}


class RenderTest(unittest.TestCase):
    def test_single_file_tables(self):
        md = render_results.markdown([CUDA])
        self.assertIn("| bytes | cached_pair_ns | raw_pair_ns |", md)
        self.assertIn("| 1 MiB | 101.0 | 9,500.0 |", md)
        self.assertIn("| 0 | t.csv | 10 | 12 | 1.2 | 3 | 50.0 |", md)
        self.assertIn("first write: fresh_segment (on_alloc) | 231.4", md)
        self.assertIn("| 0 | move_h2d | 48.4 |", md)
        self.assertIn("cached_alloc_ns | 78.0", md)
        self.assertNotIn("VmmCreate", md)  # nested breakdowns stay in the JSON

    def test_comparison_side_by_side(self):
        md = render_results.markdown([CUDA, HIP])
        self.assertIn("cached_pair_ns [0] | raw_pair_ns [0] | cached_pair_ns [1]", md)
        self.assertIn("| 512 B | 100.0 | 9,000.0 | 120.0 | 7,000.0 |", md)
        self.assertIn("| 1 MiB | 101.0 | 9,500.0 |  |  |", md)  # HIP had no 1 MiB row
        self.assertIn("[1] hip (MI300X), d2", md)

    def test_files_name_their_runtime(self):
        hip = dict(HIP, runtime="HIP 50221153 (/x/hip_on_cuda/libamdhip64.so)", xnack="absent",
                   managed_memory="no xnack feature in the target (target sm_90)")
        cuda = dict(CUDA, runtime="CUDA runtime 13000, driver 13000")
        md = render_results.markdown([hip, cuda])
        self.assertIn("[0] hip (MI300X), d2, runtime HIP 50221153 "
                      "(/x/hip_on_cuda/libamdhip64.so), XNACK absent", md)
        self.assertIn("[1] cuda (H200), d1, runtime CUDA runtime 13000, driver 13000", md)
        self.assertIn("- [0] managed memory: no xnack feature in the target (target sm_90)", md)
        self.assertNotIn("runtime", render_results.markdown([HIP]))  # older files: unchanged

    def test_cli_writes_markdown(self):
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "r.json"), os.path.join(d, "r.md")
            with open(src, "w") as f:
                json.dump(CUDA, f)
            self.assertEqual(render_results.main([src, "--out", out]), 0)
            with open(out) as f:
                self.assertIn("## Latency", f.read())
            with self.assertRaises(SystemExit):
                render_results.main([src, src, src])


if __name__ == "__main__":
    unittest.main()
