"""The Python layer on the host backend (no GPU): ctypes binding, errors,
stats, zero-copy host views and moves."""
import os
import sys

import numpy
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cma  # noqa: E402


@pytest.fixture(autouse=True)
def host_allocator():
    cma.init("", backend="host")
    yield
    cma.shutdown()


def test_malloc_free_and_stats():
    p = cma.malloc(1000)
    s = cma.stats(0)
    assert s["allocated_bytes.all.current"] == 1024
    assert s["requested_bytes.all.current"] == 1000
    assert cma.device_of(p) == 0
    cma.free(p)
    assert cma.stats()["allocation.all.current"] == 0
    assert cma.backend_name() == "host"


def test_cpu_memory_comes_from_the_host_pool_and_moves_without_a_copy():
    n = 3 << 20
    p = cma.malloc(n, "cpu")
    view = cma.host_view(p, n)
    view[:] = 7
    assert cma.device_of(p) is None  # no device owns it
    assert cma.placed_on_host(p) is True
    assert cma.stats()["allocation.all.current"] == 0
    cma.move(p, 0)
    assert cma.placed_on_host(p) is False
    cma.move(p, "cpu")
    cma.synchronize()
    assert int(view.sum()) == 7 * n
    h = cma.host_stats()
    assert h["requested_bytes.current"] == n
    assert h["moves"] == 2 and h["moved_bytes_to_device"] == 4 << 20
    cma.free(p)
    assert cma.host_stats()["allocation.current"] == 0
    with pytest.raises(cma.CmaError, match="double free of host allocation"):
        cma.free(p)


def test_oversubscription_calls_are_public():
    # docs/oversubscription.md names them as cma.placed_on_host and
    # cma.set_host_routing.
    p = cma.malloc(1 << 20)
    assert cma.placed_on_host(p) is False
    cma.free(p)
    assert cma.set_host_routing is cma._lib.set_host_routing


def test_errors_carry_the_librarys_message():
    with pytest.raises(cma.CmaError, match="0 bytes"):
        cma.malloc(0)
    with pytest.raises(cma.CmaError, match="invalid device 5"):
        cma.malloc(64, device=5)
    p = cma.malloc(64)
    cma.free(p)
    with pytest.raises(cma.CmaError, match="double free"):
        cma.free(p)
    with pytest.raises(ValueError):
        cma.move(p, "gpu")
    assert cma.device_of(12345) is None


def test_last_placement_error_none_when_nothing_failed_bad_device_refused():
    p = cma.malloc(1 << 20)
    cma.move(p, "cpu")
    assert cma.last_placement_error(0) is None
    assert cma.stats(0)["num_placement_errors"] == 0
    with pytest.raises(cma.CmaError, match="device 9"):
        cma.last_placement_error(9)
    cma.free(p)


def test_host_view_aliases_the_allocation_and_survives_a_move():
    p = cma.malloc(4 << 20)
    view = cma.host_view(p, 4 << 20)
    view[:] = numpy.arange(4 << 20, dtype=numpy.uint64).astype(numpy.uint8)
    cma.move(p, "cpu")
    cma.synchronize()
    again = cma.host_view(p, 4 << 20)
    assert again.ctypes.data == p  # same address: nothing was copied
    assert numpy.array_equal(again[:256], numpy.arange(256, dtype=numpy.uint8))
    cma.move(p, 1)
    assert cma.stats(0)["moves"] == 2
    snap = cma.snapshot()
    assert any(b["location"] == "device 1" for seg in snap for b in seg["blocks"])
    del view, again
    cma.free(p)


def test_host_view_keeps_its_owner_alive():
    class Owner:
        pass
    owner = Owner()
    p = cma.malloc(4096)
    view = cma.host_view(p, 4096, owner=owner)
    assert view.base.owner is owner
    del view
    cma.free(p)


def test_advise_empty_cache_and_fraction():
    p = cma.malloc(1 << 20)
    cma.advise(p, read_mostly=True, preferred="cpu", accessed_by=(1,))
    assert cma.stats(0)["advise_calls"] >= 3
    with pytest.raises(cma.CmaError, match="accessed-by device 9"):
        cma.advise(p, accessed_by=(9,))
    cma.free(p)
    cma.empty_cache()
    assert cma.stats(0)["reserved_bytes.all.current"] == 0
    cma.set_memory_fraction(0.001, 0)
    with pytest.raises(cma.CmaError, match="managed budget"):
        cma.malloc(64 << 20)


def test_pytorch_settings_round_from_the_next_allocation():
    cma.apply_pytorch_settings("expandable_segments:True,roundup_power2_divisions:4")
    p = cma.malloc(84 << 10)
    assert cma.stats(0)["allocated_bytes.all.current"] == 96 << 10
    assert cma.stats(0)["requested_bytes.all.current"] == 84 << 10
    cma.free(p)
    with pytest.raises(cma.CmaError, match="'max_split_size_mb'"):
        cma.apply_pytorch_settings("max_split_size_mb:-2")
    cma.apply_pytorch_settings("")
    p = cma.malloc(84 << 10)
    assert cma.stats(0)["allocated_bytes.all.current"] == 84 << 10
    cma.free(p)


def test_init_twice_with_other_config_fails():
    with pytest.raises(cma.CmaError, match="already initialised"):
        cma.init("prefetch:none", backend="host")


def test_history_records_alloc_and_free():
    cma.record_history(True, max_entries=100)
    a = cma.malloc(3 << 20)
    b = cma.malloc(1000)
    cma.free(a)
    events = cma.history()
    assert [e["action"] for e in events] == ["alloc", "alloc", "free_requested", "free_completed"]
    assert events[0]["size"] == 3 << 20 and events[2]["addr"] == a
    cma.free(b)
    cma.record_history(False)
    assert cma.history() == []
    with pytest.raises(cma.CmaError, match="max_entries"):
        cma.record_history(True, max_entries=0)


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))


def test_forget_stream_refuses_the_default_stream_and_ignores_one_never_used():
    p = cma.malloc(1 << 20)
    with pytest.raises(cma.CmaError, match="default stream cannot be forgotten"):
        cma.forget_stream(None)
    cma.forget_stream(0xDEAD)  # never seen by cma: nothing to wait for or release
    assert cma.stats(0)["allocation.all.current"] == 1
    cma.free(p)


def test_sleep_levels_staging_and_its_release():
    n = 4 << 20
    w = cma.malloc(n)
    kv = cma.malloc(n)
    view = cma.host_view(w, n)
    view[:] = 7
    cma.set_disposable(kv)
    with pytest.raises(cma.CmaError, match="sleep level 9"):
        cma.sleep(0, level=9)
    assert cma.sleep(0) == 2 * n                      # level 1: staged
    assert cma.stats(0)["host_staging_bytes.all.current"] == n
    with pytest.raises(cma.CmaError, match="wake them first"):
        cma.release_sleep_staging(0)
    assert cma.wake(0) == 2 * n
    assert int(view.min()) == 7 and int(view.max()) == 7
    assert cma.release_sleep_staging(0) == n
    assert cma.stats(0)["host_staging_bytes.all.current"] == 0
    cma.set_keep(w)
    cma.sleep(0, level=2)
    cma.wake(0)
    assert int(view.min()) == 7
    cma.free(w)
    cma.free(kv)
