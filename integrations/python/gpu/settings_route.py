"""Issue 50's memory tools and names under cma's default route, in a fresh
process, for torch_gpu_test.py:

    PYTORCH_CUDA_ALLOC_CONF=... python3 settings_route.py settings  ->  JSON
        the settings at start, then _set_allocator_settings and
        torch._C._accelerator_setAllocatorSettings at run time: cma's live
        config, getDeviceStats' max_split_size and the snapshot's
        allocator_settings (config_metadata) after each
    python3 settings_route.py rfc  ->  JSON
        RFC-0023's names: set_enabled_uvm, get_enabled_uvm,
        set_uvm_move_on_copy, enabled_uvm_move_on_copy, uvm_to; CPU tensors
        in the snapshot's "cma" key
    python3 settings_route.py host OUTDIR  ->  JSON
        (CMA_ALLOC_CONF oversubscribe:1) the host tier and an away tensor
        marked in torch.cuda.memory._snapshot(); memory_viz still renders it
"""
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402

MiB = 1 << 20
mode = sys.argv[1]
cmat.use_as_default("oversubscribe:1" if mode == "host" else None)
out = {"mode": mode}


def view():
    """What each of PyTorch's tools and cma say of the settings now."""
    keep = torch.empty(MiB, device="cuda")  # the allocator is in use
    snap = torch.cuda.memory._snapshot()
    settings = snap.get("allocator_settings", {})
    live = cma.config()["live"]
    del keep
    return {"cma_max_split_size": live["max_split_size"],
            "cma_roundup": live["roundup_power2_divisions"],
            "cma_gc": live["garbage_collection_threshold"],
            "cma_pytorch_settings": live["pytorch_settings"],
            "stats_max_split_size": torch.cuda.memory_stats()["max_split_size"],
            "snapshot_max_split_size": settings.get("max_split_size"),
            "snapshot_conf": settings.get("PYTORCH_CUDA_ALLOC_CONF"),
            "snapshot_roundup": settings.get("roundup_power2_divisions"),
            "snapshot_gc": settings.get("garbage_collection_threshold"),
            "snapshot_expandable": settings.get("expandable_segments"),
            "snapshot_has_cma": "cma" in snap}


if mode == "settings":
    out["env"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    out["start"] = view()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.memory._set_allocator_settings(
            "max_split_size_mb:128,garbage_collection_threshold:0.6")
    out["set_warnings"] = [str(w.category.__name__) for w in caught]
    out["after_set"] = view()
    torch._C._accelerator_setAllocatorSettings("roundup_power2_divisions:8")
    out["after_accelerator"] = view()
    # PyTorch refuses: nothing reaches cma.
    try:
        torch._C._accelerator_setAllocatorSettings("max_split_size_mb:bogus")
        out["bogus_refused"] = False
    except Exception:  # noqa: BLE001 - PyTorch's parser's error, whatever its type
        out["bogus_refused"] = True
    out["after_bogus"] = view()
    # 84 KiB under 8 divisions rounds up to the next 8 KiB step (1/8 of its
    # power of two's interval, 64..128 KiB): 88 KiB, as in PyTorch.
    before = torch.cuda.memory_allocated()
    t = torch.empty(84 << 10, dtype=torch.uint8, device="cuda")
    out["allocated_84k"] = torch.cuda.memory_allocated() - before
    del t
elif mode == "rfc":
    out["move_on_copy_default"] = cmat.enabled_uvm_move_on_copy()
    out["enabled_before"] = cmat.get_enabled_uvm()
    cmat.set_enabled_uvm(True)
    out["enabled_after"] = cmat.get_enabled_uvm()
    x = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB, managed memory
    hosts = {b["address"]: b for b in torch.cuda.memory._snapshot()["cma"]["host_pool"]}
    out["cpu_tensor_in_snapshot"] = hosts.get(x.data_ptr(), {}).get("location")
    y = x.to("cuda")
    out["to_copies_by_default"] = y.data_ptr() != x.data_ptr()
    z = cmat.uvm_to(x, "cuda")
    torch.cuda.synchronize()
    out["uvm_to_moves"] = z.data_ptr() == x.data_ptr() and z.is_cuda
    out["uvm_to_values"] = bool(torch.equal(z.cpu(), x))
    hosts = {b["address"]: b for b in torch.cuda.memory._snapshot()["cma"]["host_pool"]}
    out["moved_tensor_in_snapshot"] = hosts.get(x.data_ptr(), {}).get("location")
    cmat.set_uvm_move_on_copy(True)
    out["move_on_copy_set"] = cmat.enabled_uvm_move_on_copy()
    w = x.to("cuda")
    out["to_moves_when_set"] = w.data_ptr() == x.data_ptr()
    n = torch.ones(3, dtype=torch.float64)
    out["uvm_to_copies_other_tensors"] = bool(torch.equal(cmat.uvm_to(n, "cuda").cpu(), n))
    del y, z, w
    cmat.set_enabled_uvm(False)
    out["enabled_off"] = cmat.get_enabled_uvm()
    out["cpu_after_off_is_torchs"] = torch.empty(4 << 20).data_ptr() not in {
        b["address"] for b in torch.cuda.memory._snapshot()["cma"]["host_pool"]}
elif mode == "host":
    with cmat.host_tier():
        tier = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    resident = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
    sent = torch.full((64 * MiB,), 3, dtype=torch.uint8, device="cuda")
    cmat.send_away([sent])
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()

    def seg_of(t):
        p = t.data_ptr()
        return [s for s in snap["segments"] if s["address"] <= p < s["address"] + s["total_size"]]

    out["tier_marked"] = bool(seg_of(tier)) and all(s["cma_on_host"] for s in seg_of(tier))
    out["resident_unmarked"] = bool(seg_of(resident)) and not any(
        s["cma_on_host"] for s in seg_of(resident))
    away = [b for s in snap["segments"] for b in s["blocks"] if b.get("cma_away")]
    out["away_blocks"] = len(away)
    out["away_listed"] = [a["address"] for a in snap["cma"]["away"]] == [sent.data_ptr()]
    out["host_tier_bytes"] = snap["cma"]["host_tier_bytes"]
    out["away_bytes"] = snap["cma"]["away_bytes"]
    from torch.cuda import _memory_viz  # noqa: E402
    outdir = sys.argv[2] if len(sys.argv) > 2 else "."
    html = _memory_viz.segment_plot(snap)
    with open(os.path.join(outdir, "host_segment_plot.html"), "w") as f:
        f.write(html)
    out["segment_plot_bytes"] = len(html)
    cmat.bring_back([sent])
    out["sent_values"] = bool((sent == 3).all().item())
print(json.dumps(out))
