"""Shared setup for the review repros: run from the repo root on the GPU machine,
    CMA_LIBRARY=.../libcma.so python3 repro/<name>.py"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integrations", "python"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def deterministic(torch):
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def finish(results):
    bad = [n for n, ok, _ in results if not ok]
    for n, ok, why in results:
        print(f"{'PASS' if ok else 'FAIL'} {n}{': ' + why if why else ''}", flush=True)
    print(f"{'FAIL' if bad else 'PASS'} all ({len(bad)} failed)", flush=True)
    sys.exit(1 if bad else 0)
