"""`lucid demo`: the whole pipeline on scikit-learn's breast-cancer data, in a few minutes.

train (N + every leave-one-out network) -> verify (per-class iDP-DB, HiGHS by default)
-> evaluate (LUCID vs Naive-Noise vs Naive-iDP). Re-running resumes: a finished training is
kept, and a verification with the same options continues from its checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from lucid.errors import LucidError
from lucid.option_fields import default_of
from lucid.settings import VerifySettings
from lucid.training.settings import TrainSettings

DEMO_DATA = "sklearn:breast_cancer"
DEMO_ARCH = "2x10"
DEMO_BATCH_SIZE = 64
DEMO_EPSILONS = "0,0.2,1"


@click.command(name="demo")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("lucid-demo"),
    show_default=True,
    help="Directory for the run, the evaluation JSON and the confidence plot.",
)
@click.option(
    "--solver", default=default_of(VerifySettings, "solver"), show_default=True, help="MILP backend for verification."
)
@click.option(
    "--time-limit",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds for verification; the bounds found by then are sound (anytime).",
)
@click.option("--arch", default=DEMO_ARCH, show_default=True, help="Network architecture (e.g. 2x10).")
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=default_of(TrainSettings, "epochs"),
    show_default=True,
    help="Training epochs.",
)
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Verification workers [default: all cores].")
@click.option(
    "--seed",
    type=int,
    default=default_of(TrainSettings, "seed"),
    show_default=True,
    help="Seed of training and of the evaluation's noise.",
)
def command(out: Path, solver: str, time_limit: float, arch: str, epochs: int, workers: int | None, seed: int) -> None:
    """Train, verify and evaluate on breast_cancer end to end, printing the accuracy table."""
    from rich.console import Console

    from lucid.cli.evaluate import run_evaluation

    if not (time_limit > 0):
        raise LucidError(f"--time-limit must be a positive number of seconds, got {time_limit}")
    console = Console(stderr=True)
    run_dir = out / "run"
    started = time.monotonic()

    console.rule(f"[bold]1/3 training N and every leave-one-out network ({arch}, {DEMO_DATA})")
    from lucid.training import train_run

    train_run(DEMO_DATA, run_dir, arch=arch, epochs=epochs, batch_size=DEMO_BATCH_SIZE, seed=seed)

    console.line()
    console.rule(f"[bold]2/3 verifying the per-class iDP decision bounds ({solver}, up to {time_limit:g} s)")
    _verify(run_dir, solver, time_limit, workers, console)

    console.line()
    console.rule("[bold]3/3 evaluating label-only access on the test split")
    run_evaluation(run_dir, DEMO_EPSILONS, out / "evaluation.json", out / "confidences.png", seed)
    console.print(
        f"\ndone in {time.monotonic() - started:.0f} s. Results: {out / 'evaluation.json'}, plot: "
        f"{out / 'confidences.png'}.\nServe it:  lucid serve {run_dir} --epsilon 1",
        soft_wrap=True,
    )


def _verify(run_dir: Path, solver: str, time_limit: float, workers: int | None, console) -> None:
    from lucid.verify import verify_run

    checkpoint = run_dir / "verify.checkpoint.json"
    kwargs: dict[str, Any] = {"solver": solver, "time_limit": time_limit, "workers": workers, "progress": True}
    if checkpoint.exists():
        try:
            verify_run(run_dir, resume=True, **kwargs)
            return
        except LucidError as exc:  # e.g. other options than last time: start over
            console.print(f"not resuming the earlier verification ({exc}); starting afresh")
    verify_run(run_dir, **kwargs)
