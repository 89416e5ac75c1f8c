"""What a memo is bound to: N's fingerprint, the epsilon of its draws and the bounds it was
served with (the `meta` table of the memo's database, SQLite or PostgreSQL; lucid/access/memo/),
and the migration of SQLite files written before these records existed. The functions run the
same statements on either database (a PostgreSQL `meta` value is TEXT: numbers come back as text,
hence the float() and int() wherever one is read).

Why the epsilon is recorded: a stored draw keeps the epsilon it was drawn with. A service started
on the same file with another epsilon would hand those draws out again and charge each client its
own epsilon for them: after 20 draws at epsilon 10, a restart at 0.1 with a budget of 2 would
give a client 200-iDP answers while its ledger said 2. So a memo takes the epsilon of its first
binding and refuses any other one, in one line, at start.

Why the bounds are recorded: they decide which answers were released and which noised. A memo
refuses a bounds.json that is not the one it was served with, unless every class's bound is at
most the recorded one: a continued (anytime) verification only lowers bounds, and the stored
answers stay exactly accounted for, since each keeps the `noised` flag it was given with. Any
other change (a bounds.json of another verification, or one restored from an older state) is
refused, as a likely operator mistake.

Files without an epsilon record (lucid-memo/1 and /2) are migrated when opened. Their epsilon is
adopted only where the file itself proves it: the ledger row of the memo's own draws ('*') names
exactly one epsilon and every stored answer was given to a client (so its draw is in that row).
Otherwise the epsilon of the stored answers cannot be established, the file is marked so, and
it answers nothing more (its ledger stays readable by `lucid budget`). A file with nothing
stored takes the epsilon of its first binding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from lucid.access.memo.backend import Session
from lucid.access.memo.budget import answered_to_no_client, drawn_epsilons
from lucid.errors import LucidError

MEMO_FORMAT = "lucid-memo/3"
# /1: noised answers only, no ledger; /2: no epsilon or bounds record. Migrated on opening.
OLD_FORMATS = ("lucid-memo/1", "lucid-memo/2")
UNKNOWN = "unknown"  # meta 'epsilon' of a migrated file whose answers' epsilon is not provable


def new_meta(db: Session, fingerprint: str | None) -> None:
    """A new file: no epsilon or bounds yet (its first binding or answer records them)."""
    db.executemany(
        "INSERT INTO meta (name, value) VALUES (?, ?)",
        [("format", MEMO_FORMAT), ("fingerprint", fingerprint or ""), ("count", 0)],
    )


def migrate(db: Session, meta: dict[str, Any]) -> None:
    """Bring a lucid-memo/1 or /2 file to the current format, recording its epsilon where the
    file proves it (module docstring)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(memo)")}
    if "noised" not in columns:  # lucid-memo/1 stored noised answers only
        db.execute("ALTER TABLE memo ADD COLUMN noised INTEGER NOT NULL DEFAULT 1")
    if db.execute("SELECT 1 FROM memo LIMIT 1").fetchone() is not None:
        epsilons = drawn_epsilons(db)
        known = meta.get("format") != "lucid-memo/1" and len(epsilons) == 1 and not answered_to_no_client(db)
        db.execute(
            "INSERT OR REPLACE INTO meta (name, value) VALUES ('epsilon', ?)",
            (float(epsilons[0]) if known else UNKNOWN,),
        )
    db.execute("UPDATE meta SET value = ? WHERE name = 'format'", (MEMO_FORMAT,))


def check_fingerprint(db: Session, meta: dict[str, Any], fingerprint: str | None, name: str) -> None:
    """Answers stored for another model are not draws around this model's labels: refuse them."""
    stored = meta.get("fingerprint") or ""
    if fingerprint and stored and stored != fingerprint:
        raise LucidError(f"the memo {name} belongs to a different model or run; use another --memo file or database")
    if fingerprint and not stored:
        db.execute("UPDATE meta SET value = ? WHERE name = 'fingerprint'", (fingerprint,))


def bind_epsilon(db: Session, recorded: Any, epsilon: float, name: str) -> None:
    """Record `epsilon` for a memo without one; refuse a memo recorded with another (one line)."""
    if recorded is None:
        db.execute("INSERT INTO meta (name, value) VALUES ('epsilon', ?)", (float(epsilon),))
    elif recorded == UNKNOWN:
        raise LucidError(
            f"the memo {name} was written before memos recorded their epsilon, and the epsilon of its answers "
            f"cannot be established from its ledger: use a new --memo file or database (`lucid budget --memo {name}` "
            "still reads this one's ledger)"
        )
    else:
        refuse_other_epsilon(float(recorded), epsilon, name)


def refuse_other_epsilon(recorded: float, epsilon: float, name: str) -> None:
    """One line naming the memo's epsilon and the two ways on, unless `epsilon` is that one."""
    if float(epsilon) != recorded:
        raise LucidError(
            f"the memo {name} holds answers drawn with epsilon = {recorded!r}, not {float(epsilon)!r}: serve with "
            f"--epsilon {recorded!r}, or use a new --memo file or database (it starts new ledgers: keep this one for "
            "`lucid budget`)"
        )


@dataclass(frozen=True)
class BoundsRecord:
    """The bounds a memo's answers were given under: one per class ([C]), or with --regions one per
    box and class ([M, C]) together with the partition's digest (lucid/regions/tree.py)."""

    upper: np.ndarray
    regions: str | None = None

    def to_text(self) -> str:
        values = np.asarray(self.upper, dtype=np.float64)
        listed = (
            [_finite_or_none(v) for v in values]
            if values.ndim == 1
            else [[_finite_or_none(v) for v in row] for row in values]
        )
        return json.dumps(listed if self.regions is None else {"regions": self.regions, "bounds": listed})

    @classmethod
    def from_text(cls, text: str) -> BoundsRecord:
        doc = json.loads(text)
        regions = None
        if isinstance(doc, dict):
            regions, doc = doc.get("regions"), doc.get("bounds")
        upper = np.array(doc, dtype=object)
        upper = np.where(upper == None, np.inf, upper).astype(np.float64)  # noqa: E711 (element-wise)
        return cls(upper, regions)


def _finite_or_none(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None  # +inf: nothing proved (JSON has no infinity)


def bind_bounds(db: Session, recorded: Any, bounds: np.ndarray | BoundsRecord, name: str) -> None:
    """Record the upper bounds; accept equal or tighter ones over the same boxes (updating the
    record) and refuse any other (module docstring)."""
    new = bounds if isinstance(bounds, BoundsRecord) else BoundsRecord(np.asarray(bounds, dtype=np.float64))
    text = new.to_text()
    if recorded is None:
        db.execute("INSERT INTO meta (name, value) VALUES ('bounds', ?)", (text,))
        return
    old = BoundsRecord.from_text(recorded)
    if old.regions != new.regions or old.upper.shape != new.upper.shape or not (new.upper <= old.upper).all():
        raise LucidError(
            f"the memo {name} holds answers given under other bounds than this run's bounds.json (only a "
            "continued verification's tighter bounds over the same regions may replace them): restore that "
            "bounds.json, or use a new --memo file or database"
        )
    if (new.upper < old.upper).any():
        db.execute("UPDATE meta SET value = ? WHERE name = 'bounds'", (text,))
