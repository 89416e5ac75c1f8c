"""Seconds per leave-one-out network: `lucid train` vs a reference-style one-network loop.

Setting (the paper's Crypto run): ../shared/data/crypto/train.npz (2800 rows, 7 features),
arch 2x50, batch 100, lr 0.1, weight decay 1e-5, 50 epochs -> 2801 networks.

The reference loop trains one network at a time the way one usually would: a shuffled
DataLoader, the left-out row masked out of its batch, torch.optim.SGD. It is timed on a few
networks with one torch thread and extrapolated. "Same cores" is granted generously: the
reference's per-network time is its one-thread time divided by the number of cores (as if one
such loop ran per core with perfect scaling). `--reference-all-threads` also times it with torch
using all cores in one loop (on small networks that is usually slower, and very slow on a busy
machine). `lucid train` trains all 2801 networks.

Other processes on the machine skew wall-clock figures, so CPU seconds are printed as well
(CPU-s / cores estimates the wall time on an idle machine), with the load average.

    python benchmarks/train_throughput.py [--reference-networks 2] [--out /tmp/crypto-run]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lucid.training import train_run  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "crypto" / "train.npz"
EPOCHS, LR, WD, BATCH, SEED = 50, 0.1, 1e-5, 100, 0


def reference_network(X: torch.Tensor, y: torch.Tensor, removed: int) -> nn.Module:
    torch.manual_seed(SEED)
    net = nn.Sequential(nn.Linear(X.shape[1], 50), nn.ReLU(), nn.Linear(50, 50), nn.ReLU(), nn.Linear(50, 2))
    opt = torch.optim.SGD(net.parameters(), lr=LR, weight_decay=WD)
    loader = DataLoader(TensorDataset(X, y, torch.arange(len(X))), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(SEED))
    for _ in range(EPOCHS):
        for xb, yb, idx in loader:
            keep = idx != removed
            opt.zero_grad()
            nn.functional.cross_entropy(net(xb[keep]), yb[keep]).backward()
            opt.step()
    return net


def time_reference(X: torch.Tensor, y: torch.Tensor, networks: int, threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per network."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(networks):
            reference_network(X, y, removed=i)
        return (time.perf_counter() - start) / networks, (time.process_time() - cpu) / networks
    finally:
        torch.set_num_threads(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--reference-networks", type=int, default=2)
    parser.add_argument("--reference-all-threads", action="store_true")
    parser.add_argument("--out", default=None, help="keep the run here (default: a temporary directory)")
    parser.add_argument("--chunk-size", type=int, default=None)
    args = parser.parse_args()
    if not Path(args.data).exists():
        sys.exit(f"{args.data} not found (the shared data lives in ../shared/data)")
    cores = len(os.sched_getaffinity(0))
    with np.load(args.data, allow_pickle=False) as npz:
        X = torch.from_numpy(np.clip(npz["X"], 0, 1).astype(np.float32))
        y = torch.from_numpy(npz["y"].astype(np.int64))
    n = len(X)
    print(f"data {args.data}: {n} rows x {X.shape[1]} features -> {n + 1} networks; {cores} cores; "
          f"load average {os.getloadavg()[0]:.2f}")

    threads = sorted({1, cores}) if args.reference_all_threads else [1]
    ref = {t: time_reference(X, y, args.reference_networks, t) for t in threads}
    for t, (wall, cpu) in ref.items():
        print(f"reference loop, {t} thread(s): {wall:.3f} s/network wall, {cpu:.3f} CPU-s/network "
              f"(timed on {args.reference_networks} networks)", flush=True)
    ref_cpu = ref[1][1]
    # one single-thread loop per core, perfect scaling
    ref_best = min([ref[1][0] / cores] + [wall for t, (wall, _) in ref.items() if t > 1])
    print(f"reference, per network on {cores} cores: {ref_best:.3f} s wall", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-"))
    out = Path(args.out) if args.out else tmp / "run"
    if out.exists():
        shutil.rmtree(out)
    try:
        load_before = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        train_run(args.data, out, arch="2x50", epochs=EPOCHS, lr=LR, weight_decay=WD, batch_size=BATCH,
                  seed=SEED, test_fraction=0.0, chunk_size=args.chunk_size, progress=True)
        total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
        load_after = os.getloadavg()[0]
    finally:
        if not args.out:
            shutil.rmtree(tmp, ignore_errors=True)
    per = total / (n + 1)
    print(f"lucid train: {total:.1f} s for {n + 1} networks = {per * 1000:.1f} ms/network "
          f"(load average {load_before:.2f} -> {load_after:.2f})")
    print(f"           {total_cpu:.1f} CPU-s = {total_cpu / (n + 1) * 1000:.1f} CPU-ms/network; on {cores} idle cores "
          f"that is ~{total_cpu / cores:.0f} s for all networks")
    print(f"speed-up per network vs the faster reference: {ref_best / per:.1f}x wall "
          f"(reference extrapolated to all networks: {ref_best * (n + 1) / 60:.1f} min); "
          f"{ref_cpu / (total_cpu / (n + 1)):.1f}x in CPU time")


if __name__ == "__main__":
    main()
