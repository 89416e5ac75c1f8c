"""Screen benchmark (issue 19): how many leave-one-out networks each screen discards, and how fast.

For every workload and class: the share of the networks N_-i whose sound upper bound on
beta*_{c,{i}} is <= the class's lower bound LB (such a network can never raise the class's bound,
so the BaB drops it), for
  (a) interval:  today's `lucid.verifier.screen_upper_bounds` (interval difference propagation),
  (b) symbolic:  `lucid.bounds.symbolic.symbolic_screen`, lambda = 1, CROWN slopes,
  (c) optimised: the same with projected Adam steps on lambda and the alpha slopes,
  (d) LP:        the LP relaxation of each singleton's own MILP (encoder with relax_all=True,
                 HiGHS, plus the verifier's safety margin) on a random sample: the ceiling,
and the seconds each screen takes for all networks (d: per network).

  python benchmarks/screen.py --prepare                    # train the workloads into runs/
  python benchmarks/screen.py --workloads crypto-2x50,adult-2x50 --lp-sample 40

LB per class: the final lower bound recorded by a finished verification of the same training
(benchmarks/results/paper_tables.md / idle_machine.md), and, independently, the confidence of N at a
replayed leak found by `lucid.replay.search_node_witness` on these networks (a true lower bound of
max_i beta*_{c,{i}}, whatever the training). The table uses the larger of the two where the
witness confirms the networks are the recorded ones, else the replayed one (see --lb).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RUNS = ROOT / "runs"

# Final lower bounds of finished verifications (same training settings, seed 0):
# crypto-2x50: idle_machine.md "Branch-and-bound (issue 6)" (lower 0.944143 / 0.279948);
# adult-2x50: idle_machine.md sessions 9/10 (best replayed leaks 0.01875 / 0.02945).
RECORDED_LB = {"crypto-2x50": {0: 0.944143, 1: 0.279948}, "adult-2x50": {0: 0.01875, 1: 0.02945}}

WORKLOADS = {
    "crypto-2x50": dict(arch="2x50", batch_size=100),
    "adult-2x50": dict(arch="2x50", batch_size=1024),
    "digits-2x20": dict(arch="2x20", batch_size=100),
}


def _splits(name: str) -> tuple[Path, Path]:
    out = RUNS / "data"
    out.mkdir(parents=True, exist_ok=True)
    if name.startswith("crypto"):
        return DATA / "crypto" / "train.npz", DATA / "crypto" / "test.npz"
    from sklearn.model_selection import train_test_split

    if name.startswith("adult"):  # as benchmarks/paper_tables.py: 4000 / 4000 rows, stratified, seed 0
        with np.load(DATA / "adult" / "adult.npz", allow_pickle=False) as f:
            X, y = f["X"], f["y"]
        xa, xb, ya, yb = train_test_split(X, y, train_size=4000, test_size=4000, stratify=y, random_state=0)
    elif name.startswith("digits"):
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        xa, xb, ya, yb = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    else:
        raise ValueError(name)
    paths = []
    for part, xs, ys in (("train", xa, ya), ("test", xb, yb)):
        p = out / f"{name.split('-')[0]}-{part}.npz"
        if not p.exists():
            np.savez(p, X=np.clip(np.asarray(xs, dtype=np.float32), 0, 1), y=np.asarray(ys, dtype=np.int64))
        paths.append(p)
    return paths[0], paths[1]


def prepare(names: list[str]) -> None:
    from lucid.training import train_run

    for name in names:
        train, test = _splits(name)
        cfg = WORKLOADS[name]
        train_run(str(train), RUNS / name, arch=cfg["arch"], batch_size=cfg["batch_size"], test_data=str(test),
                  progress=False)
        print(f"trained {name}", flush=True)
