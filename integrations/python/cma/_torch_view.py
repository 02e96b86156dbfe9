"""What cma adds to PyTorch's own memory tools, without torch: cma.torch's
patches (_default.py) call these, and integrations/python/torch_view_test.py
tests them on the host backend with plain dicts shaped as PyTorch's.

* mark_snapshot(): torch.cuda.memory._snapshot() shows what cma placed on the
  host. PyTorch's snapshot has room only for device segments, so cma's
  CUDAAllocator reports the oversubscription host tier and away allocations
  among them (their addresses are device-usable). Here each segment gets
  "cma_on_host" and each block "cma_away", and the snapshot one key "cma"
  with everything on the host side, the host pool's CPU tensors included
  (docs/pytorch.md, "Host memory in a snapshot").
* SettingsFollower: PyTorch's allocator settings strings reach cma exactly
  once per call, whichever of PyTorch's two setters is called (in PyTorch
  2.11 torch.cuda.memory._set_allocator_settings calls
  torch._C._accelerator_setAllocatorSettings, so both may be on one path).
"""
import threading

KEY = "cma"  # the snapshot's key for what cma adds


def _block_addresses(segment):
    """Each block's address: PyTorch's own "address" where it gives one, else
    the segment's address plus the sizes of the blocks before it (how
    PyTorch's readers derive it)."""
    address = segment["address"]
    for block in segment.get("blocks", ()):
        yield block, block.get("address", address)
        address += block["size"]


def mark_snapshot(snap, segments, host_blocks, config):
    """Adds cma's host-side view to `snap` (a torch.cuda.memory._snapshot()
    dict) in place and returns it. `segments`: cma's snapshot (_lib.snapshot()),
    `host_blocks`: the host pool's (_lib.host_snapshot()), `config`:
    _lib.config()."""
    tier = [s for s in segments if s.get("on_host")]
    tier_ranges = [(s["device"], s["address"], s["address"] + s["total_size"]) for s in tier]
    away = [dict(b, device=s["device"]) for s in segments for b in s["blocks"]
            if b.get("away") and b["state"] == "active_allocated"]
    away_at = {(b["device"], b["address"]) for b in away}
    for seg in snap.get("segments", ()):
        dev, start = seg.get("device"), seg["address"]
        seg["cma_on_host"] = any(d == dev and lo <= start < hi for d, lo, hi in tier_ranges)
        for block, address in _block_addresses(seg):
            block["cma_away"] = (dev, address) in away_at
    live = [b for b in host_blocks if b["state"] == "active_allocated"]
    snap[KEY] = {
        # CPU tensors in managed memory (managed_cpu(), empty_managed,
        # managed): each with where its pages are now.
        "host_pool": list(host_blocks),
        "host_pool_bytes": sum(b["size"] for b in live),
        "host_pool_on_device_bytes": sum(b["size"] for b in live if b["location"] != "host"),
        # Oversubscription's host tier: segments whose pages live on the
        # host, read by the GPU over the link ("cma_on_host" above).
        "host_tier": [{"device": s["device"], "address": s["address"],
                       "total_size": s["total_size"], "allocated_size": s["allocated_size"]}
                      for s in tier],
        "host_tier_bytes": sum(s["allocated_size"] for s in tier),
        # Live allocations sent away (send_away, learn_step): their pages
        # wait on the host until brought back ("cma_away" above).
        "away": [{"device": b["device"], "address": b["address"], "size": b["size"],
                  "requested_size": b["requested_size"]} for b in away],
        "away_bytes": sum(b["size"] for b in away),
        "settings": config.get("live", {}),
    }
    return snap


class SettingsFollower:
    """Wraps PyTorch's settings setters so that each call's string reaches cma
    (`apply`) once, after PyTorch has parsed and accepted it: a setter called
    from inside another wrapped one (PyTorch's deprecated
    _set_allocator_settings calling _accelerator_setAllocatorSettings) leaves
    it to the outer call. A string PyTorch refuses raises there and never
    reaches cma. Thread safety: the nesting is counted per thread."""

    def __init__(self, apply):
        self._apply = apply
        self._local = threading.local()

    def wrap(self, original):
        """`original` made to follow; None if it follows already."""
        if getattr(original, "_cma_follows", False):
            return None

        def follow(env):
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            try:
                result = original(env)
            finally:
                self._local.depth = depth
            if depth == 0:
                self._apply(env)
            return result

        follow._cma_follows = True
        follow._cma_wraps = original
        follow.__doc__ = getattr(original, "__doc__", None)
        follow.__name__ = getattr(original, "__name__", "follow")
        return follow
