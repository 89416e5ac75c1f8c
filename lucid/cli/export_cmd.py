"""`lucid export RUN --out DIR`: N as ONNX; `--all` every network and a manifest for `lucid import`;
`--class C --network I` the singleton query N ⊕ N_-I as ONNX + VNN-LIB for a VNN-COMP verifier."""

from __future__ import annotations

from pathlib import Path

import click

from lucid.errors import LucidError


@click.command(name="export")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False), help="Directory to write into.")
@click.option(
    "--all",
    "all_networks",
    is_flag=True,
    help="Also every leave-one-out network as n{ROW}.onnx, and a manifest.json that `lucid import` reads.",
)
@click.option(
    "--class", "cls", type=int, default=None, help="Write the query for this class (needs --network or --position)."
)
@click.option(
    "--network",
    "row",
    type=int,
    default=None,
    help="The query's N_-i by training row i: the network whose 'removed' value is i.",
)
@click.option("--position", type=int, default=None, help="The query's network by its position in networks.safetensors.")
@click.option(
    "--beta",
    type=float,
    default=None,
    help="The query's confidence threshold (default: the class's upper bound in bounds.json).",
)
def command(
    run: Path, out: Path, all_networks: bool, cls: int | None, row: int | None, position: int | None, beta: float | None
) -> None:
    """Write RUN's networks as ONNX (input x: the networks' input space, after the run's scaler)."""
    from lucid.interop import export_all, export_network, export_query
    from lucid.rundir import open_run

    if cls is None and (row is not None or position is not None or beta is not None):
        raise LucidError("--network, --position and --beta belong to a query: give --class too")
    run_ = open_run(run)
    written = []
    if cls is not None:  # first: its options are checked before anything is written
        written += [p.name for p in export_query(run_, out, cls, row=row, position=position, beta=beta)]
    if all_networks:
        manifest = export_all(run_, out)
        written[:0] = ["N.onnx", "n{ROW}.onnx for every training row", manifest.name]
    else:
        written.insert(0, export_network(run_, 0, out).name)
    click.echo(f"wrote {', '.join(written)} into {out}", err=True)
