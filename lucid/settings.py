"""Option types: `VerifySettings` (every option of one verification) and the encoder's `EncodingOptions`.

The CLI (or `verify_run`'s keyword arguments) builds one frozen `VerifySettings`; the engine, the
workers, the node analysis and the solver calls all read this same object, so an option cannot be
dropped on the way (as `--no-search` once was: the node-level search never saw it). The encoder and
the backends take their own small parameter objects (`EncodingOptions`, `SolverOptions`), and those
are built here and nowhere else. The checkpoint and the log store `result_options()`, and a resume
compares them. Training's options are `lucid.training.settings.TrainSettings`; both are built from
keyword options the same way (`lucid.option_fields`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from lucid.errors import LucidError
from lucid.option_fields import settings_from_options
from lucid.solvers import check_solver_spec
from lucid.solvers.base import SolverOptions

BOUND_METHODS = ("interval", "lp")
# none: every network goes to the MILPs; interval: interval propagation of the differences;
# symbolic: also the input-dependent linear bounds (lucid.bounds.symbolic), the smaller of the two
# per network; optimised: symbolic, then the networks a node is about to solve that are still above
# the class's cutoff get their Lagrange multipliers and ReLU slopes optimised.
SCREENS = ("none", "interval", "symbolic", "optimised")
DEFAULT_SCREEN = "optimised"


def parse_hyper(hyper: Any) -> int:
    """--hyper: "loo" (hyper-networks over the leave-one-out networks) -> 0; "agt:K" (the run's
    AGT parameter box for up to K removed rows, docs/agt.md) -> K >= 1."""
    if hyper == "loo":
        return 0
    text = str(hyper)
    prefix, _, k = text.partition(":")
    if prefix == "agt" and re.fullmatch("[0-9]+", k) and int(k) >= 1:
        return int(k)
    raise LucidError(f"unknown --hyper {text!r}; valid: loo, or agt:K with K a positive whole number of removed rows")


def _check_device(device: str) -> None:
    if device == "cpu":
        return
    if device != "cuda" and not device.startswith("cuda:"):
        raise LucidError(f"unknown device {device!r} (use cpu or cuda)")
    import torch

    if not torch.cuda.is_available():
        raise LucidError(f"--device {device} was requested but CUDA is not available here")


def _positive(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LucidError(f"{name} must be a positive number, got {value!r}")


def _non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise LucidError(f"{name} must be a non-negative number, got {value!r}")


def parse_classes(classes: Any) -> tuple[int, ...] | None:
    """'0,2' / [0, 2] -> (0, 2); None -> None (every class). Ranges are checked by `resolve_classes`."""
    if classes is None:
        return None
    parts = [p.strip() for p in classes.split(",") if p.strip()] if isinstance(classes, str) else list(classes)
    if not parts:
        raise LucidError("--classes is empty")
    out: list[int] = []
    for p in parts:
        try:
            c = int(p)
        except (TypeError, ValueError):
            raise LucidError(f"class {p!r} is not an integer class id") from None
        if c not in out:
            out.append(c)
    return tuple(sorted(out))


SPLIT_TIME = 60.0  # the default --split-time
RESIDUAL_AUTO = "auto"  # --residual auto (lucid/residual_choice.py)
# --max-residual's default: networks per class a deployment serves at most. The query checks the
# union of the sets for every input (equal work), so this bounds its time and memory: on Adult
# 2x50 a single query took 0.09 ms with 32 such networks and 1.1 ms with 1 024 (git show
# 00a0405:benchmarks/results/residual.md), so about 0.3 ms at 256, and 256 x 3 752 float64 parameters (7.7 MB).
DEFAULT_MAX_RESIDUAL = 256
SPLIT_SPACES = ("auto", "relu", "input")
DEFAULT_SPLIT_SPACE = "auto"
# `split_space="auto"` cuts the input box of networks with at most INPUT_SPLIT_MAX_DIM inputs and at
# least INPUT_SPLIT_MIN_NEURONS hidden neurons per input, and splits ReLUs otherwise. At 7 inputs and
# 100-200 neurons (Crypto) cutting the box proves networks the ReLU split and the MILPs leave open; at
# 21 inputs (Adult) its boxes multiply faster than their bounds fall
# (benchmarks/results/hard_singletons.md); a network with few neurons is cheaper to split by its
# ReLUs (the test suite's 2-input networks of 8-16 neurons took about twice as long with boxes).
INPUT_SPLIT_MAX_DIM = 12
INPUT_SPLIT_MIN_NEURONS = 10


def split_space_for(split_space: str, input_dim: int, hidden_neurons: int) -> str:
    """ "relu" or "input": `split_space`, with "auto" decided for a network of this shape."""
    if split_space != "auto":
        return split_space
    cut_box = input_dim <= INPUT_SPLIT_MAX_DIM and hidden_neurons >= INPUT_SPLIT_MIN_NEURONS * input_dim
    return "input" if cut_box else "relu"


@dataclass
class EncodingOptions:
    """Switches of the encoder (every technique can be turned off for the ablation).

    md / md_pre: matching dependencies z + dl <= z# <= z + du after / before the ReLU.
    coupling: relational matching dependencies: z# - z tied to zhat# - zhat through ReLU's
      monotonicity and 1-Lipschitz continuity (lucid.milp.matching.add_relu_coupling).
    ris / tau: relax-if-similar: an unstable hyper neuron whose pre-activation difference
      interval is at most tau wide gets the triangle relaxation instead of a binary (never for a
      singleton, which stays exact).
    bounds: how N's pre-activation bounds are computed ("interval" or "lp").
    disjunction: the output disjunction "some class t beats c in N#" for C > 2: "bigm" (one
      binary per target class, paper 3c) or "split" (one sub-problem per target, max of bounds).
    search: look for a leaking input without a solver first; its replayed confidence LB is a
      true lower bound, so the MILP is restricted to beta >= LB (optimum unchanged).
    symbolic: the node's difference intervals are also bounded by the symbolic (input-dependent)
      pass of `lucid.bounds.symbolic` for each of its networks, hulled and intersected with the
      interval ones: tighter matching dependencies, smaller big-M constants, more relax-if-similar.
    obbt: node-specific bound tightening over the node's own LP relaxation (lucid.bounds.obbt),
      after a probe solve of `obbt_probe` seconds that supplies a replayed lower bound:
      True (every node), False (none) or "singletons" (nodes of one network, the default).
      Tighter neuron bounds mean smaller big-M constants and fewer unstable binaries, which is
      what lets a solver close a singleton's exact bound; on large hyper-networks the LPs cost
      more and move the loose interval weights' bounds little, so the time is better spent in
      the MILP (benchmarks/milp_core.py).
    """

    md: bool = True
    md_pre: bool = True
    coupling: bool = True
    ris: bool = True
    tau: float = 0.01
    bounds: str = "lp"
    symbolic: bool = False
    disjunction: str = "bigm"  # one tree shared by all targets; "split" solves one MILP per target
    obbt: bool | str = "singletons"
    search: bool = True  # solver-free witness search first (lucid.witness.search.search_node_witness)
    obbt_probe: float = 5.0
    obbt_share: float = 0.5  # at most this share of the node's time limit goes to tightening


@dataclass(frozen=True)
class VerifySettings:
    """One verification's options (the `lucid verify` flags, and the encoder's fixed knobs).

    solver: a backend name, `auto`, or names joined by '+' (cross-check every node).
    workers / scheduler: parallel node analyses, locally or on a Dask scheduler.
    time_limit: seconds for this invocation; node_time_limit: per node MILP (None: derived).
    classes: the classes to verify (None: all).
    gap / rel_gap: a class stops when upper - lower <= max(gap, rel_gap * |lower|).
    md / ris / tau: matching dependencies (also the ReLU coupling), relax-if-similar and its width.
    bab / naive: False / True are the paper's ablations (one hyper-network; one MILP per network).
    screen: how every single network's bound is screened before any MILP (`SCREENS`; True / False
        are the default / "none"); device: where the symbolic screen's tensors live (cpu, cuda).
    search: the solver-free witness search (root and nodes).
    split_time: seconds of ReLU-splitting branch and bound a singleton gets before its MILP under a
        cutoff (`lucid.bounds.relu_split`; `lucid.analysis.time_shares.NodeTimeShares`: more on retries, at most half
        the node's limit); 0 turns it off (the MILP alone, as `--naive` always does).
    split_race: a singleton's splitting tier and MILP run side by side, each for the attempt's whole
        limit, and the first to settle the node stops the other (`lucid.analysis.analyse._raced`),
        instead of the split first and the MILP after it. The last work of a verification, which
        gets the idle workers' threads, races on them either way.
    split_space: what the splitting tier splits: "relu" (neurons, `lucid.bounds.relu_split`), "input"
        (the input box, `lucid.bounds.input_split`) or "auto" (input for networks with at most
        INPUT_SPLIT_MAX_DIM inputs and INPUT_SPLIT_MIN_NEURONS hidden neurons per input, else relu).
    bounds: how N's pre-activation bounds are computed ("lp" or "interval").
    disjunction, obbt, obbt_probe, obbt_share: the encoder's fixed knobs (see `EncodingOptions`).
    seed: k-means' random state when a node is split.
    hyper: what the verified networks are: "loo" (the run's leave-one-out networks, by
        branch-and-bound over their hyper-networks) or "agt:K" (every network within K removed
        rows, through the run's AGT box: one MILP per class, `lucid.analysis.agt_box`).
    regions: up to this many boxes of the domain get their own bounds (`lucid.verify.regions`; 1: one
        bound per class); public_inputs: an .npz of public inputs that weighs where boxes are cut.
    residual: M, the size of each class's residual set (`lucid.residual`): the M networks with the
        largest proven bounds are checked at query time, and the level L_c, the (M+1)-th largest
        bound, covers the others (`lucid.bab.order_statistic`); with regions, per box
        (`lucid.regions.one_box`); 0: one bound over every network; "auto": the smallest M up to
        `max_residual` whose rule meets the noised-share target (`lucid.residual_choice`).
    max_residual: with residual "auto", the most networks per class a deployment may serve.
    """

    solver: str = "highs"
    workers: int | None = None
    scheduler: Any = None
    time_limit: float | None = None
    node_time_limit: float | None = None
    classes: tuple[int, ...] | None = None
    tau: float = 0.01
    gap: float = 0.0
    rel_gap: float = 0.0
    md: bool = True
    ris: bool = True
    bab: bool = True
    naive: bool = False
    screen: str | bool = "optimised"
    device: str = "cpu"
    search: bool = True
    split_time: float = SPLIT_TIME
    split_race: bool = False
    split_space: str = DEFAULT_SPLIT_SPACE
    bounds: str = "lp"
    resume: bool = False
    progress: bool = True
    disjunction: str = "bigm"
    obbt: bool | str = "singletons"
    obbt_probe: float = 5.0
    obbt_share: float = 0.5
    seed: int = 0
    hyper: str = "loo"
    regions: int = 1
    public_inputs: str | None = None
    residual: int | str = 0
    max_residual: int | None = None

    def __post_init__(self) -> None:
        _positive("--time-limit", self.time_limit)
        _positive("--node-time-limit", self.node_time_limit)
        _positive("--workers", self.workers)
        if self.workers is not None and int(self.workers) != self.workers:
            raise LucidError(f"--workers must be a whole number, got {self.workers!r}")
        _non_negative("--tau", self.tau)
        _non_negative("--gap", self.gap)
        _non_negative("--rel-gap", self.rel_gap)
        _non_negative("--split-time", self.split_time)
        if self.naive and not self.bab:
            raise LucidError("--naive and --no-bab are different variants; give at most one")
        if self.bounds not in BOUND_METHODS:
            raise LucidError(f"unknown bound method {self.bounds!r}; valid: {', '.join(BOUND_METHODS)}")
        if isinstance(self.screen, bool):  # the API's historical on/off switch
            object.__setattr__(self, "screen", DEFAULT_SCREEN if self.screen else "none")
        if self.screen not in SCREENS:
            raise LucidError(f"unknown screen {self.screen!r}; valid: {', '.join(SCREENS)}")
        _check_device(self.device)
        if self.disjunction not in ("bigm", "split"):
            raise LucidError(f"unknown disjunction {self.disjunction!r}; valid: bigm, split")
        if self.split_space not in SPLIT_SPACES:
            raise LucidError(f"unknown split space {self.split_space!r}; valid: {', '.join(SPLIT_SPACES)}")
        object.__setattr__(self, "classes", parse_classes(self.classes))
        for name in ("time_limit", "node_time_limit", "tau", "gap", "rel_gap", "split_time"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        if self.workers is not None:
            object.__setattr__(self, "workers", int(self.workers))
        self._check_regions()
        self._check_residual()
        object.__setattr__(self, "hyper", f"agt:{self.removals}" if self.removals else "loo")
        if self.removals:
            self._check_box_mode()
        check_solver_spec(self.solver)

    def _check_box_mode(self) -> None:
        """Options of the branch-and-bound that a box verification (one MILP per class) has no use for."""
        unused = [
            flag
            for flag, on in (
                ("--resume", self.resume),
                ("--naive", self.naive),
                ("--no-bab", not self.bab),
                ("--gap", self.gap > 0),
                ("--rel-gap", self.rel_gap > 0),
                ("--scheduler", self.scheduler is not None),
                # the box MILP has no member networks to screen
                (f"--screen {self.screen}", self.screen != DEFAULT_SCREEN),
                ("--split-time", self.split_time != SPLIT_TIME),
                (f"--split-space {self.split_space}", self.split_space != DEFAULT_SPLIT_SPACE),
                (f"--device {self.device}", self.device != "cpu"),
            )
            if on
        ]
        if unused:
            raise LucidError(
                f"{', '.join(unused)} cannot be combined with --hyper {self.hyper} "
                "(one MILP per class over the AGT box: no branch-and-bound, no checkpoint)"
            )

    def _check_regions(self) -> None:
        if isinstance(self.regions, bool) or not isinstance(self.regions, int) or self.regions < 1:
            raise LucidError(f"--regions must be a whole number >= 1, got {self.regions!r}")
        if self.public_inputs is not None:
            object.__setattr__(self, "public_inputs", str(self.public_inputs))
        if self.regions == 1:
            if self.public_inputs is not None and self.residual != RESIDUAL_AUTO:
                raise LucidError(
                    "--public-inputs only weighs the boxes of --regions K (K > 1) or measures --residual auto"
                )
            return
        unused = [
            flag
            for flag, on in (
                ("--scheduler", self.scheduler is not None),
                ("--naive", self.naive),
                ("--no-bab", not self.bab),
                (f"--hyper {self.hyper}", self.removals > 0),
            )
            if on
        ]
        if unused:
            raise LucidError(f"{', '.join(unused)} cannot be combined with --regions (yet)")

    def _check_residual(self) -> None:
        if self.residual != RESIDUAL_AUTO and (
            isinstance(self.residual, bool) or not isinstance(self.residual, int) or self.residual < 0
        ):
            raise LucidError(f"--residual must be a whole number >= 0 or auto, got {self.residual!r}")
        if self.max_residual is not None:
            if isinstance(self.max_residual, bool) or not isinstance(self.max_residual, int) or self.max_residual < 1:
                raise LucidError(f"--max-residual must be a whole number >= 1, got {self.max_residual!r}")
            if self.residual != RESIDUAL_AUTO:
                raise LucidError("--max-residual caps --residual auto only; give --residual auto or drop it")
        if self.residual == 0:
            return
        if self.residual == RESIDUAL_AUTO and self.regions > 1:
            raise LucidError("--residual auto cannot be combined with --regions (yet): give --residual M")
        unused = [
            flag
            for flag, on in (
                (f"--hyper {self.hyper}", self.removals > 0),
                ("--screen none", self.screen == "none"),
                ("--naive", self.naive),
            )
            if on
        ]
        if unused:
            # the residual set is ranked by the screen; AGT's box bounds no single network
            raise LucidError(f"{', '.join(unused)} cannot be combined with --residual")

    def residual_size(self, networks: int) -> int:
        """M to start from for a run of `networks` leave-one-out networks: the given M, or with
        "auto" the cap (every network when there are fewer: then the rule may become Naive-iDP)."""
        if self.residual == RESIDUAL_AUTO:
            return min(self.max_residual or DEFAULT_MAX_RESIDUAL, networks)
        return int(self.residual)

    @property
    def removals(self) -> int:
        """K of --hyper agt:K; 0 for the leave-one-out verification."""
        return parse_hyper(self.hyper)

    @classmethod
    def from_options(cls, **options: Any) -> VerifySettings:
        """From keyword options; an unknown name is one error line, not a TypeError."""
        return settings_from_options(cls, "verify", options)

    # --- what the parts of the verifier read ------------------------------------------------------
    def resolve_classes(self, num_classes: int) -> list[int]:
        """The classes to verify, checked against the run's class count."""
        if self.classes is None:
            return list(range(num_classes))
        for c in self.classes:
            if not 0 <= c < num_classes:
                raise LucidError(f"unknown class {c}: this run has classes 0..{num_classes - 1}")
        return list(self.classes)

    @property
    def keep_trees(self) -> bool:
        """A singleton retry's solver tree is kept in its worker (`lucid.analysis.kept_trees`), except on
        Dask, which decides itself where a task runs."""
        return self.scheduler is None

    @property
    def targeted_search(self) -> bool:
        """A small node whose MILP ends without a witness gets a search aimed at its networks."""
        return self.search and not self.naive

    def encoding_options(self) -> EncodingOptions:
        """The encoder's switches (md also switches the ReLU coupling, as `--no-md` documents)."""
        return EncodingOptions(
            md=self.md,
            md_pre=self.md,
            coupling=self.md,
            ris=self.ris,
            tau=self.tau,
            disjunction=self.disjunction,
            obbt=self.obbt,
            search=self.search,
            symbolic=self.screen in ("symbolic", "optimised"),
            obbt_probe=self.obbt_probe,
            obbt_share=self.obbt_share,
        )

    def solver_options(self, time_limit: float | None, threads: int = 1) -> SolverOptions:
        """One node solve's options: exact MIP gaps (LUCID's tolerance is applied by the engine)."""
        return SolverOptions(time_limit=time_limit, threads=int(threads), mip_rel_gap=0.0, mip_abs_gap=0.0)

    def result_options(self, classes: list[int]) -> dict:
        """The options that determine the result: a resume must use the same ones."""
        return {
            "solver": self.solver,
            "tau": self.tau,
            "gap": self.gap,
            "rel_gap": self.rel_gap,
            "md": self.md,
            "ris": self.ris,
            "bab": self.bab,
            "naive": self.naive,
            "screen": self.screen,
            "search": self.search,
            "bounds": self.bounds,
            "node_time_limit": self.node_time_limit,
            "classes": list(classes),
            "hyper": self.hyper,
            "regions": self.regions,
            "public_inputs": self.public_inputs,
            # only when set, so that checkpoints written before the option still resume
            **({"residual": self.residual} if self.residual else {}),
            **({"max_residual": self.max_residual} if self.max_residual is not None else {}),
        }

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: it deep-copies a Client
        out["scheduler"] = None if self.scheduler is None else str(self.scheduler)
        out["classes"] = None if self.classes is None else list(self.classes)
        return out
