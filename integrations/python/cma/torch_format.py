"""cma's snapshot and history in torch.cuda.memory._snapshot()'s format
(segments with blocks, device_traces), so torch.cuda._memory_viz renders
them. Pure data conversion: no torch import, tested without a GPU."""

_PAGE = 2 << 20


def _clip(seg):
    """An arena is address space: keep the part up to its last block in use
    (rounded to the 2 MiB page), which is what memory ever held there."""
    if not seg.get("is_arena"):
        return seg["total_size"], seg["blocks"]
    base = seg["address"]
    end = 0
    for b in seg["blocks"]:
        if b["state"] != "inactive":
            end = max(end, b["address"] + b["size"] - base)
    end = (end + _PAGE - 1) // _PAGE * _PAGE
    blocks = []
    for b in seg["blocks"]:
        start = b["address"] - base
        if start >= end:
            break
        blocks.append(dict(b, size=min(b["size"], end - start)))
    return end, blocks


def snapshot(cma_segments, history, device_count):
    """PyTorch's snapshot dict from cma's snapshot and history (cma._lib)."""
    segments = []
    for seg in cma_segments:
        total, blocks = _clip(seg)
        if total == 0:
            continue
        out_blocks = [{"address": b["address"], "size": b["size"],
                       "requested_size": b["requested_size"], "state": b["state"],
                       "frames": []} for b in blocks]
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segments.append({
            "device": seg["device"], "address": seg["address"], "total_size": total,
            "allocated_size": seg["allocated_size"], "active_size": active,
            "requested_size": seg["requested_size"],
            "stream": blocks[0]["stream"] if blocks else 0,
            "segment_type": seg["segment_type"], "segment_pool_id": (0, 0),
            "is_expandable": bool(seg.get("is_arena")), "frames": [], "blocks": out_blocks})
    traces = [[] for _ in range(device_count)]
    for e in history:
        if e["device"] < len(traces):
            traces[e["device"]].append({"action": e["action"], "addr": e["addr"],
                                        "size": e["size"], "stream": e["stream"],
                                        "time_us": e["time_us"], "frames": []})
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"allocator": "caching_managed_allocator"}}
