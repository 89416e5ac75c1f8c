"""Privacy accounting across queries: what each client has been given, and a budget.

Each answer is one run of LUCID-Inference: N's label (released, 0-iDP: the verifier proved that
no single training row changes it) or an exponential-mechanism draw (noised, epsilon-iDP). A
client's answers compose. The ledger (tables `seen` and `ledger` of the memo's database, written
by `Memo.get_or_put` in the same transaction as the answers; its SQL is in
lucid/access/memo/budget.py, and this module holds none) counts, per client and
epsilon, the distinct inputs the client was answered and how many of those answers were noised.
A repeat of an input the client was answered before returns the stored answer and costs nothing;
an input whose memo entry was evicted is drawn afresh and charged again.

Totals per client (`summarise`), each an exact statement about the client's view (its labels):
  spent      sum of epsilon over its distinct noised answers: the view is (spent, 0)-iDP for
             the training set by basic composition (released answers add 0).
  spent_tight  the optimal (epsilon', delta)-iDP of the adaptive composition of those noised
             answers, each epsilon-iDP (Kairouz, Oh & Viswanath 2015: k-fold binary randomized
             response dominates any k epsilon-DP mechanisms), computed with dp-accounting's
             privacy-loss distributions (delta: `lucid budget --delta`, default 1e-6); always
             <= spent. It assumes no more than `spent` does:
             not the mechanism's own shape (its C-ary randomized response has log-ratio
             epsilon/2 between two centres, which a mechanism-specific accountant could use).
  charged    sum of epsilon over ALL its distinct answers, released or noised: the worst case
             of `spent`, and the quantity a budget caps. Unlike `spent` it does not depend on
             which branch answered, so neither does a refusal: which answers were noised is
             exactly the bit (confidence <= beta_c) the guarantee does not cover, and a budget
             on `spent` would reveal it through the moment the client is refused.
The row for all clients together ('*') counts the memo's draws: what any coalition of clients
holds at most (a memo hit for a second client reveals nothing the first did not get). A total
budget caps that row's `charged`, for the same reason a client's budget caps its own.

Planning (`plan_epsilon`, `lucid serve --target-epsilon`, `lucid budget --plan`): the per-answer
epsilon whose Q-fold composition is (E, delta)-iDP under the same accountant as `spent_tight`,
and the per-client budget Q * epsilon, which lets a client be answered Q distinct inputs.

Both iDP statements presuppose that the branch is not observable otherwise; see the threat
model in docs/access.md for timing, status codes and refusals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lucid.errors import LucidError, non_negative_number

DEFAULT_CLIENT = "default"  # the single ledger of a service without per-client API keys
ALL_CLIENTS = "*"  # ledger row of the memo's own draws (client names cannot contain '*')
DEFAULT_DELTA = 1e-6
_BUDGET_SLACK = 1e-9  # relative: sum of 0.1 thirty times must fit a budget of 3
# Above this epsilon a noised answer is treated by basic composition only (exp(eps) would
# overflow the randomized-response parameters, and the tight bound equals the basic one there).
_TIGHT_MAX_EPSILON = 30.0
_MIXED_GRID = 100  # grid steps per smallest epsilon when several epsilons are composed


class BudgetExceeded(LucidError):
    """A client's next answers would take its worst-case charge above the budget (HTTP 429)."""


def check_budget(budget: float | None, what: str = "the privacy budget") -> float | None:
    return None if budget is None else non_negative_number(budget, what)


def check_total_budget(total: float | None) -> float | None:
    return check_budget(total, "the total privacy budget")


def within_budget(charge: float, budget: float) -> bool:
    return charge <= budget * (1.0 + _BUDGET_SLACK) + 1e-12


def check_client_name(name: str) -> str:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "_.-@" for c in name):
        raise LucidError(f"client name {name!r} must be 1-64 letters, digits or _.-@")
    return name


def _grid_step(eps: float, steps: int) -> float:
    """A loss-grid step on which +-eps fall exactly (eps / step == steps in floating point), so
    dp-accounting's pessimistic rounding (ceil) adds nothing; else eps / steps (still sound)."""
    step = eps / steps
    for candidate in (step, math.nextafter(step, math.inf), math.nextafter(step, 0.0)):
        if math.ceil(eps / candidate) == steps and math.ceil(-eps / candidate) == -steps:
            return candidate
    return step


def check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise LucidError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def optimal_composition(groups: Iterable[tuple[float, int]], delta: float) -> float:
    """Smallest epsilon' with (epsilon', delta)-DP for the adaptive composition of `k` eps-DP
    mechanisms per (eps, k) group, from dp-accounting's privacy-loss distributions.

    Each eps-DP answer is dp-accounting's pessimistic PLD of an (eps, 0)-DP mechanism
    (`from_privacy_parameters`: losses +-eps, i.e. binary randomized response, the worst case of
    any eps-DP mechanism), self-composed k times; the groups are composed and epsilon' read off at
    delta. With one epsilon the loss grid step is eps itself, which represents the losses
    exactly; several epsilons share a grid of the smallest one / 100, onto which the others are
    rounded up (pessimistic). (`PLDAccountant.compose(event, count)` is not used: in
    dp-accounting 0.6.0 it ignores `count` for randomized-response events.)
    """
    check_delta(delta)
    events = [(float(e), int(k)) for e, k in groups if e > 0 and k > 0]
    basic_rest = sum(e * k for e, k in events if e > _TIGHT_MAX_EPSILON)
    events = [(e, k) for e, k in events if e <= _TIGHT_MAX_EPSILON]
    if not events:
        return basic_rest
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    smallest = min(e for e, _ in events)
    step = _grid_step(smallest, 1 if len({e for e, _ in events}) == 1 else _MIXED_GRID)
    total: Any = None
    for eps, count in events:
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0.0), step)
        composed = one.self_compose(count)
        total = composed if total is None else total.compose(composed)
    tight = float(total.get_epsilon_for_delta(delta))
    return min(tight, sum(e * k for e, k in events)) + basic_rest


# The accountant's cost grows with Q (a privacy-loss distribution over 2Q + 1 losses, about 1 s
# per composition at 10^7); planning composes some 40 times.
MAX_PLAN_QUERIES = 10_000_000
_PLAN_DIGITS = 6  # the planned epsilon is a 6-digit decimal: what `:g` prints, and reproducible
_PLAN_RTOL = 1e-7  # bisection stops below the 6th digit (the last step is done on decimals)


@dataclass(frozen=True)
class EpsilonPlan:
    """Per-answer epsilon for a target (E, delta) over Q noised answers per client."""

    target: float  # E
    delta: float
    queries: int  # Q
    epsilon: float  # per answer: Q of them compose to at most (E, delta) (optimal_composition)
    budget: float  # per client: Q * epsilon, the charge of Q distinct answers (what --budget caps)
    composed: float  # what Q answers at `epsilon` compose to, <= E
    basic_epsilon: float  # E / Q: the per-answer epsilon basic composition alone allows

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return "\n".join(
            [
                (
                    f"target: (epsilon {self.target:g}, delta {self.delta:g})-iDP for the labels of "
                    f"{self.queries} distinct answers per client"
                ),
                (
                    f"per-answer epsilon: {self.epsilon:g}  ({self.queries} answers compose to {self.composed:.8g} "
                    "at this delta, dp-accounting)"
                ),
                (
                    f"per-client budget: {self.budget:.6g}  (charged epsilon of {self.queries} distinct answers, "
                    "released or noised)"
                ),
                (
                    f"basic composition alone would allow: per-answer epsilon {self.basic_epsilon:g} "
                    f"({self.epsilon / self.basic_epsilon:.3g} times less)"
                ),
                # 12 digits: the budget check's relative slack (1e-9) still admits all Q answers.
                f"to pin it: lucid serve RUN --epsilon {self.epsilon:g} --budget {self.budget:.12g}",
            ]
        )


def check_plan(target: float, delta: float, queries: int) -> tuple[float, float, int]:
    """(E, delta, Q) checked: E finite > 0, 0 < delta < 1, Q an integer in 1..MAX_PLAN_QUERIES."""
    try:
        target = float(target)
    except (TypeError, ValueError):
        raise LucidError(f"the target epsilon must be a number, got {target!r}") from None
    if not math.isfinite(target) or target <= 0:
        raise LucidError(f"the target epsilon must be a finite number > 0, got {target!r}")
    if isinstance(queries, bool) or not isinstance(queries, int) or not 1 <= queries <= MAX_PLAN_QUERIES:
        raise LucidError(f"the number of queries must be an integer from 1 to {MAX_PLAN_QUERIES}, got {queries!r}")
    return target, check_delta(delta), queries


def _decimal_below(eps: float) -> tuple[int, int]:
    """(m, e) with m an integer of at most _PLAN_DIGITS digits and float(m * 10^e) <= eps."""
    e = math.floor(math.log10(eps)) - (_PLAN_DIGITS - 1)
    m = math.floor(eps / 10.0**e)
    while _decimal(m, e) > eps:  # the division rounded up
        m -= 1
    return m, e


def _decimal(m: int, e: int) -> float:
    return float(f"{m}e{e}")


def plan_epsilon(target: float, delta: float, queries: int) -> EpsilonPlan:
    """The largest per-answer epsilon (a 6-digit decimal) such that `queries` epsilon-iDP answers
    compose to at most (target, delta) under `optimal_composition`, by bisection on epsilon.

    The result is a short decimal, not the bisection's last float, because the memo binds its
    file to the epsilon it serves: the same plan must give the same epsilon on every restart, and
    an operator must be able to pass it as --epsilon. The next 6-digit decimal above it composes
    to more than the target, so rounding loses at most one unit in the 6th digit.
    """
    target, delta, queries = check_plan(target, delta, queries)

    def fits(eps: float) -> bool:
        return optimal_composition([(eps, queries)], delta) <= target

    # E / Q always fits (optimal_composition never exceeds basic composition); double to a
    # bracket [lo, hi] with hi not fitting (basic composition takes over above 30, so it ends).
    lo = target / queries
    hi = 2.0 * lo
    while fits(hi):
        lo, hi = hi, 2.0 * hi
    while hi - lo > _PLAN_RTOL * lo:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    m, e = _decimal_below(lo)
    while fits(_decimal(m + 1, e)):  # lo sat just below a 6-digit decimal that still fits
        m += 1
    eps = _decimal(m, e)
    return EpsilonPlan(
        target, delta, queries, eps, eps * queries, optimal_composition([(eps, queries)], delta), target / queries
    )


@dataclass
class ClientTotals:
    """One client's row of `lucid budget` (see the module docstring for each total)."""

    client: str
    answers: int = 0
    noised: int = 0
    refused: int = 0
    charged: float = 0.0
    spent: float = 0.0
    spent_tight: float = 0.0
    delta: float = DEFAULT_DELTA
    by_epsilon: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def summarise(rows: Sequence[tuple[str, float, int, int, int]], delta: float = DEFAULT_DELTA) -> list[ClientTotals]:
    """Ledger rows (client, epsilon, answers, noised, refused) -> one ClientTotals per client,
    clients by name, the all-clients row ('*') last."""
    per: dict[str, ClientTotals] = {}
    for client, eps, answers, noised, refused in rows:
        t = per.setdefault(client, ClientTotals(client, delta=delta))
        t.answers += int(answers)
        t.noised += int(noised)
        t.refused += int(refused)
        t.charged += float(eps) * int(answers)
        t.spent += float(eps) * int(noised)
        t.by_epsilon.append(
            {"epsilon": float(eps), "answers": int(answers), "noised": int(noised), "refused": int(refused)}
        )
    for t in per.values():
        t.spent_tight = optimal_composition([(g["epsilon"], g["noised"]) for g in t.by_epsilon], delta)
    return sorted(per.values(), key=lambda t: (t.client == ALL_CLIENTS, t.client))


def format_table(totals: Sequence[ClientTotals]) -> str:
    delta = totals[0].delta if totals else DEFAULT_DELTA
    head = ["client", "answers", "noised", "refused", "charged ε", "spent ε (basic)", f"spent ε (δ={delta:g})"]
    body = [
        [
            ("(all clients: memo draws)" if t.client == ALL_CLIENTS else t.client),
            str(t.answers),
            str(t.noised),
            ("-" if t.client == ALL_CLIENTS else str(t.refused)),
            f"{t.charged:.6g}",
            f"{t.spent:.6g}",
            f"{t.spent_tight:.6g}",
        ]
        for t in totals
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
