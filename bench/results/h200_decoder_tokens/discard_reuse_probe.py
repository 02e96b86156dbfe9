"""Does memory populated right after cma's empty_cache (which discards idle
managed pages) keep what is written into it? Each cycle fills tensors,
frees them, empties the cache, then at once writes known values into new
tensors by three paths (a kernel on the current stream, a kernel on a side
stream, a copy from pageable host memory), waits a random 0-40 ms (the
driver works ~30 ms behind a discard), and checks every element on the GPU.

  PYTHONPATH=py CMA_LIBRARY=py/cma/libcma.so python3 discard_reuse_probe.py SECONDS [native]
"""
import json
import random
import sys
import time

seconds = float(sys.argv[1])
route = sys.argv[2] if len(sys.argv) > 2 else "cma"
if route == "cma":
    import cma.torch as cmat
    cmat.use_as_default()
import torch  # noqa: E402

rng = random.Random(7)
side = torch.cuda.Stream()
host = torch.arange(48 << 18, dtype=torch.int32)  # 48 MiB, pageable
cycles, bad, by_path = 0, 0, {"kernel": 0, "side_stream": 0, "h2d": 0}
t_end = time.monotonic() + seconds
while time.monotonic() < t_end:
    cycles += 1
    junk = [torch.full(((rng.randint(1, 64)) << 18,), -1, dtype=torch.int32, device="cuda")
            for _ in range(rng.randint(1, 6))]
    if rng.random() < 0.5:
        torch.cuda.synchronize()
    del junk
    torch.cuda.empty_cache()
    v = cycles & 0x7FFF
    a = torch.empty((rng.randint(1, 64)) << 18, dtype=torch.int32, device="cuda")
    a.fill_(v)
    with torch.cuda.stream(side):
        b = torch.empty((rng.randint(1, 64)) << 18, dtype=torch.int32, device="cuda")
        b.fill_(v + 1)
    c = host[: (rng.randint(1, 48)) << 18].to("cuda")
    time.sleep(rng.random() * 0.04)
    torch.cuda.synchronize()
    checks = {"kernel": bool((a == v).all()), "side_stream": bool((b == v + 1).all()),
              "h2d": bool(torch.equal(c.cpu(), host[: c.numel()]))}
    for k, ok in checks.items():
        if not ok:
            by_path[k] += 1
            bad += 1
    with torch.cuda.stream(side):
        del b
    del a, c
stats = {}
if route == "cma":
    from cma import _lib
    st = _lib.stats(0)
    stats = {k: st.get(k) for k in ("num_pages_discarded", "discard_calls", "num_discard_waits",
                                   "num_pages_populated", "num_placement_errors")}
print(json.dumps({"route": route, "cycles": cycles, "bad": bad, "by_path": by_path,
                  "cma": stats}))
