"""The cost of distribution: `lucid train` locally vs on a 2-process Dask LocalCluster, same 2 cores.

  python benchmarks/dask_training.py [--rows 2000] [--repeats 2]

Adult 2x50 at the scaling benchmark's settings (50 epochs, lr 0.1, batch 1024) on the first `--rows`
rows of its nested training subset. Local and cluster runs alternate (local, cluster, local, ...)
so slow phases of a shared machine hit both; every cluster run must be bit-identical to the local
one (the networks file's tensors are compared). The LocalCluster's start-up is part of its time,
as a user of `--scheduler local:2` pays it. Results: benchmarks/results/dask_training.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
REPORT = REPO / "benchmarks" / "results" / "dask_training.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    import scaling
    from safetensors.numpy import load_file

    from lucid.training import train_run

    train, test = scaling.split(args.rows)
    work = Path(tempfile.mkdtemp(prefix="lucid-dask-training-"))
    times: dict[str, list[float]] = {"local": [], "local:2": []}
    reference = None
    try:
        for r in range(args.repeats):
            for mode in ("local", "local:2"):
                out = work / f"{mode.replace(':', '')}-{r}"
                t0 = time.perf_counter()
                train_run(str(train), out, arch="2x50", epochs=50, lr=0.1, batch_size=1024, seed=scaling.SEED,
                          test_data=str(test), progress=False, scheduler=None if mode == "local" else mode)
                times[mode].append(time.perf_counter() - t0)
                tensors = load_file(str(out / "networks.safetensors"))
                if reference is None:
                    reference = tensors
                elif any(not np.array_equal(reference[k], tensors[k]) for k in reference):
                    raise SystemExit(f"{mode} run {r} differs from the first local run")
                shutil.rmtree(out)
                print(f"{mode} run {r}: {times[mode][-1]:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    local, cluster = min(times["local"]), min(times["local:2"])
    lines = [
        "# Training on a 2-process Dask LocalCluster vs locally (same 2 cores)", "",
        f"`python benchmarks/dask_training.py --rows {args.rows} --repeats {args.repeats}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): Adult 2x50, {args.rows} rows, "
        f"{args.rows + 1} networks, 50 epochs, batch 1024. Every cluster run was bit-identical to the local one.", "",
        "| mode | runs (s) | best (s) |", "|---|---|---|",
        f"| local (threads) | {', '.join(f'{t:.1f}' for t in times['local'])} | {local:.1f} |",
        f"| `--scheduler local:2` (2 worker processes, start-up included) | "
        f"{', '.join(f'{t:.1f}' for t in times['local:2'])} | {cluster:.1f} |", "",
        f"Overhead of distribution (best vs best): **{100 * (cluster / local - 1):+.1f} %** (target: within 15 %).", "",
    ]
    REPORT.write_text("\n".join(lines))
    print(REPORT.read_text())


if __name__ == "__main__":
    main()
