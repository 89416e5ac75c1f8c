"""The hard-singleton suite: the leave-one-out networks that decide when a class ends, each with its
exact beta*_{c,{i}}, and how fast the leak search and the proofs reach it.

  python benchmarks/hard_singletons.py select --tasks adult-2x50:0,crypto-2x100:1 --candidates 12 --split 20 --keep 3
  python benchmarks/hard_singletons.py exact --solver gurobi --time-limit 300
  python benchmarks/hard_singletons.py leaks --methods today,gradient
  python benchmarks/hard_singletons.py proofs --methods today,race --time-limit 300
  python benchmarks/hard_singletons.py report

Workloads are the run directories of benchmarks/screen.py (`--prepare`). Per task (workload, class):
- `select`: the class's level L = its best known leak (benchmarks/screen.py's `lower_bounds`) times
  1 + --rel-gap; the optimised screen at L; the `--candidates` networks with the highest screened
  bounds above L each get `--split` seconds of the ReLU-splitting tier at L; the `--keep` that it
  leaves furthest above L are the task's hard singletons. The suite is
  benchmarks/results/hard_singletons/suite.json.
- `exact`: each singleton's own beta*_{c,{i}} with no cutoff (analyse_node, `--solver`, one long
  solve): its proved upper bound and its best replayed leak, kept in the suite. "Exact" means
  upper/lower <= 1 + 1e-4; otherwise the interval is what is known.
- `leaks`: the leak searches alone, per singleton: `today` = the node's boundary search plus the
  search aimed at a small node (what analyse_node and the engine run for a singleton), `walk` = the
  same without their gradient ascent (the searches before it), `gradient` = lucid.witness.gradient
  alone from the boundary points and the training rows. The measure is the
  replayed leak divided by the singleton's exact lower bound.
- `proofs`: the time to prove beta*_{c,{i}} <= 1.1 x the class's best leak (or the network's own, if
  higher): the level the engine needs at --rel-gap 0.1 (`--tasks` limits it to some tasks), per method: `today` = analyse_node's
  attempts as the engine escalates them (split tier, then MILP; 60/240/960-s limits) until proved
  or --time-limit; `race` = the split tier and the MILP side by side (--split-race); `input` = `today`
  with the splitting tier cutting the input box instead of splitting ReLUs (--split-space input);
  `input-race` = both (--split-race --split-space input); `default` = analyse_node with
  `lucid verify`'s defaults of the commit measured (`today` is the default of its own, older, commit).
Measurements are appended one line per (singleton, method, commit) to leaks.jsonl / proofs.jsonl, so an
interrupted run continues; `report` writes benchmarks/results/hard_singletons.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
OUT = ROOT / "benchmarks" / "results" / "hard_singletons"
SUITE = OUT / "suite.json"
REPORT = ROOT / "benchmarks" / "results" / "hard_singletons.md"
EXACT_TOL = 1e-4


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _stamp() -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
            "machine": f"{platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"}


def _problem(name: str):
    from screen import RUNS

    from lucid.analysis.problem import VerificationProblem
    from lucid.rundir import open_run

    return VerificationProblem.from_run(open_run(RUNS / name))


def _load_suite() -> list[dict]:
    return json.loads(SUITE.read_text()) if SUITE.exists() else []


def _save_suite(suite: list[dict]) -> None:
    from lucid.atomic import write_json_atomic

    OUT.mkdir(parents=True, exist_ok=True)
    write_json_atomic(SUITE, suite)


def _key(entry: dict) -> tuple:
    return entry["workload"], entry["class"], entry["network"]


# ------------------------------------------------------------------------------------ select

def select(tasks: list[tuple[str, int]], candidates: int, split: float, keep: int, rel_gap: float) -> None:
    from screen import lower_bounds

    from lucid.bounds.relu_split import split_singleton
    from lucid.bounds.split_options import SplitLimits
    from lucid.bounds.stack_screen import symbolic_screen
    from lucid.bounds.symbolic import ScreenOptions

    suite = _load_suite()
    have = {(e["workload"], e["class"]) for e in suite}
    for name, cls in tasks:
        if (name, cls) in have:
            print(f"{name}:{cls} already selected", flush=True)
            continue
        problem = _problem(name)
        positions = np.arange(1, len(problem.stack))
        lb = lower_bounds(name, problem, [cls])[cls]
        best = lb["replayed"] if lb["recorded"] is None else max(lb["replayed"], lb["recorded"])
        level = best + rel_gap * abs(best)
        screened = symbolic_screen(problem, cls, positions, ScreenOptions.optimised(), cutoff=level)
        above = np.flatnonzero(screened > level)
        order = above[np.argsort(-screened[above])][:candidates]
        rows = []
        for i in order:
            pos = int(positions[i])
            res = split_singleton(problem, cls, pos, level, SplitLimits(split))
            rows.append({"workload": name, "class": cls, "network": pos, "removed_row": int(problem.stack.removed[pos]),
                         "class_lower": best, "level": level, "screened": float(screened[i]),
                         "split_bound": float(res.bound), "split_proved": bool(res.proved), "split_seconds": split,
                         "survivors": int(len(above))})
            print(f"{name}:{cls} network {pos}: screened {screened[i]:.6g}, split {res.bound:.6g} "
                  f"({'proved' if res.proved else 'open'}) at level {level:.6g}", flush=True)
        hard = sorted((r for r in rows if not r["split_proved"]), key=lambda r: -(r["split_bound"] / level))[:keep]
        suite.extend(hard)
        _save_suite(suite)


# ------------------------------------------------------------------------------------ exact

def exact(solver: str, time_limit: float, only: set[str]) -> None:
    """Each singleton's beta*: one solve with no cutoff (its best leak and a dual bound), then proofs
    at 1.01 and 1.1 x that leak under a cutoff (far easier than the unrestricted optimum) until one holds."""
    from lucid.analysis.analyse import NodeRequest, analyse_node
    from lucid.settings import VerifySettings
    from lucid.solvers.base import SolverOptions

    suite = _load_suite()
    settings = VerifySettings(solver=solver, split_time=0)
    options = SolverOptions(time_limit=time_limit, threads=1)
    for entry in suite:
        ex = entry.get("exact")
        if (ex is not None and ex.get("tried") == [1.01, 1.1]) or (only and f"{entry['workload']}:{entry['class']}"
                                                                   not in only):
            continue
        problem = _problem(entry["workload"])
        pos = np.array([entry["network"]])
        t0 = time.perf_counter()
        if ex is None or "unrestricted" not in ex:
            out = analyse_node(problem, entry["class"], pos, settings=settings, solver_options=options)
            ex = {"unrestricted": {"upper": float(out.upper), "status": out.status,
                                   "lower": float(out.lower if out.lower is not None else -math.inf)}}
        lower, upper = ex["unrestricted"]["lower"], ex["unrestricted"]["upper"]
        ex["tried"] = []
        for factor in (1.01, 1.1):
            if not lower > 0 or upper <= factor * lower:
                break
            ex["tried"].append(factor)
            out = analyse_node(problem, entry["class"], pos, settings=settings, solver_options=options,
                               request=NodeRequest(factor * lower, attempt=2))
            if out.lower is not None:
                lower = max(lower, float(out.lower))
            if out.upper <= factor * lower:
                upper = min(upper, float(out.upper))
                break
        ex["tried"] = [1.01, 1.1]
        ex.update(upper=upper, lower=lower, exact=bool(lower > 0 and upper <= lower * (1 + EXACT_TOL)),
                  solver=solver, seconds=ex.get("seconds", 0.0) + time.perf_counter() - t0, **_stamp())
        entry["exact"] = ex
        print(f"{_key(entry)}: [{lower:.6g}, {upper:.6g}] in {ex['seconds']:.0f} s", flush=True)
        _save_suite(suite)


# ------------------------------------------------------------------------------------ leaks

def _boundary_starts(problem, cls: int, count: int, seed: int = 0) -> np.ndarray:
    """Points on N's decision boundary for `cls` and some training rows: where leaks of a network
    close to N lie."""
    from lucid.witness.search import boundary_points

    pts = [boundary_points(problem.stack, cls, problem.lower, problem.upper, count, samples=8 * count, seed=seed)]
    if problem.points is not None and len(problem.points):
        rng = np.random.default_rng(seed)
        pts.append(np.asarray(problem.points, dtype=np.float64)[rng.permutation(len(problem.points))[:count]])
    return np.concatenate(pts)


def leak_once(problem, cls: int, position: int, method: str) -> float:
    from dataclasses import replace

    from lucid.witness.gradient import gradient_search
    from lucid.witness.replay import LeakQuery
    from lucid.witness.search import NODE_SEARCH, TARGETED_SEARCH, search_class_witness, search_node_witness

    query = LeakQuery(problem.stack, np.array([position]), cls, problem.lower, problem.upper)
    if method in ("walk", "today"):  # walk: the LP walks alone (before the gradient ascent); today: all of it
        g = method == "today"
        found = [search_node_witness(query, replace(NODE_SEARCH, gradient=g)),
                 search_class_witness(problem, cls, query.positions, points=problem.points,
                                      effort=replace(TARGETED_SEARCH, gradient=g))]
    elif method == "gradient":
        found = [gradient_search(query, _boundary_starts(problem, cls, 256))]
    else:
        raise SystemExit(f"unknown leak method {method!r}")
    return max((w.confidence for w in found if w is not None), default=-math.inf)


def _done(path: Path, commit: str) -> set[tuple]:
    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["workload"], r["class"], r["network"], r["method"]) for r in rows if r["commit"] == commit}


def _append(path: Path, row: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def _best_leak(ex: dict) -> float:
    """The best replayed leak of the exact step so far (its unrestricted solve's, until the level proofs end)."""
    return float(ex.get("lower", ex["unrestricted"]["lower"]))


def leaks(methods: list[str]) -> None:
    path = OUT / "leaks.jsonl"
    commit = _commit()
    done = _done(path, commit)
    for entry in _load_suite():
        if "exact" not in entry:
            continue
        problem = _problem(entry["workload"])
        for method in methods:
            if (*_key(entry), method) in done:
                continue
            t0 = time.perf_counter()
            value = leak_once(problem, entry["class"], entry["network"], method)
            row = {"workload": entry["workload"], "class": entry["class"], "network": entry["network"], "method": method,
                   "lower": value, "seconds": time.perf_counter() - t0, "exact_lower": _best_leak(entry["exact"]),
                   **_stamp()}
            row["commit"] = commit
            _append(path, row)
            print(f"{_key(entry)} {method}: {value:.6g} of {row['exact_lower']:.6g} in {row['seconds']:.1f} s",
                  flush=True)


# ------------------------------------------------------------------------------------ proofs

def prove_once(problem, cls: int, position: int, level: float, method: str, time_limit: float) -> dict:
    """Seconds until analyse_node proves beta*_{cls,{position}} <= level, escalating attempts as the
    engine does (node limit 60 s, grown 4x per retry), or None at `time_limit`."""
    from lucid.analysis.analyse import NodeRequest, analyse_node
    from lucid.analysis.time_shares import RETRY_GROWTH
    from lucid.settings import VerifySettings
    from lucid.solvers.base import SolverOptions

    if method == "default":  # the product's defaults of the day
        settings = VerifySettings()
    else:
        settings = VerifySettings(split_race=method in ("race", "input-race"),
                                  split_space="input" if method in ("input", "input-race") else "relu")
    t0 = time.perf_counter()
    attempts, upper = [], math.inf
    for attempt in range(1, 10):
        left = time_limit - (time.perf_counter() - t0)
        if left <= 1:
            break
        limit = min(60.0 * RETRY_GROWTH ** (attempt - 1), left)
        out = analyse_node(problem, cls, np.array([position]), settings=settings,
                           solver_options=SolverOptions(time_limit=limit, threads=1),
                           request=NodeRequest(level, attempt, keep_trees=True))
        upper = min(upper, float(out.upper))
        attempts.append({"limit": limit, "upper": float(out.upper), "seconds": out.seconds,
                         "profile": out.stats.get("profile")})
        if upper <= level:
            return {"seconds": time.perf_counter() - t0, "upper": upper, "attempts": attempts}
    return {"seconds": None, "upper": upper, "attempts": attempts}


def proofs(methods: list[str], time_limit: float, factor: float, only: set[str]) -> None:
    path = OUT / "proofs.jsonl"
    commit = _commit()
    done = _done(path, commit)
    for entry in _load_suite():
        ex = entry.get("exact")
        if only and f"{entry['workload']}:{entry['class']}" not in only:
            continue
        # the level the engine needs at --rel-gap factor - 1: factor x the class's best leak (or the
        # network's own, if higher: the class's leak then rises to it)
        level = factor * max(entry["class_lower"], -math.inf if ex is None else _best_leak(ex))
        problem = _problem(entry["workload"])
        for method in methods:
            if (*_key(entry), method) in done:
                continue
            res = prove_once(problem, entry["class"], entry["network"], level, method, time_limit)
            row = {"workload": entry["workload"], "class": entry["class"], "network": entry["network"], "method": method,
                   "level": level, "time_limit": time_limit, **res, **_stamp()}
            row["commit"] = commit
            _append(path, row)
            shown = "unproved" if res["seconds"] is None else f"{res['seconds']:.1f} s"
            print(f"{_key(entry)} {method}: {shown} (upper {res['upper']:.6g}, level {level:.6g})", flush=True)


# ------------------------------------------------------------------------------------ report

def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report() -> None:
    suite = _load_suite()
    leak_rows, proof_rows = _rows(OUT / "leaks.jsonl"), _rows(OUT / "proofs.jsonl")
    latest: dict[tuple, dict] = {}
    for r in leak_rows + proof_rows:  # the last measurement of each (singleton, kind, method) counts
        latest[("proof" if "level" in r else "leak", r["workload"], r["class"], r["network"], r["method"])] = r
    leak_methods = sorted({k[4] for k in latest if k[0] == "leak"})
    proof_methods = sorted({k[4] for k in latest if k[0] == "proof"})
    lines = ["# Hard singletons: exact beta*, leak search and proof time per network", "",
             "Commands: see the docstring of `benchmarks/hard_singletons.py`. Leak: replayed leak / the exact "
             "lower bound (1.0 = as good as the long exact solve). Proof: seconds to prove beta* <= 1.1 x the class's "
             "best leak ('–': not within the time limit or not measured). 2 cores, shared; `race` runs 2 threads.", "",
             "| workload | class | network | class leak | screened | exact [lower, upper] (solver, s) | "
             + " | ".join(f"leak {m}" for m in leak_methods) + " | " + " | ".join(f"proof {m} (s)" for m in proof_methods)
             + " |",
             "|" + "---|" * (6 + len(leak_methods) + len(proof_methods))]
    for e in suite:
        ex = e.get("exact")
        exs = "–" if ex is None or "upper" not in ex else \
            f"[{ex['lower']:.6g}, {ex['upper']:.6g}] ({ex['solver']}, {ex['seconds']:.0f})"
        cells = []
        for m in leak_methods:
            r = latest.get(("leak", *_key(e), m))
            cells.append("–" if r is None or not (r["exact_lower"] or 0) > 0 else
                         f"{r['lower'] / r['exact_lower']:.3f} ({r['seconds']:.1f} s)")
        for m in proof_methods:
            r = latest.get(("proof", *_key(e), m))
            cells.append("–" if r is None or r["seconds"] is None else f"{r['seconds']:.1f}")
        lines.append(f"| {e['workload']} | {e['class']} | {e['network']} | {e['class_lower']:.6g} | {e['screened']:.6g} | "
                     f"{exs} | " + " | ".join(cells) + " |")
    summary = []
    for m in leak_methods:
        ratios = [r["lower"] / r["exact_lower"] for k, r in latest.items() if k[0] == "leak" and k[4] == m
                  and r["exact_lower"] > 0]
        if ratios:
            summary.append(f"- leak `{m}`: within 5 % of the exact lower bound on {np.mean(np.array(ratios) >= 0.95):.0%} "
                           f"of {len(ratios)} networks (median ratio {np.median(ratios):.3f})")
    for m in proof_methods:
        secs = [r["seconds"] if r["seconds"] is not None else math.inf for k, r in latest.items()
                if k[0] == "proof" and k[4] == m]
        if secs:
            summary.append(f"- proof `{m}`: median {np.median(secs):.1f} s over {len(secs)} networks "
                           f"({sum(math.isinf(s) for s in secs)} not proved in the limit)")
    body = "\n".join(lines + [""] + summary) + "\n"
    marker = "\n## Notes"
    if REPORT.exists() and marker in REPORT.read_text():  # notes written below the table by hand stay
        old = REPORT.read_text()
        body += old[old.index(marker):]
    REPORT.write_text(body)
    print(REPORT.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["select", "exact", "leaks", "proofs", "report"])
    ap.add_argument("--tasks", default="", help="WORKLOAD:CLASS,... (select)")
    ap.add_argument("--candidates", type=int, default=12)
    ap.add_argument("--split", type=float, default=20.0)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--rel-gap", type=float, default=0.1)
    ap.add_argument("--solver", default="gurobi")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--methods", default="")
    ap.add_argument("--factor", type=float, default=1.1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.step == "select":
        tasks = [(t.split(":")[0], int(t.split(":")[1])) for t in args.tasks.split(",") if t]
        select(tasks, args.candidates, args.split, args.keep, args.rel_gap)
    elif args.step == "exact":
        exact(args.solver, args.time_limit, {t for t in args.tasks.split(",") if t})
    elif args.step == "leaks":
        leaks([m for m in (args.methods or "today,gradient").split(",") if m])
    elif args.step == "proofs":
        proofs([m for m in (args.methods or "today").split(",") if m], args.time_limit, args.factor,
               {t for t in args.tasks.split(",") if t})
    report()


if __name__ == "__main__":
    main()
