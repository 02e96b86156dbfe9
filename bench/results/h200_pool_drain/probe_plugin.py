"""Debug probe (not committed): the snapshot's pools at the start and end of
test_cuda_graph_allocator_propagates_stream, to $PROBE_OUT."""
import json
import os

import pytest


def _summary(torch):
    return [{"pool": list(s["segment_pool_id"]), "size": s["total_size"],
             "stream": s["stream"], "alloc": s["allocated_size"],
             "blocks": [(b["size"], b["state"]) for b in s["blocks"]]}
            for s in torch.cuda.memory_snapshot()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if "propagates_stream" not in item.name:
        yield
        return
    import torch
    rec = {"start": _summary(torch)}
    try:
        yield
    finally:
        rec["end"] = _summary(torch)
        path = os.path.join(os.environ.get("PROBE_OUT", "/tmp"),
                            "probe_%s.json" % os.environ.get("CMA_CONF_ROUTE", "x"))
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
