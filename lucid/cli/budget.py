"""`lucid budget RUN [--memo FILE|URL]`: the privacy ledger of a served run (lucid.access.ledger).
`lucid budget --plan --target-epsilon E --queries Q`: the per-answer epsilon and budget for a target."""

from __future__ import annotations

import json
from pathlib import Path

import click

from lucid.errors import LucidError


@click.command(name="budget")
@click.argument("run", type=click.Path(path_type=Path), required=False)
@click.option(
    "--memo",
    default=None,
    metavar="FILE|URL",
    help="The memo `lucid serve` used: a SQLite file [default: RUN/memo.sqlite] or its "
    "postgresql://user@host:port/db URL.",
)
@click.option(
    "--delta",
    type=float,
    default=None,
    help="delta of the tight (epsilon, delta) total, and of --plan's target [default: 1e-6].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ledger (or the plan) as JSON.")
@click.option(
    "--plan",
    is_flag=True,
    help="Print the per-answer epsilon and per-client budget for --target-epsilon over --queries "
    "answers, as `lucid serve --target-epsilon` picks them (no RUN or memo needed).",
)
@click.option(
    "--target-epsilon",
    type=float,
    default=None,
    metavar="E",
    help="With --plan: the epsilon that --queries answers per client may compose to at --delta.",
)
@click.option(
    "--queries", type=int, default=None, metavar="Q", help="With --plan: the distinct answers per client to plan for."
)
def command(
    run: Path | None,
    memo: str | None,
    delta: float | None,
    as_json: bool,
    plan: bool,
    target_epsilon: float | None,
    queries: int | None,
) -> None:
    """Per client: distinct answers, noised answers, refused requests and the privacy totals.

    charged: epsilon per distinct answer (the worst case, what --budget caps); spent (basic):
    epsilon per distinct noised answer, an (epsilon, 0)-iDP guarantee for the client's labels;
    spent (delta): the optimal (epsilon, delta)-iDP composition of those noised answers.
    """
    from lucid.access.ledger import DEFAULT_DELTA

    delta = DEFAULT_DELTA if delta is None else delta
    if plan:
        _print_plan(run, memo, delta, as_json, target_epsilon, queries)
        return
    if target_epsilon is not None or queries is not None:
        raise LucidError("--target-epsilon and --queries go with --plan")
    if run is None:
        raise LucidError("give RUN (the run directory `lucid serve` served), or --plan")
    _print_ledger(run, memo, delta, as_json)


def _print_plan(
    run: Path | None, memo: str | None, delta: float, as_json: bool, target: float | None, queries: int | None
) -> None:
    """The plan reads nothing: a run or memo given with it is a mistake worth saying."""
    from lucid.access.ledger import check_plan, plan_epsilon

    if run is not None or memo is not None:
        raise LucidError("--plan reads no run or memo: give it without RUN and --memo")
    if target is None or queries is None:
        raise LucidError("--plan needs --target-epsilon E and --queries Q")
    planned = plan_epsilon(*check_plan(target, delta, queries))
    click.echo(json.dumps(planned.to_json(), indent=2) if as_json else planned.describe())


def _print_ledger(run: Path, memo: str | None, delta: float, as_json: bool) -> None:
    from lucid.access.classifier import run_ledger
    from lucid.access.ledger import format_table
    from lucid.access.memo import memo_name, memo_target
    from lucid.rundir import open_run

    if not run.is_dir():
        raise LucidError(f"run directory {run} does not exist")
    target = memo_target(run, memo)
    totals = run_ledger(open_run(run), target, delta)
    name = memo_name(target)  # a URL without its password
    if as_json:
        click.echo(json.dumps({"memo": name, "clients": [t.to_json() for t in totals]}, indent=2))
    elif not totals:
        click.echo(f"{name}: no answers recorded yet")
    else:
        click.echo(format_table(totals))
