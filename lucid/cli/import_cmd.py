"""`lucid import --manifest MANIFEST --data DATA --out RUN`: a run directory from networks trained
elsewhere (ONNX or PyTorch state dicts), ready for `lucid verify`, `evaluate` and `serve`."""

from __future__ import annotations

from pathlib import Path

import click

from lucid.interop.import_data import MAX_FILE_BYTES, size_text

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A byte count: a number with an optional K, M, G or T (binary units; a trailing B is allowed)."""
    text = value.strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in UNITS else ""
    try:
        number = float(text[: len(text) - len(unit)])
    except ValueError:
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise click.BadParameter(f"'{value}' is not a size such as 4G, 500M or 1000000")
    return int(number * UNITS[unit])


@click.command(name="import")
@click.option(
    "--manifest",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="JSON listing the training algorithm and one network file per network (docs/interop.md).",
)
@click.option(
    "--data",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="An .npz with X_train, y_train (optionally X_test, y_test) or X, y: the rows in the networks' "
    "input space, y as class ids.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    help="Run directory to write (created atomically; must not exist or be empty).",
)
@click.option(
    "--max-file-size",
    "max_file_bytes",
    default=size_text(MAX_FILE_BYTES),
    show_default=True,
    callback=_size,
    help="Refuse any input file larger than this before reading it (K, M, G: binary units).",
)
def command(manifest: Path, data: Path, out: Path, max_file_bytes: int) -> None:
    """Import N and its leave-one-out networks, trained elsewhere, into the run directory OUT."""
    from lucid.interop import import_run

    result = import_run(manifest, data, out, max_file_bytes)
    meta = result.meta
    trained_by = meta["training"].get("name") or meta["training"].get("algorithm", "?")
    hidden = "x".join(map(str, meta["architecture"]["hidden"])) or "no"
    click.echo(
        f"wrote {result.path}: {result.networks} networks ({hidden} "
        f"hidden), {meta['train_size']} training rows, trained by {trained_by}",
        err=True,
    )
    if result.provenance == "kept":
        click.echo(
            "lucid: the run lucid export wrote these files from is restored as it was (same run.json and fingerprint)",
            err=True,
        )
    elif result.provenance:
        click.echo(f"lucid: note: provenance {result.provenance}; imported as trained elsewhere", err=True)
    if result.domain_from_data:
        click.echo(
            "lucid: note: the manifest gives no domain, so the verified box is the data's range on features "
            'outside [0, 1], which reveals their extremes; give "domain" with public bounds for a deployment',
            err=True,
        )
