"""`lucid evaluate RUN --epsilon 0,0.2,1`: accuracy and access time of LUCID vs the naive mechanisms."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import TaskID

from pathlib import Path

import click

from lucid.errors import LucidError


def run_evaluation(run: Path, epsilon: str, json_path: Path | None, plot: Path | None, seed: int | None) -> dict:
    """Evaluate, print the markdown table, write the JSON/plot; shared with `lucid demo`."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from lucid.access.evaluate import evaluate_run, markdown_table, parse_epsilons, plot_confidences
    from lucid.atomic import write_json_atomic

    epsilons = parse_epsilons(epsilon)
    if plot is not None and plot.suffix.lower() not in {".png", ".pdf", ".svg"}:
        raise LucidError(f"--plot must name a .png, .pdf or .svg file, got {plot}")
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            label = {"Naive-iDP": "Naive-iDP: networks evaluated", "LUCID": "mechanisms: epsilons done"}[stage]
            if stage not in tasks:
                tasks[stage] = bar.add_task(label, total=total)
            bar.update(tasks[stage], completed=done)

        result, plot_data = evaluate_run(run, epsilons, seed=seed, progress=progress)
    click.echo(markdown_table(result, epsilons))
    if plot_data["released_but_leaking"]:
        console.print(
            f"[bold red]WARNING: {plot_data['released_but_leaking']} test inputs were released by LUCID although "
            "a leave-one-out network labels them differently: bounds.json is UNSOUND for this run.[/]"
        )
    if json_path is not None:
        write_json_atomic(json_path, result)
    if plot is not None:
        plot_confidences(plot_data, plot)
    return result


@click.command(name="evaluate")
@click.argument("run", type=click.Path(path_type=Path))
@click.option(
    "--epsilon",
    "-e",
    default="0,0.2,1",
    show_default=True,
    help="Comma-separated privacy budgets; JSON keys are the values as written.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the results as JSON.",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Draw test-set confidences per class with the iDP-DB line (paper Fig. 6).",
)
@click.option("--seed", type=int, default=None, help="Seed the noise (reproducible tables); default: OS randomness.")
def command(run: Path, epsilon: str, json_path: Path | None, plot: Path | None, seed: int | None) -> None:
    """Accuracy of N, LUCID, Naive-Noise and Naive-iDP on RUN's test split, per epsilon."""
    run_evaluation(run, epsilon, json_path, plot, seed)
