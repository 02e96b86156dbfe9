"""t.to('cpu') / t.to('cuda') (copies) against cma.torch.move (zero-copy), 16 MiB
to 4 GiB: time and the memory each needs. Run on a GPU machine:
    CMA_LIBRARY=.../libcma.so python3 bench/torch_move_bench.py --json out.json"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integrations", "python"))
import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402


def timed(f, reps=3):
    best = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = f()
        torch.cuda.synchronize()
        best.append(time.perf_counter() - t0)
        del out
    best.sort()
    return best[len(best) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    pool = cmat.pool()
    rows = []
    for mib in (16, 64, 256, 1024, 4096):
        n = mib << 20
        native = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        to_cpu = timed(lambda: native.to("cpu"))
        host = native.to("cpu")
        to_cuda = timed(lambda: host.to("cuda"))
        copy_peak = torch.cuda.max_memory_allocated() - base + n  # the source plus a new copy
        del native, host
        with torch.cuda.use_mem_pool(pool):
            t = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
        before = cmat.memory_stats()["reserved_bytes.all.current"]
        state = {"t": t}

        def there_and_back(target):
            state["t"] = cmat.move(state["t"], target)
            return None
        # Alternate directions so each timed move really migrates.
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter(); there_and_back("cpu"); t1 = time.perf_counter()
            there_and_back("cuda"); torch.cuda.synchronize(); t2 = time.perf_counter()
            ts.append((t1 - t0, t2 - t1))
        ts.sort()
        move_cpu, move_cuda = ts[1]
        after = cmat.memory_stats()["reserved_bytes.all.current"]
        rows.append({"MiB": mib, "to_cpu_copy_s": to_cpu, "to_cuda_copy_s": to_cuda,
                     "move_to_cpu_s": move_cpu, "move_to_cuda_s": move_cuda,
                     "copy_peak_gpu_bytes": copy_peak, "move_extra_reserved_bytes": after - before,
                     "to_cpu_copy_GBps": n / to_cpu / 1e9, "move_to_cpu_GBps": n / move_cpu / 1e9,
                     "to_cuda_copy_GBps": n / to_cuda / 1e9,
                     "move_to_cuda_GBps": n / move_cuda / 1e9})
        print(json.dumps(rows[-1]))
        del t, state
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_move": rows, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
