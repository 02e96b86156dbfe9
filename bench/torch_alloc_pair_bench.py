"""The alloc+free pair through PyTorch's allocator interface, per route
(native, expandable segments, cma's default route), one fresh process per
route and round, rounds interleaved with the order rotated, every route
process pinned to one core:

  cpp_pair_ns.SIZE  c10::cuda::CUDACachingAllocator::raw_alloc + raw_delete
                    in a tight C++ loop (a tiny extension built with
                    torch.utils.cpp_extension.load_inline, cached in
                    TORCH_EXTENSIONS_DIR), timed with std::chrono: median of
                    --batches batches of --pairs pairs
  py_pair_ns.SIZE   t = torch.empty(SIZE, dtype=torch.uint8, device="cuda");
                    del t, from Python: median of --batches batches
  py_cpu_pair_ns    the same on device="cpu" (the Python-side floor: what no
                    CUDA allocator can go below)

SIZE: 512 B, 1 MiB, 64 MiB. Each figure is the median over rounds; the table
gives the ratios to native and to expandable. The extension is built once,
before the rounds, in a process that does not initialise CUDA. The extension
returns numbers to Python; it formats nothing (iostream formatting crashed in
this process mix before).

On the GPU machine, from a folder made by bench/gpu/package.sh:
    PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so \\
      python3 torch_alloc_pair_bench.py --rounds 3 --core 5 --json OUT/torch_alloc_pair.json
writes OUT/torch_alloc_pair.json (every per-batch figure) and OUT/torch_alloc_pair.txt
(the table). --quick: one round, few pairs.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_routes  # noqa: E402

SIZES = (512, 1 << 20, 64 << 20)
EXT_NAME = "cma_bench_raw_pair_v1"
EXT_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

// ns per alloc+free pair, one value per batch. Numbers go back to Python
// as numbers: nothing here formats them.
std::vector<double> raw_pairs(int64_t bytes, int64_t pairs, int64_t batches) {
  namespace cca = c10::cuda::CUDACachingAllocator;
  if (bytes <= 0 || pairs <= 0 || batches <= 0) throw std::invalid_argument("raw_pairs: bad arguments");
  void* first = cca::raw_alloc(static_cast<size_t>(bytes));  // the first one may create a segment
  if (first == nullptr) throw std::runtime_error("raw_alloc returned null");
  cca::raw_delete(first);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(batches));
  for (int64_t b = 0; b < batches; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < pairs; ++i) {
      void* p = cca::raw_alloc(static_cast<size_t>(bytes));
      if (p == nullptr) throw std::runtime_error("raw_alloc returned null");
      cca::raw_delete(p);
    }
    auto t1 = std::chrono::steady_clock::now();
    out.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pairs));
  }
  return out;
}

// The allocator's name as the interface reports it (a string, not a number).
std::string allocator_name() { return c10::cuda::CUDACachingAllocator::get()->name(); }
"""


def load_extension():
    from torch.utils import cpp_extension
    return cpp_extension.load_inline(name=EXT_NAME, cpp_sources=EXT_SOURCE,
                                      functions=["raw_pairs", "allocator_name"], with_cuda=True,
                                      extra_cflags=["-O2"], verbose=False)


def py_pairs(torch, n, device, pairs, batches):
    empty, u8 = torch.empty, torch.uint8
    out = []
    rng = range(pairs)
    t = empty(n, dtype=u8, device=device)
    del t
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in rng:
            t = empty(n, dtype=u8, device=device)
            del t
        out.append((time.perf_counter_ns() - t0) / pairs)
    return out


def route_main(a):
    torch_routes.install(a.route)
    import torch
    torch.cuda.init()
    torch.cuda.synchronize()
    metrics, per_batch, problems, ext = {}, {}, [], None
    if not a.no_cpp:
        try:
            ext = load_extension()
        except Exception as e:  # noqa: BLE001 - the Python figures still come
            problems.append("raw_alloc extension: " + str(e)[-500:])
    for n in SIZES if ext else ():
        v = ext.raw_pairs(n, a.pairs, a.batches)
        per_batch["cpp_pair_ns.%d" % n] = v
        metrics["cpp_pair_ns.%d" % n] = statistics.median(v)
    for n in SIZES:
        v = py_pairs(torch, n, "cuda", a.py_pairs, a.batches)
        per_batch["py_pair_ns.%d" % n] = v
        metrics["py_pair_ns.%d" % n] = statistics.median(v)
    v = py_pairs(torch, 1 << 20, "cpu", a.py_pairs, a.batches)
    per_batch["py_cpu_pair_ns"] = v
    metrics["py_cpu_pair_ns"] = statistics.median(v)
    torch.cuda.synchronize()
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = []
    if a.core >= 0 and affinity != [a.core]:
        problems.append("not pinned to core %d: affinity %s" % (a.core, affinity))
    torch_routes.emit({"route": a.route, "metrics": metrics, "per_batch": per_batch,
                       "allocator": ext.allocator_name() if ext else None, "affinity": affinity,
                       "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                       "check": {"sizes": list(SIZES)}, "problems": problems})


def prepare(timeout_s):
    """Builds the extension (and cma's own, through cma.torch's import) in a
    process that initialises no CUDA, so that no timed process compiles."""
    code = ("import sys; sys.path.insert(0, %r); import torch_alloc_pair_bench as b; "
            "b.load_extension(); import torch; assert not torch.cuda.is_initialized(); "
            "print('extension ready')" % os.path.dirname(os.path.abspath(__file__)))
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout_s)
        error = p.stderr[-4000:] if p.returncode != 0 else None
    except subprocess.TimeoutExpired:
        error = "building the raw_alloc extension took over %.0f s" % timeout_s
    print("[bench] extension %s in %.1f s%s" % (
        "FAILED" if error else "built/loaded", time.monotonic() - t0,
        ":\n" + error + "\n[bench] going on with the Python pairs only" if error else ""),
        file=sys.stderr)
    return error is None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    torch_routes.add_common_args(ap, rounds=3, timeout_s=90, budget_s=130)
    ap.add_argument("--pairs", type=int, default=200_000, help="C++ pairs per batch")
    ap.add_argument("--py-pairs", type=int, default=20_000, help="Python pairs per batch")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--core", type=int, default=5, help="pin each route process (-1: do not)")
    ap.add_argument("--no-cpp", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.pairs, a.py_pairs, a.batches = 1, 20_000, 2_000, 3
    if a.route:
        route_main(a)
        return
    if a.core >= 0 and a.core not in os.sched_getaffinity(0):
        sys.exit("core %d is not available here (affinity %s): pass --core" % (
            a.core, sorted(os.sched_getaffinity(0))))
    routes = a.routes.split(",")
    have_cpp = prepare(torch_routes.remaining(a.budget, 600))
    torch_routes.prepare_routes(routes, torch_routes.remaining(a.budget, 300))

    def argv_for(route, k):
        argv = [sys.executable, os.path.abspath(__file__), "--route", route, "--round-index",
                str(k), "--pairs", str(a.pairs), "--py-pairs", str(a.py_pairs), "--batches",
                str(a.batches), "--core", str(a.core)] + ([] if have_cpp else ["--no-cpp"])
        return (["taskset", "-c", str(a.core)] if a.core >= 0 else []) + argv

    run = torch_routes.run_rounds(argv_for, routes, a.rounds, a.timeout, a.budget,
                                  started=torch_routes.STARTED)
    metrics = ([("cpp_pair_ns.%d" % n, "ns") for n in SIZES] +
               [("py_pair_ns.%d" % n, "ns") for n in SIZES] + [("py_cpu_pair_ns", "ns")])
    sys.exit(torch_routes.finish("torch_alloc_pair_bench", a, run, routes, metrics, a.json))


if __name__ == "__main__":
    main()
