"""`python -m lucid.baselines RUN`: the private-training baselines on a LUCID run's data.

Trains DP-SGD, DP-CERT, ALIBI, subsample-and-aggregate and AGT smooth-sensitivity prediction (one model,
or teachers) with the run's architecture and training
settings (run.json) on its training split and reports test accuracy and training seconds as a
markdown table (and JSON with --json). Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import click

from lucid.command_errors import fail
from lucid.errors import LucidError

METHODS = ("plain", "dpsgd", "dpcert", "alibi", "sa", "agt-ss", "agt-sa")


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise LucidError(f"{what} must be comma-separated numbers, got {text!r}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path())
@click.option("--epsilon", default="0.02,0.2,1", show_default=True, help="Comma-separated privacy budgets.")
@click.option("--methods", default="plain,dpsgd,alibi,sa", show_default=True, help="Subset of plain,dpsgd,dpcert,alibi,sa,agt-ss,agt-sa (AGT smooth sensitivity: one model / --teachers).")
@click.option("--teachers", default="16,64,256", show_default=True, help="Teacher counts T of sa and agt-sa.")
@click.option("--delta", type=float, default=None, help="DP-SGD delta (default 1/n).")
@click.option("--max-grad-norm", type=float, default=1.0, show_default=True, help="DP-SGD clipping norm.")
@click.option("--agt-k", type=int, default=10, show_default=True, help="AGT smooth sensitivity: boxes for k = 1..K.")
@click.option("--json", "json_path", type=click.Path(), default=None, help="Also write the results as JSON.")
def command(run_dir, epsilon, methods, teachers, delta, max_grad_norm, agt_k, json_path) -> None:
    from lucid.atomic import write_json_atomic
    from lucid.baselines.alibi import train_alibi
    from lucid.access.mechanism import check_epsilon
    from lucid.baselines.common import load_run_data, train_plain
    from lucid.baselines.dpcert import train_dpcert
    from lucid.baselines.dpsgd import train_dpsgd
    from lucid.baselines.smooth_sensitivity import run_smooth_sensitivity
    from lucid.baselines.subsample_aggregate import run_subsample_aggregate

    eps = [check_epsilon(e) for e in _floats(epsilon, "--epsilon")]
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS]
    if unknown or not chosen:
        raise LucidError(f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(METHODS)}")
    ts = [int(t) for t in _floats(teachers, "--teachers")]
    data, config = load_run_data(run_dir)
    results = []
    for m in chosen:
        if m == "plain":
            results.append(train_plain(data, config))
        elif m == "dpsgd":
            results += [train_dpsgd(data, config, e, delta=delta, max_grad_norm=max_grad_norm) for e in eps]
        elif m == "dpcert":
            results += [train_dpcert(data, config, e, delta=delta, max_grad_norm=max_grad_norm) for e in eps]
        elif m == "alibi":
            results += [train_alibi(data, config, e) for e in eps]
        elif m == "agt-ss":
            results += run_smooth_sensitivity(data, config, eps, k_max=agt_k)
        elif m == "agt-sa":
            for t in ts:
                results += run_smooth_sensitivity(data, config, eps, k_max=agt_k, teachers=t)
        else:  # sa
            for t in ts:
                results += run_subsample_aggregate(data, config, t, eps)
    click.echo("| method | epsilon | test accuracy | train s | note |\n|---|---|---|---|---|")
    for r in results:
        acc = "–" if r.accuracy is None else f"{100 * r.accuracy:.1f} %"
        click.echo(f"| {r.method} | {'–' if r.epsilon is None else f'{r.epsilon:g}'} | {acc} | "
                   f"{r.train_seconds:.1f} | {r.message if r.status != 'ok' else ''} |")
    if json_path:
        write_json_atomic(json_path, {"run": str(run_dir), "results": [r.to_json() for r in results]})


def main(argv: list[str] | None = None) -> None:
    try:
        command.main(args=argv, prog_name="python -m lucid.baselines", standalone_mode=False)
    except LucidError as exc:
        fail(str(exc))
    except click.ClickException as exc:
        fail(exc.format_message())


if __name__ == "__main__":
    main()
