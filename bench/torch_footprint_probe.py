"""Where a route's device memory goes beyond what its allocator reserves.

One fresh process per route (native, expandable segments, cma's default
route). Each measures cudaMemGetInfo's used memory against the allocator's
own reserved bytes at three points: after its first tiny tensor, after 3000
tensors of mixed sizes (small-pool and large), and after a bf16 matmul has
created cuBLAS's handle and workspace. What is left over ("unexplained") is
what the device holds that the allocator does not count.

    python3 torch_footprint_probe.py --json out.json
"""
import argparse
import json
import os
import random
import subprocess
import sys

ROUTES = ("native", "expandable", "cma")


def reserved(route):
    import torch
    if route == "cma":
        import cma.torch as cmat
        return cmat.memory_stats()["reserved_bytes.all.current"]
    return torch.cuda.memory_reserved()


def probe(route):
    import torch
    if route == "cma":  # before CUDA is initialised, as PyTorch requires
        import cma.torch as cmat
        cmat.use_as_default()
    torch.cuda.init()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    out = {"route": route}

    def point(name):
        torch.cuda.synchronize()
        used = free0 - torch.cuda.mem_get_info()[0]
        out[name] = {"used": used, "reserved": reserved(route), "unexplained": used - reserved(route)}

    keep = [torch.empty(1, device="cuda")]
    point("first_tensor")
    rng = random.Random(7)
    for _ in range(3000):
        if rng.random() < 0.6:
            n = rng.randrange(512, 1 << 20)  # small pool
        else:
            n = rng.randrange(1 << 20, 8 << 20)
        keep.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
    point("mixed_tensors")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    keep.append(a @ a)
    point("after_matmul")
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--route", default="")
    a = ap.parse_args()
    if a.route:
        probe(a.route)
        return
    runs = {}
    for route in ROUTES:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if route == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        if route == "cma":
            env.setdefault("CMA_ALLOC_CONF", "managed_budget:16G")
        r = subprocess.run([sys.executable, __file__, "--route", route], env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            sys.exit(1)
        runs[route] = json.loads(r.stdout.strip().splitlines()[-1])
    print("%-11s %-14s %12s %12s %12s" % ("route", "point", "used_MiB", "reserved_MiB",
                                          "unexplained"))
    for route, r in runs.items():
        for name in ("first_tensor", "mixed_tensors", "after_matmul"):
            p = r[name]
            print("%-11s %-14s %12.1f %12.1f %12.1f" % (route, name, p["used"] / 2**20,
                                                        p["reserved"] / 2**20,
                                                        p["unexplained"] / 2**20))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
