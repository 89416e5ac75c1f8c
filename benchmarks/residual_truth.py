"""How far the tiers leave a plateau network's bound above its truth, for `--residual M`.

  python benchmarks/residual_truth.py RUN --class 0 --ranks 750 --solver gurobi --exact-limit 900
  python benchmarks/residual_truth.py RUN --class 0 --ranks 40,750,1500 --question 0.49 --exact-limit 0

The level of `--residual M` is held by a plateau of networks whose own bounds the tiers leave far
above their leaks. For the networks at the given ranks of the optimised screen (0: the highest
bound), this measures each tier's bound on beta*_{c,{i}} against the best leak found: the optimised
screen, the ReLU split alone (`--split-limit` s, at `--question`), the singleton analysis the
engine runs at that question (`--node-limit` s: split, then the MILP), and, with `--exact-limit`
> 0, the singleton MILP without a cutoff (the network's own maximum) for that long with `--solver`
(Gurobi's size-limited licence fits one 2x50 singleton). Every bound is sound; the truth lies
between the best leak and the smallest bound. Rows are appended to benchmarks/results/residual_truth.jsonl
(a row already there for the same run, class, network and limits is not measured again) and the
table is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from lucid.analysis.analyse import NodeRequest, analyse_node
from lucid.analysis.domain_lp import DomainLp
from lucid.analysis.problem import VerificationProblem
from lucid.bounds.relu_split import split_singleton
from lucid.bounds.split_options import SplitLimits, SplitOptions
from lucid.bounds.stack_screen import symbolic_screen
from lucid.bounds.symbolic import ScreenOptions
from lucid.rundir import open_run
from lucid.settings import VerifySettings

RESULTS = Path(__file__).resolve().parent / "results" / "residual_truth.jsonl"


def _leak(*values: float | None) -> float | None:
    found = [v for v in values if v is not None and math.isfinite(v)]
    return max(found) if found else None


def measure(problem: VerificationProblem, cls: int, position: int, screen: float, args: argparse.Namespace) -> dict:
    """Every tier's bound on one network (module docstring)."""
    settings = VerifySettings(solver=args.solver)
    t0 = time.perf_counter()
    lp = DomainLp(problem, cls, position, settings.encoding_options())
    split = split_singleton(problem, cls, position, args.question, SplitLimits(args.split_limit), SplitOptions(),
                            domain_bound=lp.bound)
    split_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    node = analyse_node(problem, cls, np.array([position]), settings=VerifySettings(),
                        solver_options=VerifySettings().solver_options(args.node_limit),
                        request=NodeRequest(cutoff=args.question))
    node_s = time.perf_counter() - t0
    row = {
        "network": position, "screen": screen,
        "split": split.bound, "split_seconds": round(split_s, 1),
        "node": node.upper, "node_seconds": round(node_s, 1), "node_status": node.status,
    }
    leaks = [None if split.witness is None else split.witness.confidence, node.lower]
    if args.exact_limit > 0:
        t0 = time.perf_counter()
        exact = analyse_node(problem, cls, np.array([position]), settings=settings,
                             solver_options=settings.solver_options(args.exact_limit))
        row.update(exact=exact.upper, exact_seconds=round(time.perf_counter() - t0, 1), exact_status=exact.status)
        leaks.append(exact.lower)
    row["leak"] = _leak(*leaks)
    return row


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(rows: list[dict]) -> str:
    lines = ["| run | class | question | rank | network | best leak | optimised screen | split (s) | "
             "analysis at the question (s) | exact MILP (solver, s) | truth within |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        exact = "-" if "exact" not in r else f"{r['exact']:.3f} ({r['solver']}, {r['exact_seconds']:.0f} s, {r['exact_status']})"
        upper = min(v for v in (r["screen"], r["split"], r["node"], r.get("exact", math.inf)))
        lines.append(
            f"| {r['run']} | {r['class']} | {r['question']} | {r['rank']} | {r['network']} | {_fmt(r['leak'])} | "
            f"{r['screen']:.3f} | {r['split']:.3f} ({r['split_seconds']:.0f}) | {r['node']:.3f} ({r['node_seconds']:.0f}) | "
            f"{exact} | [{_fmt(r['leak'])}, {upper:.3f}] |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--class", dest="cls", type=int, default=0)
    parser.add_argument("--ranks", default="750", help="ranks of the optimised screen, comma-separated (0: highest)")
    parser.add_argument("--question", type=float, default=0.35, help="the cutoff the split and the analysis are asked")
    parser.add_argument("--split-limit", type=float, default=10.0)
    parser.add_argument("--node-limit", type=float, default=20.0)
    parser.add_argument("--exact-limit", type=float, default=0.0, help="seconds for the MILP without a cutoff (0: none)")
    parser.add_argument("--solver", default="highs")
    args = parser.parse_args()
    run = Path(args.run)
    problem = VerificationProblem.from_run(open_run(run), with_points=True)
    positions = np.arange(1, len(problem.stack))
    screens = symbolic_screen(problem, args.cls, positions, ScreenOptions.optimised())
    order = positions[np.lexsort((positions, -screens))]
    done = [json.loads(line) for line in RESULTS.read_text().splitlines()] if RESULTS.exists() else []
    name = run.parent.name if run.name == "run" else run.name
    fixed = {"run": name, "class": args.cls, "question": args.question, "split_limit": args.split_limit,
             "node_limit": args.node_limit, "exact_limit": args.exact_limit, "solver": args.solver}
    for rank in (int(r) for r in args.ranks.split(",")):
        position = int(order[rank])
        if any(all(d.get(k) == v for k, v in fixed.items()) and d["network"] == position for d in done):
            continue
        row = {**fixed, "rank": rank, **measure(problem, args.cls, position, float(screens[position - 1]), args)}
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done.append(row)
        print(json.dumps(row), flush=True)
    print(table([d for d in done if d["run"] == name]))


if __name__ == "__main__":
    main()
