"""Where is Abstract Gradient Training viable? Box width against epochs on Crypto and Adult (2x50).

For each setting it runs AGT (k = 1) on LUCID's algorithm T and records, after each recorded
epoch, per layer (weights and bias together) the median and max *relative width*
(theta_U - theta_L) / mean|theta_N| of the layer (N = the float32 network trained on all rows).
A setting that overflows, turns NaN or passes a width of 1e6 is reported as diverged, with the
epoch and step. For settings that stay finite it also reports:

- N's test accuracy (a tight box around an untrained model is worth nothing),
- containment: N and `--loo-sample` leave-one-out networks N_-i (rows drawn at random, trained
  by the trainer's kernels) all inside the k = 1 box (must be "yes"),
- the real spread of those N_-i around N (max |theta_-i - theta_N| / mean|theta_N|, a lower
  bound on what any sound box must cover) against the box,
- "IBP-fixed": the share of test inputs whose predicted class is the same for every network in
  the box by plain interval propagation (a quick lower bound on what LUCID's MILP could certify).

Settings: the paper's (lr 0.1, 50 epochs, batch 100 / 1024), a smaller learning rate, larger
batches (up to full batch), and fine-tuning only the last layer of a model pre-trained on
public data (Crypto: the paper's test split as the public set, evaluation on a held-out half of
it; Adult: 40 % of the training split, disjoint from the 60 % that is fine-tuned on).

    python benchmarks/agt.py [--data crypto,adult] [--only NAME] [--loo-sample 8] [--json OUT]

Results: benchmarks/results/agt.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lucid.agt import AgtDiverged, abstract_train  # noqa: E402
from lucid.agt.stability import certified_classes  # noqa: E402
from lucid.data import prepare_dataset  # noqa: E402
from lucid.sgd import SgdStep, TrainingInputs  # noqa: E402
from lucid.training.architecture import initial_parameters, parse_arch  # noqa: E402
from lucid.training.vectorized import batch_orders, train_networks  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
RECORD = {1, 2, 3, 5, 10, 20, 30, 50}
DIVERGED = 1e6


def load(name: str):
    """(X_train, y_train, X_test, y_test, public (X, y) or None) as float32/int64 tensors."""
    if name == "crypto":
        ds = prepare_dataset(str(DATA / "crypto" / "train.npz"), test_data=str(DATA / "crypto" / "test.npz"),
                             seed=0, label=None, test_fraction=0.2, domain=None)
    else:
        ds = prepare_dataset(str(DATA / "adult" / "adult.npz"), test_data=None, seed=0, label=None,
                             test_fraction=0.2, domain=None)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return t(ds.X_train), t(ds.y_train), t(ds.X_test), t(ds.y_test)


SETTINGS = {  # name: (lr, batch or "full", epochs, fine-tune last layer only)
    "paper": (0.1, None, 50, False),
    "lr 0.01": (0.01, None, 50, False),
    "lr 0.001": (0.001, None, 50, False),
    "batch 1000, 10 ep": (0.1, 1000, 10, False),
    "batch 4096, 10 ep": (0.1, 4096, 10, False),
    "full batch": (0.1, "full", 50, False),
    "full batch, lr 0.5": (0.5, "full", 50, False),
    "fine-tune last layer": (0.1, None, 50, True),
}
PAPER_BATCH = {"crypto": 100, "adult": 1024}


def layer_stats(box, ref: dict[str, torch.Tensor], n_layers: int) -> list[tuple[float, float]]:
    out = []
    for i in range(n_layers):
        names = [f"layers.{i}.weight", f"layers.{i}.bias"]
        width = torch.cat([(box.upper[n] - box.lower[n]).flatten() for n in names])
        scale = float(torch.cat([ref[n].double().abs().flatten() for n in names]).mean())
        rel = width / scale
        out.append((float(rel.median()), float(rel.max())))
    return out


def ibp_fixed(box, X: torch.Tensor) -> float:
    """Share of inputs whose class every network in the box agrees on (interval propagation)."""
    return float((certified_classes(box, X.numpy()) >= 0).mean())


def run_setting(data: str, name: str, loo_sample: int, log, k: int = 1, epochs_override: int | None = None,
                update: str = "zonotope") -> dict:
    lr, batch, epochs, finetune = SETTINGS[name]
    epochs = epochs_override or epochs
    X, y, Xt, yt = load(data)
    spec = parse_arch("2x50")
    n_layers = 3
    init = initial_parameters(spec, X.shape[1], 2, seed=0)
    trainable = None
    if finetune:  # pre-train T (paper settings) on public data, then fine-tune the last layer
        if data == "crypto":
            half = len(yt) // 2
            Xp, yp, Xt, yt = Xt[:half], yt[:half], Xt[half:], yt[half:]
        else:
            cut = int(0.4 * len(y))
            Xp, yp, X, y = X[:cut], y[:cut], X[cut:], y[cut:]
        pre = train_networks(TrainingInputs(init, spec, Xp, yp, batch_orders(len(yp), 50, seed=1)),
                             SgdStep(lr=0.1, weight_decay=1e-5, batch_size=PAPER_BATCH[data], num_classes=2),
                             torch.tensor([-1]))
        init = {k: v[0] for k, v in pre.items()}
        trainable = {n_layers - 1}
    n = len(y)
    bs = n if batch == "full" else (batch or PAPER_BATCH[data])
    orders = batch_orders(n, epochs, seed=0)
    inputs = TrainingInputs(init, spec, X, y, orders)
    sgd = SgdStep(lr=lr, weight_decay=1e-5, batch_size=bs, num_classes=2, trainable=trainable)
    rng = np.random.default_rng(0)
    sample = sorted(rng.choice(n, size=min(loo_sample, n), replace=False).tolist())
    t0 = time.time()
    nets = train_networks(inputs, sgd, torch.tensor([-1] + sample))
    n_ref = {k: v[0] for k, v in nets.items()}
    scores = Xt @ n_ref["layers.0.weight"].T + n_ref["layers.0.bias"]
    for i in range(1, n_layers):
        scores = torch.relu(scores) @ n_ref[f"layers.{i}.weight"].T + n_ref[f"layers.{i}.bias"]
    acc = float((scores.argmax(1) == yt).double().mean())
    t_train = time.time() - t0
    rows: list[dict] = []

    def on_epoch(epoch: int, box) -> None:
        if epoch + 1 in RECORD or epoch + 1 == epochs:
            rows.append({"epoch": epoch + 1, "layers": layer_stats(box, n_ref, n_layers),
                         "ibp_fixed": ibp_fixed(box, Xt)})
            log(f"  {data} / {name}: epoch {epoch + 1}: {rows[-1]['layers']}")

    trace: list[tuple[int, int, float]] = []  # (epoch, step, max width) of the first epochs

    def on_step(epoch: int, step: int, box) -> None:
        if epoch < 2:
            trace.append((epoch + 1, step + 1, box.max_width()))

    result = {"data": data, "k": k, "update": update, "setting": name, "lr": lr, "batch": bs, "epochs": epochs, "finetune": finetune,
              "n": n, "test_accuracy": acc, "epochs_table": rows}
    t0 = time.time()
    try:
        box = abstract_train(inputs, sgd, k=k, max_width=DIVERGED, update=update, on_epoch=on_epoch, on_step=on_step)
    except AgtDiverged as exc:
        result["diverged"] = str(exc)
        result["trace"] = trace
        result["agt_seconds"] = time.time() - t0
        return result
    result["agt_seconds"] = time.time() - t0
    result["train_seconds_sampled"] = t_train
    result["contains_sampled"] = bool(box.contains(nets))
    result["loo_sample"] = len(sample)
    spread = []
    for i in range(n_layers):
        names = [f"layers.{i}.weight", f"layers.{i}.bias"]
        diff = torch.cat([(nets[nm][1:] - nets[nm][:1]).abs().reshape(len(sample), -1) for nm in names], dim=1)
        scale = float(torch.cat([n_ref[nm].abs().flatten() for nm in names]).mean())
        spread.append(float(diff.max()) / scale if len(sample) else 0.0)
    result["loo_spread"] = spread
    result["ibp_fixed"] = ibp_fixed(box, Xt)
    return result


def render(results: list[dict]) -> str:
    """Markdown tables of the JSON results (one row per recorded epoch)."""
    out = []
    for data in dict.fromkeys(r["data"] for r in results):
        out.append(f"### {data} 2x50\n")
        out.append("| setting | lr | batch | epochs | N test acc | epoch | L0 rel. width median / max "
                   "| L1 median / max | L2 median / max | IBP-fixed | outcome |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in (r for r in results if r["data"] == data):
            label = r["setting"] + ("" if r.get("k", 1) == 1 else f", k = {r['k']}")
            if r["finetune"]:  # only fine-tuning the last layer has other update rules
                label += f", {r.get('update', 'interval')} update"
            head = f"| {label} | {r['lr']:g} | {r['batch']} | {r['epochs']} | {100 * r['test_accuracy']:.1f} % "
            table = r["epochs_table"] or [{"epoch": "-", "layers": None}]
            for i, row in enumerate(table):
                cells = " | ".join(f"{a:.2g} / {b:.2g}" for a, b in row["layers"]) if row["layers"] else "- | - | -"
                cells += f" | {100 * row['ibp_fixed']:.1f} %" if "ibp_fixed" in row else " | -"
                if i < len(table) - 1:
                    outcome = ""
                elif "diverged" in r:
                    outcome = "**diverged** " + r["diverged"].split(" diverged ")[1].split(";")[0]
                    trace = r.get("trace") or []
                    if trace:  # absolute max width along the first two epochs
                        picks = trace[:: max(1, len(trace) // 6)] + [trace[-1]]
                        outcome += "; max width by (epoch.step): " + ", ".join(
                            f"{e}.{st}: {w:.1g}" for e, st, w in dict.fromkeys(map(tuple, picks)))
                else:
                    outcome = (f"finite; N and {r.get('loo_sample', 8)} sampled N_-i inside: "
                               f"{'yes' if r['contains_sampled'] else 'NO'}; IBP-fixed test predictions "
                               f"{100 * r['ibp_fixed']:.1f} %; real N_-i spread (max rel.) "
                               + " / ".join(f"{v:.2g}" for v in r["loo_spread"]))
                out.append((head if i == 0 else "| | | | | ") + f"| {row['epoch']} | {cells} | {outcome} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="crypto,adult")
    parser.add_argument("--only", default=None, help="setting names separated by ;")
    parser.add_argument("--loo-sample", type=int, default=8)
    parser.add_argument("--k", type=int, default=1, help="rows removed (sampled networks still leave one out)")
    parser.add_argument("--epochs", type=int, default=None, help="override the settings' epochs")
    parser.add_argument("--update", choices=["zonotope", "corner", "interval"], default="zonotope",
                        help="AGT's update rule for last-layer fine-tuning (docs/agt.md)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--render", nargs="+", default=None, help="print markdown tables of saved JSON results")
    args = parser.parse_args()
    if args.render:
        print(render([r for path in args.render for r in json.loads(Path(path).read_text())]))
        return
    names = args.only.split(";") if args.only else list(SETTINGS)
    results = []
    log = lambda s: print(s, flush=True)  # noqa: E731
    for data in args.data.split(","):
        for name in names:
            res = run_setting(data, name, args.loo_sample, log, k=args.k, epochs_override=args.epochs,
                              update=args.update)
            results.append(res)
            log(json.dumps(res))
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
