"""`LabelOnlyClassifier`: the deployable, label-only, iDP-protected view of a trained run.

    clf = LabelOnlyClassifier.from_run("runs/crypto", epsilon=1.0, memo="memo.sqlite")
    clf.predict(X)          # X in the data's original units -> labels in original label values

Only N (position 0 of the run's network stack) is loaded, in float64 - the same arithmetic
the verifier used - and kept as plain numpy matrices so a query costs a few small matmuls.

Inputs are validated (2-D, numeric, finite, right width), scaled with the run's affine scaler
(x_net = (x - offset) * scale) and must lie in the verified domain, which run.json states in
network space: the bounds say nothing outside it. With the `clip` option they are clipped into the
box instead (sound: the answer is then the answer for a verified point).

Memo key (documented choice): the canonical float64 bytes of the point N is evaluated at, i.e.
after scaling and clipping. The mechanism's output distribution is a function of that point
only, so every input that reaches it must share one stored draw; keying on the raw input would
let an attacker collect fresh draws for one network input by sending many raw inputs that clip
(or, through float rounding or a zero scale, scale) to the same point, and average them.

Constant work per row: whether a row is released or noised is the bit (confidence <= beta_c)
that the iDP guarantee does not cover, and it differs between D and D minus one row. So every
row takes the same path: N's scores and its box's threshold, one memo read for every row, and
for every row the memo does not hold yet one mechanism draw (also for rows that will be
released), a branch-free select between N's label and the draw, and one memo write plus ledger
charge (released answers are memoised too). A memo hit draws nothing, whatever its branch.
Time, memo hits and misses, draws, ledger writes and budget refusals therefore depend on which
inputs were asked, not on the branch. Only the label value differs, and the label is what the
client receives anyway.
`min_response_ms`, a minimum response time, additionally holds every `predict`/`predict_index`
call (answer or error) until that long after it started, for callers who want any residual
difference (memo hits, batch size, machine noise) under one fixed time; `lucid serve
--min-response-ms` does the same per request.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lucid.access.guard import check_min_response_ms
from lucid.access.ledger import (
    DEFAULT_CLIENT,
    DEFAULT_DELTA,
    ClientTotals,
    check_budget,
    check_client_name,
    check_total_budget,
    summarise,
)
from lucid.access.mechanism import RandomSource, check_epsilon, exponential_mechanism
from lucid.access.memo import DEFAULT_MEMO_SIZE, BoundsRecord, Charge, MemoStore, Turn, open_memo, read_memo_ledger
from lucid.access.release_rule import ClassBounds, ReleaseRule, from_bounds
from lucid.access.residual_check import ResidualCheck
from lucid.access.served_run import load_bounds, load_n
from lucid.analysis.soundness import confidence_error, release_thresholds
from lucid.dynamic_range import check_network_range
from lucid.errors import LucidError
from lucid.network import NetworkFile
from lucid.regions import RegionTree
from lucid.regions.lookup import RegionLookup
from lucid.rundir import Run, open_run, read_scaler

# Inputs this close (relative) outside the box are rounding noise from scaling: clip them in.
_DOMAIN_TOLERANCE = 1e-9


def run_ledger(run: Run, memo: str | Path, delta: float = DEFAULT_DELTA) -> list[ClientTotals]:
    """The privacy ledger of a memo that served this run (checked to be N's), one total per client:
    what `lucid budget` prints and `lucid report` shows."""
    return summarise(read_memo_ledger(memo, load_n(run)[2]), delta)


def _hold_until(until: float) -> None:
    """Return at `until` (perf_counter seconds): sleep most of the wait, spin the last
    millisecond, because a sleep alone overshoots by a scheduler tick that varies."""
    left = until - time.perf_counter()
    if left > 0.002:
        time.sleep(left - 0.001)
    while time.perf_counter() < until:
        pass


@dataclass(frozen=True)
class ClassifierOptions:
    """How a classifier answers, besides its run, epsilon and memo: `clip` inputs outside the verified
    domain into it (else refuse them); `seed` the mechanism's draws (None: fresh entropy); `memo_size`
    the most inputs a memo it opens keeps; `budget` the most epsilon one client may be charged and
    `total_budget` all clients together (None: no limit; a query that would exceed one raises
    BudgetExceeded); `min_response_ms` (module docstring)."""

    clip: bool = False
    seed: int | None = None
    memo_size: int = DEFAULT_MEMO_SIZE
    budget: float | None = None
    total_budget: float | None = None
    min_response_ms: float = 0.0


class LabelOnlyClassifier:
    """Label-only access to N with iDP protection (see the module docstring)."""

    def __init__(
        self,
        run: Run,
        epsilon: float,
        memo: str | Path | MemoStore | None = None,
        options: ClassifierOptions | None = None,
    ) -> None:
        options = ClassifierOptions() if options is None else options
        self.run = run
        self.epsilon = check_epsilon(epsilon)
        self.budget = check_budget(options.budget)
        self.total_budget = check_total_budget(options.total_budget)
        self.min_response = check_min_response_ms(options.min_response_ms) / 1e3  # seconds; 0: off
        self.clip = bool(options.clip)
        self.rng = RandomSource(options.seed)
        self.num_classes = run.num_classes
        self.input_dim = run.input_dim
        self.labels: list[Any] = list(run.meta["labels"])
        if len(self.labels) != self.num_classes:
            raise LucidError(f"run.json lists {len(self.labels)} labels for {self.num_classes} classes")
        self.classes_ = np.asarray(self.labels)
        self.bounds, regions, residual = load_bounds(run)
        # A diverged leave-one-out network voids every bound: refuse the run (the whole file, streamed;
        # `lucid budget` and `lucid report` only need N's fingerprint from load_n and skip this).
        NetworkFile(run.path, run.meta).check_finite()
        self._weights, self._biases, self.fingerprint = load_n(run)
        if self._weights[0].shape[0] != self.input_dim or self._weights[-1].shape[1] != self.num_classes:
            raise LucidError("networks.safetensors does not match run.json's input_dim / num_classes")
        self.offset, self.scale = read_scaler(run)
        lower, upper = run.domain
        if lower.shape != (self.input_dim,) or upper.shape != (self.input_dim,) or (lower > upper).any():
            raise LucidError("run.json: the domain must have lower <= upper, one entry per feature")
        self.domain_lower, self.domain_upper = lower, upper
        check_network_range([w.T for w in self._weights], self._biases, lower, upper, f"{run.path}: N")
        # Released only above max(beta_c, 0) + E_N (lucid.analysis.soundness): beta_c is about exact
        # arithmetic, N's confidence here is float64.
        self.confidence_error = confidence_error([w.T for w in self._weights], self._biases, lower, upper)
        self.thresholds = release_thresholds(self.bounds, self.confidence_error)
        # Which rule answers (beta_c, per box, residual levels, or both): decided once, here.
        self.release_rule: ReleaseRule = from_bounds(
            self.bounds, regions, residual, self.confidence_error, lower, upper, str(run.path)
        )
        slack = _DOMAIN_TOLERANCE * np.maximum(1.0, np.maximum(np.abs(lower), np.abs(upper)))
        self._lower_tol, self._upper_tol = lower - slack, upper + slack
        # The memo records the epsilon and bounds of its draws and refuses others (memo/metadata.py).
        self.memo: MemoStore = (
            memo.bind(self.epsilon, self.release_rule.served, self.fingerprint)
            if isinstance(memo, MemoStore)
            else open_memo(
                memo,
                max_size=options.memo_size,
                fingerprint=self.fingerprint,
                epsilon=self.epsilon,
                bounds=self.release_rule.served,
            )
        )

    @classmethod
    def from_run(
        cls,
        path: str | Path,
        epsilon: float,
        memo: str | Path | MemoStore | None = None,
        options: ClassifierOptions | None = None,
    ) -> LabelOnlyClassifier:
        """Open a run directory. `memo`: a SQLite file path (persistent; use one in production), a
        `postgresql://` URL (a database several replicas share), an open memo (`Memo`,
        `PostgresMemo`), or None for an in-memory memo that is lost when the process exits.
        `options`: see ClassifierOptions; the budgets are charged as lucid.access.ledger says (the
        total budget in the ledger's '*' row: epsilon per memo draw given to any client)."""
        return cls(open_run(path), epsilon, memo, options)

    # -- validation -------------------------------------------------------------------------
    def validate(self, X: Any) -> np.ndarray:
        """Raw queries -> float64 [B, d] in original units, or a LucidError saying what is wrong."""
        if isinstance(X, np.ndarray) and X.dtype.kind in "iuf":
            arr = X
        else:
            try:
                arr = np.asarray(X)
            except (ValueError, TypeError, OverflowError):
                raise LucidError("inputs must be a rectangular list of rows of numbers") from None
            if arr.dtype.kind not in "iuf":
                raise LucidError("inputs must contain only numbers")
        if arr.ndim != 2:
            raise LucidError(f"inputs must be a 2-D array [queries, {self.input_dim}], got {arr.ndim}-D")
        if arr.shape[1] != self.input_dim:
            raise LucidError(f"each input must have {self.input_dim} features, got {arr.shape[1]}")
        arr = arr.astype(np.float64, copy=False)
        if not np.isfinite(arr).all():
            raise LucidError("inputs must be finite numbers (no NaN or infinity)")
        return arr

    def to_network_space(self, X: np.ndarray) -> np.ndarray:
        """Scale validated inputs and enforce the verified domain (refuse, or clip with the `clip` option)."""
        with np.errstate(over="ignore", invalid="ignore"):
            xn = (X - self.offset) * self.scale
        if not np.isfinite(xn).all():  # overflow while scaling (|x| near the float limit)
            row = int(np.argwhere(~np.isfinite(xn))[0][0])
            raise LucidError(f"input {row} is far outside the verified domain; the service only answers inside it")
        if not self.clip:
            bad = (xn < self._lower_tol) | (xn > self._upper_tol)
            if bad.any():
                row, col = np.argwhere(bad)[0]
                raise LucidError(
                    f"input {row} is outside the verified domain (feature {col}); the service only answers inside it"
                )
        # Also pulls in-tolerance rounding noise into the box; + 0.0 turns -0.0 into 0.0 so the
        # memo key of a point is unique.
        return np.minimum(np.maximum(xn, self.domain_lower), self.domain_upper) + 0.0

    # -- the mechanism ----------------------------------------------------------------------
    def scores(self, xn: np.ndarray) -> np.ndarray:
        """N's output scores on network-space inputs [B, d] -> [B, C] (float64)."""
        h = xn
        last = len(self._weights) - 1
        for i, (w, b) in enumerate(zip(self._weights, self._biases, strict=True)):
            h = h @ w
            h += b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    def decide(self, xn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N's class, must-noise mask) for in-domain network-space inputs."""
        s = self.scores(xn)
        if self.num_classes == 2:
            cls = (s[:, 1] > s[:, 0]).astype(np.int64)  # argmax's tie rule: first index wins
            conf = np.abs(s[:, 1] - s[:, 0])
        else:
            cls = s.argmax(axis=1)
            top2 = np.partition(s, -2, axis=1)[:, -2:]
            conf = top2[:, 1] - top2[:, 0]  # = score_c - runner-up (0 on ties)
        return cls, self.release_rule.must_noise(xn, cls, conf)

    def predict_network_space(
        self,
        xn: np.ndarray,
        return_noised: bool = False,
        client: str | None = None,
        turn: Turn | None = None,
    ):
        """Class ids for in-domain network-space inputs (evaluate uses this on the test split).

        Every row does the same work whatever its branch (module docstring). `client` names the
        ledger charged (default: the single ledger "default"); with a budget, a batch whose new
        inputs would exceed the client's budget, or the total budget of all clients, raises
        BudgetExceeded and nothing is answered. `turn`: see the memo's `get_or_put` (lucid serve
        passes its decision gate; N's forward pass needs no turn, and the draws for the rows not
        stored yet, microseconds each, are made inside the memo's steps).

        Bounds are read once, at construction: a later, tighter bounds.json (anytime verification
        continuing) takes effect on restart; the older, larger bound stays sound meanwhile.
        """
        cls, noised = self.decide(xn)

        def proposals(rows_to_store: np.ndarray) -> np.ndarray:  # the memo's misses: same work on both branches
            own = cls[rows_to_store]
            drawn = exponential_mechanism(own, self.num_classes, self.epsilon, self.rng)
            return np.where(noised[rows_to_store], drawn, own)

        rows = np.ascontiguousarray(xn, dtype=np.float64) + 0.0  # -0.0 -> 0.0: one key per point
        width = rows.shape[1] * 8
        buf = rows.tobytes()
        keys = [buf[i : i + width] for i in range(0, len(buf), width)]
        client = DEFAULT_CLIENT if client is None else check_client_name(client)
        charge = Charge(client, self.epsilon, self.budget, self.total_budget)
        out = self.memo.get_or_put(keys, proposals, noised=noised, charge=charge, turn=turn)
        return (out, noised) if return_noised else out

    def predict_index(self, X: Any, client: str | None = None) -> np.ndarray:
        """Class ids (0..C-1) for raw queries."""
        if not self.min_response:
            return self.predict_network_space(self.to_network_space(self.validate(X)), client=client)
        started = time.perf_counter()
        try:
            return self.predict_network_space(self.to_network_space(self.validate(X)), client=client)
        finally:
            _hold_until(started + self.min_response)

    def predict(self, X: Any, client: str | None = None) -> np.ndarray:
        """Labels in the data's original label values for a batch of raw queries [B, d]."""
        return self.classes_[self.predict_index(X, client=client)]

    def ledger(self, delta: float | None = None) -> list:
        """The privacy ledger of this classifier's memo: one ClientTotals per client."""
        return summarise(self.memo.ledger_rows(), DEFAULT_DELTA if delta is None else delta)

    @property
    def rule(self) -> str:
        """Which release rule answers: "global" (beta_c), "regions", "residual" or both ("regions+residual")."""
        return self.release_rule.name

    # The release rule's parts, under the names benchmarks and tests read (None where the rule has none).
    @property
    def regions(self) -> RegionTree | None:
        return self.release_rule.regions

    @property
    def residual(self) -> ResidualCheck | None:
        return self.release_rule.residual

    @property
    def _lookup(self) -> RegionLookup | None:
        return self.release_rule.lookup

    @property
    def region_thresholds(self) -> np.ndarray | None:
        return self.release_rule.box_thresholds

    @property
    def residual_levels(self) -> np.ndarray | None:
        return self.release_rule.levels

    @property
    def residual_thresholds(self) -> np.ndarray | None:
        return self.release_rule.level_thresholds

    def with_global_bounds(self) -> LabelOnlyClassifier:
        """The same classifier answering with beta_c alone, without regions or residual check (the
        memo, the mechanism's source and the settings shared): `lucid evaluate`'s side-by-side
        comparison."""
        plain = copy.copy(self)
        plain.release_rule = ClassBounds(self.thresholds, BoundsRecord(self.bounds))
        return plain

    def close(self) -> None:
        self.memo.close()
