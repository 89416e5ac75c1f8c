"""`python -m lucid.baselines RUN`: the private-training baselines on a LUCID run's data.

Trains DP-SGD, DP-CERT, ALIBI, subsample-and-aggregate and AGT smooth-sensitivity prediction (one model,
or teachers) with the run's architecture and training
settings (run.json) on its training split and reports test accuracy and training seconds as a
markdown table (and JSON with --json). Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from lucid.access.mechanism import check_epsilon
from lucid.baselines.common import BaselineResult, Dataset, DpSgdSettings, TrainConfig, load_run_data
from lucid.command_errors import fail
from lucid.errors import LucidError
from lucid.option_fields import default_of

METHODS = ("plain", "dpsgd", "dpcert", "alibi", "sa", "agt-ss", "agt-sa")


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise LucidError(f"{what} must be comma-separated numbers, got {text!r}") from None


@dataclass(frozen=True)
class BaselineRequest:
    """What the command is asked to run, one field a flag (the flags' defaults are written here).

    epsilon, methods, teachers: comma-separated lists as typed, read by `epsilons`, `chosen_methods`
    and `teacher_counts`, which the command calls in that order so that the first bad flag is named;
    delta, max_grad_norm: DP-SGD's and DP-CERT's `DpSgdSettings`; agt_k: the AGT boxes k = 1..K."""

    epsilon: str = "0.02,0.2,1"
    methods: str = "plain,dpsgd,alibi,sa"
    teachers: str = "16,64,256"
    delta: float | None = None
    max_grad_norm: float = 1.0
    agt_k: int = 10

    def epsilons(self) -> list[float]:
        return [check_epsilon(e) for e in _floats(self.epsilon, "--epsilon")]

    def chosen_methods(self) -> list[str]:
        chosen = [m.strip() for m in self.methods.split(",") if m.strip()]
        unknown = [m for m in chosen if m not in METHODS]
        if unknown or not chosen:
            raise LucidError(f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(METHODS)}")
        return chosen

    def teacher_counts(self) -> list[int]:
        return [int(t) for t in _floats(self.teachers, "--teachers")]

    @property
    def dp_sgd(self) -> DpSgdSettings:
        return DpSgdSettings(self.delta, self.max_grad_norm)


def _default(name: str) -> Any:
    return default_of(BaselineRequest, name)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path())
@click.option("--epsilon", default=_default("epsilon"), show_default=True, help="Comma-separated privacy budgets.")
@click.option(
    "--methods",
    default=_default("methods"),
    show_default=True,
    help="Subset of plain,dpsgd,dpcert,alibi,sa,agt-ss,agt-sa (AGT smooth sensitivity: one model / --teachers).",
)
@click.option("--teachers", default=_default("teachers"), show_default=True, help="Teacher counts T of sa and agt-sa.")
@click.option("--delta", type=float, default=_default("delta"), help="DP-SGD delta (default 1/n).")
@click.option(
    "--max-grad-norm", type=float, default=_default("max_grad_norm"), show_default=True, help="DP-SGD clipping norm."
)
@click.option(
    "--agt-k",
    type=int,
    default=_default("agt_k"),
    show_default=True,
    help="AGT smooth sensitivity: boxes for k = 1..K.",
)
@click.option("--json", "json_path", type=click.Path(), default=None, help="Also write the results as JSON.")
def command(run_dir: str, json_path: str | None, **flags: Any) -> None:
    from lucid.atomic import write_json_atomic

    request = BaselineRequest(**flags)
    eps = request.epsilons()
    chosen = request.chosen_methods()
    ts = request.teacher_counts()
    data, config = load_run_data(run_dir)
    results = [r for m in chosen for r in _results(m, data, config, eps, ts, request)]
    click.echo("| method | epsilon | test accuracy | train s | note |\n|---|---|---|---|---|")
    for r in results:
        acc = "–" if r.accuracy is None else f"{100 * r.accuracy:.1f} %"
        click.echo(
            f"| {r.method} | {'–' if r.epsilon is None else f'{r.epsilon:g}'} | {acc} | "
            f"{r.train_seconds:.1f} | {r.message if r.status != 'ok' else ''} |"
        )
    if json_path:
        write_json_atomic(json_path, {"run": str(run_dir), "results": [r.to_json() for r in results]})


def _results(
    method: str, data: Dataset, config: TrainConfig, eps: list[float], teachers: list[int], request: BaselineRequest
) -> list[BaselineResult]:
    """One method's results, one per epsilon (and teacher count), in the order the table lists them."""
    from lucid.baselines.alibi import train_alibi
    from lucid.baselines.common import train_plain
    from lucid.baselines.dpcert import train_dpcert
    from lucid.baselines.dpsgd import train_dpsgd
    from lucid.baselines.smooth_sensitivity import run_smooth_sensitivity
    from lucid.baselines.subsample_aggregate import run_subsample_aggregate

    if method == "plain":
        return [train_plain(data, config)]
    if method == "dpsgd":
        return [train_dpsgd(data, config, e, request.dp_sgd) for e in eps]
    if method == "dpcert":
        return [train_dpcert(data, config, e, request.dp_sgd) for e in eps]
    if method == "alibi":
        return [train_alibi(data, config, e) for e in eps]
    if method == "agt-ss":
        return run_smooth_sensitivity(data, config, eps, k_max=request.agt_k)
    if method == "agt-sa":
        return [r for t in teachers for r in run_smooth_sensitivity(data, config, eps, k_max=request.agt_k, teachers=t)]
    return [r for t in teachers for r in run_subsample_aggregate(data, config, t, eps)]  # sa


def main(argv: list[str] | None = None) -> None:
    try:
        command.main(args=argv, prog_name="python -m lucid.baselines", standalone_mode=False)
    except LucidError as exc:
        fail(str(exc))
    except click.ClickException as exc:
        fail(exc.format_message())


if __name__ == "__main__":
    main()
