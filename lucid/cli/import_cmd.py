"""`lucid import --manifest MANIFEST --data DATA --out RUN`: a run directory from networks trained
elsewhere (ONNX or PyTorch state dicts), ready for `lucid verify`, `evaluate` and `serve`."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="import")
@click.option("--manifest", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="JSON listing the training algorithm and one network file per network (docs/interop.md).")
@click.option("--data", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="An .npz with X_train, y_train (optionally X_test, y_test) or X, y: the rows in the networks' "
                   "input space, y as class ids.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Run directory to write (created atomically; must not exist or be empty).")
def command(manifest: Path, data: Path, out: Path) -> None:
    """Import N and its leave-one-out networks, trained elsewhere, into the run directory OUT."""
    from lucid.interop import import_run

    result = import_run(manifest, data, out)
    meta = result.meta
    trained_by = meta["training"].get("name") or meta["training"].get("algorithm", "?")
    click.echo(f"wrote {result.path}: {result.networks} networks ({'x'.join(map(str, meta['architecture']['hidden'])) or 'no'} "
               f"hidden), {meta['train_size']} training rows, trained by {trained_by}", err=True)
    if result.provenance == "kept":
        click.echo("lucid: the run lucid export wrote these files from is restored as it was (same run.json and "
                   "fingerprint)", err=True)
    elif result.provenance:
        click.echo(f"lucid: note: provenance {result.provenance}; imported as trained elsewhere", err=True)
    if result.domain_from_data:
        click.echo("lucid: note: the manifest gives no domain, so the verified box is the data's range on features "
                   "outside [0, 1], which reveals their extremes; give \"domain\" with public bounds for a deployment",
                   err=True)
