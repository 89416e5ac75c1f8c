"""`lucid train DATA --out RUN`: train N and every leave-one-out network into a run directory."""

from __future__ import annotations

from typing import Any

import click

from lucid.agt.train import DEFAULT_MAX_WIDTH
from lucid.errors import LucidError
from lucid.option_fields import default_of
from lucid.training.settings import TrainSettings


def _default(name: str) -> Any:
    return default_of(TrainSettings, name)


@click.command(name="train")
@click.argument("data")
@click.option("--out", "out", required=True, type=click.Path(), help="Run directory to write (created atomically).")
@click.option(
    "--arch",
    default=_default("arch"),
    show_default=True,
    help="MLP as DEPTHxWIDTH (2x50) or widths (50,20), 'cnn' (the paper's 1-D CNN), or a 2-D CNN as "
    "layers: conv(OUT,KERNEL,stride=1,pad=0),...,fc(WIDTH),... (needs --input-shape).",
)
@click.option(
    "--input-shape",
    default=_default("input_shape"),
    help="C,H,W of the images a conv(...) --arch reads (e.g. 1,8,8): the features are the C-H-W flattened image.",
)
@click.option("--epochs", default=_default("epochs"), show_default=True, type=int)
@click.option("--lr", default=_default("lr"), show_default=True, type=float, help="SGD learning rate.")
@click.option("--weight-decay", default=_default("weight_decay"), show_default=True, type=float)
@click.option("--batch-size", default=_default("batch_size"), show_default=True, type=int)
@click.option(
    "--seed",
    default=_default("seed"),
    show_default=True,
    type=int,
    help="Seeds the initialisation, batch order and split.",
)
@click.option(
    "--test-fraction",
    default=_default("test_fraction"),
    show_default=True,
    type=float,
    help="Stratified test split (0 allowed).",
)
@click.option(
    "--test-data", default=_default("test_data"), help="Use this file as the test split instead of splitting DATA."
)
@click.option("--label", default=_default("label"), help="Label column of a CSV (default: the last column).")
@click.option(
    "--domain",
    default=_default("domain"),
    type=click.Path(),
    help='JSON {"lower": [...], "upper": [...]} in original units.',
)
@click.option("--device", default=_default("device"), show_default=True, help="cpu or cuda.")
@click.option(
    "--chunk-size",
    default=_default("chunk_size"),
    type=int,
    help="Networks per chunk (default: up to 64, within a 3 GiB budget); one chunk per core at a time.",
)
@click.option(
    "--scheduler",
    default=_default("scheduler"),
    help="Train the chunks on a Dask cluster: tcp://HOST:8786, or local:N for N local worker processes.",
)
@click.option("--progress/--no-progress", default=_default("progress"), show_default=True)
@click.option(
    "--agt",
    default=_default("agt"),
    show_default=True,
    type=int,
    help="Also store abstract-gradient-training parameter boxes for k = 1..K removed rows (agt.safetensors).",
)
@click.option(
    "--agt-max-width",
    default=_default("agt_max_width"),
    type=float,
    help=f"Stop (exit 2) when an AGT parameter interval grows wider than this (default {DEFAULT_MAX_WIDTH:g}).",
)
@click.option(
    "--loo/--no-loo",
    default=_default("loo"),
    show_default=True,
    help="Train the leave-one-out networks; --no-loo trains N alone (with --agt: N and the boxes; "
    "without: a pre-trained start for another run's --init).",
)
@click.option(
    "--init",
    "init_from",
    default=_default("init_from"),
    type=click.Path(),
    help="Start from N of this run directory (e.g. trained on public data) instead of a seeded initialisation.",
)
@click.option(
    "--train-layers",
    default=_default("train_layers"),
    show_default=True,
    help="Dense layers SGD updates: all, last, or indices like 0,2 (MLPs); the others keep their start values.",
)
def command(data: str, out: str, **options) -> None:
    """Train N and every leave-one-out network N_-i on DATA (CSV with header, .npz with X and y,
    or sklearn:NAME for breast_cancer, wine, digits, iris) into the run directory OUT."""
    from lucid.training import train_run

    settings = TrainSettings(**options)
    try:
        run_dir = train_run(data, out, settings)
    except KeyboardInterrupt:
        click.echo(f"lucid: finished chunks are kept in {out}.partial; re-run the same command to resume", err=True)
        raise
    click.echo(_summary(run_dir), err=True)
    if settings.domain is None and _scaled_from_data(run_dir):
        click.echo(
            "lucid: note: features outside [0, 1] were min-max scaled over the data, so the verified domain "
            "(which `lucid serve` enforces) reveals their extremes; pass --domain with public bounds for a deployment",
            err=True,
        )


def _scaled_from_data(run_dir) -> bool:
    from lucid.rundir import open_run

    scaler = open_run(run_dir).meta["scaler"]
    return any(o != 0.0 for o in scaler["offset"]) or any(s != 1.0 for s in scaler["scale"])


def _summary(run_dir) -> str:
    from lucid.network import NetworkFile
    from lucid.rundir import open_run

    try:
        run = open_run(run_dir)
        arrays = run.data()
        source = NetworkFile(run.path, run.meta)
        full = source.select(slice(0, 1))  # N: the summary never needs the other networks
    except LucidError as exc:  # the run was written; a summary problem must not fail the command
        return f"wrote {run_dir} ({exc})"
    parts = [f"wrote {run_dir}: {len(source)} networks"]
    for split in ("train", "test"):
        X, y = arrays[f"X_{split}"], arrays[f"y_{split}"]
        if len(y):
            acc = float((full.forward(X)[0].argmax(axis=1) == y).mean())
            parts.append(f"N {split} accuracy {100 * acc:.1f}%")
    return ", ".join(parts)
