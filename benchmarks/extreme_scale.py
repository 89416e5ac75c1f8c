"""Soundness at extreme weight scales: every tier and backend against exact rational arithmetic.

For each family (a 2-4-4-2 ReLU stack whose layers are scaled by 1e-6 ... 5e6, mixed, or whose
leave-one-out networks are one float32 step from N; generator: tests/verify/test_extreme_scale.py), the
first SEEDS seeds whose exact beta* is positive for some class are verified with every option
set of TIERS; each class's upper bound is compared with the exact beta* (tests/helpers/exact_oracle.py,
Fractions), and every input the access layer releases among 441 grid points, the box corners and
the exact leaks with their one-ulp neighbours is replayed through every network exactly.

    python benchmarks/extreme_scale.py                  # resumable: rows already in the JSONL are kept
    python benchmarks/extreme_scale.py --report         # the Markdown report from the JSONL only

Writes benchmarks/results/extreme_scale.jsonl (one row per run) and extreme_scale.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "helpers"), str(ROOT / "tests" / "verify")]  # exact_oracle, test_extreme_scale

from exact_oracle import exact_bound, exact_label_and_agreement, exact_singleton  # noqa: E402
from test_extreme_scale import FAMILIES as TEST_FAMILIES, _stack, probes, scaled_tensors, write_scaled_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FAMILIES = {
    **TEST_FAMILIES,
    "1e2": ((1e2,) * 3, 1e-7),
    "1e4": ((1e4,) * 3, 1e-7),
    "1e5": ((1e5,) * 3, 1e-7),
    "2e6": ((2e6,) * 3, 1e-7),  # scores ~1e19-1e20; the guard's score bound reaches 2^67.7
    "2.5e6": ((2.5e6,) * 3, 1e-7),  # at the limits: biases past 2^64 on some seeds (refused), 2^67.5 on another
    "5e6": ((5e6,) * 3, 1e-7),  # biases ~1.25e20: beyond 2^64, refused
    "mixed-2": ((1e-6, 1e6, 1e6), 1e-7),
}
TIERS = {
    "defaults": {},
    "no-search": {"search": False},
    "no-screen": {"screen": "none"},
    "screen-interval": {"screen": "interval"},
    "bounds-interval": {"bounds": "interval"},
    "naive-no-screen": {"naive": True, "screen": "none"},
    "split-time-0": {"split_time": 0},
    "defaults-scip": {"solver": "scip"},
    "defaults-gurobi": {"solver": "gurobi"},
}
SEEDS = 3


def seeds_of(family: str) -> list[tuple[int, dict, list]]:
    scales, difference = FAMILIES[family]
    out = []
    for seed in range(200):
        tensors = scaled_tensors(scales, difference, seed)
        exact = [exact_bound(_stack(tensors), c, [0, 0], [1, 1]) for c in range(2)]
        if any(e is not None and e > 0 for e in exact):
            out.append((seed, tensors, exact))
            if len(out) == SEEDS:
                break
    return out


def one_run(family: str, seed: int, tensors: dict, exact: list, tier: str) -> dict:
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.verify import verify_run
    from lucid.errors import LucidError

    row = {"family": family, "seed": seed, "tier": tier, "exact": [None if e is None else float(e) for e in exact]}
    with tempfile.TemporaryDirectory() as tmp:
        run = write_scaled_run(Path(tmp) / "run", tensors)
        t0 = time.perf_counter()
        try:
            doc = verify_run(run, workers=1, progress=False, time_limit=20, **TIERS[tier])
        except LucidError as exc:
            row.update(refused=str(exc), seconds=time.perf_counter() - t0)
            return row
        row["seconds"] = time.perf_counter() - t0
        uppers, margins = [], []
        for c in range(2):
            upper, e = doc["bounds"][str(c)]["upper"], exact[c]
            uppers.append(upper)
            if upper is None or e is None:
                margins.append(None)  # nothing proved (+inf: sound) or no leak (any bound is sound)
                continue
            up = -np.inf if upper == -1.0 else upper  # -1.0 stands for -inf
            margins.append(float((Fraction(up) - e) / max(1, abs(e))) if np.isfinite(up) else -np.inf)
        row.update(upper=uppers, margin=margins)
        stack = _stack(tensors)
        net_n = ([w[0] for w in stack.weights], [b[0] for b in stack.biases])
        leaks = [exact_singleton(net_n, ([w[j] for w in stack.weights], [b[j] for b in stack.biases]), c, [0, 0], [1, 1])[1]
                 for j in range(1, len(stack)) for c in range(2)]
        clf = LabelOnlyClassifier.from_run(run, epsilon=1.0)
        try:
            xs = probes(stack, [p for p in leaks if p is not None])
            cls, noised = clf.decide(xs)
            bad = 0
            for x, label in zip(xs[~noised], cls[~noised]):
                n_label, agree = exact_label_and_agreement(stack, x)
                bad += int(not (agree and n_label == label))
            row.update(probes=len(xs), released=int((~noised).sum()), leaking_releases=bad)
        finally:
            clf.close()
    return row


def report(rows: list[dict]) -> str:
    lines = ["# Extreme weight scales against exact arithmetic", "",
             "`python benchmarks/extreme_scale.py` (HiGHS unless the tier says scip; `--time-limit 20`, one worker).",
             "margin: (upper - exact beta*) / max(1, |exact beta*|), the worst (smallest) over the family's classes,",
             "seeds and tiers; negative would be unsound. Leaking releases: inputs released although some network",
             "labels them otherwise in exact arithmetic.", "",
             "| family | runs | refused | sound classes | worst margin | released probes | leaking releases |",
             "|---|---|---|---|---|---|---|"]
    for family in FAMILIES:
        mine = [r for r in rows if r["family"] == family]
        if not mine:
            continue
        refused = [r for r in mine if "refused" in r]
        done = [r for r in mine if "refused" not in r]
        margins = [m for r in done for m in r["margin"] if m is not None]
        sound = sum(1 for m in margins if m >= 0)
        worst = f"{min(margins):.3g}" if margins else "-"
        lines.append(f"| {family} | {len(mine)} | {len(refused)} | {sound} / {len(margins)} | {worst} | "
                     f"{sum(r.get('released', 0) for r in done)} | {sum(r.get('leaking_releases', 0) for r in done)} |")
    refusals = sorted({r["refused"].split(": ", 1)[-1] for r in rows if "refused" in r})
    if refusals:
        lines += ["", "Refusals (one line each):", ""] + [f"- {m}" for m in refusals]
    total = [m for r in rows if "refused" not in r for m in r["margin"] if m is not None]
    lines += ["", f"{len(rows)} runs, {len(total)} class bounds compared, {sum(1 for m in total if m < 0)} below "
              f"the exact beta*; {sum(r.get('leaking_releases', 0) for r in rows)} leaking releases."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only write the report from the JSONL")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--tiers", default=",".join(TIERS))
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    jsonl = RESULTS / "extreme_scale.jsonl"
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    done = {(r["family"], r["seed"], r["tier"]) for r in rows}
    if not args.report:
        for family in args.families.split(","):
            for seed, tensors, exact in seeds_of(family):
                for tier in args.tiers.split(","):
                    if (family, seed, tier) in done:
                        continue
                    row = one_run(family, seed, tensors, exact, tier)
                    rows.append(row)
                    with open(jsonl, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    (RESULTS / "extreme_scale.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
