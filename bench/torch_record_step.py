"""Records one training step's memory events for bench/link_limit (issue 48):
every allocation the step makes and frees, and every kernel's uses of each
allocation (read or write), in the step file format of bench/step_file.h.

    python3 torch_record_step.py --out gpt2_step.csv.gz            # the 0.91 B model
    python3 torch_record_step.py --fused --out gpt2_fused_step.csv.gz
    python3 torch_record_step.py --quick --out quick_step.csv

The model and the step are torch_oversub_bench.py's (a GPT2LMHeadModel from a
config, fp32 unless --bf16, AdamW, forward, zero_grad(set_to_none=True),
backward, step); the defaults are the model of bench/results/h200_oversub*
(16 layers, width 2048, batch 4x512). --warmup steps run first (the
optimizer's state exists), then one step is recorded, then --time-steps
unrecorded steps give in_memory_s (their median), written as metadata.

How the events are found (the robust option, and why):
  - Allocations and frees come from PyTorch's own allocator trace
    (torch.cuda.memory._record_memory_history; actions alloc and
    free_requested, keyed by address). The allocations live when the step
    begins are the active blocks of a snapshot taken just before it.
  - Uses come from a TorchDispatchMode that sees every aten op, forward,
    backward (the autograd engine carries the mode to its thread) and the
    optimizer's: each CUDA tensor argument or result stands for its untyped
    storage, whose data_ptr is the address of its allocator block. Arguments
    the op's schema marks as written (alias_info.is_write) and fresh results
    are writes, other arguments reads. Ops whose results all alias their
    arguments and that write nothing (views) run no kernel and are skipped,
    as are the allocating factories (empty, empty_strided, ...). A foreach
    or fused op over tensor lists becomes one use per list index (its
    kernels take the lists in chunks, not all at once); any other op's
    lists (cat, stack, index) are one use with all of them.
  - The two are put in one order by the allocator's cumulative counters
    (memory_stats' allocation.all.allocated and .freed), read before and
    after each op: the k-th alloc entry of the trace is the counter's k-th
    increment, so each trace entry falls before, inside or after each op.
    Allocations inside an op come before its uses, frees inside it after.
    The counts of trace entries and counter increments must agree, or the
    record is refused (a trace ring buffer too small, another allocator).
  Weakref finalizers on storages were not used: an UntypedStorage's Python
  object need not live as long as its memory, and a finalizer runs at the
  Python object's death, which may come early or not at all.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Factories that only allocate: their result's first kernel creates it.
NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
             "empty_permuted", "resize_", "record_stream"}
MODEL = dict(layers=16, width=2048, heads=16, batch=4, seq=512)
QUICK = dict(layers=4, width=512, heads=8, batch=2, seq=128)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the step file (.gz: gzip'ed)")
    ap.add_argument("--quick", action="store_true", help="a small model: checks the plumbing")
    for k in MODEL:
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast")
    ap.add_argument("--fused", action="store_true", help="AdamW(fused=True) (default: foreach)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--time-steps", type=int, default=5)
    ap.add_argument("--max-entries", type=int, default=20_000_000,
                    help="the allocator trace's ring buffer")
    a = ap.parse_args(argv)
    for k, v in (QUICK if a.quick else MODEL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.mode = "train"  # for torch_oversub_bench.build_model
    if a.width % a.heads:
        ap.error("--width must be a multiple of --heads")
    return a


# ---------------------------------------------------------------- uses

def _storage(torch, t):
    """(data_ptr, nbytes) of a CUDA tensor's storage, or None."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        return None
    st = t.untyped_storage()
    ptr = st.data_ptr()
    return (ptr, st.nbytes()) if ptr else None


def _arg_schema(func, args, kwargs):
    """[(value, written)] for every argument, by the op's schema."""
    schema = func._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    by_name = {a.name: a for a in schema.arguments}
    out = []

    def written(arg):
        if arg is None:
            return True  # unknown: a write is the safe guess (no stale copy kept)
        info = arg.alias_info
        return bool(info is not None and info.is_write)

    for i, v in enumerate(args):
        out.append((v, written(positional[i] if i < len(positional) else None)))
    for name, v in kwargs.items():
        out.append((v, written(by_name.get(name))))
    return out


def kernel_touches(torch, func, args, kwargs, result):
    """The uses one op makes: a list of groups, each {ptr: [nbytes, reads, writes]};
    [] for an op that runs no kernel."""
    name = func.overloadpacket.__name__
    if name in NO_KERNEL:
        return []
    # Foreach and fused ops run their lists in chunks, index by index; any
    # other op with a list (cat, stack, index) needs all of it at once.
    per_index = name.startswith(("_foreach_", "_fused_"))
    singles, lists = {}, []  # singles: ptr -> [nbytes, r, w]; lists: [[(ptr, nbytes, w, r)]]

    def add(group, s, w, r=True):
        # An argument is read, and written too when the schema says so (the
        # schema cannot tell an overwrite from an update); a fresh result is
        # written only.
        e = group.setdefault(s[0], [s[1], False, False])
        e[1] = e[1] or r
        e[2] = e[2] or w

    in_ptrs, wrote = set(), False
    for v, w in _arg_schema(func, args, kwargs):
        if not per_index and isinstance(v, (list, tuple)):
            for x in v:
                s = _storage(torch, x)
                if s:
                    add(singles, s, w)
                    in_ptrs.add(s[0])
                    wrote = wrote or w
        elif isinstance(v, (list, tuple)) and v and any(isinstance(x, torch.Tensor) for x in v):
            lst = []
            for x in v:
                s = _storage(torch, x)
                lst.append(s and (s[0], s[1], w, True))
                if s:
                    in_ptrs.add(s[0])
                    wrote = wrote or w
            lists.append(lst)
        else:
            s = _storage(torch, v)
            if s:
                add(singles, s, w)
                in_ptrs.add(s[0])
                wrote = wrote or w
    # Several returns come as a tuple; one Tensor[] return as a list.
    returns = getattr(func._schema, "returns", None)
    several = isinstance(result, tuple) and (returns is None or len(returns) != 1)
    results = list(result) if several else [result]
    out_single, out_lists, fresh, any_tensor = [], [], False, False
    for r in results:
        tensors = list(r) if isinstance(r, (list, tuple)) else [r]
        tensors = [x for x in tensors if isinstance(x, torch.Tensor)]
        lst = [_storage(torch, x) for x in tensors]
        if isinstance(r, (list, tuple)) and per_index:
            out_lists.append([s and (s[0], s[1], True, False) for s in lst])
        else:
            out_single += [s for s in lst if s]
        any_tensor = any_tensor or bool(tensors)
        # A result that is not a CUDA alias of an argument is new data (a
        # copy to the host included): the op ran a kernel.
        fresh = fresh or any(s is None or s[0] not in in_ptrs for s in lst)
    if any_tensor and not fresh and not wrote:
        return []  # a view: its results alias its arguments, nothing written
    for s in out_single:
        if s[0] not in in_ptrs:
            add(singles, s, True, False)
    lists += [[x if (x and x[0] not in in_ptrs) else None for x in lst] for lst in out_lists]
    n = max((len(lst) for lst in lists), default=0)
    if n == 0:
        return [singles] if singles else []
    groups = []
    for i in range(n):
        g = {p: list(e) for p, e in singles.items()}
        for lst in lists:
            if i < len(lst) and lst[i]:
                add(g, (lst[i][0], lst[i][1]), lst[i][2], lst[i][3])
        if g:
            groups.append(g)
    return groups


def make_recorder(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    device = torch.cuda.current_device()

    def counts():
        s = torch.cuda.memory_stats(device)
        return s.get("allocation.all.allocated", 0), s.get("allocation.all.freed", 0)

    class StepRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.errors = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            before = counts()
            result = func(*args, **kwargs)
            after = counts()
            try:
                groups = kernel_touches(torch, func, args, kwargs, result)
            except Exception as e:  # the record must not break the step
                groups = []
                self.errors.append("%s: %r" % (func, e))
            self.ops.append((before, after, str(func), groups))
            return result

    return StepRecorder(), counts


# ---------------------------------------------------------------- the merge

def live_blocks(snapshot, device):
    """[(address, bytes)] of the blocks allocated in a snapshot."""
    out = []
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out.append((b.get("address", addr), b.get("requested_size") or b["size"]))
            addr += b["size"]
    return out


def merge(start_blocks, trace, ops, base):
    """The step's lines: live, then events in order. `base` = counters at the start."""
    entries, n_alloc, n_free = [], base[0], base[1]
    for e in trace:
        if e["action"] == "alloc":
            n_alloc += 1
            entries.append(("alloc", n_alloc, e["addr"], e["size"]))
        elif e["action"] == "free_requested":
            n_free += 1
            entries.append(("free", n_free, e["addr"], e["size"]))
    ids, addr_id, lives, events = iter(range(1 << 62)), {}, [], []
    stats = dict(unresolved_uses=0, unknown_frees=0, uses=0, kernels=0)
    for addr, size in start_blocks:
        i = next(ids)
        addr_id[addr] = i
        lives.append("live,%d,%d" % (i, size))

    def apply(e, out):
        kind, _, addr, size = e
        if kind == "alloc":
            i = next(ids)
            addr_id[addr] = i
            out.append("alloc,%d,%d" % (i, size))
        elif addr in addr_id:
            out.append("free,%d" % addr_id.pop(addr))
        else:
            stats["unknown_frees"] += 1

    def resolve(ptr, nbytes):
        if ptr in addr_id:
            return addr_id[ptr]
        stats["unresolved_uses"] += 1  # not a block start: a storage of its own, live at start
        i = next(ids)
        addr_id[ptr] = i
        lives.append("live,%d,%d" % (i, nbytes))
        return i

    pos = 0

    def take(limit, out):
        nonlocal pos
        while pos < len(entries):
            kind, idx = entries[pos][0], entries[pos][1]
            if idx > (limit[0] if kind == "alloc" else limit[1]):
                break
            apply(entries[pos], out)
            pos += 1

    for before, after, _name, groups in ops:
        take(before, events)
        inside = []
        take(after, inside)
        events += [x for x in inside if x.startswith("alloc")]
        for g in groups:
            fields = []
            for ptr, (nbytes, r, w) in sorted(g.items()):
                fields.append("%d:%s" % (resolve(ptr, nbytes), "rw" if r and w else ("w" if w else "r")))
            events.append("use," + ",".join(fields))
            stats["uses"] += len(fields)
        stats["kernels"] += len(groups)
        events += [x for x in inside if x.startswith("free")]
    take((float("inf"), float("inf")), events)
    return lives, events, stats, (n_alloc, n_free)


# ---------------------------------------------------------------- the step

def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from torch_oversub_bench import build_model
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(0)
    device = torch.cuda.current_device()
    model = build_model(torch, a).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if a.fused else None)
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g) for _ in range(4)]
    state = {"loss": None, "k": 0}

    def step():
        ids = data[state["k"] % len(data)].cuda(non_blocking=True)
        state["k"] += 1
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            state["loss"] = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        state["loss"].backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    recorder, counts = make_recorder(torch)
    start = torch.cuda.memory._snapshot()
    base = counts()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=a.max_entries)
    t0 = time.perf_counter()
    with recorder:
        step()
    torch.cuda.synchronize()
    record_s = time.perf_counter() - t0
    end = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    final = counts()
    peak = torch.cuda.max_memory_allocated()
    trace = end["device_traces"][device]
    lives, events, stats, seen = merge(live_blocks(start, device), trace, recorder.ops, base)
    if seen != final:
        sys.exit("torch_record_step: the allocator trace has %d allocs and %d frees, its "
                 "counters %d and %d: the trace is incomplete (raise --max-entries?)"
                 % (seen[0] - base[0], seen[1] - base[1], final[0] - base[0], final[1] - base[1]))
    times = []
    for _ in range(a.time_steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    meta = dict(recorder="bench/torch_record_step.py", torch=torch.__version__,
                gpu=torch.cuda.get_device_name(device), in_memory_s=statistics.median(times),
                in_memory_steps_s=json.dumps([round(t, 5) for t in times]),
                torch_max_allocated=peak, recorded_step_s=round(record_s, 3), ops=len(recorder.ops),
                dispatch_errors=len(recorder.errors), **stats,
                model=json.dumps({k: getattr(a, k) for k in list(MODEL) + ["vocab", "bf16", "fused"]}))
    opener = gzip.open if a.out.endswith(".gz") else open
    with opener(a.out, "wt") as f:
        f.write("cma_step v1\n")
        for k, v in meta.items():
            f.write("# %s=%s\n" % (k, v))
        f.write("\n".join(lives + events) + "\n")
    for e in recorder.errors[:5]:
        print("dispatch error:", e)
    print("wrote %s: %d live, %d events, %d kernels, %d uses; in-memory %.4f s/step; "
          "torch max allocated %.3f GiB; unresolved uses %d, unknown frees %d"
          % (a.out, len(lives), len(events), stats["kernels"], stats["uses"], meta["in_memory_s"],
             peak / 2**30, stats["unresolved_uses"], stats["unknown_frees"]))


if __name__ == "__main__":
    main()
