"""CUDA graphs under one allocator route, in a fresh process, for
torch_gpu_test.py: torch.cuda.graph capture and replay, and
torch.compile(mode="reduce-overhead"), each compared with eager results.
Each case ends "match", "refused: <message>" or "MISMATCH" (never allowed).

    python3 graph_route.py native|default|pool  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

route = sys.argv[1]
if route != "native":
    import cma.torch as cmat
    if route == "default":
        cmat.use_as_default()
    pool = cmat.pool() if route == "pool" else None
torch.manual_seed(0)


def in_route(fn):
    if route == "pool":
        with torch.cuda.use_mem_pool(pool):
            return fn()
    return fn()


model = in_route(lambda: torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                             torch.nn.Linear(1024, 512)).cuda())
inputs = [in_route(lambda: torch.randn(64, 512, device="cuda")) for _ in range(3)]
with torch.no_grad():
    eager = [model(x) for x in inputs]
out = {"route": route}


def graph_case():
    static_in = in_route(lambda: torch.zeros(64, 512, device="cuda"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_out = model(static_in)
    results = []
    for x in inputs:
        static_in.copy_(x)
        g.replay()
        results.append(static_out.clone())
    return results


def compile_case():
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            compiled(inputs[0])
        return [compiled(x).clone() for x in inputs]


for name, case in (("cuda_graph", graph_case), ("compile_reduce_overhead", compile_case)):
    try:
        got = in_route(case)
        torch.cuda.synchronize()
        same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, eager))
        out[name] = "match" if same else "MISMATCH"
    except Exception as e:  # noqa: BLE001 - a refusal is reported, not hidden
        out[name] = "refused: " + str(e).splitlines()[0][:300]
    torch.cuda.synchronize()
# The process keeps working after a refusal.
with torch.no_grad():
    out["eager_after"] = bool(torch.allclose(model(inputs[0]), eager[0]))
print(json.dumps(out))
