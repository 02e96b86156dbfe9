"""Sharing CUDA tensors between processes (issue 49), in a fresh process, for
torch_gpu_test.py. Under cma (route default) every way torch.multiprocessing
shares a CUDA tensor refuses in the calling thread, within seconds, with
cma's message naming the ways out, and the queue and its consumer (a spawned
process on PyTorch's allocator) go on; the way out through the CPU works.
Under PyTorch's allocator (route native) the same queue shares, as a check
of the script itself.

    python3 ipc_route.py native|default
        -> JSON {route, allocator, <check>: True or how it failed, ...}"""
import faulthandler
import json
import os
import sys
import time

faulthandler.enable()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.multiprocessing import reductions  # noqa: E402

from route_checks import make_check  # noqa: E402

REFUSAL = "caching_managed_allocator does not support shareIpcHandle"
WAYS_OUT = ("t.cpu()", "cma.torch.symmetric")
LIMIT_S = 5.0  # a refusal must come this fast: the feeder thread never sees it


def consume(q, results):
    """The consumer, spawned: reports what it got (a spawned process runs
    PyTorch's allocator: nothing here installs cma)."""
    while True:
        item = q.get()
        if item is None:
            return
        if isinstance(item, torch.Tensor):
            results.put(("tensor", item.device.type, float(item.sum())))
            del item
        else:
            results.put(("other", repr(item)))


def refused(send):
    """True when send() raised cma's refusal, naming the ways out, in time."""
    start = time.monotonic()
    try:
        send()
    except RuntimeError as e:
        took = time.monotonic() - start
        text = str(e)
        if REFUSAL not in text or not all(w in text for w in WAYS_OUT):
            return "another error: " + text[:300]
        return True if took < LIMIT_S else f"took {took:.1f} s"
    return "no error"


def main(route):
    out = {"route": route}
    if route == "default":
        import cma.torch as cmat
        cmat.use_as_default()
    check = make_check(out)
    ctx = mp.get_context("spawn")
    q, results = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=consume, args=(q, results), daemon=True)
    consumer.start()
    t = torch.arange(8, dtype=torch.float32, device="cuda")  # sums to 28
    out["allocator"] = type(torch.cuda.memory._get_current_allocator()).__name__ \
        if hasattr(torch.cuda.memory, "_get_current_allocator") else None

    def got(want):
        item = results.get(timeout=120)
        return True if item == want else item

    if route == "native":
        @check("queue_shares")
        def _():
            q.put(t)
            return got(("tensor", "cuda", 28.0))
    else:
        for name, send in [
                ("queue_put_refuses", lambda: q.put(t)),
                ("queue_put_nested_refuses", lambda: q.put({"batch": [(0, t)]})),
                ("queue_put_view_refuses", lambda: q.put(t[2:])),
                ("joinable_queue_put_refuses", lambda: ctx.JoinableQueue().put(t)),
                ("simple_queue_put_refuses", lambda: ctx.SimpleQueue().put(t)),
                ("pipe_send_refuses", lambda: ctx.Pipe()[0].send(t)),
                ("reduce_tensor_refuses", lambda: reductions.reduce_tensor(t)),
                ("share_cuda_refuses", lambda: t.untyped_storage()._share_cuda_())]:
            check(name)(lambda send=send: refused(send))

    @check("share_memory_is_a_no_op")  # as in PyTorch: CUDA tensors share by pickling
    def _():
        return t.share_memory_() is t and float(t.sum()) == 28.0

    @check("queue_and_consumer_go_on")  # nothing of the refused puts arrives
    def _():
        q.put("after")
        return got(("other", "'after'"))

    @check("cpu_way_out")
    def _():
        q.put(t.cpu())
        return got(("tensor", "cpu", 28.0))

    @check("tensor_still_usable")
    def _():
        return float((t * 2).sum()) == 56.0

    # An empty CUDA tensor has no memory to share: a fact, not a check.
    try:
        q.put(torch.empty(0, device="cuda"))
        out["empty_tensor"] = results.get(timeout=120)
    except Exception as e:  # noqa: BLE001 - reported
        out["empty_tensor"] = f"raised {type(e).__name__}: {str(e)[:200]}"

    q.put(None)
    consumer.join(timeout=60)
    out["consumer_exit"] = consumer.exitcode
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
