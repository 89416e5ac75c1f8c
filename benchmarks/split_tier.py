"""The ReLU-splitting tier (lucid/bounds/relu_split.py) on the networks the optimised screen leaves.

  python benchmarks/split_tier.py --tasks digits-2x20:2,digits-2x20:8,adult-2x50:0 --budget 30
  python benchmarks/split_tier.py --probe adult-2x50:0:1941,1537 --cutoff 0.020626 --budget 900

Per workload and class, at the same lower bound LB as benchmarks/screen.py (the larger of the
recorded and the replayed one): (c) the optimised screen over every leave-one-out network, then (e)
`split_singleton(cutoff=LB)` with `--budget` seconds on each network (c) leaves above LB. A network
is discarded when its bound is <= LB. Results are appended network by network to
benchmarks/results/split_tier/<workload>-<class>.json, so an interrupted run continues where it
stopped (a run at another budget or LB starts over and keeps the earlier file as
<workload>-<class>-<commit>.json); the report is benchmarks/results/split_tier.md.

--probe WORKLOAD:CLASS:NETWORKS runs the tier on the named networks alone at `--cutoff` (e.g. a
class's last open networks at the bound a target needs) and appends one JSON line per network to
benchmarks/results/split_tier/probes.jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
OUT = ROOT / "benchmarks" / "results" / "split_tier"
REPORT = ROOT / "benchmarks" / "results" / "split_tier.md"


def measure(name: str, cls: int, budget: float, threads: int) -> dict:
    import torch

    from screen import RUNS, lower_bounds

    from lucid.bounds.relu_split import split_singleton
    from lucid.bounds.split_options import SplitLimits
    from lucid.bounds.stack_screen import symbolic_screen
    from lucid.bounds.symbolic import ScreenOptions
    from lucid.analysis.problem import VerificationProblem
    from lucid.rundir import open_run

    torch.set_num_threads(threads)
    path = OUT / f"{name}-{cls}.json"
    state = json.loads(path.read_text()) if path.exists() else None
    problem = VerificationProblem.from_run(open_run(RUNS / name))
    positions = np.arange(1, len(problem.stack))
    lb = lower_bounds(name, problem, [cls])[cls]
    level = lb["replayed"] if lb["recorded"] is None else max(lb["replayed"], lb["recorded"])
    if state is not None and (state.get("budget") != budget or state["lb"] != level):
        # another question: the earlier answer is kept beside the new one, under its commit
        path.replace(path.with_name(f"{path.stem}-{state['commit']}.json"))
        state = None
    if state is None:
        t0 = time.perf_counter()
        screened = symbolic_screen(problem, cls, positions, ScreenOptions.optimised(), cutoff=level)
        left = positions[screened > level]
        order = np.argsort(-screened[left - 1], kind="stable")  # hardest first
        state = {"workload": name, "class": cls, "networks": int(len(positions)), "lb": level, "budget": budget,
                 "screen_seconds": time.perf_counter() - t0, "left": [int(p) for p in left[order]],
                 "screen_bounds": {str(int(p)): float(screened[p - 1]) for p in left}, "done": {},
                 "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "commit": _commit(), "machine": _machine(threads)}
    for p in state["left"]:
        if str(p) in state["done"]:
            continue
        res = split_singleton(problem, cls, p, state["lb"], SplitLimits(budget, give_up=False))
        state["done"][str(p)] = {"bound": res.bound, "proved": bool(res.proved), "domains": res.domains,
                                 "seconds": res.seconds}
        print(f"{name} class {cls} network {p}: {state['screen_bounds'][str(p)]:.5g} -> {res.bound:.5g} "
              f"({'proved' if res.proved else 'open'}, {res.domains} domains, {res.seconds:.1f} s)", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)
    return state


def probe(spec: str, cutoff: float, budget: float, threads: int) -> None:
    import torch

    from screen import RUNS

    from lucid.bounds.relu_split import split_singleton
    from lucid.bounds.split_options import SplitLimits
    from lucid.analysis.problem import VerificationProblem
    from lucid.rundir import open_run

    torch.set_num_threads(threads)
    name, cls, nets = spec.split(":")
    problem = VerificationProblem.from_run(open_run(RUNS / name))
    for p in (int(n) for n in nets.split(",")):
        res = split_singleton(problem, int(cls), p, cutoff, SplitLimits(budget, give_up=False))
        row = {"workload": name, "class": int(cls), "network": p, "cutoff": cutoff, "budget": budget,
               "bound": res.bound, "proved": bool(res.proved), "domains": res.domains, "seconds": res.seconds,
               "trace": [[round(t, 2), b] for t, b in res.trace],
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
               "machine": _machine(threads)}
        print(json.dumps(row), flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        with open(OUT / "probes.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def _machine(threads: int) -> str:
    return f"{platform.platform()}, {threads} torch thread(s)"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def report() -> None:
    rows = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    lines = ["# The ReLU-splitting tier on the networks the optimised screen leaves (issue 19)", "",
             "`python benchmarks/split_tier.py --tasks WORKLOAD:CLASS --budget B` (LB as in screen.md; a network is "
             "discarded when its bound is <= LB; (e) = after `split_singleton(cutoff=LB)` with B seconds per network, "
             "hardest (highest screened) first).", "",
             "| workload | class | networks | LB | (c) optimised: left | (e) split: left | (e) discarded | budget s | "
             "seconds per network: median / max / total | date, commit, machine |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        done = r["done"]
        secs = np.array([d["seconds"] for d in done.values()]) if done else np.zeros(1)
        open_ = sum(not d["proved"] for d in done.values()) + (len(r["left"]) - len(done))
        partial = "" if len(done) == len(r["left"]) else f" ({len(done)} of {len(r['left'])} run)"
        lines.append(f"| {r['workload']} | {r['class']} | {r['networks']} | {r['lb']:.6g} | {len(r['left'])} | "
                     f"{open_}{partial} | {100 * (1 - open_ / r['networks']):.2f} % | {r['budget']:g} | "
                     f"{np.median(secs):.1f} / {secs.max():.1f} / {secs.sum():.0f} | {r['date']}, {r['commit']}, "
                     f"{r['machine']} |")
    body = "\n".join(lines) + "\n"
    if REPORT.exists():  # keep the notes written below the table by hand
        old = REPORT.read_text()
        if "\n## Notes" in old:
            body += old[old.index("\n## Notes"):]
    REPORT.write_text(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="", help="WORKLOAD:CLASS, comma-separated")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--probe", default="", help="WORKLOAD:CLASS:NET[,NET...]: these networks alone at --cutoff")
    ap.add_argument("--cutoff", type=float, default=None)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if args.probe:
        if args.cutoff is None:
            ap.error("--probe needs --cutoff")
        probe(args.probe, args.cutoff, args.budget, args.threads)
        return
    if not args.report_only:
        for task in filter(None, args.tasks.split(",")):
            name, cls = task.split(":")
            measure(name, int(cls), args.budget, args.threads)
    report()


if __name__ == "__main__":
    main()
