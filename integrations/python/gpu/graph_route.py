"""CUDA graphs under one allocator route, in a fresh process, for
torch_gpu_test.py: torch.cuda.graph capture and replay, and
torch.compile(mode="reduce-overhead"), each compared with eager results.
Each case ends "match", "refused: <message>" or "MISMATCH" (never allowed).

    python3 graph_route.py native|default|mempool  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

route = sys.argv[1]
if route != "native":
    import cma.torch as cmat
    if route in ("default", "mempool"):
        cmat.use_as_default()
    pool = torch.cuda.MemPool() if route == "mempool" else None
torch.manual_seed(0)


def in_route(fn):
    if route == "mempool":
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
    # Two batch shapes: cudagraph trees record a graph for each, sharing one
    # private pool (checkpointing and restoring its state between them).
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    small = [x[:16] for x in inputs]
    with torch.no_grad():
        for _ in range(3):
            compiled(inputs[0])
            compiled(small[0])
        results = []
        for x, xs in zip(inputs, small):
            results.append(compiled(x).clone())
            results.append(compiled(xs).clone())
    return results


def graphed_callables_case():
    g_model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()).cuda()
    ref.load_state_dict(g_model.state_dict())
    x = torch.randn(64, 512, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(g_model, (x,))
    got, want = [], []
    for inp in inputs:
        a = inp.clone().requires_grad_()
        out_g = graphed(a)
        out_g.sum().backward()
        got += [out_g.detach().clone(), a.grad.clone()]
        b = inp.clone().requires_grad_()
        out_r = ref(b)
        out_r.sum().backward()
        want += [out_r.detach().clone(), b.grad.clone()]
    return got, want


def compared(case):
    got = in_route(case)
    if isinstance(got, tuple):
        return got
    if case is compile_case:
        with torch.no_grad():
            want = []
            for x in inputs:
                want += [model(x), model(x[:16])]
        return got, want
    return got, eager


for name, case in (("cuda_graph", graph_case), ("compile_reduce_overhead", compile_case),
                   ("graphed_callables", graphed_callables_case)):
    try:
        got, want = compared(case)
        torch.cuda.synchronize()
        same = len(got) == len(want) and all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want))
        out[name] = "match" if same else "MISMATCH"
    except Exception as e:  # noqa: BLE001 - a refusal is reported, not hidden
        out[name] = "refused: " + str(e).splitlines()[0][:300]
    torch.cuda.synchronize()
# The process keeps working after a refusal.
with torch.no_grad():
    out["eager_after"] = bool(torch.allclose(model(inputs[0]), eager[0]))
print(json.dumps(out))
