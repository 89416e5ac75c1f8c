"""The residual check (`lucid verify --residual M`) against one bound per class and Naive-iDP.

  python benchmarks/residual.py                                   # every workload, M = 0 8 32 128 512
  python benchmarks/residual.py --workloads breast_cancer-2x10 --ms 0,32 --time-limit 120
  python benchmarks/residual.py --workloads adult3k-2x50 --ms 32,128 --regions 64   # per-box residual sets
  python benchmarks/residual.py --workloads breast_cancer-2x10,elsewhere-2x10 --ms auto --time-limit 120
  python benchmarks/residual.py --workloads adult4k-2x50 --ms 32 --time-limit 1200   # the issue's loose-level workload
  python benchmarks/residual.py --workloads adult800-2x20 --ms 32,auto --time-limit 120  # a 600-row tabular set
  python benchmarks/residual.py --workloads adult-growth-1000,adult-growth-2000,adult-growth-4000,adult-growth-8000,\
      adult-growth-12000 --ms auto --time-limit 600       # the growth curve: benchmarks/results/residual_growth.md
  python benchmarks/residual.py --report-only
  python benchmarks/residual.py --refresh                         # measure the verified runs again

Per workload (the train / public / test splits of benchmarks/regions.py, trained once there; and
`elsewhere-2x10`: breast cancer trained by a plain PyTorch script with Adam, benchmarks/
loo_training_elsewhere.py, and imported) and per M, the same `--time-limit`, then on the test
split:
  * noised share and accuracy at epsilon = 0 (expected over the mechanism's draws) of the residual
    rule, of its own global bound and of Naive-iDP (the exact leaking set);
  * every released test input replayed through all |D| + 1 networks (float64 argmax; 0 expected);
  * the single query in process (`LabelOnlyClassifier.decide` on one row, median of 2 000) and the
    full query path with the memo (`lucid_single_query` of `lucid evaluate`);
  * served memory: the float64 bytes of N plus the union of the residual sets, against all networks;
    the single-query time and memory of the union are what every row pays (equal work);
  * the time the global bound (M = 0) needs to reach upper <= 1.1 x lower per class, from its log,
    against the time the residual run's level needs to come within 10 % of its final value and the
    time its noised share first meets the target (replayed from the log's sets and levels);
  * the side channel: single-query times of rows released by the level, released by the check,
    noised by the level and noised by the check, compared pairwise (Mann-Whitney U, p-values).
With `--regions K` the runs are verified with `--regions K --public-inputs` (the public split of
benchmarks/regions.py): each box gets its own residual sets.
Resumable: each (workload, M) is benchmarks/results/residual/<workload>-M<m>.json (with -R<K> for
`--regions K`); the report is benchmarks/results/residual.md.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regions as region_bench  # noqa: E402  (the shared workloads and their trained runs)

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "runs" / "residual"
RESULTS = REPO / "benchmarks" / "results" / "residual"
REPORT = REPO / "benchmarks" / "results" / "residual.md"
# Adult subsets trained as a user would (rows of the shared file, numpy.random.default_rng(7).permutation,
# a quarter held out as the test split): issue 63's loose-level workload and its small tabular set.
ADULT_SUBSETS = {"adult4k-2x50": (4000, "2x50"), "adult800-2x20": (800, "2x20")}
# The growth curve along |D|: Adult 2x50 on nested training sets of 1 000 to 12 000 rows beside one
# fixed 4 000-row test split (the first 4 000 rows of the same permutation; 16 000 of the file's 16 281).
GROWTH = {f"adult-growth-{n}": n for n in (1000, 2000, 4000, 8000, 12000)}
GROWTH_TEST_ROWS = 4000
GROWTH_REPORT = REPO / "benchmarks" / "results" / "residual_growth.md"
NOTES_MARKER = "<!-- notes: kept when the tables are written again -->\n"
WORKLOADS = [*region_bench.WORKLOADS, "elsewhere-2x10", *ADULT_SUBSETS, *GROWTH]
SINGLE_SAMPLES = 2000


def prepare(name: str) -> Path:
    """The workload's run directory (trained or imported once)."""
    if name in ADULT_SUBSETS:
        return _adult_run(name, *ADULT_SUBSETS[name])
    if name in GROWTH:
        return _adult_run(name, GROWTH[name], "2x50", test_rows=GROWTH_TEST_ROWS)
    if name != "elsewhere-2x10":
        return region_bench.prepare(name) / "run"
    import loo_training_elsewhere as elsewhere  # noqa: PLC0415 (torch: only for this workload)

    work = RUNS / name
    run = work / "run"
    if (run / "run.json").exists():
        return run
    work.mkdir(parents=True, exist_ok=True)
    X_tr, X_te, y_tr, y_te = elsewhere.data(0)
    np.savez(work / "data.npz", X_train=X_tr, y_train=y_tr, X_test=X_te, y_test=y_te)
    elsewhere.write_variant(work / "files", "mask", X_tr, y_tr,
                            argparse.Namespace(epochs=30, batch=32, seed=0))
    subprocess.run([sys.executable, "-m", "lucid", "import", "--manifest", str(work / "files" / "manifest.json"),
                    "--data", str(work / "data.npz"), "--out", str(run)], check=True)
    return run


def _adult_run(name: str, rows: int, arch: str, test_rows: int = 0) -> Path:
    """A run on rows of the shared Adult file, in the order of numpy.random.default_rng(7).permutation,
    trained as a user would (50 epochs, batch 100, lr 0.1). Without `test_rows`: the first `rows`
    rows, a quarter held out by `--test-fraction 0.25` (no public split: auto chooses on the test
    split). With them: the first `test_rows` rows are a fixed test split (`--test-data`) and the
    next `rows` the training set (the growth workloads: nested training sets, one test split)."""
    work = RUNS / name
    run = work / "run"
    if (run / "run.json").exists():
        return run
    work.mkdir(parents=True, exist_ok=True)
    with np.load(region_bench.DATA / "adult" / "adult.npz") as f:
        X, y = np.clip(f["X"], 0, 1), f["y"]
    order = np.random.default_rng(7).permutation(len(X))
    train = order[test_rows : test_rows + rows]
    if len(train) < rows:
        raise SystemExit(f"{name}: the Adult file has {len(X) - test_rows} rows beside the test split")
    np.savez(work / "rows.npz", X=X[train], y=y[train])
    split = ["--test-fraction", "0.25"]
    if test_rows:
        np.savez(work / "test.npz", X=X[order[:test_rows]], y=y[order[:test_rows]])
        split = ["--test-data", str(work / "test.npz")]
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "lucid", "train", str(work / "rows.npz"), *split, "--arch", arch,
                    "--epochs", "50", "--batch-size", "100", "--lr", "0.1", "--seed", "0", "--out", str(run),
                    "--no-progress"], check=True)
    (work / "train_seconds.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
    return run


def _label(m: int | str, regions: int) -> str:
    return f"M{m}" if regions <= 1 else f"M{m}-R{regions}"


def scratch(run: Path, name: str, label: str) -> Path:
    path = RUNS / name / label
    path.mkdir(parents=True, exist_ok=True)
    for f in ("run.json", "networks.safetensors", "data.npz"):
        if not (path / f).exists():
            os.symlink((run / f).resolve(), path / f)
    return path


def time_to_ratio(run: Path, ratio: float = 1.1) -> float | None:
    """Seconds until every class's anytime upper <= ratio x lower (None: never within the run)."""
    events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
    classes = {e["class"] for e in events if e["event"] == "class_started"}
    reached: dict[int, float] = {}
    for e in events:
        if e["event"] in ("anytime", "class_done") and e.get("class") in classes and e["class"] not in reached:
            up, lo = _number(e.get("upper")), _number(e.get("lower"))
            if up is not None and (up <= 0 or (lo is not None and lo > 0 and up <= ratio * lo)):
                reached[e["class"]] = e["t"]
    return max(reached.values()) if len(reached) == len(classes) and classes else None


def time_to_final(run: Path, share: float = 0.1) -> float | None:
    """Seconds until every class's anytime upper came within `share` x |final| of its final value."""
    events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
    curves: dict[int, list] = {}
    for e in events:
        if e["event"] == "anytime" and e.get("upper") is not None:
            curves.setdefault(e["class"], []).append((e["t"], _number(e["upper"])))
    if not curves:
        return None
    when = []
    for points in curves.values():
        final = points[-1][1]
        near = final if math.isinf(final) else final + share * abs(final)
        when.append(next(t for t, up in points if up <= near))
    return max(when)


def time_to_target(run: Path, x: np.ndarray, target: float) -> float | None:
    """Seconds until the rule's noised share on `x` is at most `target`, replayed from the log:
    each class's anytime level with its final set (`residual` events; the log does not name the
    set at each moment, so this is approximate while the set still changed). A row is noised when
    N's confidence is at or below its class's level or a member of its class's set labels it
    otherwise (float64 argmax; the served check's float margins are left out). One bound per
    class (M = 0): the anytime upper alone. None: never within the run (or regions)."""
    from lucid.network import confidence, load_networks

    events = [json.loads(line) for line in (run / "verify.log.jsonl").read_text().splitlines()]
    if any(e["event"] == "region" for e in events):
        return None
    stack = load_networks(run)
    n_scores = stack.select(slice(0, 1)).forward(x)[0]  # position 0 is N
    cls, conf, rows = n_scores.argmax(axis=1), confidence(n_scores), np.arange(len(x))
    disagree = np.zeros((len(stack), len(x)), dtype=bool)  # [K, B], by chunks of networks (8 000 x 4 000 rows
    for start in range(0, len(stack), 256):  # of 2x50 activations at once need 26 GB)
        part = slice(start, min(len(stack), start + 256))
        disagree[part] = stack.select(part).forward(x).argmax(axis=2) != cls
    sets = {e["class"]: np.asarray(e["positions"], dtype=np.int64) for e in events if e["event"] == "residual"}
    levels: dict[int, float] = {}
    for e in events:
        c = e.get("class")
        if e["event"] in ("anytime", "class_done") and e.get("upper") is not None:
            levels[c] = _number(e["upper"])
        else:
            continue
        level = np.array([levels.get(int(k), math.inf) for k in cls])
        checked = np.zeros(len(x), dtype=bool)
        for k, members in sets.items():
            mine = rows[cls == k]
            checked[mine] = disagree[np.ix_(members, mine)].any(axis=0) if len(members) else False
        if ((conf <= level) | checked).mean() <= target + 1e-12:
            return float(e["t"])
    return None


def _number(value) -> float | None:
    """A bound as the log writes it: a number, null, or "inf" / "-inf" (no network outside the set)."""
    return None if value is None else float(value)


def side_channel(clf, x: np.ndarray, section: dict | None) -> dict:
    """Single-query decide times of the outcomes, compared pairwise (Mann-Whitney U): released with
    every member's bound below the confidence (by the level) or not (by the check), noised by the
    level, noised by the check. `section`: bounds.json's residual section (the members' bounds)."""
    from scipy.stats import mannwhitneyu

    from lucid.network import confidence

    cls, noised = clf.decide(x)
    if clf.residual is None:
        return {}
    conf = confidence(clf.scores(x))
    if clf.regions is None:
        levels = clf.residual_thresholds[cls]
        entries = (section or {}).get("classes", {})
        tops = np.array([_highest(entries[str(c)]["bounds"]) if str(c) in entries else -np.inf
                         for c in range(len(clf.residual_thresholds))])[cls]
    else:
        leaves = clf._lookup.locate(x)
        levels = clf.region_thresholds[leaves, cls]
        sets = clf.regions.residual
        tops = np.array([_highest(sets[leaf][c].bounds.tolist()) if c in sets[leaf] else -np.inf
                         for leaf, c in zip(leaves.tolist(), cls.tolist())])
    above, checked = conf > levels, conf <= tops
    groups = {"released_by_level": x[~noised & ~checked], "released_by_check": x[~noised & checked],
              "noised_by_level": x[~above], "noised_by_check": x[above & noised]}
    for c in np.unique(cls)[:2]:  # N's class is hidden in a noised answer: it must not show in time either
        groups[f"class_{c}"] = x[cls == c]
    sizes = {k: len(g) for k, g in groups.items()}
    groups = {k: g for k, g in groups.items() if len(g) >= 5}  # an outcome this run (almost) never has: left out
    if len(groups) < 2:
        return {"sizes": sizes}
    times: dict[str, list[float]] = {k: [] for k in groups}
    for rep in range(300):  # interleaved, so that machine noise hits every group alike
        for name, rows in groups.items():
            row = rows[rep % len(rows)][None]
            t0 = time.perf_counter_ns()
            clf.decide(row)
            times[name].append(time.perf_counter_ns() - t0)
    names = list(groups)
    out = {"sizes": sizes, "median_us": {k: float(np.median(v)) / 1e3 for k, v in times.items()}}
    out["p_values"] = {f"{a} vs {b}": float(mannwhitneyu(times[a], times[b]).pvalue)
                       for i, a in enumerate(names) for b in names[i + 1:]}
    return out


def _highest(bounds: list) -> float:
    """The largest of a set's member bounds as bounds.json writes them (null: +inf, nothing proved)."""
    return max((math.inf if b is None else float(b) for b in bounds), default=-math.inf)


def single_decide_ms(clf, x: np.ndarray) -> float:
    rows = x[np.arange(SINGLE_SAMPLES) % len(x)]
    for i in range(100):  # warm the caches first
        clf.decide(rows[i : i + 1])
    times = []
    for i in range(len(rows)):
        t0 = time.perf_counter()
        clf.decide(rows[i : i + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def naive_single_ms(run, x: np.ndarray) -> float:
    """Naive-iDP on one query: all |D| + 1 networks in one stacked float64 pass (median of 20)."""
    from lucid.network import load_networks

    stack = load_networks(run.path, run.meta)
    times = []
    for i in range(20):
        t0 = time.perf_counter()
        labels = stack.forward(x[i % len(x)][None]).argmax(axis=-1)
        bool((labels != labels[0]).any())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def served_bytes(clf, run) -> dict:
    from lucid.network import NetworkFile

    n = sum(w.nbytes for w in clf._weights) + sum(b.nbytes for b in clf._biases)
    residual = 0 if clf.residual is None else clf.residual.nbytes
    return {"served": n + residual, "all_networks": n * len(NetworkFile(run.path, run.meta)),
            "residual_networks": 0 if clf.residual is None else clf.residual.count,
            "slots": 0 if clf.residual is None else clf.residual.size * clf.num_classes}


def run_one(name: str, m: int | str, args: argparse.Namespace) -> None:
    label = _label(m, args.regions)
    out = RESULTS / f"{name}-{label}.json"
    if out.exists():
        if args.refresh:  # the measurements again, on the verified run (nothing is verified again)
            old = json.loads(out.read_text())
            record = measure(name, m, RUNS / name / label, old["verify_wall_s"], args)
            record.update(time_limit=old["time_limit"], workers=old["workers"])
            out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name} M={m}: done before", file=sys.stderr)
        return
    if args.refresh:
        return
    source = prepare(name)
    if m != "auto" and m > json.loads((source / "run.json").read_text())["train_size"]:
        print(f"{name} M={m}: more than the run's networks, skipped", file=sys.stderr)
        return
    path = scratch(source, name, label)
    cmd = [sys.executable, "-m", "lucid", "verify", str(path), "--time-limit", str(args.time_limit), "--quiet",
           "--workers", str(args.workers), "--residual", str(m)]
    public = source.parent / "public.npz"
    if m == "auto" and public.exists():  # M chosen on the public split, measured on the test split
        cmd += ["--public-inputs", str(public)]
    if args.regions > 1:  # boxes weighed by the public split where the workload has one, else uniform samples
        cmd += ["--regions", str(args.regions), *(["--public-inputs", str(public)] if public.exists() else [])]
    if (path / "verify.checkpoint.json").exists() and not (path / "bounds.json").exists():
        cmd.append("--resume")
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    wall = time.monotonic() - t0
    record = measure(name, m, path, wall, args)
    trained = RUNS / name / "train_seconds.txt"  # written where this script trained the run
    if trained.exists():
        record["train_s"] = float(trained.read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name} {label}: noised {record['noised']}, {wall:.0f} s", file=sys.stderr)


def measure(name: str, m: int, path: Path, wall: float, args: argparse.Namespace) -> dict:
    """Everything but the verification, on the verified run directory `path`."""
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.access.evaluate import evaluate_run, leaking_set
    from lucid.access.memo import Memo
    from lucid.network import NetworkFile
    from lucid.rundir import open_run

    result, plot = evaluate_run(path, [("0", 0.0)], seed=0)
    run = open_run(path)
    clf = LabelOnlyClassifier(run, epsilon=0.0, memo=Memo(None))
    x = np.clip(np.asarray(run.data()["X_test"], np.float64), clf.domain_lower, clf.domain_upper) + 0.0
    _, noised = clf.decide(x)
    replay_leaks = int((~noised & leaking_set(NetworkFile(run.path, run.meta), x)).sum())
    exp = result["expected_accuracy"]
    bounds = json.loads((path / "bounds.json").read_text())
    record = {
        "workload": name, "M": m, "regions": args.regions, "time_limit": args.time_limit, "workers": args.workers,
        "verify_wall_s": round(wall, 1), "networks": len(NetworkFile(run.path, run.meta)) - 1,
        "test_inputs": len(x),
        "noised": {"rule": result["noised_fraction"]["lucid"],
                   "global": result["noised_fraction"].get("lucid_global", result["noised_fraction"]["lucid"]),
                   "naive_idp": result["noised_fraction"]["naive_idp"]},
        "accuracy_eps0": {"plain": result["accuracy"]["plain"], "rule": exp["lucid"]["0"],
                          "global": exp.get("lucid_global", exp["lucid"])["0"], "naive_idp": exp["naive_idp"]["0"]},
        "released_but_leaking": replay_leaks,
        "single_decide_ms": single_decide_ms(clf, x), "single_query_ms": result["access_ms"]["lucid_single_query"],
        "naive_idp_ms_per_query": result["access_ms"]["naive_idp"],
        "naive_idp_single_ms": naive_single_ms(run, x),
        "memory": served_bytes(clf, run),
        "levels": {c: e.get("level") for c, e in bounds.get("residual", {}).get("classes", {}).items()},
        "leaks_outside": {c: b["lower"] for c, b in bounds["bounds"].items()},  # the levels' own lower bounds
        "choice": bounds.get("residual_choice"),
        "leaves": (bounds.get("regions") or {}).get("leaves", 1),
        "global_bounds": {c: (b["upper"], b["lower"]) for c, b in bounds["bounds"].items()},
        "seconds_to_ratio_1.1": time_to_ratio(path),
        "seconds_to_final_upper": time_to_final(path),
        "seconds_to_target": time_to_target(path, x, _target(result["noised_fraction"]["naive_idp"])),
        "side_channel": side_channel(clf, np.vstack([x, np.random.default_rng(0).uniform(
            clf.domain_lower, clf.domain_upper, size=(5000, len(clf.domain_lower)))]), bounds.get("residual")),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
    }
    return record


def _target(naive: float) -> float:
    return max(2 * naive, naive + 0.02)


def _m(r: dict) -> str:
    """M, or `auto (M)` with the M that --residual auto chose."""
    choice = r.get("choice") or {}
    return f"auto ({choice.get('size')})" if r["M"] == "auto" else str(r["M"])


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _regions(r: dict) -> str:
    return "1" if r.get("regions", 1) <= 1 else f"{r['regions']} ({r.get('leaves', '?')})"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def report() -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    rows.sort(key=lambda r: (WORKLOADS.index(r["workload"]) if r["workload"] in WORKLOADS else 99,
                             r.get("regions", 1), r["M"] if isinstance(r["M"], int) else 10**9))
    pct = lambda v: f"{100 * v:.1f} %"  # noqa: E731
    lines = ["# The residual check (`lucid verify --residual M`)", "",
             "`python benchmarks/residual.py` (open-source backend HiGHS, 2 workers). Noised share and expected "
             "accuracy at ε = 0 on the test split; target: noised ≤ max(2 × Naive-iDP, Naive-iDP + 2 points), "
             "accuracy within 0.3 points of Naive-iDP's. M = 0 is one bound per class (today's LUCID); K > 1: "
             "`--regions K`, residual sets per box (K: the boxes asked for, leaves: those made).", "",
             "| workload | M | K (leaves) | time limit | noised (rule) | noised target | Naive-iDP | accuracy rule / Naive-iDP | "
             "released but leaking | decide, 1 row | memory served / all | u/l ≤ 1.1 after | upper within 10 % of "
             "its final after | noised target reached after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nz, acc, mem = r["noised"], r["accuracy_eps0"], r["memory"]
        ok = nz["rule"] <= _target(nz["naive_idp"]) + 1e-12
        acc_ok = acc["rule"] >= acc["naive_idp"] - 0.003
        ratio = r["seconds_to_ratio_1.1"]
        lines.append(
            f"| {r['workload']} | {_m(r)} | {_regions(r)} | {r['time_limit']:.0f} s | {pct(nz['rule'])} | "
            f"{pct(_target(nz['naive_idp']))} {'met' if ok else 'missed'} | {pct(nz['naive_idp'])} | "
            f"{pct(acc['rule'])} / {pct(acc['naive_idp'])} {'met' if acc_ok else 'missed'} | {r['released_but_leaking']} | "
            f"{r['single_decide_ms']:.3f} ms | {mem['served'] / 1e3:.0f} / {mem['all_networks'] / 1e3:.0f} kB | "
            f"{'not reached' if ratio is None else _seconds(ratio)} | "
            f"{_seconds(r.get('seconds_to_final_upper'))} | "
            f"{'not measured' if 'seconds_to_target' not in r else _seconds(r['seconds_to_target'])} |")
    lines += ["", "Each class's level against the best leak of a network outside its set (the level can be no lower "
              "for that set): level / leak, per class.", "", "| workload | M | K (leaves) | levels / leaks outside |",
              "|---|---|---|---|"]
    for r in rows:
        if r.get("leaks_outside") and r.get("levels"):
            cells = [f"{_fmt(r['levels'].get(c))} / {_fmt(leak)}" for c, leak in sorted(r["leaks_outside"].items())]
            lines.append(f"| {r['workload']} | {_m(r)} | {_regions(r)} | {'; '.join(cells)} |")
    lines += ["", "Single query in process, `decide` on one row (N, the level and every network of the union of the sets) "
              "against Naive-iDP on one row (all |D| + 1 networks, one stacked float64 pass; the paper reports 25 s "
              "per query for its Naive-iDP):", "",
              "| workload | M | K (leaves) | networks | residual networks served | residual rule | Naive-iDP | "
              "full query with the memo |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['M']} | {_regions(r)} | {r['networks']} | "
                     f"{r['memory'].get('residual_networks', 0)} | {r['single_decide_ms']:.3f} ms | "
                     f"{r.get('naive_idp_single_ms', float('nan')):.2f} ms | {r['single_query_ms']:.3f} ms |")
    lines += ["", "Side channel: single-row `decide` on test inputs and 5 000 uniform samples of the domain, 300 "
              "interleaved timings per group (released by the level: every member's bound below the confidence; "
              "released by the check: some member's bound at or above it; noised by the level; noised by the check; "
              "N's first two classes; a group of fewer than 5 rows is left out of the comparison; rows measured before the "
              "released rows were split show one `released` group), "
              "compared pairwise with Mann-Whitney U:", "",
              "| workload | M | K (leaves) | rows, median µs per group | smallest p |", "|---|---|---|---|---|"]
    for r in rows:
        sc = r.get("side_channel") or {}
        if "p_values" in sc:
            cells = [f"{name.replace('_', ' ')} {n}" + (f", {sc['median_us'][name]:.1f}" if name in sc["median_us"] else "")
                     for name, n in sc["sizes"].items()]
            lines.append(f"| {r['workload']} | {r['M']} | {_regions(r)} | {' / '.join(cells)} | "
                         f"{min(sc['p_values'].values()):.3f} |")
    if rows:
        lines += ["", f"Machine: {rows[-1]['machine']}; last row {rows[-1]['date']}."]
    REPORT.write_text("\n".join(lines) + "\n")
    print(REPORT.read_text())


def growth_report() -> None:
    """benchmarks/results/residual_growth.md: the growth workloads along |D|, and a power-law fit of
    each cost against the training rows, extrapolated to the paper's 36 000 rows."""
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("adult-growth-*-Mauto.json"))]
    if not rows:
        return
    rows.sort(key=lambda r: r["networks"])
    pct = lambda v: f"{100 * v:.1f} %"  # noqa: E731
    lines = ["# The growth curve: Adult 2x50 along |D| with `--residual auto`", "",
             "`python benchmarks/residual.py --workloads " + ",".join(GROWTH) + " --ms auto --time-limit T` (HiGHS, "
             "2 workers): nested training sets of the shared Adult file (`numpy.random.default_rng(7).permutation`, "
             f"the first {GROWTH_TEST_ROWS} rows the fixed test split, the next |D| rows the training set), "
             "`lucid train --arch 2x50 --epochs 50 --batch-size 100 --lr 0.1 --seed 0 --test-data`, then "
             "`lucid verify --residual auto` (cap 256, chosen on the test split) and `lucid evaluate`.", "",
             "| |D| | train | verify (limit) | level within 10 % of its final after | M chosen | noised: rule / Naive-iDP / "
             "target | networks served | memory served / all | decide, 1 row | Naive-iDP, 1 row | levels / leaks outside |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nz, mem, choice = r["noised"], r["memory"], r.get("choice") or {}
        target = _target(nz["naive_idp"])
        served = mem.get("residual_networks", 0)
        levels = "; ".join(f"{_fmt(r['levels'].get(c))} / {_fmt(leak)}" for c, leak in sorted(r["leaks_outside"].items()))
        lines.append(
            f"| {r['networks']} | {_seconds(r.get('train_s'))} | "
            f"{r['verify_wall_s']:.0f} s ({r['time_limit']:.0f} s) | {_seconds(r.get('seconds_to_final_upper'))} | "
            f"{choice.get('size', '-')} | {pct(nz['rule'])} / {pct(nz['naive_idp'])} / {pct(target)} "
            f"{'met' if nz['rule'] <= target + 1e-12 else 'missed'} | {served} ({pct(served / r['networks'])}) | "
            f"{mem['served'] / 1e6:.2f} / {mem['all_networks'] / 1e6:.1f} MB | {r['single_decide_ms']:.3f} ms | "
            f"{r['naive_idp_single_ms']:.2f} ms | {levels} |")
    if len(rows) >= 2:
        lines += ["", "Power-law fits y = a·|D|^b over the rows above, extrapolated to the paper's 36 000 rows "
                  "(a cost that reached its cap or a time limit extrapolates that limit, not the method):", "",
                  "| quantity | b | at 36 000 rows |", "|---|---|---|"]
        serving = [r for r in rows if r["memory"].get("residual_networks", 0)]  # (M = 0 serves nothing: left out)
        series = {
            "networks served": (serving, lambda r: r["memory"]["residual_networks"]),
            "share served": (serving, lambda r: r["memory"]["residual_networks"] / r["networks"]),
            "decide, 1 row (ms)": (serving, lambda r: r["single_decide_ms"]),
            "Naive-iDP noised share": (rows, lambda r: max(1e-4, r["noised"]["naive_idp"])),
            "rule noised share": (rows, lambda r: max(1e-4, r["noised"]["rule"])),
            "Naive-iDP, 1 row (ms)": (rows, lambda r: r["naive_idp_single_ms"]),
        }
        for name, (some, value) in series.items():
            if len(some) < 2:
                lines.append(f"| {name} | - | fewer than two rows |")
                continue
            xs = np.log([r["networks"] for r in some])
            b, log_a = np.polyfit(xs, np.log([float(value(r)) for r in some]), 1)
            at = float(np.exp(log_a) * 36000**b)
            shown = (pct(min(at, 1.0)) + (" (the fit passes 100 %)" if at > 1 else "")) if "share" in name else f"{at:.3g}"
            lines.append(f"| {name} (over {len(some)} rows) | {b:.2f} | {shown} |")
    lines += ["", f"Machine: {rows[-1]['machine']}; last row {rows[-1]['date']}."]
    notes = ""  # the hand-written reading of the figures below the marker is kept
    if GROWTH_REPORT.exists() and NOTES_MARKER in GROWTH_REPORT.read_text():
        notes = GROWTH_REPORT.read_text().split(NOTES_MARKER, 1)[1]
    GROWTH_REPORT.write_text("\n".join(lines) + "\n\n" + NOTES_MARKER + notes)
    print(GROWTH_REPORT.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--ms", default="0,8,32,128,512")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--regions", type=int, default=1, help="K > 1: verify with --regions K (per-box residual sets)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--refresh", action="store_true", help="measure the verified runs again, verify nothing")
    args = parser.parse_args()
    if not args.report_only:
        for name in args.workloads.split(","):
            shared = name in ADULT_SUBSETS or name in GROWTH or (name in region_bench.WORKLOADS
                                               and region_bench.WORKLOADS[name][0] in ("crypto", "adult"))
            if shared and not region_bench.DATA.exists():
                print(f"{name}: {region_bench.DATA} is absent, skipped", file=sys.stderr)
                continue
            for m in (v if v == "auto" else int(v) for v in args.ms.split(",")):
                run_one(name, m, args)
    report()
    growth_report()


if __name__ == "__main__":
    main()
