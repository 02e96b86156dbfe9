"""cma.torch.managed_cpu() (RFC-0023's switch) in a fresh process, for
torch_gpu_test.py: CPU tensors in cma's host pool, device-only .to() as a
move in both directions with no copy kernel or memcpy (profiled), the
aliasing rules (in-place writes through either alias, views, autograd,
torch.compile), what CPU tensors must still support (pickling, shared
memory, pin_memory, DataLoader workers), out of memory, the switch off,
and nothing left behind.   python3 managed_cpu_route.py  ->  JSON"""
import gc
import io
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch import cpu_switch as torch_managed  # noqa: E402

cmat.use_as_default()
torch.cuda.init()
out = {}
base = cma.host_stats()["allocation.current"]
cmat.managed_cpu()
N = 1 << 22  # 16 MiB of float32

x = torch.arange(N, dtype=torch.float32)
out["cpu_tensor_is_managed"] = cma._lib.allocation_size(x.data_ptr()) == 4 * N
out["host_pool_counts_it"] = cma.host_stats()["allocation.current"] == base + 1


def copies_during(fn):
    """(result, number of memcpy/copy kernels the profiler saw during fn)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return r, sum(1 for n in names if "memcpy" in n.lower() or "copy_" in n or "_to_copy" in n)


before = torch_managed.move_counts()
y, copies = copies_during(lambda: x.to("cuda"))
out["to_cuda_is_a_move"] = y.data_ptr() == x.data_ptr() and y.device == torch.device("cuda", 0)
out["to_cuda_copied_nothing"] = copies == 0
out["to_cuda_values"] = bool(torch.equal(y, torch.arange(N, dtype=torch.float32, device="cuda")))
y.mul_(2)                                  # GPU writes ...
z, copies = copies_during(lambda: y.cpu())
out["cpu_is_a_move"] = z.data_ptr() == x.data_ptr() and z.device.type == "cpu"
out["cpu_copied_nothing"] = copies == 0
out["gpu_write_seen_through_source"] = x[3].item() == 6.0   # ... are seen by every alias
z[0] = -1.0                                # a CPU write through one alias
out["cpu_write_seen_on_gpu"] = y[0].item() == -1.0
after = torch_managed.move_counts()
out["counted"] = (after["moved"] - before["moved"] == 2
                  and after["moved_bytes"] - before["moved_bytes"] == 8 * N)
out["non_blocking_move"] = x.to("cuda", non_blocking=True).data_ptr() == x.data_ptr()
torch.cuda.synchronize()
out["host_stats_moves"] = cma.host_stats()["moves"] >= 3

# prefer_host: the GPU maps the pages instead of migrating them.
m = cmat.prefer_host(torch.full((1 << 22,), 3.0))
mapped_before = cma.host_stats()["mapped_moves"]
mg, copies = copies_during(lambda: m.to("cuda"))
mg.add_(1)                                 # the GPU writes host pages over the link
torch.cuda.synchronize()
out["prefer_host_maps"] = (mg.data_ptr() == m.data_ptr() and copies == 0
                           and cma.host_stats()["mapped_moves"] == mapped_before + 1
                           and cma.placed_on_host(m.data_ptr()) is True
                           and m[5].item() == 4.0 and m.cpu().data_ptr() == m.data_ptr())
del m, mg

# What copies, exactly as PyTorch copies it.
copied = {
    "copy_true": x.to("cuda", copy=True),
    "dtype_change": x.to("cuda", torch.float64),
    "view": x[8:].to("cuda"),
    "non_contiguous": x.view(1024, -1).t().to("cuda"),
    "foreign_memory": torch.from_numpy(x.numpy().copy()).to("cuda"),
}
out["fallbacks_copy"] = {k: v.data_ptr() != x.data_ptr() for k, v in copied.items()}
out["fallback_values"] = bool(torch.equal(copied["view"].cpu(), x[8:]))

# Layouts and modes the alias does not serve: copied, never raised.
csr = torch.eye(64).to_sparse_csr()
out["sparse_csr_copies"] = csr.to("cuda").layout == torch.sparse_csr
traced = torch.jit.trace(lambda t: t.to("cuda") * 2, (torch.ones(1 << 20),))
out["jit_trace_works"] = traced(torch.ones(1 << 20)).sum().item() == 2.0 * (1 << 20)
with cmat.zero_copy() as mode:  # the switch moves first; the mode sees its copies as PyTorch's
    x.to("cuda")
    x.to("cuda", copy=True)
out["zero_copy_mode_under_switch"] = mode.aliased == 0 and mode.copied == 1
try:
    cma.shutdown()
    out["shutdown_refused_while_on"] = False
except cma.CmaError:
    out["shutdown_refused_while_on"] = True
side = torch.cuda.Stream()
rs = torch.ones(1 << 22)
rsg = rs.to("cuda")
with torch.cuda.stream(side):
    rsg.mul_(3)
rsg.record_stream(side)          # reaches cma for an alias of a CPU tensor (raises if refused)
out["record_stream_on_alias_accepted"] = True
del rs, rsg
torch.cuda.synchronize()

# Autograd: a tensor that requires grad while autograd records is copied
# (an alias would carry no grad_fn); a module's .to() (no_grad) moves.
w = torch.randn(1 << 16, requires_grad=True)
wc = w.to("cuda")
out["grad_recording_copies"] = wc.grad_fn is not None and wc.data_ptr() != w.data_ptr()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 8))
reference = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 8))
reference.load_state_dict(model.state_dict())
ptrs = [p.data_ptr() for p in model.parameters()]
model.to("cuda")
reference._apply(lambda t: t.to("cuda", copy=True))
out["module_to_moves_parameters"] = [p.data_ptr() for p in model.parameters()] == ptrs
inp = torch.randn(64, 1024, device="cuda")
model(inp).square().sum().backward()
reference(inp).square().sum().backward()
out["grads_identical"] = all(torch.equal(a.grad, b.grad) for a, b in
                             zip(model.parameters(), reference.parameters()))
model.to("cpu")
out["module_back_same_pointers"] = [p.data_ptr() for p in model.parameters()] == ptrs

# torch.compile over managed tensors: traced as PyTorch's copy, same values.
a = torch.randn(1 << 20)


@torch.compile
def compiled(t):
    return (t.to("cuda") * 2).sum()


eager = (a.to("cuda", copy=True) * 2).sum()
out["compile_same_result"] = bool(torch.allclose(compiled(a), eager, rtol=1e-5))
ac = a.to("cuda")
triple = torch.compile(lambda t: t * 3)
out["compile_over_alias"] = bool(torch.allclose(triple(ac), ac * 3))

# What CPU tensors must support.
buf = io.BytesIO()
torch.save(x, buf)
buf.seek(0)
loaded = torch.load(buf)
out["pickle_round_trip"] = bool(torch.equal(loaded, x))
out["torch_load_is_managed"] = cma._lib.allocation_size(loaded.data_ptr()) is not None
shared = x.clone().share_memory_()
out["share_memory"] = shared.is_shared() and bool(torch.equal(shared, x))
pinned = x.pin_memory()
out["pin_memory_copies_into_pinned"] = pinned.is_pinned() and bool(torch.equal(pinned, x))


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((256,), float(i * i))


if __name__ == "__main__":
    # fork chosen explicitly: this script is unguarded at module level, which
    # forkserver (the switch's default for loaders, dataloader_route.py) would
    # re-run in every worker; workers that make their own tensors are fine
    # under fork.
    loader = torch.utils.data.DataLoader(Squares(), batch_size=8, num_workers=2,
                                         multiprocessing_context="fork")
    total = sum(b.to("cuda").sum().item() for b in loader)
    out["dataloader_workers"] = total == 256 * sum(i * i for i in range(64))

    # ManagedBatches: 32 MiB batches copied by three threads into the host
    # pool, moved (not copied) to the GPU, the same numbers.
    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return torch.arange(1 << 20, dtype=torch.float32) + i

    batches = torch.utils.data.DataLoader(
        Rows(), batch_size=8, num_workers=2, pin_memory=True, multiprocessing_context="fork",
        collate_fn=cma.torch.ManagedBatches(copy_threads=3))
    moves_before = cma.torch.move_counts()["moved"]
    good = True
    for k, b in enumerate(batches):
        good = good and cma._lib.allocation_size(b.data_ptr()) is not None
        g = b.to("cuda")
        want = torch.arange(1 << 20, dtype=torch.float32).cuda() + torch.arange(
            8 * k, 8 * k + 8, dtype=torch.float32, device="cuda")[:, None]
        good = good and g.data_ptr() == b.data_ptr() and bool(torch.equal(g, want))
    out["managed_batches_threaded_copy"] = good and (
        cma.torch.move_counts()["moved"] - moves_before >= 4)
    try:
        cma.torch.ManagedBatches(copy_threads=0)
        out["managed_batches_bad_threads_refused"] = False
    except ValueError as e:
        out["managed_batches_bad_threads_refused"] = "copy_threads=0" in str(e)

# Out of memory: refused by name, and the process goes on.
try:
    torch.empty(1 << 62, dtype=torch.uint8)
    out["huge_refused"] = False
except (RuntimeError, torch.OutOfMemoryError) as e:
    out["huge_refused"] = "caching_managed_allocator" in str(e)
out["goes_on_after_refusal"] = torch.ones(4).sum().item() == 4.0

# Lifetimes: an alias keeps the memory alive after its source dies.
s = torch.full((1 << 20,), 5.0)
sc = s.to("cuda")
del s
gc.collect()
out["alias_outlives_source"] = sc.sum().item() == 5.0 * (1 << 20)
del sc

# Nothing grows: cycles of make, move, use, move back, drop.
def cycle():
    t = torch.randn(1 << 20)
    g = t.to("cuda")
    g.add_(1)
    c = g.cpu()
    del t, g, c


cycle()
gc.collect()
torch.cuda.synchronize()
live = cma.host_stats()["allocation.current"]
for _ in range(5):
    cycle()
gc.collect()
torch.cuda.synchronize()
out["no_growth_over_cycles"] = cma.host_stats()["allocation.current"] == live

# Switch off: PyTorch's CPU allocator again, .to() copies; tensors made
# while on are still freed by cma.
was = cmat.managed_cpu(False)
plain = torch.ones(1 << 20)
out["switch_off"] = (was is True and cma._lib.allocation_size(plain.data_ptr()) is None
                     and x.to("cuda").data_ptr() != x.data_ptr())
del x, y, z, copied, w, wc, model, reference, a, ac, loaded, shared, pinned, plain, eager
del compiled, triple, traced, csr
torch._dynamo.reset()
gc.collect()
torch.cuda.synchronize()
cma.empty_cache()
# Reported, not asserted: PyTorch may keep tensors it made while the switch
# was on (caches of its own), which cma frees whenever they die.
out["left_behind"] = cma.host_stats()["allocation.current"] - base
out["host_stats"] = {k: v for k, v in cma.host_stats().items()
                     if k in ("moves", "moved_bytes_to_device", "moved_bytes_to_host",
                              "returned_bytes", "reserved_bytes.peak", "num_sync_streams")}
print(json.dumps(out))
