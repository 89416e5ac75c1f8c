"""End-to-end `lucid verify` on real workloads with the default open-source backend (HiGHS).

  python benchmarks/verify_e2e.py --workload adult-2x50=runs/adult-2x50 --rel-gap 0.1 --time-limit 3600
  python benchmarks/verify_e2e.py --workload crypto-2x50=runs/crypto-2x50 --rel-gap 0 --screen interval
  python benchmarks/verify_e2e.py --report-only

Each (workload, screen, rel-gap) verifies in its own scratch run directory under
benchmarks/runs/e2e/ (links to the run's networks and data, so the run itself is untouched) and
writes benchmarks/results/verify_e2e/<workload>-<screen>-gap<rel-gap>.json: per class the seconds
until the class finished, upper, lower, upper/lower, whether it is complete, the nodes solved and
how many networks the screen left. An interrupted benchmark continues with `--resume` on a
re-run; finished ones are skipped. The report is benchmarks/results/verify_e2e.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / "benchmarks" / "runs" / "e2e"
RESULTS = REPO / "benchmarks" / "results" / "verify_e2e"
REPORT = REPO / "benchmarks" / "results" / "verify_e2e.md"


def scratch_run(name: str, source: Path) -> Path:
    path = SCRATCH / name
    path.mkdir(parents=True, exist_ok=True)
    for f in ("run.json", "networks.safetensors", "data.npz"):
        if not (path / f).exists():
            os.symlink((source / f).resolve(), path / f)
    return path


def summarise(run: Path, wall: float, args: argparse.Namespace, workload: str) -> dict:
    bounds = json.loads((run / "bounds.json").read_text())
    events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
    classes = {}
    for c, b in bounds["bounds"].items():
        ev = [e for e in events if e.get("class") == int(c)]
        done = [e["t"] for e in ev if e["event"] == "class_done"]
        refined = [e for e in ev if e["event"] == "refined"]
        u, lo = b["upper"], b["lower"]
        classes[c] = {
            "seconds": done[-1] if done else None, "upper": u, "lower": lo, "complete": b["complete"],
            "ratio": (u / lo) if (u is not None and lo not in (None, 0)) else None, "nodes": b["nodes"],
            "reason": b.get("reason"), "refined": [{k: e[k] for k in ("networks", "below", "seconds")} for e in refined],
        }
    return {"workload": workload, "screen": args.screen, "rel_gap": args.rel_gap, "split_time": args.split_time,
            "split_space": args.split_space, "split_race": args.split_race, "time_limit": args.time_limit,
            "workers": args.workers, "wall_seconds": wall, "classes": classes, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end"}


def run_one(workload: str, source: Path, args: argparse.Namespace) -> None:
    key = f"{workload}-{args.screen}-gap{args.rel_gap:g}-split{args.split_time:g}"
    if args.split_space != "relu":
        key += f"-{args.split_space}"
    if args.split_race:
        key += "-race"
    out = RESULTS / f"{key}.json"
    if out.exists():
        print(f"{key}: done before ({out})", file=sys.stderr)
        return
    run = scratch_run(key, source)
    cmd = [sys.executable, "-m", "lucid", "verify", str(run), "--rel-gap", str(args.rel_gap), "--screen", args.screen,
           "--workers", str(args.workers), "--split-time", str(args.split_time), "--split-space", args.split_space,
           "--quiet", *(["--split-race"] if args.split_race else [])]
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    if (run / "verify.checkpoint.json").exists() and not (run / "bounds.json").exists():
        cmd.append("--resume")
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summarise(run, time.monotonic() - t0, args, workload), indent=1) + "\n")
    (run / "bounds.json").unlink()  # the result is recorded; a re-run of this key starts over


def report() -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    lines = ["# End-to-end verification, default open-source backend (HiGHS)", "",
             "Command: `python benchmarks/verify_e2e.py --workload NAME=RUN --screen S --rel-gap G --time-limit T` "
             "(2 workers). Seconds: until the class finished (or the time limit).", "",
             "| workload | screen | rel-gap | split-time | split-space | class | seconds | upper | lower | upper/lower | complete | nodes | date, machine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for c, b in r["classes"].items():
            fmt = lambda v: "-" if v is None else f"{v:.6g}"
            # runs before the ReLU-splitting tier existed had none: split-time 0
            # runs before --split-space existed split ReLUs
            lines.append(f"| {r['workload']} | {r['screen']} | {r['rel_gap']:g} | {r.get('split_time', 0):g} | "
                         f"{r.get('split_space', 'relu')}{' + race' if r.get('split_race') else ''} | {c} | {fmt(b['seconds'])} | {fmt(b['upper'])} "
                         f"| {fmt(b['lower'])} | {fmt(b['ratio'])} | {b['complete']} | {b['nodes']} | {r['date']}, {r['machine']} |")
    notes = [f"- {r['workload']}, {r['screen']}, rel-gap {r['rel_gap']:g}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        lines += ["", "Notes:", *notes]
    REPORT.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", action="append", default=[], help="NAME=RUN_DIR (repeatable)")
    ap.add_argument("--screen", default="optimised")
    ap.add_argument("--rel-gap", type=float, default=0.1)
    ap.add_argument("--time-limit", type=float, default=3600)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--split-time", type=float, default=60.0, help="lucid verify --split-time (0: MILP-only singletons)")
    ap.add_argument("--split-space", default="auto", choices=["relu", "input", "auto"], help="lucid verify --split-space")
    ap.add_argument("--split-race", action="store_true", help="lucid verify --split-race")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    if not args.report_only:
        for spec in args.workload:
            name, _, path = spec.partition("=")
            if not path or not (Path(path) / "run.json").exists():
                raise SystemExit(f"--workload wants NAME=RUN_DIR with a trained run, got {spec!r}")
            run_one(name, Path(path), args)
    report()


if __name__ == "__main__":
    main()
