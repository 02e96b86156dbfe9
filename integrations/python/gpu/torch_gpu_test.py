"""PyTorch and CuPy on a real GPU. This process runs under cma as PyTorch's
CUDA allocator (installed at import, before CUDA initialises); route scripts
compare it in fresh processes with PyTorch's native allocator: training gives
identical losses, graphs and compiled graphs match eager, the zero-copy move
keeps pointers and values, record_stream stays correct across streams,
PyTorch's own memory tools read cma. Run on the GPU machine:
    CMA_LIBRARY=.../libcma.so python3 -m pytest -q torch_gpu_test.py
It and its route scripts put the folder above on sys.path (the repository's
package); from a folder with no cma beside it they use the installed wheel
(bench/gpu/wheel_gpu_check.sh)."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()  # before anything initialises CUDA

# Which cma ran (the repository's package, or an installed wheel's).
RESULTS = {"cma_file": cma.__file__, "library": cma.library_path()}


def run_script(script, *args, timeout=600):
    """Runs a route script of this folder in a fresh process; its last line
    of output is JSON."""
    out = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def train(route):
    return run_script("train_route.py", route)


def test_routes_train_identically():
    runs = {r: train(r) for r in ("native", "default", "mempool")}
    RESULTS["training"] = {r: {"step_ms_median": v["step_ms_median"], "final_loss": v["losses"][-1]}
                           for r, v in runs.items()}
    assert runs["default"]["losses"] == runs["native"]["losses"]
    assert runs["mempool"]["losses"] == runs["native"]["losses"]
    # The routes really went through cma.
    assert runs["default"]["cma_stats"]["num_device_alloc"] > 0
    assert runs["mempool"]["cma_stats"]["allocation.all.allocated"] > 0


@pytest.mark.parametrize("route", ["default", "mempool"])
def test_out_of_memory_raises_torch_out_of_memory_error(route):
    r = run_script("oom_route.py", route)
    RESULTS.setdefault("oom", {})[route] = r
    assert r["raised"], r
    assert r["type"] == "torch.OutOfMemoryError", r
    # PyTorch's message shape, then cma's own message and statistics.
    assert r["message"].startswith("CUDA out of memory. Tried to allocate 10.00 GiB."), r
    assert "caching_managed_allocator" in r["message"] and "num_ooms=" in r["message"], r
    assert r["after_ok"] and r["keep_ok"], r


@pytest.mark.parametrize("case", ["too_large", "pytorch_huge", "budget", "bad_device"])
def test_every_failed_allocation_raises_and_the_process_goes_on(case):
    r = run_script("error_route.py", case)
    RESULTS.setdefault("errors", {})[case] = r
    assert r["after_ok"], r
    if case == "bad_device":  # PyTorch checks the device before any allocator
        assert r["type"] is not None, r
        return
    # As PyTorch's own allocator: any request the device cannot hold.
    assert r["type"] == "torch.OutOfMemoryError", r
    assert "Tried to allocate" in r["message"] and "total capacity" in r["message"], r
    if case == "pytorch_huge":
        assert "Tried to allocate 800000000.00 GiB" in r["message"], r


@pytest.mark.parametrize("route", ["default", "mempool"])
def test_cuda_graphs_and_compiled_graphs_match_eager(route):
    r = run_script("graph_route.py", route, timeout=600)
    RESULTS.setdefault("graphs", {})[route] = r
    # torch.cuda.graph and torch.compile's cudagraph trees capture into
    # private pools that live in cma's core.
    for case in ("cuda_graph", "compile_reduce_overhead", "graphed_callables"):
        assert r[case] == "match", r
    assert r["eager_after"], r


@pytest.mark.parametrize("route", ["native", "default"])
def test_a_failed_capture_leaves_the_allocator_working(route):
    r = run_script("failed_capture_route.py", route)
    RESULTS.setdefault("failed_capture", {})[route] = r
    assert r["capture_error"] is not None, r  # the capture did fail
    # PyTorch's own allocator keeps deferring record_stream's events after a
    # failed capture (its context stays open too): measured, not asserted.
    must = [k for k in r if k not in ("route", "capture_error")]
    if route == "native":
        must = [k for k in must if not k.startswith("record_stream")]
    failed = {k: r[k] for k in must if r[k] is not True}
    assert not failed, r


@pytest.mark.parametrize("route", ["default", "mempool"])
def test_two_gpus_in_one_process(route):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    r = run_script("two_gpu_route.py", route, timeout=300)
    RESULTS.setdefault("two_gpus", {})[route] = r
    assert r["device_of_cuda1"] == 1 and r["device_of_cuda0"] == 0, r
    assert r["compute_on_1"] and all(r["stats_devices"]), r
    if route == "default":
        assert r["move_same_ptr"] and r["move_values"] and r["move_back"], r


def test_pytorch_memory_tools_see_cma_and_render(tmp_path):
    r = run_script("memory_tools_route.py", str(tmp_path), timeout=300)
    RESULTS["memory_tools"] = r
    assert r["stats_keys_ok"] and r["summary_ok"], r
    assert r["max_memory_allocated"] >= (53 << 20) + 1000, r
    assert r["peak_after_reset"] < r["max_memory_allocated"], r
    # One arena carves every size: one segment, clipped to the pages it holds.
    assert r["segments"] >= 1 and r["trace_entries"] >= 5, r
    assert r["segment_plot_bytes"] > 1000 and r["trace_plot_bytes"] > 1000, r


def test_move_round_trip_keeps_pointer_values_and_memory():
    t = torch.randn(64 << 20, device="cuda")  # 256 MiB
    ref = t.clone().cpu()
    ptr = t.data_ptr()
    before = cmat.memory_stats()
    c = cmat.move(t, "cpu")
    assert c.device.type == "cpu" and c.data_ptr() == ptr
    assert torch.equal(c, ref)
    g = cmat.move(c, "cuda")
    assert g.device.type == "cuda" and g.data_ptr() == ptr
    assert torch.equal(g.cpu(), ref)
    after = cmat.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]  # no 2nd buffer
    assert after["moves"] == before["moves"] + 2
    # A view keeps its strides and offset.
    v = cmat.move(t[1024:].view(-1, 1024)[:, :512], "cpu")
    assert torch.equal(v, ref[1024:].view(-1, 1024)[:, :512])


def test_move_of_memory_cma_does_not_own_is_refused():
    t = torch.ones(4096)  # host memory from PyTorch's CPU allocator
    with pytest.raises(ValueError, match="does not own a cma allocation"):
        cmat.move(t, "cuda")


def test_record_stream_across_two_streams():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    n = 32 << 20
    for _ in range(5):
        with torch.cuda.stream(s1):
            x = torch.full((n,), 3.0, device="cuda")
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            torch.cuda._sleep(50_000_000)  # s2 is still reading x when x dies
            y = x * 2
        x.record_stream(s2)
        del x
        with torch.cuda.stream(s1):
            z = torch.full((n,), 7.0, device="cuda")  # must not land on x
        torch.cuda.synchronize()
        assert torch.all(y == 6.0).item()
        assert torch.all(z == 7.0).item()


def test_pytorchs_statistics_are_cmas():
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 1 << 20, 3 << 20)]
    mine = cmat.memory_stats(0)
    theirs = torch.cuda.memory_stats(0)  # through c10's getDeviceStats, unpatched
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                "requested_bytes.all.current", "allocation.all.current", "num_ooms"):
        assert theirs[key] == mine[key], key
    assert theirs["requested_bytes.all.current"] >= 1000 + (1 << 20) + (3 << 20)
    segments = torch.cuda.memory_snapshot()
    # Every segment PyTorch sees lies inside one of cma's (a segment may
    # start at a free block over populated pages, so not at an allocation).
    ours = [(s["address"], s["address"] + s["total_size"]) for s in cma.snapshot()]
    assert segments and all(any(lo <= s["address"] and s["address"] + s["total_size"] <= hi
                                for lo, hi in ours) for s in segments)
    for t in keep:
        assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"]
                   for s in segments)
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    del keep


UNCACHED_AT_START = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch, cma, cma.torch as cmat
cmat.use_as_default()
t = torch.ones(1000, device="cuda")
s = torch.cuda.memory_stats(0)
print(json.dumps({"sum": t.sum().item(), "requested": s.get("requested_bytes.all.allocated", 0),
                  "in_cma": any(g["address"] <= t.data_ptr() < g["address"] + g["total_size"]
                                for g in cma.snapshot())}))
"""


def test_uncached_mode_and_pytorchs_no_caching_variable():
    # torch.cuda.caching_allocator_enable(False): each allocation is a
    # managed allocation of its own, outside cma's pools and statistics,
    # freed at once; True brings the pools back (PyTorch's uncached mode).
    key = "requested_bytes.all.allocated"
    before = torch.cuda.memory_stats(0)[key]
    torch.cuda.caching_allocator_enable(False)
    try:
        t = torch.full((1 << 20,), 3.0, device="cuda")
        assert t.sum().item() == 3.0 * (1 << 20)
        assert not any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"]
                       for s in cma.snapshot())
        ptr = torch._C._cuda_cudaCachingAllocator_raw_alloc(1 << 20, 0)
        torch._C._cuda_cudaCachingAllocator_raw_delete(ptr)
        assert torch.cuda.memory_stats(0)[key] == before
        del t  # freed while the mode is still off
        u = torch.ones(10, device="cuda")
    finally:
        torch.cuda.caching_allocator_enable(True)
    del u  # made uncached, freed after the mode is back on
    t = torch.empty(1 << 20, device="cuda")
    assert torch.cuda.memory_stats(0)[key] == before + (4 << 20)
    assert any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"]
               for s in cma.snapshot())
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1 starts in that mode, as native does.
    out = subprocess.run([sys.executable, "-c", UNCACHED_AT_START, os.path.join(HERE, "..")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    RESULTS["uncached_at_start"] = r
    assert r["sum"] == 1000.0 and r["requested"] == 0 and not r["in_cma"], r


def test_allocator_interface_end_to_end():
    r = run_script("allocator_api_route.py", timeout=300)
    RESULTS["allocator_api"] = r
    # Each check reports True or a string saying how it failed or what it
    # raised; the script's other entries are facts (numbers, names).
    checks = {k: v for k, v in r.items() if v is True or (isinstance(v, str) and
              v.startswith(("failed: ", "raised ")))}
    assert len(checks) >= 8, r
    failed = {k: v for k, v in checks.items() if v is not True}
    assert not failed, failed


@pytest.mark.parametrize("route", ["native", "default"])
def test_sharing_cuda_tensors_between_processes(route):
    # Issue 49: under cma every way torch.multiprocessing shares a CUDA tensor
    # (Queue, JoinableQueue, SimpleQueue, Pipe, reduce_tensor) refuses in the
    # caller within seconds, naming the ways out; the consumer does not hang;
    # .cpu() shares. Native shares the same queue (a check of the script).
    r = run_script("ipc_route.py", route, timeout=300)
    RESULTS.setdefault("ipc", {})[route] = r
    checks = {k: v for k, v in r.items() if v is True or (isinstance(v, str) and
              v.startswith(("failed: ", "raised ")))}
    assert len(checks) >= (4 if route == "native" else 12), r
    failed = {k: v for k, v in checks.items() if v is not True}
    assert not failed, r
    assert r["consumer_exit"] == 0, r


def test_mempool_with_another_allocator():
    # PyTorch's TestMemPool expectations for MemPool(allocator) (cma_pool_create_with_source).
    r = run_script("foreign_pool_route.py", timeout=400)
    RESULTS["foreign_pool"] = r
    failed = {k: v for k, v in r.items() if k != "dummy_calls" and v is not True}
    assert not failed, failed
    assert r["dummy_calls"][0] > 0 and r["dummy_calls"][0] == r["dummy_calls"][1], r


def test_sleep_and_wake_keep_tensors_and_values():
    r = run_script("sleep_route.py", timeout=300)
    RESULTS["sleep"] = r
    assert r["slept"] >= (192 << 20) and r["woke"] == r["slept"], r
    assert r["same_pointer"] and r["values_kept"] and r["disposable_usable"], r


def test_sleep_levels_and_staging():
    r = run_script("sleep_levels_route.py", timeout=300)
    RESULTS["sleep_levels"] = r
    assert all(v is True for v in r["checks"].values()), r


def test_zero_copy_mode():
    r = run_script("zero_copy_route.py", timeout=300)
    RESULTS["zero_copy"] = r
    flat = {k: v for k, v in r.items() if k != "fallbacks_copy"}
    assert all(v is True for v in flat.values()), r
    assert all(r["fallbacks_copy"].values()), r


def test_managed_cpu_switch():
    r = run_script("managed_cpu_route.py", timeout=500)
    RESULTS["managed_cpu"] = r
    flat = {k: v for k, v in r.items() if k not in ("fallbacks_copy", "host_stats", "left_behind")}
    assert all(v is True for v in flat.values()), r
    assert all(r["fallbacks_copy"].values()), r


def test_default_dataloader_under_the_switch():
    out = subprocess.run([sys.executable, os.path.join(HERE, "dataloader_route.py")],
                         capture_output=True, text=True, timeout=300)
    r = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    RESULTS["dataloader"] = r
    assert out.returncode == 0 and r.get("passed"), (r, out.stderr[-3000:])


def test_offload_patterns():
    """Staged step, activation offload and the switch's aliases against the
    plain loop (offload_patterns_route.py prints PASS/FAIL per case)."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "offload_patterns_route.py")],
                         capture_output=True, text=True, timeout=600)
    RESULTS["offload_patterns"] = [l for l in out.stdout.splitlines()
                                   if l.startswith(("PASS", "FAIL"))]
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])


def test_cupy_route():
    cupy = pytest.importorskip("cupy")
    import cma.cupy as cmac
    cmac.use()
    before = cma.stats()["allocation.all.allocated"]
    a = cupy.arange(1_000_000, dtype=cupy.float64)
    assert float(a.sum()) == 999_999 * 1_000_000 / 2
    assert cma.device_of(a.data.ptr) == 0
    assert cma.stats()["allocation.all.allocated"] > before
    del a
    cupy.cuda.set_allocator(None)


def teardown_module():
    out = os.environ.get("CMA_RESULTS")
    if out and RESULTS:
        with open(out, "w") as f:
            json.dump(RESULTS, f, indent=1)


@pytest.mark.parametrize("impl", ["fused", "foreach", "single"])
def test_oversubscription_staged_step_is_bit_identical(impl):
    runs = {r: run_script("oversub_route.py", r, impl, timeout=300)
            for r in ("native", "staged", "direct", "offload")}
    RESULTS.setdefault("oversub_staged_step", {})[impl] = runs
    for r in ("staged", "direct", "offload"):
        for key in ("losses", "params", "state"):
            assert runs[r][key] == runs["native"][key], (r, key, runs)
        assert runs[r]["state_on_host"] > 0 and runs[r]["num_host_placements"] > 0, runs[r]
        assert runs[r]["post_hook_saw_grads"] and runs[r]["host_resident_refuses_cpu"], runs[r]
    # Every step after the one that creates the state is staged, and only
    # then; a fused step never (it reads and writes the state once anyway).
    assert runs["staged"]["steps_staged"] == (0 if impl == "fused" else 7), runs["staged"]
    assert runs["direct"]["steps_staged"] == 0, runs["direct"]
    # Nothing overflows this small model: only the forced 64 MiB a step moves
    # (from the second step: cma.torch sees the optimizer at its first).
    assert runs["staged"]["offload"]["bytes_moved"] == 0, runs["staged"]
    moved = runs["offload"]["offload"]["bytes_moved"]
    assert 7 * (64 << 20) <= moved <= 7 * (128 << 20), runs["offload"]


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_oversubscription_keeps_the_state_that_fits_on_the_device(impl):
    runs = {r: run_script("oversub_route.py", r, impl, timeout=300)
            for r in ("native", "fit", "partial")}
    RESULTS.setdefault("oversub_state_fit", {})[impl] = runs
    for r in ("fit", "partial"):
        for key in ("losses", "params", "state"):
            assert runs[r][key] == runs["native"][key], (r, key, runs)
    # Nothing oversubscribed: made on the host by the first step, the whole
    # state is on the device after the second.
    assert runs["fit"]["state_bytes_on_host_after_first"] == runs["fit"]["state_bytes"] > 0, \
        runs["fit"]
    assert runs["fit"]["state_bytes_on_host"] == 0, runs["fit"]
    # A device part the size of the step's peak and half the state: about
    # half of it on the device, the rest on the host.
    part = runs["partial"]
    assert 0 < part["state_on_host"] < part["state_large"], part
    assert 0.25 <= part["state_bytes_on_host"] / part["state_bytes"] <= 0.75, part


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_fsdp2_trains_identically_with_its_state_on_the_host(impl):
    """FSDP2's DTensor parameters and state under oversubscription (its
    first run on two GPUs failed in the activation offload's watch, which
    read a DTensor's storage)."""
    runs = {r: run_script("fsdp_route.py", r, impl, timeout=300)
            for r in ("native", "cma", "oversub")}
    RESULTS.setdefault("fsdp2", {})[impl] = runs
    assert runs["native"]["params_are_dtensors"], runs["native"]
    for r in ("cma", "oversub"):
        assert runs[r]["losses"] == runs["native"]["losses"], (r, runs)
    assert runs["oversub"]["state_on_host"] == runs["oversub"]["state_tensors"] > 0, runs
    assert runs["cma"]["state_on_host"] == 0, runs


@pytest.mark.parametrize("impl", ["fused", "foreach", "single"])
def test_step_in_backward_is_bit_identical(impl):
    runs = {r: run_script("oversub_route.py", r, impl, timeout=300)
            for r in ("native", "inbwd", "inbwd_native")}
    RESULTS.setdefault("step_in_backward", {})[impl] = runs
    for r in ("inbwd", "inbwd_native"):
        for key in ("losses", "params", "state"):
            assert runs[r][key] == runs["native"][key], (r, key, runs)
        # 8 MiB buckets over 14 weights of 16 MiB: a bucket a weight or more,
        # every backward after the two plain, checked steps the hint begins
        # with. Gradients stay readable (free_grads=False): a post-hook the
        # caller registered after the hint sees them, and they live on.
        assert runs[r]["buckets_applied"] >= 6 * 14, runs[r]
        assert runs[r]["grads_after_backward"] > 0 and runs[r]["post_hook_saw_grads"], runs[r]
        assert runs[r]["refused"] == {"clip": True, "accumulate": True, "scaler": True,
                                      "bad_input": [True, True, True, True]}, runs[r]
        # Hopper offers green contexts: the side stream holds 8 SMs.
        assert runs[r]["side_stream_sms"] == {"0": 8}, runs[r]
    # State made during backward follows oversubscription's placement, but
    # for the last bucket's (the embedding, 2 x 16 MiB, and what came after
    # it), which moves to the device after the first backward.
    assert runs["inbwd"]["state_on_host"] > 0, runs["inbwd"]
    assert runs["inbwd"]["tail_state_bytes"] >= 32 << 20, runs["inbwd"]
    assert runs["inbwd_native"]["tail_state_bytes"] == 0, runs["inbwd_native"]


def run_route_env(env, *args, timeout=300):
    """settings_route.py in a fresh process with `env` added (settings read
    at start need one)."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CMA_ALLOC_CONF")}
    environ.update(env)
    out = subprocess.run([sys.executable, os.path.join(HERE, "settings_route.py"), *args],
                         capture_output=True, text=True, timeout=timeout, env=environ)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pytorchs_settings_reach_cma_and_its_reports():
    conf = "max_split_size_mb:256,roundup_power2_divisions:4"
    r = run_route_env({"PYTORCH_CUDA_ALLOC_CONF": conf}, "settings")
    RESULTS["settings"] = r
    MiB = 1 << 20
    start = r["start"]
    # At start: cma's live config, getDeviceStats and the snapshot agree.
    assert start["cma_max_split_size"] == 256 * MiB, r
    assert start["stats_max_split_size"] == 256 * MiB, r
    assert start["snapshot_max_split_size"] == 256 * MiB, r
    assert start["cma_roundup"] == "4", r
    assert set(start["snapshot_roundup"].values()) == {4}, r
    assert start["cma_pytorch_settings"] == conf and start["snapshot_conf"] == conf, r
    assert start["snapshot_expandable"] is True and start["snapshot_has_cma"], r
    # torch.cuda.memory._set_allocator_settings (deprecated in 2.11: warns).
    after = r["after_set"]
    assert after["cma_max_split_size"] == 128 * MiB == after["stats_max_split_size"], r
    assert after["snapshot_max_split_size"] == 128 * MiB, r
    assert after["cma_gc"] == 0.6 and after["snapshot_gc"] == 0.6, r
    assert after["cma_roundup"] == "0", r  # left out: CMA_ALLOC_CONF's (none)
    # torch._C._accelerator_setAllocatorSettings (PyTorch's recommended setter).
    acc = r["after_accelerator"]
    assert acc["cma_roundup"] == "8" and set(acc["snapshot_roundup"].values()) == {8}, r
    assert acc["stats_max_split_size"] == -1 and acc["snapshot_max_split_size"] == -1, r
    assert acc["cma_pytorch_settings"] == "roundup_power2_divisions:8" == acc["snapshot_conf"], r
    assert r["bogus_refused"] and r["after_bogus"] == acc, r
    assert r["allocated_84k"] == 88 << 10, r


def test_rfc_0023s_names():
    r = run_route_env({}, "rfc")
    RESULTS["rfc_0023_names"] = r
    assert r["move_on_copy_default"] is False and r["enabled_before"] is False, r
    assert r["enabled_after"] and r["cpu_tensor_in_snapshot"] == "host", r
    assert r["to_copies_by_default"], r  # the RFC's flag is off until set
    assert r["uvm_to_moves"] and r["uvm_to_values"], r
    assert r["moved_tensor_in_snapshot"] == "device 0", r
    assert r["move_on_copy_set"] and r["to_moves_when_set"], r
    assert r["uvm_to_copies_other_tensors"], r
    assert r["enabled_off"] is False and r["cpu_after_off_is_torchs"], r


def test_host_allocations_are_marked_in_pytorchs_snapshot(tmp_path):
    r = run_route_env({}, "host", str(tmp_path))
    RESULTS["host_in_snapshot"] = r
    assert r["tier_marked"] and r["resident_unmarked"], r
    assert r["away_blocks"] == 1 and r["away_listed"], r
    assert r["host_tier_bytes"] >= 64 << 20 and r["away_bytes"] >= 62 << 20, r
    assert r["segment_plot_bytes"] > 1000 and r["sent_values"], r


def test_memory_plots_name_a_freed_tensor_in_a_fresh_process():
    # PyTorch's TestCudaMallocAsync.test_memory_plots, run alone: the plots
    # drop freed allocations' events, so only a free block's last request
    # still names the size.
    runs = {r: run_script("memory_plots_route.py", r) for r in ("native", "cma")}
    RESULTS["memory_plots"] = runs
    for r in ("native", "cma"):
        for run in runs[r]["runs"]:
            assert run["size_named"], runs
            assert run["maker_named"] == (run["context"] is not None), runs
