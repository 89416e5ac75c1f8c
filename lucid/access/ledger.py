"""Privacy accounting across queries: what each client has been given, and a budget.

Each answer is one run of LUCID-Inference: N's label (released, 0-iDP: the verifier proved that
no single training row changes it) or an exponential-mechanism draw (noised, epsilon-iDP). A
client's answers compose. The ledger (tables `seen` and `ledger` of the memo's SQLite file,
written by `Memo.get_or_put` in the same transaction as the answers) counts, per client and
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
holds at most (a memo hit for a second client reveals nothing the first did not get).

Both iDP statements presuppose that the branch is not observable otherwise; see the threat
model in docs/access.md for timing, status codes and refusals.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

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


def check_budget(budget: float | None) -> float | None:
    return None if budget is None else non_negative_number(budget, "the privacy budget")


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
    if not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise LucidError(f"delta must be in (0, 1), got {delta!r}")
    events = [(float(e), int(k)) for e, k in groups if e > 0 and k > 0]
    basic_rest = sum(e * k for e, k in events if e > _TIGHT_MAX_EPSILON)
    events = [(e, k) for e, k in events if e <= _TIGHT_MAX_EPSILON]
    if not events:
        return basic_rest
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    smallest = min(e for e, _ in events)
    step = _grid_step(smallest, 1 if len({e for e, _ in events}) == 1 else _MIXED_GRID)
    total = None
    for eps, count in events:
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0.0), step)
        composed = one.self_compose(count)
        total = composed if total is None else total.compose(composed)
    tight = float(total.get_epsilon_for_delta(delta))
    return min(tight, sum(e * k for e, k in events)) + basic_rest


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
        t.by_epsilon.append({"epsilon": float(eps), "answers": int(answers), "noised": int(noised),
                             "refused": int(refused)})
    for t in per.values():
        t.spent_tight = optimal_composition([(g["epsilon"], g["noised"]) for g in t.by_epsilon], delta)
    return sorted(per.values(), key=lambda t: (t.client == ALL_CLIENTS, t.client))


def read_ledger(path: str | Path, fingerprint: str | None = None) -> list[tuple[str, float, int, int, int]]:
    """The ledger rows of a memo file, read-only (the service may be running). With the
    `fingerprint` of a run's N, a memo written for another model is refused."""
    path = Path(path)
    if not path.is_file():
        raise LucidError(f"{path} does not exist: no memo, so no answers have been given with it (or pass --memo)")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
        try:
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("format") not in ("lucid-memo/1", "lucid-memo/2", "lucid-memo/3"):
                raise LucidError(f"{path} is not a LUCID memo file")
            if fingerprint and meta.get("fingerprint") and meta["fingerprint"] != fingerprint:
                raise LucidError(f"the memo {path} belongs to a different model or run")
            if meta["format"] == "lucid-memo/1":
                return []  # written before the ledger existed
            return [tuple(r) for r in db.execute(
                "SELECT client, epsilon, answers, noised, refused FROM ledger ORDER BY client, epsilon")]
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise LucidError(f"cannot read the ledger in {path}: {exc}") from None


def format_table(totals: Sequence[ClientTotals]) -> str:
    delta = totals[0].delta if totals else DEFAULT_DELTA
    head = ["client", "answers", "noised", "refused", "charged ε", "spent ε (basic)", f"spent ε (δ={delta:g})"]
    body = [[("(all clients: memo draws)" if t.client == ALL_CLIENTS else t.client), str(t.answers), str(t.noised),
             ("-" if t.client == ALL_CLIENTS else str(t.refused)), f"{t.charged:.6g}", f"{t.spent:.6g}",
             f"{t.spent_tight:.6g}"] for t in totals]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
