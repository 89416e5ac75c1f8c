"""Peak memory of LUCID's commands on a paper-size run: 36 001 networks of 2x100 on Adult's 21 features.

  python benchmarks/memory.py [--networks 36000] [--arch 100,100] [--verify-seconds 300]

Training 36 001 real networks takes hours on 2 cores, and memory depends only on the shapes, so the
run is synthetic: N is a 2x100 MLP trained on Adult (../shared/data/adult, 40 epochs of full-batch
Adam, float32), each "leave-one-out" network is N plus Gaussian noise of 1e-3 x each tensor's
standard deviation, and data.npz holds 36 000 Adult rows (drawn with replacement) and 4 000 test
rows. Each command runs in its own process tree; a sampler sums RSS and PSS (proportional set size:
a page shared by k processes counts 1/k in each, so the sum is the memory the tree really holds)
and anonymous memory (RSS less file-backed and shared pages: what cannot be dropped; the
memory-mapped networks are page cache) over the tree every 0.2 s:

- verify: `lucid verify RUN --classes 0 --workers 2 --time-limit T --quiet` (screen, witness
  search, branch-and-bound with two worker processes, stopped by the time limit);
- evaluate: `lucid evaluate RUN --epsilon 0` (every network on 4 000 test rows, Naive-iDP);
- serve: the access layer (N only) answering 10 000 queries in process.

Results: benchmarks/results/memory.json (merged per --label) and benchmarks/results/memory.md.
`--python-path DIR` runs the commands from another source tree (e.g. a checkout of an older commit)
to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "adult" / "adult.npz"
RUNS = REPO / "benchmarks" / "runs" / "memory"
RESULTS = REPO / "benchmarks" / "results" / "memory.json"
REPORT = REPO / "benchmarks" / "results" / "memory.md"
SERVE = """
import sys, numpy as np
from lucid.access.classifier import ClassifierOptions, LabelOnlyClassifier
clf = LabelOnlyClassifier.from_run(sys.argv[1], epsilon=1.0, options=ClassifierOptions(seed=0))
x = np.load(sys.argv[1] + "/data.npz")["X_test"]
for i in range(10):
    clf.predict_network_space(np.clip(x[i * 400:(i + 1) * 400], 0, 1))
"""


def build_run(path: Path, networks: int, hidden: list[int], seed: int = 0) -> None:
    """Write the synthetic run directory (see the module docstring), atomically."""
    import torch
    from safetensors.numpy import save_file

    from lucid.atomic import write_json_atomic

    if (path / "run.json").exists():
        return
    with np.load(DATA, allow_pickle=False) as f:
        X, y = np.clip(f["X"].astype(np.float32), 0.0, 1.0), f["y"].astype(np.int64)
    rng = np.random.default_rng(seed)
    test = rng.permutation(len(y))[:4000]
    train = rng.integers(0, len(y), size=networks)
    torch.manual_seed(seed)
    sizes = [X.shape[1]] + hidden + [2]
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(X[train]), torch.from_numpy(y[train])
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    staging = path.with_name(path.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tensors = {"removed": np.concatenate([[-1], np.arange(networks)]).astype(np.int64)}
    for i, layer in enumerate(layers):
        for name in ("weight", "bias"):
            base = getattr(layer, name).detach().numpy().astype(np.float32)
            noise = rng.standard_normal((networks,) + base.shape, dtype=np.float32) * np.float32(1e-3 * base.std())
            tensors[f"layers.{i}.{name}"] = np.concatenate([base[None], base[None] + noise])
    save_file(tensors, str(staging / "networks.safetensors"))
    np.savez(staging / "data.npz", X_train=X[train], y_train=y[train], X_test=X[test], y_test=y[test])
    d = X.shape[1]
    write_json_atomic(staging / "run.json", {
        "format": "lucid-run/1", "num_classes": 2, "input_dim": d, "train_size": networks, "labels": [0, 1],
        "domain": {"lower": [0.0] * d, "upper": [1.0] * d},
        "scaler": {"type": "affine", "offset": [0.0] * d, "scale": [1.0] * d},
        "architecture": {"type": "mlp", "hidden": hidden},
        "training": {"algorithm": "synthetic (benchmarks/memory.py): N plus Gaussian noise"},
    })
    os.rename(staging, path)


def measure(cmd: list[str], env: dict, cwd: Path) -> dict:
    """Run cmd; sample the summed RSS and PSS of its process tree; return peaks (MiB) and seconds."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = peak_anon = 0.0
    while True:
        # wait4 instead of poll: the exit also yields the kernel's peak RSS of the process, which
        # covers a command shorter than the sampling interval (serve is seen at most at its start)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            peak_rss = max(peak_rss, usage.ru_maxrss / 1024)
            break
        rss = pss = anon = 0
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                info = p.memory_full_info()
                # rss - shared = anonymous memory: what the process really holds; file-backed pages
                # (the memory-mapped networks) are page cache, shared and dropped under pressure
                rss, pss, anon = rss + info.rss, pss + info.pss, anon + info.rss - info.shared
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        peak_rss, peak_pss = max(peak_rss, rss / 2**20), max(peak_pss, pss / 2**20)
        peak_anon = max(peak_anon, anon / 2**20)
        time.sleep(0.2)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-500:]}")
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_tree_rss_mib": round(peak_rss),
            "peak_tree_pss_mib": round(peak_pss), "peak_tree_anon_mib": round(peak_anon)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=36000)
    p.add_argument("--arch", default="100,100", help="hidden widths")
    p.add_argument("--verify-seconds", type=float, default=300.0)
    p.add_argument("--label", default="current")
    p.add_argument("--python-path", default=None, help="run the commands from this source tree")
    p.add_argument("--steps", default="verify,evaluate,serve")
    args = p.parse_args()
    if not DATA.exists():
        raise SystemExit(f"{DATA} is missing")
    hidden = [int(h) for h in args.arch.split(",")]
    run = RUNS / f"adult-{'x'.join(map(str, hidden))}-k{args.networks}"
    build_run(run, args.networks, hidden)
    env = dict(os.environ)
    if args.python_path:
        env["PYTHONPATH"] = args.python_path
    shutil.rmtree(run / "cache", ignore_errors=True)  # the first verify pays for the float64 map
    for f in ("verify.checkpoint.json", "verify.log.jsonl"):
        (run / f).unlink(missing_ok=True)
    commands = {
        "verify": [sys.executable, "-m", "lucid", "verify", str(run), "--classes", "0", "--workers", "2",
                   "--time-limit", str(args.verify_seconds), "--quiet"],
        "evaluate": [sys.executable, "-m", "lucid", "evaluate", str(run), "--epsilon", "0", "--seed", "0"],
        "serve": [sys.executable, "-c", SERVE, str(run)],
    }
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    entry = {"networks": args.networks + 1, "arch": hidden,
             "file_mib": round((run / "networks.safetensors").stat().st_size / 2**20),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": {}}
    for name in args.steps.split(","):
        print(f"{args.label}: {name} ...", flush=True)
        entry["steps"][name] = measure(commands[name], env, Path(args.python_path or REPO))
        print(f"  {entry['steps'][name]}", flush=True)
    results[args.label] = entry
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    lines = ["# Peak memory on a paper-size run", "",
             "`python benchmarks/memory.py` (synthetic run: see the script's docstring). MiB summed over the "
             "command's process tree; PSS counts a page shared by k processes 1/k in each.", "",
             "| code | networks | file MiB | step | seconds | peak tree RSS MiB | peak tree PSS MiB | "
             "peak tree anonymous MiB |", "|---|---|---|---|---|---|---|---|"]
    for label, e in results.items():
        for name, m in e["steps"].items():
            lines.append(f"| {label} ({e['date']}) | {e['networks']} | {e['file_mib']} | {name} | {m['seconds']} | "
                         f"{m['peak_tree_rss_mib']} | {m['peak_tree_pss_mib']} | {m.get('peak_tree_anon_mib', '-')} |")
    REPORT.write_text("\n".join(lines) + "\n")
    print(REPORT.read_text())


if __name__ == "__main__":
    main()
