"""What an AGT box is worth to LUCID: beta_c from `--hyper agt:k` against the leave-one-out BaB.

For one training setting where the k-removal boxes stay narrow (see benchmarks/agt.py and
benchmarks/results/agt.md), it runs the product end to end from the command line:

1. `lucid train DATA --agt K` (N, every leave-one-out network and the boxes k = 1..K) and
   `lucid train DATA --agt K --no-loo` (N and the boxes only): training seconds of AGT alone and,
   by difference, of the leave-one-out networks;
2. `lucid verify RUN` (the leave-one-out branch-and-bound, `--hyper loo`) and
   `lucid verify RUN --hyper agt:k` for every k asked, each on its own copy of the run;
3. `lucid evaluate RUN --seed 0` on each copy: test accuracy of LUCID at every epsilon, and the
   share of test inputs that get noise.

With `--pretrain "PUBLIC_DATA flags"`, step 0 trains N alone on public data (`lucid train
PUBLIC_DATA --no-loo`) and step 1 starts from it (`--init`): the fine-tuning setting, e.g. only
the last layer (`--train-layers last` in `--train`). `--adult-split DIR` writes the Adult files
for it (lucid train's 80/20 split of ../shared/data/adult, seed 0; the first 40 % of the training
rows are the public set, the other 60 % the private one; a [0, 1] domain file for both);
`--crypto-split DIR` the Crypto ones (the paper's train split is private, the first half of its
test split public, the other half the test set, as benchmarks/agt.py).

Every step's result is saved as it finishes under OUT/results/*.json, so an interrupted run
resumes where it stopped (delete a file to redo that step). The markdown table goes to
OUT.md (`--render` re-draws it from the saved results).

    python benchmarks/agt_verify.py --name crypto-fb10 \
        --train "/work/shared/data/crypto/train.npz --test-data /work/shared/data/crypto/test.npz \
                 --batch-size 2800 --epochs 10 --lr 0.1" \
        --k 1,2,5,10 --time-limit 600 --out benchmarks/results/agt_verify
    python benchmarks/agt_verify.py --adult-split benchmarks/runs/adult-ft
    python benchmarks/agt_verify.py --name adult-ft5 \
        --pretrain "benchmarks/runs/adult-ft/public.npz --domain benchmarks/runs/adult-ft/domain.json --test-fraction 0" \
        --train "benchmarks/runs/adult-ft/private.npz --domain benchmarks/runs/adult-ft/domain.json \
                 --test-data benchmarks/runs/adult-ft/test.npz --train-layers last --epochs 5" \
        --k 1,2,5,10 --time-limit 300
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lucid.atomic import write_json_atomic  # noqa: E402

RUN_FILES = ("run.json", "data.npz", "networks.safetensors", "agt.safetensors")


def _lucid(*args: str) -> tuple[float, str]:
    """Run the `lucid` CLI; (seconds, stdout). A failure stops the benchmark with its stderr."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lucid", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"lucid {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return seconds, proc.stdout


def _step(results: Path, name: str, compute) -> dict:
    """The saved result of a step, or compute and save it (resumable)."""
    path = results / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    write_json_atomic(path, value)
    return value


def _train(work: Path, train_args: list[str], max_k: int) -> dict:
    both, agt_only = work / "run", work / "run-agt-only"
    for d in (both, agt_only):
        shutil.rmtree(d, ignore_errors=True)  # a half-trained directory from an interrupted step
    t_both, _ = _lucid("train", *train_args, "--out", str(both), "--agt", str(max_k), "--no-progress")
    t_agt, _ = _lucid("train", *train_args, "--out", str(agt_only), "--agt", str(max_k), "--no-loo", "--no-progress")
    shutil.rmtree(agt_only)
    meta = json.loads((both / "run.json").read_text())
    return {"train_args": train_args, "max_k": max_k, "seconds_loo_and_agt": t_both, "seconds_agt_only": t_agt,
            "seconds_loo_estimate": max(t_both - t_agt, 0.0), "train_size": meta["train_size"],
            "test_size": meta["test_size"]}


def _pretrain(work: Path, args: list[str]) -> dict:
    out = work / "pretrained"
    shutil.rmtree(out, ignore_errors=True)
    seconds, _ = _lucid("train", *args, "--no-loo", "--no-progress", "--out", str(out))
    return {"pretrain_args": args, "seconds": seconds, "run": str(out)}


def fine_tuning_split(data: str, folder: Path) -> None:
    """The fine-tuning files (see the module docstring) for "adult" or "crypto"."""
    import numpy as np

    from lucid.data import prepare_dataset

    shared = ROOT.parent / "shared" / "data"
    if data == "adult":
        ds = prepare_dataset(str(shared / "adult" / "adult.npz"), test_fraction=0.2, seed=0)
        cut = int(0.4 * len(ds.y_train))
        public, private = (ds.X_train[:cut], ds.y_train[:cut]), (ds.X_train[cut:], ds.y_train[cut:])
        test = (ds.X_test, ds.y_test)
    else:  # as benchmarks/agt.py: public = the first half of the paper's test split, test = the other half
        ds = prepare_dataset(str(shared / "crypto" / "train.npz"), test_data=str(shared / "crypto" / "test.npz"), seed=0)
        half = len(ds.y_test) // 2
        public, private = (ds.X_test[:half], ds.y_test[:half]), (ds.X_train, ds.y_train)
        test = (ds.X_test[half:], ds.y_test[half:])
    folder.mkdir(parents=True, exist_ok=True)
    for name, (X, y) in (("public", public), ("private", private), ("test", test)):
        np.savez(folder / f"{name}.npz", X=X, y=y)
    d = ds.input_dim
    (folder / "domain.json").write_text(json.dumps({"lower": [0.0] * d, "upper": [1.0] * d}))
    print(f"{folder}: public {len(public[1])}, private {len(private[1])}, test {len(test[1])} rows")


def _verify(work: Path, hyper: str, verify_args: list[str]) -> dict:
    copy = work / hyper.replace(":", "")
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    for name in RUN_FILES:
        shutil.copy2(work / "run" / name, copy / name)
    seconds, _ = _lucid("verify", str(copy), "--hyper", hyper, "--quiet", *verify_args)
    bounds = json.loads((copy / "bounds.json").read_text())
    _lucid("evaluate", str(copy), "--seed", "0", "--json", str(copy / "evaluate.json"))
    evaluation = json.loads((copy / "evaluate.json").read_text())
    return {"hyper": hyper, "verify_args": verify_args, "seconds": seconds, "bounds": bounds["bounds"],
            "evaluation": evaluation}


def _smooth(work: Path, train_args: list[str], max_k: int, epsilons: list[float]) -> dict:
    """AGT smooth-sensitivity prediction (one model) from the run's own boxes: N's test labels,
    each query's stable distance k' (the largest k whose box certifies N's label) and the exact
    expected accuracy under Cauchy noise 6 exp(-eps k'/6)/eps (lucid.baselines.smooth_sensitivity)."""
    import numpy as np

    from lucid.agt.stability import stable_distances
    from lucid.agt.store import load_boxes
    from lucid.baselines.smooth_sensitivity import probability_of_one
    from lucid.network import load_networks

    run = work / "run"
    if not (run / "agt.safetensors").exists():  # cleaned up after an earlier pass: T is deterministic
        shutil.rmtree(run, ignore_errors=True)
        _lucid("train", *train_args, "--out", str(run), "--agt", str(max_k), "--no-progress")
    if json.loads((run / "run.json").read_text())["num_classes"] != 2:
        return {"unreachable": "the Cauchy mechanism is for binary classifiers"}
    with np.load(run / "data.npz", allow_pickle=False) as f:
        X, y = f["X_test"], f["y_test"]
    labels = load_networks(run, index=slice(0, 1)).forward(X)[0].argmax(axis=1)
    distance = stable_distances(load_boxes(run), X, labels)
    accuracy = {}
    for e in epsilons:
        p_one = probability_of_one(labels, distance, e)
        accuracy[f"{e:g}"] = float(np.where(y == 1, p_one, 1.0 - p_one).mean())
    return {"epsilons": epsilons, "accuracy": accuracy, "noise_free": float((labels == y).mean()),
            "stable_share": float((distance >= 1).mean()), "mean_distance": float(distance.mean())}


def render(name: str, training: dict, rows: list[dict], smooth: dict | None = None) -> str:
    pre = training.get("pretrain")
    lines = [
        f"## {name}: beta_c over the AGT box against the leave-one-out branch-and-bound",
        "",
    ]
    if pre:
        lines += [f"Pre-training on public data: `lucid train {' '.join(pre['pretrain_args'])} --no-loo` "
                  f"({pre['seconds']:.0f} s); the private run starts from it (`--init`).", ""]
    lines += [
        f"Training (`lucid train {' '.join(training['train_args'])} --agt {training['max_k']}`), "
        f"{training['train_size']} training rows: N + boxes k = 1..{training['max_k']} + every leave-one-out network "
        f"{training['seconds_loo_and_agt']:.0f} s; N + boxes only (`--no-loo`) {training['seconds_agt_only']:.0f} s; "
        f"so the {training['train_size']} leave-one-out networks ≈ {training['seconds_loo_estimate']:.0f} s.",
        "",
        "| hyper | class | upper β_c | lower | complete | reason | verify s | LUCID acc ε=0 / 0.2 / 1 | noised |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        acc = row["evaluation"]["accuracy"]["lucid"]
        accs = " / ".join(f"{100 * acc[e]:.1f} %" for e in sorted(acc, key=float))
        noised = f"{100 * row['evaluation']['noised_fraction']['lucid']:.1f} %"
        for c, b in sorted(row["bounds"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {row['hyper']} | {c} | {b['upper']:.4g} | {b['lower']:.4g} | {b['complete']} | "
                         f"{b.get('reason', '')} | {b['seconds']:.0f} | {accs} | {noised} |")
    if rows:
        lines += ["", f"N without privacy: {100 * rows[0]['evaluation']['accuracy']['plain']:.1f} % test accuracy."]
    if smooth and "accuracy" in smooth:
        accs = " / ".join(f"{100 * a:.1f} % (ε = {e})" for e, a in smooth["accuracy"].items())
        lines += ["", f"AGT smooth-sensitivity prediction from the same boxes (one model, the paper's nominal ε): "
                  f"{accs}; queries with k' ≥ 1: {100 * smooth['stable_share']:.1f} %, mean k' "
                  f"{smooth['mean_distance']:.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name")
    p.add_argument("--train", help="DATA and `lucid train` flags, quoted")
    p.add_argument("--k", default="1,2,5,10")
    p.add_argument("--time-limit", type=float, default=600.0, help="per verification (shared by the classes)")
    p.add_argument("--loo-args", default="--rel-gap 0 --workers 2", help="extra flags of the leave-one-out verify")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "agt_verify"))
    p.add_argument("--pretrain", default=None, help="PUBLIC_DATA and `lucid train` flags, quoted: train N on it first "
                   "and start the private run from it (--init)")
    p.add_argument("--render", action="store_true", help="only re-draw OUT/NAME.md from saved results")
    p.add_argument("--adult-split", default=None, metavar="DIR", help="write the Adult fine-tuning files and stop")
    p.add_argument("--crypto-split", default=None, metavar="DIR", help="write the Crypto fine-tuning files and stop")
    args = p.parse_args(argv)
    if args.adult_split or args.crypto_split:
        fine_tuning_split("adult" if args.adult_split else "crypto", Path(args.adult_split or args.crypto_split))
        return 0
    if not args.name or not args.train:
        p.error("--name and --train are required")
    ks = [int(k) for k in args.k.split(",") if k.strip()]
    out = Path(args.out)
    results, work = out / args.name, out / args.name / "work"
    results.mkdir(parents=True, exist_ok=True)
    limit = ["--time-limit", f"{args.time_limit:g}"]
    steps = [("loo", ["--hyper", "loo"], shlex.split(args.loo_args) + limit)] + \
            [(f"agt{k}", ["--hyper", f"agt:{k}"], limit) for k in ks]
    if args.render:
        training = json.loads((results / "train.json").read_text())
        rows = [json.loads((results / f"{s}.json").read_text()) for s, _, _ in steps if (results / f"{s}.json").exists()]
        smooth = json.loads((results / "smooth.json").read_text()) if (results / "smooth.json").exists() else None
    else:
        train_args = shlex.split(args.train)
        pre = None
        if args.pretrain:
            if (results / "pretrain.json").exists() and not (work / "pretrained").is_dir():
                (results / "pretrain.json").unlink()  # its run was cleaned up with the work folder
            pre = _step(results, "pretrain", lambda: _pretrain(work, shlex.split(args.pretrain)))
            train_args += ["--init", pre["run"]]
        training = _step(results, "train", lambda: dict(_train(work, train_args, max(ks)), pretrain=pre))
        rows = []
        for step, hyper, extra in steps:
            rows.append(_step(results, step, lambda h=hyper[1], e=extra: _verify(work, h, e)))
            print(f"{args.name}: {step} done", flush=True)
        smooth = _step(results, "smooth", lambda: _smooth(work, train_args, max(ks), [0.02, 0.2, 1.0]))
        shutil.rmtree(work, ignore_errors=True)
    (out / f"{args.name}.md").write_text(render(args.name, training, rows, smooth))
    print((out / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
