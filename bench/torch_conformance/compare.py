#!/usr/bin/env python3
"""Compares conformance routes: what the baseline route (the first, normally
native) passes and another route does not, with the other route's reason.

  compare.py native.json cma.json [expandable.json] [-o compare.md] [--lists DIR]

--lists writes DIR/<route>_outcomes.txt, one "outcome<TAB>test<TAB>reason"
line per test in collection order: the pass/fail/skip lists to commit.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conformance_core as core  # noqa: E402


def outcome_list(result):
    lines = []
    for nodeid in result.get("order") or []:
        t = result["tests"].get(nodeid, {"outcome": "not_run", "reason": "no result"})
        lines.append(f"{t['outcome']}\t{core.test_key(nodeid)}\t{t.get('reason', '')}")
    return "\n".join(lines) + ("\n" if lines else "")


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _outcome(result, nodeid):
    return result["tests"].get(nodeid, {"outcome": "not_run", "reason": "not selected"})


def differences(base, other):
    """Ids the baseline passes (passed/xfailed) and `other` does not, in the
    baseline's order, and the reverse."""
    ids = base.get("order") or []
    other_ids = set(other.get("order") or [])
    lost = [i for i in ids if _outcome(base, i)["outcome"] in core.OK_OUTCOMES
            and _outcome(other, i)["outcome"] not in core.OK_OUTCOMES]
    gained = [i for i in (other.get("order") or []) if _outcome(other, i)["outcome"]
              in core.OK_OUTCOMES and _outcome(base, i)["outcome"] not in core.OK_OUTCOMES]
    only_base = [i for i in ids if i not in other_ids]
    return lost, gained, only_base


def reason_groups(result, ids, width=90):
    """(count, reason prefix) of the given tests' reasons, most common first."""
    c = collections.Counter(
        (_outcome(result, i)["outcome"] + ": " + (_outcome(result, i).get("reason") or ""))[:width]
        for i in ids)
    return c.most_common()


def markdown(results):
    if not results:
        return "# test_cuda.py conformance\n\nNo results.\n"
    base = results[0]
    meta = next((r["meta"] for r in results if r.get("meta")), {})
    out = ["# PyTorch test_cuda.py conformance", ""]
    out.append(f"torch {meta.get('torch', '?')} (CUDA {meta.get('torch_cuda', '?')}), "
               f"device {meta.get('device', '?')}, python {meta.get('python', '?')}, "
               f"pytest {meta.get('pytest', '?')}")
    out.append(f"test file sha256 {meta.get('test_file_sha256', '?')}; "
               f"{meta.get('selection') or core.selection_name(core.KEYWORDS)}")
    out.append("")
    header = ["route", "selected"] + list(core.OUTCOMES) + ["restarts", "wall s"]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for r in results:
        s = r.get("summary") or core.summarize(r.get("order") or [], r.get("tests", {}))
        row = [r["route"], str(r.get("selected", len(r.get("order") or [])))]
        row += [str(s.get(o, 0)) for o in core.OUTCOMES]
        row += [str(r.get("restarts", 0)), str(r.get("wall_s", "?"))]
        out.append("| " + " | ".join(row) + " |")
    shown = set()
    for r in results:
        if r.get("fatal"):
            out += ["", f"**{r['route']} could not run:** {_cell(r['fatal'])}"]
        fb = (r.get("meta") or {}).get("fallbacks") or []
        text = ", ".join(f"`{f['module']}.{f['name']}` ({f['stand_in']})" for f in fb)
        if text and text not in shown:
            shown.add(text)
            out += ["", f"Stand-ins for names this torch lacks ({r['route']}): {text}"]
        if r.get("context_restarts"):
            out += ["", f"{r['route']}: CUDA unusable after {len(r['context_restarts'])} "
                    "test(s); each was followed by a fresh process: " + "; ".join(
                        f"{core.test_key(c['after'])} ({_cell(c['reason'])})"
                        for c in r["context_restarts"])]
    for other in results[1:]:
        lost, gained, only_base = differences(base, other)
        b, o = base["route"], other["route"]
        out += ["", f"## {b} passes, {o} does not ({len(lost)})", ""]
        if lost:
            out += [f"| test | {o} outcome | {o} reason |", "|---|---|---|"]
            for i in lost:
                t = _outcome(other, i)
                out.append(f"| {_cell(core.test_key(i))} | {t['outcome']} | "
                           f"{_cell(t.get('reason', ''))} |")
            out += ["", f"### the same, grouped by reason", "", "| tests | reason |", "|---|---|"]
            for reason, n in ((r, n) for r, n in reason_groups(other, lost)):
                out.append(f"| {n} | {_cell(reason)} |")
        out += ["", f"## {o} passes, {b} does not ({len(gained)})", ""]
        for i in gained:
            t = _outcome(base, i)
            out.append(f"- {core.test_key(i)}: {b} {t['outcome']}: {_cell(t.get('reason', ''))}")
        if only_base:
            out += ["", f"{len(only_base)} tests selected under {b} were not selected under {o}."]
    return "\n".join(out) + "\n"


def orders_markdown(by_order):
    """The run orders side by side: per order and route the outcome counts,
    then what the baseline route passes and another does not in each order,
    and the tests whose outcome under a route changes with the order."""
    out = ["# test_cuda.py conformance in several run orders", "",
           "| order | route | selected | " + " | ".join(core.OUTCOMES) + " | processes |",
           "|" + "---|" * (4 + len(core.OUTCOMES))]
    for order, results in by_order.items():
        for r in results:
            s = r.get("summary") or core.summarize(r.get("order") or [], r.get("tests", {}))
            selected = r.get("selected", len(r.get("order") or []))
            out.append(f"| {order} | {r['route']} | {selected} | "
                       + " | ".join(str(s.get(o, 0)) for o in core.OUTCOMES)
                       + f" | {r.get('processes', '?')} |")
    for order, results in by_order.items():
        base = results[0]
        for other in results[1:]:
            lost = differences(base, other)[0]
            out += ["", f"## {order}: {base['route']} passes, {other['route']} does not "
                    f"({len(lost)})", ""]
            out += [f"- {core.test_key(i)}: {_outcome(other, i)['outcome']}: "
                    f"{_cell(_outcome(other, i).get('reason', ''))}" for i in lost]
    routes = {r["route"] for results in by_order.values() for r in results}
    for route in sorted(routes):
        seen = {}
        for order, results in by_order.items():
            for r in results:
                if r["route"] == route:
                    for i in r.get("order") or []:
                        ok = _outcome(r, i)["outcome"] in core.OK_OUTCOMES
                        seen.setdefault(i, {})[order] = ok
        flaky = [i for i, v in seen.items() if len(set(v.values())) > 1]
        out += ["", f"## {route}: outcome depends on the order ({len(flaky)})", ""]
        out += [f"- {core.test_key(i)}: passes in "
                + ", ".join(o for o, ok in seen[i].items() if ok) + "; not in "
                + ", ".join(o for o, ok in seen[i].items() if not ok) for i in flaky]
    return "\n".join(out) + "\n"


def brief(report):
    """The report without its long per-test tables: the summary, the notes,
    and the grouped reasons (for a terminal with little scrollback)."""
    keep, skipping = [], False
    for line in report.splitlines():
        if line.startswith("## "):
            skipping = False
            keep.append(line)
            continue
        if line.startswith("| test |"):
            skipping = True
        elif line.startswith("### "):
            skipping = False
        if not skipping:
            keep.append(line)
    return "\n".join(keep)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="<route>.json files; the first is the baseline")
    ap.add_argument("-o", "--output", help="markdown file (default: stdout)")
    ap.add_argument("--lists", help="folder for <route>_outcomes.txt")
    args = ap.parse_args(argv)
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    text = markdown(results)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.lists:
        os.makedirs(args.lists, exist_ok=True)
        for r in results:
            with open(os.path.join(args.lists, f"{r['route']}_outcomes.txt"), "w") as f:
                f.write(outcome_list(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
