"""`lucid budget RUN [--memo FILE]`: the privacy ledger of a served run (lucid.access.ledger)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from lucid.errors import LucidError


@click.command(name="budget")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--memo", type=click.Path(path_type=Path), default=None,
              help="The memo file `lucid serve` used [default: RUN/memo.sqlite].")
@click.option("--delta", type=float, default=None, help="delta of the tight (epsilon, delta) total [default: 1e-6].")
@click.option("--json", "as_json", is_flag=True, help="Print the ledger as JSON.")
def command(run: Path, memo: Path | None, delta: float | None, as_json: bool) -> None:
    """Per client: distinct answers, noised answers, refused requests and the privacy totals.

    charged: epsilon per distinct answer (the worst case, what --budget caps); spent (basic):
    epsilon per distinct noised answer, an (epsilon, 0)-iDP guarantee for the client's labels;
    spent (delta): the optimal (epsilon, delta)-iDP composition of those noised answers.
    """
    from lucid.access.classifier import run_ledger
    from lucid.access.ledger import DEFAULT_DELTA, format_table
    from lucid.access.memo import MEMO_FILE
    from lucid.rundir import open_run

    if not run.is_dir():
        raise LucidError(f"run directory {run} does not exist")
    path = memo if memo is not None else run / MEMO_FILE
    totals = run_ledger(open_run(run), path, DEFAULT_DELTA if delta is None else delta)
    if as_json:
        click.echo(json.dumps({"memo": str(path), "clients": [t.to_json() for t in totals]}, indent=2))
    elif not totals:
        click.echo(f"{path}: no answers recorded yet")
    else:
        click.echo(format_table(totals))
