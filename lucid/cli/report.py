"""`lucid report RUN [--out FILE] [--format html|md] [--epsilon LIST]`: one reviewable artefact.

Thin: it checks the options, reads the verification log (the command line may import the
engine's log reader, lucid/report may not), and hands over to `lucid.report`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from lucid.errors import LucidError


def _class_logs(run: Path):
    """Per class, the log's node counts, node time, solver statuses and anytime curve; None if no log."""
    from lucid.bab.events import LOG_FILE, read_events
    from lucid.bab.log_view import anytime_curves, node_summary
    from lucid.report.facts import ClassLog

    path = run / LOG_FILE
    if not path.is_file():
        return None
    try:
        events = read_events(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise LucidError(f"cannot read {path}: {exc}") from None
    curves, summary = anytime_curves(events), node_summary(events)
    out = {}
    for c in sorted(set(curves) | set(summary)):
        s = summary.get(c, {})
        secs = s.get("node_seconds", [])
        out[c] = ClassLog(
            solved=int(s.get("solved", 0)),
            split=int(s.get("split", 0)),
            closed=int(s.get("closed", 0)),
            node_seconds_total=float(sum(secs)),
            node_seconds_max=float(max(secs, default=0.0)),
            statuses=tuple(sorted((str(k), int(v)) for k, v in s.get("statuses", {}).items())),
            curve=tuple(curves.get(c, [])),
        )
    return out


def _check_writable(out: Path) -> None:
    """Fail before the (slow) evaluation when --out cannot be written."""
    if out.is_dir():
        raise LucidError(f"--out {out} is a directory; name a file, e.g. {out / 'report.html'}")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise LucidError(f"cannot write {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LucidError(f"cannot write {out}: {parent} is not writable")


@click.command(name="report")
@click.argument("run", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Report file [default: RUN/report.html, or RUN/report.md with --format md].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["html", "md"]),
    default=None,
    help="html: one self-contained file; md: Markdown plus its figures as PNG files beside it "
    "[default: from --out's suffix, else html].",
)
@click.option("--epsilon", "-e", default="0,0.2,1", show_default=True, help="Comma-separated privacy budgets.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the evaluation's noise (reproducible).")
@click.option(
    "--memo",
    default=None,
    metavar="FILE|URL",
    help="The memo of `lucid serve` for the ledger: a SQLite file [default: RUN/memo.sqlite if it "
    "exists] or its postgresql://user@host:port/db URL.",
)
@click.option(
    "--baselines",
    type=click.Path(path_type=Path),
    default=None,
    help="JSON of `python -m lucid.baselines --json` [default: RUN/baselines.json if it exists].",
)
def command(
    run: Path, out: Path | None, fmt: str | None, epsilon: str, seed: int, memo: str | None, baselines: Path | None
) -> None:
    """What was proved about RUN, at what cost, and what the guarantee does not cover."""
    from rich.console import Console

    from lucid.access.evaluate import parse_epsilons
    from lucid.access.memo import memo_target
    from lucid.report import write_report
    from lucid.report.gather import gather_facts
    from lucid.rundir import open_run

    open_run(run)  # a missing or foreign directory fails first, with its own line
    epsilons = parse_epsilons(epsilon)
    if fmt is None:
        fmt = "md" if out is not None and out.suffix.lower() in (".md", ".markdown") else "html"
    out = out if out is not None else run / f"report.{fmt}"
    _check_writable(out)
    target = None if memo is None else memo_target(run, memo)
    console = Console(stderr=True)
    with console.status("reading the run and evaluating the test split …"):
        facts = gather_facts(run, epsilons, seed=seed, memo=target, baselines=baselines, class_logs=_class_logs(run))
    with console.status("drawing the figures …"):
        try:
            written = write_report(facts, out, fmt)
        except OSError as exc:
            raise LucidError(f"cannot write {out}: {exc.strerror or exc}") from None
    if facts.evaluation is not None and facts.evaluation.released_but_leaking:
        console.print(
            f"[bold red]WARNING: {facts.evaluation.released_but_leaking} test inputs were released although "
            "a leave-one-out network labels them differently: bounds.json is UNSOUND for this run.[/]"
        )
    click.echo("wrote " + ", ".join(str(p) for p in written))
