#!/usr/bin/env python3
"""Renders cma_bench JSON results as markdown tables and PNG plots.

    bench/render_results.py RESULT.json [--png latency.png]
    bench/render_results.py A.json B.json [--png compare.png]   # side by side (e.g. CUDA vs ROCm)

One file: its latency, replay, migration and symmetric sections. Two files:
the same sections with a column per file. PNG plots need matplotlib (Debian's
python3-matplotlib); markdown needs nothing beyond the standard library.
"""
import argparse
import json
import sys


def _label(d, i):
    return f"{d.get('backend', '?')} ({d.get('device', '?')})" if d else f"file {i}"


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def latency_markdown(results):
    """Median alloc+free pair (ns) per size; one column group per file."""
    keys = []
    for d in results:
        for row in d.get("latency", []):
            keys += [k for k in row if k.endswith("_ns") and k not in keys]
    sizes = sorted({row["bytes"] for d in results for row in d.get("latency", [])})
    header = ["bytes"] + [f"{k} [{i}]" if len(results) > 1 else k
                          for i, d in enumerate(results) for k in keys]
    rows = []
    for size in sizes:
        row = [_size(size)]
        for d in results:
            by = {r["bytes"]: r for r in d.get("latency", [])}
            row += [by.get(size, {}).get(k, "") for k in keys]
        rows.append(row)
    return _table(header, rows)


def replay_markdown(results):
    header = ["file", "trace", "peak_requested", "peak_reserved", "ratio", "backend_allocs",
              "ns_per_op"]
    rows = [[i, r["trace"], r["peak_requested"], r["peak_reserved"], r["ratio"],
             r["backend_allocs"], r["ns_per_op"]]
            for i, d in enumerate(results) for r in d.get("replay", [])]
    return _table(header, rows)


def migration_markdown(results):
    rows = []
    for i, d in enumerate(results):
        m = d.get("migration", {})
        for t in m.get("first_touch", []):
            rows.append([i, f"first write: {t['case']} ({t['policy']})", t["GBps"]])
        for k, v in m.items():
            if k.endswith("GBps"):
                rows.append([i, k[:-5], v])
        if "skipped" in m:
            rows.append([i, "skipped", m["skipped"]])
    return _table(["file", "measurement", "GB/s"], rows)


def symmetric_markdown(results):
    rows = []
    for i, d in enumerate(results):
        for k, v in d.get("symmetric", {}).items():
            if not isinstance(v, dict):
                rows.append([i, k, v])
    return _table(["file", "measurement", "value"], rows)


def _describe(d, i):
    """One file's label, date, and the runtime it ran on (a HIP backend may run
    on ROCm or on a forwarding library: the runtime says which)."""
    text = f"[{i}] {_label(d, i)}, {d.get('date', '')}"
    if d.get("runtime"):
        text += f", runtime {d['runtime']}"
    if d.get("xnack"):
        text += f", XNACK {d['xnack']}"
    return text


def markdown(results):
    parts = ["Files: " + "; ".join(_describe(d, i) for i, d in enumerate(results))]
    notes = [f"[{i}] managed memory: {d['managed_memory']}"
             for i, d in enumerate(results) if d.get("managed_memory")]
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    for title, fn, key in (("Latency (median alloc+free pair, ns)", latency_markdown, "latency"),
                           ("Trace replay", replay_markdown, "replay"),
                           ("Managed-memory migration", migration_markdown, "migration"),
                           ("Symmetric mode", symmetric_markdown, "symmetric")):
        if any(key in d for d in results):
            parts += [f"## {title}", fn(results)]
    return "\n\n".join(parts) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, d in enumerate(results):
        rows = d.get("latency", [])
        if not rows:
            continue
        xs = [r["bytes"] for r in rows]
        for k in [k for k in rows[0] if k.endswith("_ns")]:
            ax.plot(xs, [r[k] for r in rows], marker="o",
                    label=f"{k} [{_label(d, i)}]" if len(results) > 1 else k)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("allocation size (bytes)")
    ax.set_ylabel("alloc + free pair (ns, median)")
    ax.set_title("caching_managed_allocator vs what users would otherwise call")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="one or two cma_bench JSON files")
    ap.add_argument("--png", help="write a latency plot here (needs matplotlib)")
    ap.add_argument("--out", help="write the markdown here instead of stdout")
    args = ap.parse_args(argv)
    if len(args.files) > 2:
        ap.error("one file, or two to compare")
    results = []
    for f in args.files:
        with open(f) as fh:
            results.append(json.load(fh))
    text = markdown(results)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    if args.png:
        plot(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
