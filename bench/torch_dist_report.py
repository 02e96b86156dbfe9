"""The pure part of torch_dist_bench.py (no torch): NCCL-tests' bus
bandwidth, a job's per-rank results folded into one row, the loss
comparison against native, and the markdown tables. Tested in
torch_dist_bench_test.py."""
import statistics

MiB = 1 << 20


# ---------------------------------------------------------------- bandwidth

def bus_bw(op, nbytes, seconds, world):
    """NCCL-tests' bus bandwidth in GB/s (1e9 bytes/s). nbytes: for
    all_reduce the tensor's bytes; for reduce_scatter and all_gather the
    total (the larger side: every rank's part together), as NCCL-tests counts
    them. all_reduce moves 2(n-1)/n of it per rank, the others (n-1)/n."""
    if seconds <= 0 or world < 1:
        return None
    alg = nbytes / seconds / 1e9
    if op == "all_reduce":
        return alg * 2 * (world - 1) / world
    if op in ("reduce_scatter", "all_gather"):
        return alg * (world - 1) / world
    raise ValueError("unknown collective %r" % op)


def coll_sizes(min_mib, max_mib, factor):
    """Bytes from min_mib to max_mib MiB, each `factor` times the last."""
    out, n = [], int(min_mib * MiB)
    while n <= max_mib * MiB:
        out.append(n)
        n *= factor
    return out


# ---------------------------------------------------------------- losses

def compare_losses(base, other):
    """base, other: per-step losses as float.hex() strings. Bit-identical over
    the steps both have (and the same count); first_diff: the first step that
    differs (or where one run stops), None when none."""
    if not base or not other:
        return {"identical": False, "first_diff": 0 if base or other else None}
    n = min(len(base), len(other))
    diff = next((i for i in range(n) if base[i] != other[i]), None)
    if diff is None and len(base) != len(other):
        diff = n
    return {"identical": diff is None, "first_diff": diff}


# ---------------------------------------------------------------- one job

def _max(vals):
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def summarize_train(job):
    """A training job ({"status", "results": [per-rank result]}) as one row:
    median step seconds after warm-up (rank 0's timing, which includes the
    barrier, so every rank's is the same up to jitter), per-rank peaks and
    their max, rank 0's all-reduced losses (hex)."""
    res = sorted(job.get("results", []), key=lambda r: r.get("rank", 0))
    row = {k: job.get(k) for k in ("route", "mode", "model", "status")}
    r0 = res[0] if res else {}
    warm = r0.get("warmup", 0)
    times = r0.get("step_s", [])[warm:]
    row["step_s"] = statistics.median(times) if times else None
    row["losses"] = r0.get("loss_hex", [])
    row["peak_MiB_per_rank"] = [r.get("peak_sampled_MiB") for r in res]
    row["peak_MiB"] = _max(row["peak_MiB_per_rank"])
    # Sampled by the parent from before the job started (torch_dist_bench's job()).
    row["gpu_peak_MiB"] = _max(job.get("gpu_peak_MiB") or [])
    row["max_reserved_MiB"] = _max([r.get("max_reserved_MiB") for r in res])
    row["max_allocated_MiB"] = _max([r.get("max_allocated_MiB") for r in res])
    row["params"] = r0.get("params")
    row["ranks"] = len(res)
    if row["status"] == "ok" and len(res) < job.get("world", len(res)):
        row["status"] = "only %d of %d ranks reported" % (len(res), job["world"])
    return row


def compare_rows(rows):
    """Adds to each row its ratios to native (step time) and expandable
    (peak) of the same mode and model, and its losses against native's."""
    by = {(r["mode"], r["model"], r["route"]): r for r in rows}
    for r in rows:
        nat = by.get((r["mode"], r["model"], "native"))
        exp = by.get((r["mode"], r["model"], "expandable"))
        r["step_vs_native"] = (r["step_s"] / nat["step_s"]
                               if nat and nat["step_s"] and r["step_s"] is not None else None)
        r["peak_vs_expandable"] = (r["peak_MiB"] / exp["peak_MiB"]
                                   if exp and exp["peak_MiB"] and r["peak_MiB"] is not None
                                   else None)
        r["gpu_peak_vs_expandable"] = (
            r["gpu_peak_MiB"] / exp["gpu_peak_MiB"]
            if exp and exp.get("gpu_peak_MiB") and r.get("gpu_peak_MiB") is not None else None)
        r["same_losses"] = compare_losses(nat["losses"], r["losses"]) if nat else None
    return rows


def summarize_coll(job):
    """A collectives job as {"op/bytes": busbw GB/s} from rank 0 (whose
    times are already the max over ranks); string keys, so the JSON keeps them."""
    res = sorted(job.get("results", []), key=lambda r: r.get("rank", 0))
    out = {}
    for c in (res[0].get("collectives", []) if res else []):
        out["%s/%d" % (c["op"], c["bytes"])] = c.get("busbw_GBps")
    return out


# ---------------------------------------------------------------- tables

def _f(v, fmt="%.3f"):
    return "-" if v is None else fmt % v


def _same(s):
    if s is None:
        return "-"
    if s["identical"]:
        return "yes"
    return "no" + ("" if s["first_diff"] is None else " (step %d)" % s["first_diff"])


def train_table(rows):
    head = ("| model | mode | route | median step s | x native | peak MiB (max rank) | "
            "x expandable | job's GPU peak MiB | x expandable | max reserved MiB | "
            "losses = native | status |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["mode"], r["route"], _f(r["step_s"], "%.4f"),
            _f(r.get("step_vs_native")), _f(r["peak_MiB"], "%.0f"),
            _f(r.get("peak_vs_expandable")), _f(r.get("gpu_peak_MiB"), "%.0f"),
            _f(r.get("gpu_peak_vs_expandable")), _f(r["max_reserved_MiB"], "%.0f"),
            "(base)" if r["route"] == "native" and r.get("same_losses") else
            _same(r.get("same_losses")), r["status"]))
    return "\n".join(lines)


def coll_table(coll, routes):
    """coll: {route: {"op/bytes": busbw}}. One row per op and size, a
    column per route, then cma/native."""
    keys = sorted({k for v in coll.values() for k in v},
                  key=lambda k: (k.split("/")[0], int(k.split("/")[1])))
    ratio = "cma" in routes and "native" in routes
    lines = ["| op | size | " + " | ".join("%s GB/s" % r for r in routes) +
             (" | cma/native |" if ratio else " |"),
             "|" + "---|" * (2 + len(routes) + ratio)]
    for k in keys:
        op, n = k.split("/")[0], int(k.split("/")[1])
        vals = [coll.get(r, {}).get(k) for r in routes]
        row = "| %s | %s | %s |" % (op, _size(n), " | ".join(_f(v, "%.1f") for v in vals))
        if ratio:
            c, b = coll["cma"].get(k) if "cma" in coll else None, coll.get("native", {}).get(k)
            row += " %s |" % _f(c / b if c is not None and b else None)
        lines.append(row)
    return "\n".join(lines)


def _size(n):
    return "%d GiB" % (n >> 30) if n >= 1 << 30 and n % (1 << 30) == 0 else "%d MiB" % (n >> 20)


def markdown(doc):
    out = ["# torch_dist_bench", "", "`%s`" % " ".join(doc.get("argv", [])), ""]
    if doc.get("rows"):
        out += ["## Training (%d ranks)" % doc.get("world", 2), "", train_table(doc["rows"]), ""]
    if doc.get("coll"):
        routes = [r for r in doc.get("coll_routes", []) if r in doc["coll"]]
        out += ["## Collectives: bus bandwidth (NCCL-tests' formulas)", "",
                coll_table(doc["coll"], routes), ""]
    for n in doc.get("notes", []):
        out.append("- " + n)
    return "\n".join(out) + "\n"
