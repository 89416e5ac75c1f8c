"""What one `get_or_put` call asks of a memo: its keys and their proposals, and who is charged for
the answers within which budgets. One object carries it from the call to each transaction
(lucid/access/memo/store.py), or to each turn of a large call (lucid/access/memo/turns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# One label per key, or a function from the positions of the keys not stored yet to their
# proposals (so that no noise is drawn for memo hits).
Proposals = np.ndarray | Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Charge:
    """Who pays for a call's answers: `client`'s ledger (None: no ledger is charged, as in
    `lucid evaluate`), `epsilon` per distinct input new to that client (also the epsilon the memo's
    new draws are recorded with), within `budget` for that client and `total_budget` for all clients
    together (None: no limit). store.py's `get_or_put` says how each budget is decided."""

    client: str | None = None
    epsilon: float = 0.0
    budget: float | None = None
    total_budget: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", float(self.epsilon))


@dataclass(frozen=True)
class Batch:
    """The keys of one call (or of one turn of it), one proposal and one `noised` flag per key (None:
    all noised), and its charge; `unique` holds the distinct keys in the order they first appear."""

    keys: Sequence[bytes]
    proposals: Proposals
    noised: np.ndarray | None
    charge: Charge
    unique: list[bytes] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "unique", list(dict.fromkeys(self.keys)))
