"""Benchmark of the verification core: time and bound per backend and encoding option.

For one singleton S = {N'} and for the hyper-network of the first H leave-one-out networks,
per class, every combination of the selected {solver} x {bounds} x {md} x {ris} x {obbt}
is solved by `lucid.analysis.analyse.analyse_node` with a time limit. Make a run first, e.g.

    lucid train ../shared/data/crypto/train.npz --test-data ../shared/data/crypto/test.npz \\
        --arch 2x50 --batch-size 100 --out /tmp/crypto-run
    python benchmarks/milp_core.py /tmp/crypto-run --time-limit 30 --solvers highs,gurobi

Selecting the grid: --bounds interval,lp --md off,post,prepost --ris off,on --obbt off,on
--coupling off,on (relational md: the ReLU difference coupling; "+rc" in the md column).
The singleton defaults to the network with the median screening bound for each class;
`--singleton 1 --classes 0` on a run made with the command above is the problem behind
../shared/fixtures/singleton-crypto-2x50.mps (the issue's reference points; beta* = 0.0041206).
Results go to --out (JSON lines) and a table on stdout. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time

import numpy as np

from lucid.analysis.encode import EncodingOptions
from lucid.rundir import open_run
from lucid.settings import VerifySettings
from lucid.solvers import SolverOptions, available_solvers
from lucid.analysis.analyse import analyse_node
from lucid.analysis.problem import VerificationProblem
from lucid.analysis.screen import screen_upper_bounds

MD = {"off": (False, False), "post": (True, False), "prepost": (True, True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--solvers", default="highs")
    ap.add_argument("--bounds", default="interval,lp")
    ap.add_argument("--md", default="off,post,prepost")
    ap.add_argument("--ris", default="off,on")
    ap.add_argument("--obbt", default="singletons", help="off,on,singletons (the default: singleton nodes only)")
    ap.add_argument("--coupling", default="on", help="relational md (ReLU difference coupling): off,on")
    ap.add_argument("--classes", default="all")
    ap.add_argument("--nodes", default="singleton,hyper", help="singleton and/or hyper")
    ap.add_argument("--singleton", type=int, default=None, help="stack position of N' (default: median screen)")
    ap.add_argument("--hyper-size", type=int, default=256)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tau", type=float, default=0.01)
    ap.add_argument("--out", default=None, help="append JSON lines here")
    args = ap.parse_args(argv)

    run = open_run(args.run)
    problems = {}
    for b in args.bounds.split(","):
        t = time.perf_counter()
        problems[b] = VerificationProblem.from_run(run, bounds=b)
        print(f"N's {b} bounds: {time.perf_counter() - t:.2f}s (cached in {run.cache_dir})", flush=True)
    any_problem = next(iter(problems.values()))
    n_nets = len(any_problem.stack) - 1
    classes = range(any_problem.num_classes) if args.classes == "all" else [int(c) for c in args.classes.split(",")]
    avail = available_solvers()
    solvers = [s for s in args.solvers.split(",") if avail.get(s)]
    out = open(args.out, "a") if args.out else None
    print(f"{'node':>10} {'cls':>3} {'solver':>7} {'bounds':>8} {'md':>10} {'ris':>3} {'obbt':>10} "
          f"{'upper':>11} {'lower':>11} {'status':>10} {'sec':>7} {'bins':>5}", flush=True)
    for cls in classes:
        nodes = {}
        if "singleton" in args.nodes:
            pos = args.singleton
            if pos is None:
                screen = screen_upper_bounds(any_problem, cls, np.arange(1, n_nets + 1))
                order = np.argsort(screen)
                pos = int(order[len(order) // 2]) + 1
            nodes[f"single{pos}"] = np.array([pos])
        if "hyper" in args.nodes:
            nodes[f"hyper{min(args.hyper_size, n_nets)}"] = np.arange(1, min(args.hyper_size, n_nets) + 1)
        for (name, positions), solver, b, md, ris, obbt, cpl in itertools.product(
            nodes.items(), solvers, args.bounds.split(","), args.md.split(","), args.ris.split(","), args.obbt.split(","),
            args.coupling.split(","),
        ):
            enc = EncodingOptions(md=MD[md][0], md_pre=MD[md][1], ris=ris == "on", tau=args.tau, bounds=b,
                                  obbt={"on": True, "off": False}.get(obbt, obbt), coupling=cpl == "on")
            md = md + ("+rc" if cpl == "on" else "")
            opts = SolverOptions(time_limit=args.time_limit, threads=args.threads)
            try:
                res = analyse_node(problems[b], cls, positions, settings=VerifySettings(solver=solver), solver_options=opts, encoding=enc)
            except Exception as exc:  # e.g. a licence too small for the model: record and go on
                print(f"{name:>10} {cls:>3} {solver:>7} {b:>8} {md:>10} {ris:>3} {obbt:>10}  failed: {exc}", flush=True)
                continue
            low = "-" if res.lower is None else f"{res.lower:.6g}"
            print(f"{name:>10} {cls:>3} {solver:>7} {b:>8} {md:>10} {ris:>3} {obbt:>10} {res.upper:>11.6g} {low:>11} "
                  f"{res.status:>10} {res.seconds:>7.1f} {res.stats.get('binaries', 0):>5}", flush=True)
            if out:
                row = {"node": name, "class": cls, "solver": solver, "bounds": b, "md": md, "ris": ris, "obbt": obbt,
                       "upper": res.upper if math.isfinite(res.upper) else str(res.upper), "lower": res.lower,
                       "status": res.status, "seconds": res.seconds, "time_limit": args.time_limit, "stats": res.stats}
                out.write(json.dumps(row, default=float) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
