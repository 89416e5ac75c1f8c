"""A 2-D CNN next to the MLP on scikit-learn's digits (1x8x8 images): train, verify, evaluate.

  python benchmarks/cnn2d_digits.py [--workloads cnn2d-small] [--time-limit-per-class 120] [--workers 2]
                                    [--epochs 50] [--rel-gap 0.1]
  python benchmarks/cnn2d_digits.py --quick    # smoke run: 150 rows, 2 epochs, classes 0 and 1, 5 s each
  python benchmarks/cnn2d_digits.py --report-only

Workloads (the split of benchmarks/screen.py's digits-2x20: pixels / 16, 70 % / 30 % stratified,
seed 0, the test rows given with --test-data; batch 100):

- `cnn2d`: `--arch "conv(4,3,stride=1,pad=1),conv(4,3,stride=2),fc(20)" --input-shape 1,8,8`
  (1x8x8 -> 4x8x8 -> 4x3x3 -> 20 -> 10; 312 hidden ReLUs);
- `cnn2d-small`: `--arch "conv(4,3,stride=2),fc(20)" --input-shape 1,8,8`
  (1x8x8 -> 4x3x3 -> 20 -> 10; 56 hidden ReLUs, about the MLP's 40);
- `mlp-2x20`: `--arch 2x20` (64 -> 20 -> 20 -> 10).

Each workload is trained with `lucid train` into benchmarks/runs/cnn2d_digits/<workload>/run,
verified with `lucid verify --time-limit --rel-gap` (the per-class limit times the number of
classes verified; the engine divides it among them, and a class ends once upper / lower <= 1 +
rel-gap) and evaluated with `lucid.access.evaluate` (the code of `lucid evaluate`, which also gives
the count of released test inputs that leak: it must be 0). Finished steps are kept: a re-run
continues where the last one stopped (`--fresh` starts over). Each workload's record is
benchmarks/results/cnn2d_digits/<workload>.json, and the report, benchmarks/results/cnn2d_digits.md,
shows every recorded workload (with --quick: both in the scratch folder instead).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / "benchmarks" / "runs" / "cnn2d_digits"
REPORT = REPO / "benchmarks" / "results" / "cnn2d_digits.md"
RECORDS = REPO / "benchmarks" / "results" / "cnn2d_digits"
# the report of the runs before per-workload records, kept in git only
EARLIER_REPORT = "deb26c0:benchmarks/results/cnn2d_digits-2026-11-25.md"
EPSILONS = "0,0.2,1"
WORKLOADS = {
    "cnn2d": ["--arch", "conv(4,3,stride=1,pad=1),conv(4,3,stride=2),fc(20)", "--input-shape", "1,8,8"],
    "cnn2d-small": ["--arch", "conv(4,3,stride=2),fc(20)", "--input-shape", "1,8,8"],
    "mlp-2x20": ["--arch", "2x20"],
}


def write_splits(folder: Path, rows: int | None) -> tuple[Path, Path]:
    """Digits as images in [0, 1] (pixel / 16, so no per-pixel rescaling), split as screen.py does."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    if rows is not None:  # --quick: the first rows, every class still present
        X, y = X[:rows], y[:rows]
    xa, xb, ya, yb = train_test_split(X / 16.0, y, test_size=0.3, stratify=y, random_state=0)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, xs, ys in (("train", xa, ya), ("test", xb, yb)):
        path = folder / f"digits-{part}.npz"
        np.savez(path, X=np.clip(xs, 0, 1).astype(np.float32), y=ys.astype(np.int64))
        paths.append(path)
    return paths[0], paths[1]


def lucid(*args: str) -> float:
    """Run one `lucid` command; its wall seconds."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "lucid", *args], check=True)
    return time.monotonic() - started


def run_workload(name: str, train: Path, test: Path, args: argparse.Namespace) -> dict:
    folder = SCRATCH / ("quick" if args.quick else "full") / name
    run, record_path = folder / "run", _records(args) / f"{name}.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"workload": name}
    if "bounds" not in record and not (run / "run.json").exists():
        record = {"workload": name}  # a fresh checkout: the run is trained again
    if "train_seconds" not in record:
        shutil.rmtree(run, ignore_errors=True)
        record["train_seconds"] = lucid("train", str(train), "--test-data", str(test), "--out", str(run),
                                        *WORKLOADS[name], "--epochs", str(args.epochs), "--batch-size", "100",
                                        "--seed", "0", "--no-progress")
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1))
    if "bounds" not in record:
        meta = json.loads((run / "run.json").read_text())
        classes = args.classes.split(",") if args.classes else [str(c) for c in range(meta["num_classes"])]
        limit = args.time_limit_per_class * len(classes)
        for stale in ("bounds.json", "verify.checkpoint.json", "verify.log.jsonl"):
            (run / stale).unlink(missing_ok=True)
        record["verify_seconds"] = lucid("verify", str(run), "--time-limit", f"{limit:g}", "--workers",
                                         str(args.workers), "--classes", ",".join(classes), "--rel-gap",
                                         f"{args.rel_gap:g}", "--quiet")
        record["time_limit"] = limit
        record["rel_gap"] = args.rel_gap
        record["verified"] = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.platform()}, "
                              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end")
        record["bounds"] = json.loads((run / "bounds.json").read_text())["bounds"]
        record_path.write_text(json.dumps(record, indent=1))
    if "evaluation" not in record:
        from lucid.access.evaluate import evaluate_run

        epsilons = [(text, float(text)) for text in EPSILONS.split(",")]
        result, plot = evaluate_run(run, epsilons, seed=0)
        record["evaluation"] = result
        record["released_but_leaking"] = int(plot["released_but_leaking"])
        record_path.write_text(json.dumps(record, indent=1))
    if "networks" not in record:
        record["networks"], record["parameters"] = _network_counts(run)
        record_path.write_text(json.dumps(record, indent=1))
    return record


def _records(args: argparse.Namespace) -> Path:
    return SCRATCH / "quick" / "records" if args.quick else RECORDS


def _network_counts(run: Path) -> tuple[int, int]:
    from safetensors import safe_open

    with safe_open(str(run / "networks.safetensors"), framework="numpy") as fh:
        shapes = {name: fh.get_slice(name).get_shape() for name in fh.keys()}
    per_network = sum(int(np.prod(shape[1:])) for name, shape in shapes.items() if name != "removed")
    return int(shapes["removed"][0]), per_network


def report(records: list[dict], args: argparse.Namespace) -> str:
    eps = EPSILONS.split(",")
    lines = [
        "# 2-D CNN against the MLP on digits (1x8x8)",
        "",
        f"`python benchmarks/cnn2d_digits.py --workloads W --time-limit-per-class T --workers {args.workers} "
        f"--epochs {args.epochs} --rel-gap G{' --quick' if args.quick else ''}` (T and G per row; rows without a "
        "rel-gap ran exact). HiGHS. A class is complete when its upper / lower <= 1 + G.",
        "",
        "| workload | parameters | networks | train s | verify s (limit) | rel-gap | classes complete | N test acc. | "
        + " | ".join(f"LUCID ε={e}" for e in eps) + " | noised | released but leaking | verified |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(eps) + "---|---|---|",
    ]
    for r in records:
        ev, bounds = r["evaluation"], r["bounds"]
        complete = sum(1 for b in bounds.values() if b["complete"])
        lucid_acc = " | ".join(f"{100 * ev['accuracy']['lucid'][e]:.1f} %" for e in eps)
        lines.append(f"| {r['workload']} | {r['parameters']} | {r['networks']} | {r['train_seconds']:.0f} | "
                     f"{r['verify_seconds']:.0f} ({r['time_limit']:g}) | {r.get('rel_gap', 0):g} | "
                     f"{complete} / {len(bounds)} | {100 * ev['accuracy']['plain']:.1f} % | {lucid_acc} | "
                     f"{100 * ev['noised_fraction']['lucid']:.1f} % | {r['released_but_leaking']} | "
                     f"{r.get('verified', '2026-11-25 23:42 UTC, 2 cores, load 2.0')} |")
    lines += ["", "Per-class bounds (upper / lower; `-` none proved or found, `-inf` no input can leak):", "",
              "| class | " + " | ".join(r["workload"] for r in records) + " |",
              "|---|" + "---|" * len(records)]
    classes = sorted({int(c) for r in records for c in r["bounds"]})
    for c in classes:
        cells = [_bound(r["bounds"].get(str(c))) for r in records]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if not args.quick:
        lines += ["", "Earlier runs, before the records were kept per workload (2026-11-25, 90 s per class, exact; "
                  f"the larger `cnn2d` among them): `git show {EARLIER_REPORT}`."]
    return "\n".join(lines) + "\n"


def _bound(b: dict | None) -> str:
    if b is None:
        return "–"
    upper = "-" if b["upper"] is None else ("-inf" if b["upper"] == -1.0 else f"{b['upper']:.4g}")
    lower = "-" if b["lower"] is None else f"{b['lower']:.4g}"
    return f"{upper} / {lower}{'' if b['complete'] else ' (open)'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--time-limit-per-class", type=float, default=120.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--classes", default=None, help="Classes to verify (default: all).")
    p.add_argument("--rel-gap", type=float, default=0.1, help="A class ends at upper / lower <= 1 + this.")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--quick", action="store_true", help="Smoke run: 150 rows, 2 epochs, classes 0,1, 5 s per class.")
    p.add_argument("--fresh", action="store_true", help="Start over instead of continuing the last run.")
    p.add_argument("--report-only", action="store_true", help="Write the report from the records; run nothing.")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.time_limit_per_class, args.classes = 2, 5.0, args.classes or "0,1"
    scratch = SCRATCH / ("quick" if args.quick else "full")
    if args.fresh:
        shutil.rmtree(scratch, ignore_errors=True)
    train, test = write_splits(scratch / "data", 150 if args.quick else None)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    for name in [] if args.report_only else args.workloads.split(","):
        run_workload(name, train, test, args)
    stored = {p.stem: json.loads(p.read_text()) for p in _records(args).glob("*.json")}
    records = [stored[name] for name in WORKLOADS if name in stored and "evaluation" in stored[name]]
    text = report(records, args)
    out = scratch / REPORT.name if args.quick else REPORT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
