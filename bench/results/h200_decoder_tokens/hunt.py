"""Is the compiled decoder's rare token difference cma's? Runs
torch_compile_decoder_bench.py's route process many times, several at once,
for each variant below, and tallies the processes whose generated tokens (or
weights and constant buffers) differ from the digest most processes gave.

  python3 hunt.py OUT.json --seconds 420 --parallel 6
Variants: native; cma (default route); cma with torch.cuda.empty_cache a
no-op (--keep-cache: no discards from the captures' empty_cache calls);
cma with classic segments (whole cudaMallocManaged segments, no page
discards); cma with discard_on_free:1 (every free discards: more discards).
"""
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_routes  # noqa: E402

BENCH = os.path.join(HERE, "torch_compile_decoder_bench.py")
VARIANTS = {
    "native": ("native", [], {}),
    "cma": ("cma", [], {}),
    "cma_keep_cache": ("cma", ["--keep-cache"], {}),
    "cma_classic": ("cma", [], {"CMA_ALLOC_CONF": "managed_budget:16G,segments:classic"}),
    "cma_discard_on_free": ("cma", [], {"CMA_ALLOC_CONF": "managed_budget:16G,discard_on_free:1"}),
}


def start(name):
    route, extra, env_extra = VARIANTS[name]
    env = torch_routes.route_env(route)
    env.update(env_extra)
    argv = [sys.executable, BENCH, "--route", route, "--round-index", "0"] + extra
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def main():
    out, seconds, parallel = sys.argv[1], 420.0, 6
    args = sys.argv[2:]
    if "--seconds" in args:
        seconds = float(args[args.index("--seconds") + 1])
    if "--parallel" in args:
        parallel = int(args[args.index("--parallel") + 1])
    names = list(VARIANTS)
    if "--variants" in args:  # a comma-separated subset, taken in turn
        names = args[args.index("--variants") + 1].split(",")
    deadline = time.monotonic() + seconds
    running, results, k = [], [], 0
    while time.monotonic() < deadline or running:
        while len(running) < parallel and time.monotonic() < deadline:
            name = names[k % len(names)]
            k += 1
            running.append((name, time.monotonic(), start(name)))
        time.sleep(0.2)
        for item in list(running):
            name, t0, p = item
            if p.poll() is None:
                if time.monotonic() - t0 > 150:
                    p.kill()
                continue
            running.remove(item)
            so, se = p.communicate()
            r = torch_routes.parse_result(so)
            rec = {"variant": name, "rc": p.returncode, "seconds": time.monotonic() - t0}
            if r is None:
                rec["error"] = se[-1500:]
            else:
                rec["tokens"] = r["check"]["tokens_sha256_16"]
                rec["constants"] = r["check"].get("constants_sha256_16")
                rec["cma_counters"] = r.get("cma_counters")
                rec["tok_s"] = r["metrics"]["decode_tokens_per_s"]
                rec["problems"] = r["problems"]
            results.append(rec)
            print(json.dumps({k2: rec.get(k2) for k2 in ("variant", "rc", "seconds")}), flush=True)
    ok = [r for r in results if "tokens" in r]
    ref_tokens = collections.Counter(tuple(r["tokens"]) for r in ok).most_common(1)[0][0] if ok \
        else None
    ref_consts = collections.Counter(tuple(r["constants"] or ()) for r in ok).most_common(1)[0][0] \
        if ok else None
    tally = {}
    for name in names:
        rs = [r for r in results if r["variant"] == name]
        good = [r for r in rs if "tokens" in r]
        diff = [r for r in good if tuple(r["tokens"]) != ref_tokens]
        cdiff = [r for r in good if tuple(r["constants"] or ()) != ref_consts]
        tally[name] = {"processes": len(rs), "failed": len(rs) - len(good),
                       "tokens_differ": len(diff), "constants_differ": len(cdiff),
                       "requests_differ": [[i for i, (a, b) in enumerate(zip(r["tokens"],
                                                                             ref_tokens))
                                            if a != b] for r in diff]}
    doc = {"reference_tokens": ref_tokens, "reference_constants": ref_consts, "tally": tally,
           "processes": results}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    for name, t in tally.items():
        print(name, json.dumps(t))


if __name__ == "__main__":
    main()
