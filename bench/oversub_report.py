"""The pure parts of torch_oversub_bench.py (no torch, no GPU; tested in
oversub_bench_test.py): how much memory each ratio leaves free, what a
route needs of the host, and the per-route summary and markdown table."""
import math
import statistics

MiB, GiB = 1 << 20, 1 << 30
CMA_ROUTES = ("managed_plain", "cma_oversub", "cma_oversub_hint", "cma_oversub_direct",
              "cma_oversub_inbwd", "cma_oversub_inbwd_free", "cma_oversub_learn",
              "cma_oversub_learn_thread", "cma_oversub_learn_core",
              "cma_oversub_learn_core_nothread", "cma_oversub_state_host")


def param_count(layers, width, vocab, n_pos):
    """GPT-2's parameters (lm_head tied to wte): per block two LayerNorms,
    attention (3w + w projections) and a 4w MLP, with biases."""
    block = 12 * width * width + 13 * width
    return layers * block + vocab * width + n_pos * width + 2 * width


def context_cost(probe_free, rec, margin, fallback):
    """(bytes, how) a route's CUDA context takes from X: probe_free is what
    the probe saw, rec the calibration route's record."""
    after, reserved = rec.get("free_after_init"), rec.get("reserved_after_init") or 0
    if probe_free and after and probe_free - after - reserved > 0:
        c = probe_free - after - reserved
        how = ("measured: probe's free %d MiB - route's free after init %d MiB - torch "
               "reserved then %d MiB = %d MiB" % (probe_free // MiB, after // MiB,
                                                   reserved // MiB, c // MiB))
    else:
        c, how = fallback, "fallback (--ctx-fallback-mib): not measurable"
    if margin:
        how += " + margin %d MiB" % (margin // MiB)
    return c + margin, how


def plan(mode, base, ratio, ctx):
    """The free memory each ratio asks for: train from inmem's peak
    allocated, infer from the weights."""
    ref = base["max_allocated"] if mode == "train" else base["param_bytes"]
    data = int(ref / ratio)
    return {"ratio": ratio, "reference_bytes": ref,
            "reference": "max_memory_allocated" if mode == "train" else "weight bytes",
            "data_free": data, "blocker_free": data + ctx}


def host_need(route, mode, base, data_free):
    """Bytes of host memory a route needs beyond the GPU. Every route builds
    the model on the host first (W); FSDP2 keeps params, grads and both AdamW
    moments there (4 W); managed routes hold what does not fit the GPU."""
    w = base["param_bytes"]
    if route == "fsdp2_offload":
        return 4 * w
    if route.startswith("accel"):
        return w
    ref = base["max_allocated"] if mode == "train" else base.get("max_allocated", w)
    return max(w, ref - data_free)


def refusal(need, avail):
    if need > avail / 2:
        return ("refused: needs %.1f GiB of host memory, more than half of MemAvailable "
                "(%.1f GiB)" % (need / GiB, avail / GiB))
    return None


def cma_conf(template, data_free, avail):
    budget = int(math.ceil((data_free + avail / 2) / GiB))
    return template.format(budget_gib=budget)


def compare(base, other):
    """Bit-equality of losses (float repr) over the steps both ran."""
    n = min(len(base), len(other))
    diff = next((i for i in range(n) if repr(float(base[i])) != repr(float(other[i]))), None)
    return {"identical": diff is None and n > 0, "compared": n, "of": len(base),
            "first_diff": diff}


def compare_tokens(ref_rows, runs):
    """Every run's generated tokens against inmem's first run, row by row;
    a truncated run is compared on the tokens it has."""
    diff = next((i for i, rows in enumerate(runs) if len(rows) != len(ref_rows) or any(
        r != ref[:len(r)] for r, ref in zip(rows, ref_rows))), None)
    n = min((len(rows[0]) for rows in runs if rows), default=0)
    return {"identical": diff is None and n > 0, "compared": n,
            "of": len(ref_rows[0]) if ref_rows else 0, "first_diff": diff}


def same_text(same):
    if not same:
        return "-"
    if not same["identical"]:
        return "no (first at %s)" % same["first_diff"]
    return "yes" if same["compared"] == same["of"] else "yes (%d of %d)" % (
        same["compared"], same["of"])


def summarize_route(rec, base_row, mode, warmup, tokens_per_step):
    steps = rec.get("steps") or []
    timed = steps[warmup:] or steps  # a truncated route: what it has, flagged
    row = {"route": rec.get("route"), "status": rec.get("status"), "steps": len(steps),
           "warmup_only": bool(steps) and not steps[warmup:]}
    if timed:
        row["s_step"] = statistics.median(s["s"] for s in timed)
        # train: batch x seq a step; infer: batch x the tokens each run generated
        tok = [tokens_per_step * (s["new_tokens"] if mode == "infer" else 1) for s in timed]
        row["tokens_s"] = statistics.median(t / s["s"] for t, s in zip(tok, timed))
    if base_row and row.get("tokens_s") and base_row.get("tokens_s"):
        row["vs_inmem"] = row["tokens_s"] / base_row["tokens_s"]
    key = "loss" if mode == "train" else "tokens"
    seq = [s[key] for s in steps if key in s]
    row["values"] = seq
    if base_row is not None and base_row.get("values") and seq:
        row["same"] = (compare(base_row["values"], seq) if mode == "train" else
                       compare_tokens(base_row["values"][0], seq))
    lows = [s["free_low"] for s in steps if "free_low" in s]
    if lows and rec.get("free_after_init"):
        row["dev_peak"] = rec["free_after_init"] - min(lows)
    row["sampled_peak"] = (rec.get("sampler") or {}).get("peak")
    row["host_used"] = rec.get("host_used_peak")
    row["rss"] = rec.get("ru_maxrss")
    row["free_for_data"] = rec.get("free_after_init")
    moved = [s.get("cma_delta", {}) for s in timed]
    for d in ("to_device", "to_host"):
        vals = [m.get("prefetched_bytes_" + d, 0) for m in moved]
        if rec.get("route") in CMA_ROUTES and vals:
            row["moved_" + d] = statistics.median(vals)
    if rec.get("est_h2d_bytes_per_step") is not None:
        row["moved_to_device"] = rec["est_h2d_bytes_per_step"]
        row["moved_to_host"] = rec["est_d2h_bytes_per_step"]
        row["moved_estimated"] = True
    return row


def _g(v, unit=GiB, fmt="%.2f"):
    return "-" if v is None else fmt % (v / unit)


def _n(v, fmt="%.3g"):
    """Three significant digits, whole numbers from 1000 (tokens/s span 0.1 to 1e5)."""
    return "-" if v is None else ("%.0f" % v if abs(v) >= 1000 else fmt % v)


def markdown(doc):
    mode = doc["args"]["mode"]
    unit = "loss" if mode == "train" else "tokens"
    env = doc.get("env", {})
    lines = ["# torch_oversub_bench (%s)" % mode, "",
             "`%s`" % " ".join(doc.get("argv", [])), "",
             "GPU %s, driver %s, %s GiB; host MemAvailable %.1f GiB; torch %s, transformers %s, "
             "accelerate %s" % (env.get("gpu", {}).get("name"), env.get("gpu", {}).get("driver"),
                                _g(env.get("gpu", {}).get("total"), GiB, "%.1f"),
                                env.get("mem_available", 0) / GiB, env.get("torch"),
                                env.get("transformers"), env.get("accelerate")),
             "", "Context cost C: %s" % doc.get("context_how", "-")]
    step = "step" if mode == "train" else "run"
    head = ("| route | status | %ss | s/%s | tokens/s | vs inmem | %s = inmem | "
            "free for data GiB | R eff | dev peak GiB | NVML peak GiB | host used GiB | RSS GiB | "
            "H2D GB/%s | D2H GB/%s |" % (step, step, unit, step, step))
    for sec in doc.get("sections", []):
        p = sec.get("plan", {})
        title = ("## ceiling (GPU free)" if not p else
                 "## R = %g: X = %.2f GiB free (%s %.2f GiB / R + C)" % (
                     p["ratio"], p["blocker_free"] / GiB, p["reference"],
                     p["reference_bytes"] / GiB))
        lines += ["", title, ""]
        if sec.get("blocker"):
            lines.append("blocker: %s" % sec["blocker"])
            lines.append("")
        lines += [head, "|" + "---|" * 15]
        for r in sec.get("rows", []):
            est = "~" if r.get("moved_estimated") else ""
            r_eff = ("%.2f" % (p["reference_bytes"] / r["free_for_data"])
                     if p and r.get("free_for_data") else "-")
            cells = [r["route"], r.get("status"), "%d%s" % (r.get("steps", 0), " (warm-up only)"
                                                              if r.get("warmup_only") else ""),
                     _n(r.get("s_step"), "%.3f"), _n(r.get("tokens_s")),
                     _n(r.get("vs_inmem"), "%.3f"), same_text(r.get("same")),
                     _g(r.get("free_for_data")), r_eff, _g(r.get("dev_peak")),
                     _g(r.get("sampled_peak")), _g(r.get("host_used")), _g(r.get("rss")),
                     est + _g(r.get("moved_to_device"), 1e9), est + _g(r.get("moved_to_host"), 1e9)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        for r in sec.get("notes", []):
            lines.append("- " + r)
    lines += ["", "H2D/D2H: cma's prefetched_bytes_to_device/_to_host per timed step (median); "
              "~ FSDP2's estimate; migrations the driver makes on faults or evictions are counted "
              "in no route. "
              "Host used: MemAvailable at the route's start - its lowest while it ran."]
    return "\n".join(lines) + "\n"


