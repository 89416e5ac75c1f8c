"""Leave-one-out networks trained elsewhere: what masking the left-out row in its batch changes.

A plain PyTorch script, as a user would write it (Adam, minibatches, one seed), trains N and every
leave-one-out network on breast cancer (2x10) in two ways that differ only in how row i is left out:

- mask:  every network sees the same batch order (one permutation of all n rows per epoch, drawn
         from one seed); row i is masked out of its own batch (docs/interop.md: "Training leave-one-out
         networks yourself");
- drop:  row i is removed from the data set before batching, so every later row shifts into
         another batch and every later step differs;
- vmap:  the mask variant with every network trained at once (`torch.func.vmap` over the stacked
         parameters of `stack_module_state`, row i masked out of network i's mean loss), handed to
         `lucid import` as one stacked file (docs/interop.md, "One stacked file").

Each variant is written as state dicts (one file per network, or the one stacked file), imported
(`lucid import`), verified (`lucid verify --time-limit`) and evaluated (`lucid evaluate --epsilon
0`): the noised share of the test split is what the bounds cost. `train_s` and `import_s` are the
seconds to train every network (and write the files) and to import them.

    python benchmarks/loo_training_elsewhere.py --time-limit 180
    python benchmarks/loo_training_elsewhere.py --variants vmap     # the fast route alone
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def data(seed: int = 0):
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    return train_test_split(X.astype(np.float32), y, test_size=0.2, random_state=seed, stratify=y)


def train(X: np.ndarray, y: np.ndarray, left_out: int | None, variant: str, *, epochs: int, batch: int,
          seed: int) -> torch.nn.Sequential:
    """One network, trained by the user's loop; `left_out`: the row it must not see."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 10), torch.nn.ReLU(), torch.nn.Linear(10, 10),
                                torch.nn.ReLU(), torch.nn.Linear(10, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    rows = np.arange(len(y))
    if variant == "drop" and left_out is not None:
        rows = rows[rows != left_out]
    order_gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = rows[torch.randperm(len(rows), generator=order_gen).numpy()]
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            if variant == "mask" and left_out is not None:
                idx = idx[idx != left_out]
            if len(idx) == 0:
                continue
            loss = torch.nn.functional.cross_entropy(model(Xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def train_all(X: np.ndarray, y: np.ndarray, *, epochs: int, batch: int, seed: int) -> tuple[dict, torch.Tensor]:
    """N and every leave-one-out network of the mask variant at once: the same start, batch order
    and Adam as `train`, each network's loss its mean over the rows of the batch it keeps."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(seed)
    template = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 10), torch.nn.ReLU(), torch.nn.Linear(10, 10),
                                   torch.nn.ReLU(), torch.nn.Linear(10, 2))
    n = len(y)
    params, _ = stack_module_state([template] * (n + 1))
    removed = torch.tensor([-1, *range(n)])
    keep = torch.ones(n + 1, n)
    keep[torch.arange(1, n + 1), torch.arange(n)] = 0.0  # network i + 1 never sees row i
    opt = torch.optim.Adam(list(params.values()), lr=1e-2)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    order_gen = torch.Generator().manual_seed(seed)

    def loss(p, mask, xb, yb):
        per_row = torch.nn.functional.cross_entropy(functional_call(template, p, (xb,)), yb, reduction="none")
        return (per_row * mask).sum() / mask.sum()

    for _ in range(epochs):
        order = torch.randperm(n, generator=order_gen)
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            opt.zero_grad()
            vmap(loss, in_dims=(0, 0, None, None))(params, keep[:, idx], Xt[idx], yt[idx]).sum().backward()
            opt.step()
    return {k: v.detach().contiguous() for k, v in params.items()}, removed


def write_variant(out: Path, variant: str, X: np.ndarray, y: np.ndarray, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    if variant == "vmap":
        params, removed = train_all(X, y, epochs=args.epochs, batch=args.batch, seed=args.seed)
        save_file({**params, "removed": removed}, str(out / "all.safetensors"))
        entries.append({"file": "all.safetensors", "stacked": True})
    for left_out in [] if variant == "vmap" else [None, *range(len(y))]:
        model = train(X, y, left_out, variant, epochs=args.epochs, batch=args.batch, seed=args.seed)
        name = "N.safetensors" if left_out is None else f"n{left_out}.safetensors"
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out / name))
        entries.append({"file": name, "removed": left_out})
    manifest = {"training": {"name": f"adam-{variant}", "version": "1",
                             "description": f"Adam lr 0.01, {args.epochs} epochs, batch {args.batch}, seed {args.seed}, "
                                            f"left-out row {'dropped' if variant == 'drop' else 'masked in its batch'}"
                                            + (", every network at once with torch.func.vmap" if variant == "vmap" else "")},
                "networks": entries, "domain": {"lower": [0.0] * X.shape[1], "upper": [1.0] * X.shape[1]}}
    (out / "manifest.json").write_text(json.dumps(manifest))


def lucid(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucid", *map(str, argv)], capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=180.0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(ROOT / "runs" / "loo_elsewhere"))
    parser.add_argument("--variants", default="mask,drop,vmap", help="comma-separated: mask, drop, vmap")
    args = parser.parse_args()
    torch.set_num_threads(1)
    X_tr, X_te, y_tr, y_te = data(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "data.npz", X_train=X_tr, y_train=y_tr, X_test=X_te, y_test=y_te)
    rows = []
    for variant in args.variants.split(","):
        files, run = work / f"files-{variant}", work / f"run-{variant}"
        t0 = time.perf_counter()
        write_variant(files, variant, X_tr, y_tr, args)
        train_s = time.perf_counter() - t0
        if run.exists():
            import shutil

            shutil.rmtree(run)
        t0 = time.perf_counter()
        r = lucid("import", "--manifest", files / "manifest.json", "--data", work / "data.npz", "--out", run)
        assert r.returncode == 0, r.stderr
        import_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = lucid("verify", run, "--time-limit", args.time_limit, "--quiet")
        assert r.returncode == 0, r.stderr
        verify_s = time.perf_counter() - t0
        r = lucid("evaluate", run, "--epsilon", "0", "--seed", "0", "--json", run / "evaluation.json")
        assert r.returncode == 0, r.stderr
        ev = json.loads((run / "evaluation.json").read_text())
        bounds = json.loads((run / "bounds.json").read_text())["bounds"]
        rows.append({"variant": variant, "train_s": train_s, "import_s": import_s, "verify_s": verify_s,
                     "bounds": {c: (b["upper"], b["lower"], b["complete"]) for c, b in bounds.items()},
                     "evaluation": ev})
        print(json.dumps(rows[-1])[:400], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.variants == "mask,drop,vmap" else "-" + args.variants.replace(",", "-")
    name = f"loo_training_elsewhere{suffix}.json"
    (RESULTS / name).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
