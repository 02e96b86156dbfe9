"""What cma adds to PyTorch's memory tools (cma/_torch_view.py), on the host
backend and without torch: a snapshot shaped as torch.cuda.memory._snapshot()
gives it (one PyTorch segment per cma segment, blocks without addresses, as
PyTorch's dicts may have them), and PyTorch's settings setters are plain
functions that accept or refuse a string as PyTorch's do."""
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cma  # noqa: E402
from cma import _torch_view  # noqa: E402

MiB = 1 << 20


@pytest.fixture
def oversubscribed():
    cma.init("oversubscribe:1", backend="host")
    yield
    cma.shutdown()


@pytest.fixture
def plain():
    cma.init("max_split_size_mb:64", backend="host")
    yield
    cma.shutdown()


def torch_shaped(segments):
    """What cma's CUDAAllocator hands PyTorch, in PyTorch's dict shape."""
    return {"segments": [{"device": s["device"], "address": s["address"],
                          "total_size": s["total_size"],
                          "blocks": [{"size": b["size"], "state": b["state"]}
                                     for b in s["blocks"]]}
                         for s in segments],
            "device_traces": [[]]}


def test_the_snapshot_shows_the_host_tier_away_blocks_and_cpu_tensors(oversubscribed):
    cma.set_host_routing(True)
    tier = cma.malloc(4 * MiB)
    cma.set_host_routing(False)
    resident = cma.malloc(8 * MiB)
    sent = cma.malloc(8 * MiB)
    cma._lib.send_away([sent])
    cpu = cma.malloc(3 * MiB, "cpu")
    moved = cma.malloc(4 * MiB, "cpu")
    cma.move(moved, 0)
    cma.synchronize()
    assert cma.placed_on_host(tier) and not cma.placed_on_host(resident)

    snap = _torch_view.mark_snapshot(torch_shaped(cma.snapshot()), cma.snapshot(),
                                     cma.host_snapshot(), cma.config())
    on_host = [s for s in snap["segments"] if s["cma_on_host"]]
    assert on_host and all(s["address"] <= tier < s["address"] + s["total_size"]
                           for s in on_host)
    assert all(not (s["address"] <= resident < s["address"] + s["total_size"])
               for s in on_host)
    flagged = [(s["address"], b) for s in snap["segments"] for b in s["blocks"] if b["cma_away"]]
    assert len(flagged) == 1 and flagged[0][1]["size"] >= 8 * MiB
    mine = snap[_torch_view.KEY]
    assert [a["address"] for a in mine["away"]] == [sent]
    assert mine["away_bytes"] >= 8 * MiB
    assert mine["host_tier_bytes"] >= 4 * MiB
    host = {b["address"]: b for b in mine["host_pool"]}
    assert host[cpu]["location"] == "host" and host[cpu]["requested_size"] == 3 * MiB
    assert host[moved]["location"] == "device 0"
    assert mine["host_pool_bytes"] >= 7 * MiB
    assert mine["host_pool_on_device_bytes"] >= 4 * MiB
    assert mine["host_pool_on_device_bytes"] < mine["host_pool_bytes"]
    for p in (tier, resident, sent, cpu, moved):
        cma.free(p)
    cma.synchronize()
    after = _torch_view.mark_snapshot(torch_shaped(cma.snapshot()), cma.snapshot(),
                                      cma.host_snapshot(), cma.config())[_torch_view.KEY]
    assert after["host_pool_bytes"] == 0 and after["away"] == [] and after["host_tier_bytes"] == 0


def test_the_snapshot_reports_the_live_settings(plain):
    cma.apply_pytorch_settings("max_split_size_mb:128,roundup_power2_divisions:4")
    snap = _torch_view.mark_snapshot({"segments": []}, cma.snapshot(), cma.host_snapshot(),
                                     cma.config())
    live = snap[_torch_view.KEY]["settings"]
    assert live["max_split_size"] == 128 * MiB
    assert live["roundup_power2_divisions"] == "4"
    assert live["pytorch_settings"] == "max_split_size_mb:128,roundup_power2_divisions:4"
    assert "max_split_size_mb:128" in live["config"]
    assert "max_split_size_mb:64" in cma.config()["config"]  # as made


def test_block_addresses_prefer_pytorchs_own():
    seg = {"address": 1000, "blocks": [{"size": 10}, {"size": 5, "address": 2000}, {"size": 1}]}
    assert [a for _, a in _torch_view._block_addresses(seg)] == [1000, 2000, 1015]


class FakeSetters:
    """PyTorch 2.11's two setters: the deprecated one calls the other, which
    refuses what PyTorch's parser refuses."""

    def __init__(self):
        self.calls = []
        self.accelerator = self._accelerator
        self.cuda = self._cuda

    def _accelerator(self, env):
        if "bogus" in env:
            raise RuntimeError("Unrecognized key 'bogus' in Allocator Config.")
        self.calls.append(("accelerator", env))

    def _cuda(self, env):
        self.calls.append(("cuda", env))
        return self.accelerator(env)  # looked up at call time, as torch._C's attribute is


def test_each_settings_call_reaches_cma_once(plain):
    applied = []

    def apply(env):
        applied.append(env)
        cma.apply_pytorch_settings(env)

    follower = _torch_view.SettingsFollower(apply)
    s = FakeSetters()
    s.accelerator = follower.wrap(s.accelerator)
    s.cuda = follower.wrap(s.cuda)
    assert follower.wrap(s.accelerator) is None  # no second wrapper
    s.cuda("max_split_size_mb:32")
    assert applied == ["max_split_size_mb:32"]
    assert s.calls == [("cuda", "max_split_size_mb:32"), ("accelerator", "max_split_size_mb:32")]
    s.accelerator("roundup_power2_divisions:2")
    assert applied == ["max_split_size_mb:32", "roundup_power2_divisions:2"]
    live = cma.config()["live"]
    assert live["pytorch_settings"] == "roundup_power2_divisions:2"
    assert live["max_split_size"] == 64 * MiB  # the string left it out: CMA_ALLOC_CONF's
    # PyTorch refuses: cma never sees it, and a later call still applies.
    with pytest.raises(RuntimeError, match="bogus"):
        s.cuda("bogus:1")
    assert applied[-1] == "roundup_power2_divisions:2"
    s.accelerator("max_split_size_mb:256")
    assert cma.config()["live"]["max_split_size"] == 256 * MiB
    # cma refuses what its own parser refuses, after PyTorch accepted it.
    with pytest.raises(cma.CmaError, match="garbage_collection_threshold"):
        s.accelerator("garbage_collection_threshold:2")
    assert cma.config()["live"]["max_split_size"] == 256 * MiB


def test_the_nesting_is_counted_per_thread(plain):
    applied = []
    follower = _torch_view.SettingsFollower(applied.append)
    inside, release = threading.Event(), threading.Event()

    def slow(env):
        inside.set()
        release.wait(5)

    wrapped_slow = follower.wrap(slow)
    fast = follower.wrap(lambda env: None)
    t = threading.Thread(target=wrapped_slow, args=("a:1",))
    t.start()
    inside.wait(5)
    fast("b:2")  # another thread's call, while the first is inside its setter
    release.set()
    t.join(5)
    assert sorted(applied) == ["a:1", "b:2"]


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
