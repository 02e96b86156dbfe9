"""The blocker of torch_oversub_bench.py: another process that holds all of
the GPU's memory but X with plain cudaMalloc-style allocations (the driver
API's cuMemAlloc through ctypes: no torch, no runtime library to find), so
a route sees exactly X free and managed memory cannot borrow the rest (the
driver never evicts cuMemAlloc memory).

Lifetime: the blocker must never outlive the benchmark that started it.
It asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG),
exits when its stdin closes (the parent's end of the pipe closes with the
parent, whatever killed it), and polls os.getppid() every second in case
the parent died before the death signal was armed. The parent side
(Blocker) closes it in close(), from atexit, and its user's try/finally.

Also here, torch-free: host memory (/proc/meminfo) and NVML device facts.
    python3 oversub_blocker.py --free BYTES [--device N] [--tol BYTES]
prints "READY free=F total=T held=H" (or "ERROR ...") and waits; H is what
its allocations hold (its context's cost comes on top).
"""
import argparse
import atexit
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

MiB, GiB = 1 << 20, 1 << 30
PR_SET_PDEATHSIG = 1
HERE = os.path.abspath(__file__)


def die_with_parent(sig=signal.SIGKILL):
    """In a child (preexec_fn or its own start): the kernel sends `sig` when
    the parent exits. Best effort: not Linux, no error."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def meminfo(path="/proc/meminfo"):
    """{field: bytes} of /proc/meminfo."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def mem_available(path="/proc/meminfo"):
    return meminfo(path).get("MemAvailable", 0)


def fill_to(target, tol, get_free, alloc, release, step=2 * MiB, max_iter=200):
    """Allocates until get_free() is within target +- tol. alloc(n) -> handle
    or None (refused); release(handle). Aims at target + tol/2, because each
    allocation may cost the driver a little more than its size; overshoot
    below target - tol gives the last chunk back and retries smaller.
    Returns (free, [(handle, size)]); raises RuntimeError when it cannot."""
    held = []  # [(handle, size)]
    free = get_free()
    if free < target - tol:
        raise RuntimeError("only %d MiB free, asked to leave %d MiB" % (free // MiB, target // MiB))
    for _ in range(max_iter):
        free = get_free()
        if target - tol <= free <= target + tol:
            return free, held
        if free < target - tol:
            if not held:
                raise RuntimeError("free memory fell to %d MiB under us" % (free // MiB))
            h, size = held.pop()
            release(h)
            short = target - free
            size = (size - short - tol // 2) // step * step
            if size >= step:
                h = alloc(size)
                if h is not None:
                    held.append((h, size))
            continue
        size = (free - target - tol // 2) // step * step
        size = max(size, step)
        h = None
        while size >= step:
            h = alloc(size)
            if h is not None:
                break
            size = size // 2 // step * step
        if h is None:
            raise RuntimeError("the driver refused %d MiB with %d MiB free" % (
                step // MiB, free // MiB))
        held.append((h, size))
    raise RuntimeError("free memory did not settle within %d MiB of %d MiB (last %d MiB)"
                       % (tol // MiB, target // MiB, free // MiB))


class _Driver:
    """The few CUDA driver calls the blocker needs."""

    def __init__(self, device):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0), "cuInit")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self._ok(self.cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self._ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ok(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def _ok(rc, what):
        if rc:
            raise RuntimeError("%s returned CUDA error %d" % (what, rc))

    def info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._ok(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def alloc(self, n):
        p = ctypes.c_uint64()
        return p.value if self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0 else None

    def release(self, p):
        self.cu.cuMemFree_v2(ctypes.c_uint64(p))


class _Fake:
    """For the tests: a device with `free` bytes and 1 MiB of overhead per allocation."""

    def __init__(self, free):
        self.free, self.total = free, free

    def info(self):
        return self.free, self.total

    def alloc(self, n):
        if n + MiB > self.free:
            return None
        self.free -= n + MiB
        return n

    def release(self, n):
        self.free += n + MiB


def child_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--free", type=int, required=True,
                    help="bytes to leave free; negative: hold nothing (a context-cost probe)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--tol", type=int, default=64 * MiB)
    ap.add_argument("--fake", type=int, default=0, help="tests: a fake device with this many bytes")
    a = ap.parse_args(argv)
    die_with_parent()
    parent = int(os.environ.get("OVERSUB_BLOCKER_PARENT", os.getppid()))
    if os.getppid() != parent:
        return 1
    try:
        dev = _Fake(a.fake) if a.fake else _Driver(a.device)
        if a.free < 0:
            free, held = dev.info()[0], []
        else:
            free, held = fill_to(a.free, a.tol, lambda: dev.info()[0], dev.alloc, dev.release)
    except (RuntimeError, OSError) as e:
        print("ERROR " + str(e).replace("\n", " "), flush=True)
        return 1
    total = dev.info()[1]
    print("READY free=%d total=%d held=%d" % (free, total, sum(n for _, n in held)), flush=True)
    while True:
        r, _, _ = select.select([sys.stdin], [], [], 1.0)
        if r and sys.stdin.readline() in ("", "exit\n"):
            return 0  # the process's exit gives the memory back
        if os.getppid() != parent:
            return 0


class Blocker:
    """The parent's handle on one blocker process. Blocker(free) returns once
    the blocker reports READY; raises RuntimeError (with the blocker's
    message) otherwise. Use as a context manager; close() is idempotent and
    also registered with atexit."""

    def __init__(self, free, device=0, tol=64 * MiB, timeout=180, fake=None):
        if fake is None:  # the tests' fake device (torch_oversub_bench's end-to-end test)
            fake = int(os.environ.get("OVERSUB_FAKE_GPU", "0"))
        argv = [sys.executable, HERE, "--free", str(int(free)), "--device", str(device),
                "--tol", str(int(tol))] + (["--fake", str(fake)] if fake else [])
        env = dict(os.environ, OVERSUB_BLOCKER_PARENT=str(os.getpid()), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, preexec_fn=die_with_parent)
        atexit.register(self.close)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("READY"):
            self.close()
            raise RuntimeError("blocker: %s" % (line or "no READY within %d s" % timeout))
        self.facts = {k: int(v) for k, v in (f.split("=") for f in line.split()[1:])}
        self.free = self.facts["free"]

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def gpu_facts(index=None):
    """NVML's view of the device (no CUDA context): name, driver, total,
    free; {"error": ...} without NVML. index: the first CUDA_VISIBLE_DEVICES
    entry when it is a number, else 0."""
    if index is None:
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        index = int(first) if first.isdigit() else 0
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2():
            return {"error": "nvmlInit_v2 failed"}
        h, buf = ctypes.c_void_p(), ctypes.create_string_buffer(96)
        if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)):
            return {"error": "no NVML device %d" % index}
        out = {"nvml_index": index}
        if nvml.nvmlDeviceGetName(h, buf, 96) == 0:
            out["name"] = buf.value.decode()
        if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
            out["driver"] = buf.value.decode()
        mem = (ctypes.c_ulonglong * 3)()
        if nvml.nvmlDeviceGetMemoryInfo(h, mem) == 0:
            out["total"], out["free"] = mem[0], mem[1]
        return out
    except OSError as e:
        return {"error": str(e)}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
