"""`lucid verify RUN`: per-class iDP decision bounds by branch-and-bound (writes RUN/bounds.json)."""

from __future__ import annotations

from typing import Any

import click

from lucid.option_fields import default_of
from lucid.settings import (
    DEFAULT_MAX_RESIDUAL,
    DEFAULT_SCREEN,
    INPUT_SPLIT_MAX_DIM,
    INPUT_SPLIT_MIN_NEURONS,
    RESIDUAL_AUTO,
    SPLIT_SPACES,
    VerifySettings,
)


def _default(name: str) -> Any:
    return default_of(VerifySettings, name)


class _ResidualSize(click.ParamType):
    """--residual: a whole number, or auto."""

    name = "M|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | str:
        if isinstance(value, int) or value == RESIDUAL_AUTO:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not a valid integer or {RESIDUAL_AUTO!r}", param, ctx)


def _print_summary(result: dict) -> None:
    residual = result.get("residual") or {}
    for c, entry in (residual.get("classes") or {}).items():
        level = "none proved" if entry["level"] is None else f"{entry['level']:.6g}"
        click.echo(f"class {c}: level {level} over all but {len(entry['positions'])} networks (checked at query time)")
    choice = result.get("residual_choice")
    if choice is not None:
        click.echo(
            f"--residual auto chose M = {choice['size']} (cap {choice['cap']}): noises "
            f"{100 * choice['noised']:.1f} % of {choice['inputs']} ({choice['count']} inputs) against Naive-iDP's "
            f"{100 * choice['naive_idp']:.1f} %, target {100 * choice['target']:.1f} % "
            + ("met" if choice["met"] else f"missed: M = {choice.get('needed')} would meet it")
            + f"; serves {choice.get('networks_served', 0)} networks"
            + (
                " (the run has no more networks than the cap: every one may be checked, as Naive-iDP does)"
                if choice.get("every_network")
                else ""
            )
        )
    for c, b in result["bounds"].items():
        upper = (
            "none proved (every input of this class is noised)"
            if b["upper"] is None
            else ("-inf (no input can leak)" if b["upper"] == -1.0 and b["lower"] is None else f"{b['upper']:.6g}")
        )
        lower = "-" if b["lower"] is None else f"{b['lower']:.6g}"
        state = (
            "complete"
            if b["complete"]
            else f"stopped: {b.get('reason', '')}" + (f" in {b['stopped_in']}" if b.get("stopped_in") else "")
        )
        click.echo(f"class {c}: upper {upper}  lower {lower}  ({state}, {b['nodes']} nodes, {b['seconds']:.1f}s)")


@click.command("verify", help="Compute per-class iDP decision bounds (branch-and-bound over hyper-networks).")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "--solver",
    default=_default("solver"),
    show_default=True,
    help="MILP backend: highs, gurobi, cbc, scip or auto; A+B cross-checks every node with both and keeps the "
    "larger proved bound.",
)
@click.option(
    "--workers", type=int, default=_default("workers"), help="Parallel node MILPs (default: number of cores)."
)
@click.option(
    "--time-limit",
    type=float,
    default=_default("time_limit"),
    help="Total seconds (anytime bounds are reported when it ends).",
)
@click.option(
    "--node-time-limit",
    type=float,
    default=_default("node_time_limit"),
    help="Seconds per node MILP (default with --time-limit: an eighth of it, at least 20 s; without: none). "
    "A node that hits it keeps its proved bound and is split.",
)
@click.option("--classes", default=_default("classes"), help="Comma-separated class ids, e.g. 0,1 (default: all).")
@click.option("--tau", type=float, default=_default("tau"), show_default=True, help="Relax-if-similar threshold.")
@click.option("--gap", type=float, default=_default("gap"), show_default=True, help="Stop when upper - lower <= GAP.")
@click.option(
    "--rel-gap",
    type=float,
    default=_default("rel_gap"),
    show_default=True,
    help="Stop when upper <= lower + REL_GAP * |lower| (0.1: within 10 per cent). Nodes then only have to be "
    "proved below that level, which is far cheaper than exact bounds.",
)
@click.option("--resume", is_flag=True, help="Continue from RUN/verify.checkpoint.json.")
@click.option(
    "--scheduler", default=_default("scheduler"), help="Dask scheduler address (tcp://host:8786) to solve nodes on."
)
@click.option("--no-md", is_flag=True, help="Ablation: no matching dependencies.")
@click.option("--no-ris", is_flag=True, help="Ablation: no relax-if-similar.")
@click.option("--no-bab", is_flag=True, help="Ablation: one hyper-network of all networks (paper's H/HM).")
@click.option("--naive", is_flag=True, help="Ablation: one MILP per network (paper's Naive).")
@click.option(
    "--screen",
    default=None,
    help="How each network is screened before any MILP: none, interval, symbolic or optimised "
    f"(default: {DEFAULT_SCREEN}; all are sound, tighter ones leave fewer networks to the MILPs).",
)
@click.option("--no-screen", is_flag=True, help="Ablation: the same as --screen none.")
@click.option(
    "--device",
    default=_default("device"),
    show_default=True,
    help="Where the symbolic screen and the ReLU-splitting tier run: cpu or cuda.",
)
@click.option("--no-search", is_flag=True, help="Ablation: no heuristic witness search for the lower bound.")
@click.option(
    "--split-time",
    type=float,
    default=_default("split_time"),
    show_default=True,
    help="Seconds of ReLU-splitting branch and bound per single network before its MILP (at most half "
    "the node's limit; 0: off). It proves most networks below the cutoff long before a MILP would.",
)
@click.option(
    "--split-race/--split-then-milp",
    default=_default("split_race"),
    show_default=True,
    help="A single network's splitting tier and MILP side by side, the first to settle it stopping the "
    "other, or the split first and the MILP after it.",
)
@click.option(
    "--split-space",
    type=click.Choice(list(SPLIT_SPACES)),
    default=_default("split_space"),
    show_default=True,
    help="What the splitting tier splits: relu (neurons), input (the input box) or auto (input for networks "
    f"with at most {INPUT_SPLIT_MAX_DIM} inputs and {INPUT_SPLIT_MIN_NEURONS} hidden neurons per input, "
    "else relu).",
)
@click.option(
    "--bounds",
    type=click.Choice(["lp", "interval"]),
    default=_default("bounds"),
    show_default=True,
    help="How N's pre-activation bounds are computed.",
)
@click.option(
    "--hyper",
    default=_default("hyper"),
    show_default=True,
    help="What is verified: loo (the run's leave-one-out networks, branch-and-bound) or agt:K (every "
    "network within K removed rows, one MILP per class over the AGT box of `lucid train --agt`).",
)
@click.option(
    "--regions",
    type=int,
    default=_default("regions"),
    show_default=True,
    help="Up to K boxes of the domain, each with its own bounds: inputs are noised only where their box "
    "can leak (1: one bound per class). --time-limit bounds the whole run.",
)
@click.option(
    "--public-inputs",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="An .npz with an array X of public inputs (the data's units) that weighs where --regions cuts "
    "(default: uniform samples of the domain), or on which --residual auto measures the noised share "
    "(default: the test split). Never the training rows.",
)
@click.option(
    "--residual",
    type=_ResidualSize(),
    default=_default("residual"),
    show_default=True,
    help="M: per class, the M networks with the largest proven bounds are checked at query time (the "
    "residual check) and the level, the (M+1)-th largest bound, covers the others; an input is "
    "released when its confidence is above that level and those M networks agree with N. 0: one bound "
    "over every network; |D|: every network checked (Naive-iDP); auto: the smallest M up to "
    "--max-residual that noises at most max(2x, +2 points) of Naive-iDP's share of the test split "
    "(or of --public-inputs). Which M pays: docs/verification.md.",
)
@click.option(
    "--max-residual",
    type=int,
    default=None,
    help=f"With --residual auto: the most networks per class a deployment may serve (default {DEFAULT_MAX_RESIDUAL}).",
)
@click.option("--quiet", is_flag=True, help="No live progress display.")
def command(
    run_dir,
    solver,
    workers,
    time_limit,
    node_time_limit,
    classes,
    tau,
    gap,
    rel_gap,
    resume,
    scheduler,
    no_md,
    no_ris,
    no_bab,
    naive,
    screen,
    no_screen,
    device,
    no_search,
    split_time,
    split_race,
    split_space,
    bounds,
    hyper,
    regions,
    public_inputs,
    residual,
    max_residual,
    quiet,
) -> None:
    from lucid.errors import LucidError
    from lucid.verify import verify_run

    if no_screen and screen not in (None, "none"):
        raise LucidError(f"--no-screen and --screen {screen} contradict each other; give one")
    screen = "none" if no_screen else (screen or DEFAULT_SCREEN)

    settings = VerifySettings(
        solver=solver,
        workers=workers,
        time_limit=time_limit,
        node_time_limit=node_time_limit,
        classes=classes,
        tau=tau,
        gap=gap,
        rel_gap=rel_gap,
        md=not no_md,
        ris=not no_ris,
        bab=not no_bab,
        naive=naive,
        resume=resume,
        scheduler=scheduler,
        progress=not quiet,
        screen=screen,
        device=device,
        search=not no_search,
        split_time=split_time,
        split_race=split_race,
        split_space=split_space,
        bounds=bounds,
        hyper=hyper,
        regions=regions,
        public_inputs=public_inputs,
        residual=residual,
        max_residual=max_residual,
    )
    result = verify_run(run_dir, settings)
    _print_summary(result)
    if "regions" in result:
        click.echo(f"{result['regions']['leaves']} regions (`lucid log {run_dir}` lists each box's bounds)")
