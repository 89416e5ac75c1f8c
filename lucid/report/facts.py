"""The facts a report states, as typed, frozen records.

A report is only as trustworthy as the numbers in it, so they are gathered once
(`lucid.report.gather`) into these immutable records and every renderer (HTML, Markdown, the
figures) reads the same objects: the two formats cannot disagree, and tests can compare a rendered
number with the record it came from. Nothing here reads files or computes anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TrainingFacts:
    """The data and the training algorithm T as recorded in run.json (what the guarantee is about)."""

    data_source: str
    train_size: int
    test_size: int
    input_dim: int
    num_classes: int
    labels: tuple[Any, ...]
    architecture: str
    algorithm: str
    epochs: int | None
    lr: float | None
    weight_decay: float | None
    batch_size: int | None
    seed: int | None
    networks: int  # N plus the leave-one-out networks stored in networks.safetensors
    fingerprint: str | None
    fine_tuned_from: str | None  # sha256 of the pre-trained start (T's fine-tuning variant)
    trainable_layers: tuple[int, ...] | None
    agt_max_k: int | None
    domain_lower: tuple[float, ...]  # verified box in the data's original units
    domain_upper: tuple[float, ...]
    feature_names: tuple[str, ...]
    domain_from_data: bool | None  # True: the box looks min-max fitted to the data (reveals extremes)
    # an imported run's training as its manifest named it: (name, version, description); None otherwise
    external: tuple[str, str, str] | None = None
    domain_given: bool = False  # the box was given by the run's owner (an imported run's manifest domain)

    @property
    def loo_networks(self) -> int:
        return max(0, self.networks - 1)


@dataclass(frozen=True)
class ClassLog:
    """What the verification log adds to bounds.json for one class (read by the CLI layer,
    which alone may import the engine's log reader)."""

    solved: int
    split: int
    closed: int
    node_seconds_total: float
    node_seconds_max: float
    statuses: tuple[tuple[str, int], ...]
    curve: tuple[tuple[float, float | None, float | None], ...]  # (t, lower, upper) anytime updates


@dataclass(frozen=True)
class ClassBound:
    """One class's entry of bounds.json (lucid-bounds/1), plus its log summary if a log exists."""

    cls: int
    label: Any
    upper: float | None  # None: nothing proved (every input of the class is noised)
    lower: float | None  # None: no replayed leak
    complete: bool
    exact: bool | None  # None: bounds.json predates the field
    reason: str | None
    seconds: float | None
    nodes: int | None
    leaking_row: int | None
    removals: int  # 1: leave-one-out (iDP); K: group iDP over an AGT box of K removals
    log: ClassLog | None

    @property
    def ratio(self) -> float | None:
        """upper / lower, the tightness benchmarks report (None if undefined)."""
        if self.upper is None or self.lower is None or self.lower <= 0 or not math.isfinite(self.lower):
            return None
        return self.upper / self.lower

    @property
    def status(self) -> str:
        """One phrase a reviewer can read: was this class's bound proved, and how far."""
        if self.upper is None:
            return "nothing proved: every input of this class is noised"
        if self.complete and self.exact:
            return "proved, exact"
        if self.complete and self.exact is None:
            return "proved, complete"
        if self.complete:
            return "proved, within the requested gap"
        return f"proved upper bound, {self.reason or 'stopped'} (not tight)"


@dataclass(frozen=True)
class VerificationFacts:
    solver: str
    hyper: str
    options: tuple[tuple[str, Any], ...]
    classes: tuple[ClassBound, ...]
    log_present: bool
    regions: int = 1  # leaves of `lucid verify --regions K` (1: one bound per class)
    residual: int = 0  # M of `lucid verify --residual M` (0: no residual check)
    levels: tuple[tuple[int, float | None, int], ...] = ()  # per class: (class, L_c, networks in R_c)
    members: tuple[tuple[int, tuple[int, ...], tuple[float | None, ...]], ...] = ()  # per class: (class, rows, bounds)
    choice: Mapping[str, Any] | None = None  # --residual auto: bounds.json's residual_choice


@dataclass(frozen=True)
class EvaluationFacts:
    """`lucid evaluate`'s result (its JSON, unchanged) and the per-input data behind Figure 6."""

    epsilons: tuple[str, ...]
    seed: int | None
    result: Mapping[str, Any]  # exactly evaluate_run's JSON result
    confidence: np.ndarray  # N's confidence (top score - runner-up) per test input
    predicted: np.ndarray  # N's class per test input
    noised: np.ndarray  # per test input: did the access layer noise it (its own decision, not recomputed)
    betas: tuple[float, ...]  # beta_c used by the access layer (+inf: nothing proved); with residual sets, L_c
    released_but_leaking: int  # > 0 means bounds.json is contradicted by a concrete input
    bound_name: str = "iDP-DB"  # "level" when the rule compares with the residual levels


@dataclass(frozen=True)
class BaselineRow:
    method: str
    epsilon: float | None
    accuracy: float | None
    status: str
    message: str


@dataclass(frozen=True)
class BaselineFacts:
    source: str
    rows: tuple[BaselineRow, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.method for r in self.rows if r.epsilon is not None))

    def at(self, method: str, epsilon: float) -> BaselineRow | None:
        for r in self.rows:
            if (
                r.method == method
                and r.epsilon is not None
                and math.isclose(r.epsilon, epsilon, rel_tol=1e-9, abs_tol=1e-12)
            ):
                return r
        return None


@dataclass(frozen=True)
class LedgerRow:
    client: str  # "*" is the memo's own draws (all clients together)
    answers: int
    noised: int
    refused: int
    charged: float
    spent: float
    spent_tight: float


@dataclass(frozen=True)
class LedgerFacts:
    memo: str
    delta: float
    rows: tuple[LedgerRow, ...]


@dataclass(frozen=True)
class ReportFacts:
    run: str
    generated: str  # ISO timestamp (UTC)
    lucid_version: str
    training: TrainingFacts
    verification: VerificationFacts
    evaluation: EvaluationFacts | None  # None: the run has no test split
    evaluation_note: str
    baselines: BaselineFacts | None  # None: no baseline results found
    baselines_note: str
    ledger: LedgerFacts | None  # None: the run has not been served (no memo)
    ledger_note: str
