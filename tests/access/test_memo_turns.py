"""Large batches answered in turns (lucid/access/memo/turns.py, lucid/access/memo/budget.py), bodies
parsed in pieces (lucid/access/guard.py `input_pieces`) and the memo's own WAL checkpoints
(lucid/access/memo/sqlite.py `Checkpointer`): each must give exactly what the one-piece path gives,
with the budget decided once per batch."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import numpy as np
import pytest

from lucid.access.memo import budget as memo_budget
from lucid.access.memo import sqlite as memo_sqlite
from lucid.access.memo import turns as memo_turns
from lucid.access.guard import PIECE_BYTES, BadJson, TooLarge, input_pieces, parse_inputs
from lucid.access.ledger import BudgetExceeded
from lucid.access.memo import Charge, Memo
from lucid.errors import LucidError

from thread_helpers import run_threads


class Turns:
    """A `turn` that counts the turns taken and checks that they never overlap."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, rows: int):
        assert self._lock.acquire(blocking=False), "two turns at once"
        try:
            self.rows.append(rows)
            yield
        finally:
            self._lock.release()


def keys_of(n: int, prefix: str = "k") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


@pytest.fixture()
def small_turns(monkeypatch):
    monkeypatch.setattr(memo_turns, "TURN_ROWS", 4)


def test_a_batch_in_turns_answers_and_charges_as_in_one_transaction(tmp_path, small_turns):
    """Duplicates, memo hits and new keys across turns: the same labels, ledger and memo as the
    one-transaction path, and no reservation left behind."""
    whole, turned, turns = Memo(tmp_path / "a.sqlite"), Memo(tmp_path / "b.sqlite"), Turns()
    charge = Charge(client="c", epsilon=0.5, budget=100.0, total_budget=100.0)
    rng = np.random.default_rng(0)
    for memo, turn in ((whole, None), (turned, turns)):
        memo.get_or_put(keys_of(3), np.array([0, 1, 2]), charge=charge)  # hits for the batch below
    batch = keys_of(11) + keys_of(5)  # 11 distinct, 5 repeated within the call
    proposals = rng.integers(0, 3, len(batch))
    noised = rng.random(len(batch)) < 0.5
    a = whole.get_or_put(batch, proposals, noised=noised, charge=charge)
    b = turned.get_or_put(batch, proposals, noised=noised, turn=turns, charge=charge)
    assert a.tolist() == b.tolist()
    assert whole.ledger_rows() == turned.ledger_rows()
    assert len(whole) == len(turned) == 11
    # The reservation, ceil(11 / 4) = 3 turns, the release.
    assert turns.rows == [1, 4, 4, 3, 1]
    with turned._transaction() as db:
        assert db.execute("SELECT COUNT(*) FROM reserved").fetchone()[0] == 0


def test_proposal_functions_see_positions_of_the_call(tmp_path, small_turns):
    memo, asked = Memo(tmp_path / "m.sqlite"), []
    batch = [b"x", b"y", b"x", b"z", b"w", b"v", b"u"]
    memo.get_or_put([b"z"], np.array([2]))

    def propose(positions):
        asked.append(positions.tolist())
        return np.asarray(positions) % 3

    out = memo.get_or_put(batch, propose, turn=Turns())
    assert out.tolist() == [0, 1, 0, 2, 1, 2, 0]  # z was stored before; each other key its first position % 3
    assert sorted(p for part in asked for p in part) == [0, 1, 4, 5, 6]


def test_the_budget_is_decided_once_for_the_whole_batch(tmp_path, small_turns):
    """Over the budget: refused before any turn, nothing stored or charged. A worst case over the
    budget whose exact charge fits (inputs seen before are free) is decided exactly, in one turn."""
    memo, turns = Memo(tmp_path / "m.sqlite"), Turns()
    charge = Charge(client="c", epsilon=1.0, budget=10.0)
    with pytest.raises(BudgetExceeded, match="budget"):
        memo.get_or_put(keys_of(11), np.zeros(11), turn=turns, charge=charge)
    assert len(memo) == 0 and turns.rows == [1, 11]  # the reservation failed; the exact check refused
    assert memo.ledger_rows() == [("c", 1.0, 0, 0, 1)]
    memo.get_or_put(keys_of(6), np.zeros(6), charge=charge)
    turns.rows.clear()
    out = memo.get_or_put(keys_of(10), np.ones(10), turn=turns, charge=charge)  # worst case 10 + 6 > 10; exact 4 + 6
    assert out.tolist() == [0] * 6 + [1] * 4 and turns.rows == [1, 10]
    assert memo.ledger_rows()[-1][2] == 10


def test_racing_batches_of_one_client_never_exceed_its_budget(tmp_path, small_turns):
    """Four threads on two connections, one client, batches in turns against a budget and a total
    budget: charges equal what was answered, never above either budget, one draw per key."""
    path = tmp_path / "m.sqlite"
    memos = [Memo(path), Memo(path)]
    answered: list[set[bytes]] = [set() for _ in range(4)]
    refusals = [0] * 4

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        for _ in range(12):
            part = [f"k{i}".encode() for i in rng.choice(80, 9, replace=False)]
            try:
                memos[t % 2].get_or_put(part, np.full(9, t % 3), turn=lambda rows: contextlib.nullcontext(),
                                        charge=Charge(client="c", epsilon=0.5, budget=20.0, total_budget=25.0))
            except BudgetExceeded:
                refusals[t] += 1
                continue
            answered[t].update(part)

    errors = run_threads(worker, 4)
    assert not errors, errors
    rows = {r[0]: r for r in memos[0].ledger_rows()}
    everything = set().union(*answered)
    assert rows["c"][2] == len(everything) <= 40  # 20 / 0.5
    assert rows["*"][2] == len(memos[0]) == len(everything) <= 50
    assert rows["c"][4] == sum(refusals) > 0


def test_a_reservation_left_by_a_dead_process_holds_the_budget_until_it_expires(tmp_path, monkeypatch):
    memo = Memo(tmp_path / "m.sqlite")
    charge = Charge(client="c", epsilon=1.0, budget=10.0)
    with memo._transaction() as db:  # what a process killed in the middle of a 8-input batch leaves
        rid = memo_budget.new_reservation(db, "c", 1.0, 8)
    with pytest.raises(BudgetExceeded):
        memo.get_or_put(keys_of(3), np.zeros(3), charge=charge)
    assert memo.get_or_put(keys_of(2), np.zeros(2), charge=charge).tolist() == [0, 0]  # 8 + 2 fits
    now = time.time()
    monkeypatch.setattr(memo_budget.time, "time", lambda: now + memo_budget.RESERVATION_TTL_S + 1)
    memo.get_or_put(keys_of(8), np.zeros(8), charge=charge)  # expired: counts for nothing
    assert memo.ledger_rows()[-1][2] == 8
    # A turn whose reservation expired is checked on its own: never charged past the budget.
    with memo._transaction() as db:
        assert not memo_budget.draw_on(db, rid, "c", 1)
        assert memo_budget.charged(db, "c") == 8.0


def test_without_a_turn_or_a_client_nothing_is_reserved(tmp_path, small_turns):
    memo, turns = Memo(tmp_path / "m.sqlite"), Turns()
    memo.get_or_put(keys_of(9), np.zeros(9), charge=Charge(epsilon=1.0), turn=turns)  # no client: nothing to reserve
    assert turns.rows == [4, 4, 1]
    memo.get_or_put(keys_of(9, "n"), np.zeros(9), charge=Charge(client="c", epsilon=1.0))  # no turn: one transaction
    assert memo.ledger_rows()[-1][2] == 9


# -- bodies in pieces ----------------------------------------------------------------------------------
def big(rows, **dumps) -> bytes:
    body = json.dumps({"inputs": rows}, **dumps).encode()
    assert len(body) > PIECE_BYTES
    return body


@pytest.mark.parametrize("dumps", [{}, {"indent": 1}, {"separators": (",", ":")}])
def test_pieces_are_the_rows_json_loads_gives(dumps):
    rng = np.random.default_rng(1)
    rows = [[float(v) for v in r] for r in rng.normal(size=(3000, 3)) * 10.0 ** rng.integers(-300, 300, (3000, 3))]
    rows[5] = [1, -2, 3]  # JSON integers stay integers
    body = big(rows, **dumps)
    pieces = list(input_pieces(body, 10_000, 3))
    assert len(pieces) > 3
    assert [r for p in pieces for r in p] == json.loads(body)["inputs"] == rows


def _outcome(body: bytes, width: int = 2, max_batch: int = 10_000):
    try:
        rows = parse_inputs(body, max_batch, width)
        return ("ok", len(rows), hash(json.dumps(rows)))
    except LucidError as exc:
        return (type(exc).__name__, str(exc))


def _whole(body: bytes, width: int = 2, max_batch: int = 10_000):
    """The same body parsed by json.loads in one piece, checked as input_pieces checks."""
    from lucid.access import guard

    try:
        rows = guard._whole_inputs(body)
        if len(rows) > max_batch:
            raise TooLarge(f"at most {max_batch} inputs per request")
        return ("ok", len(rows), hash(json.dumps(guard._checked(rows, 0, width))))
    except LucidError as exc:
        return (type(exc).__name__, str(exc))


PAD = "[0.5, 0.25], " * 4000  # puts what follows past the first piece
MALFORMED = [
    '{"inputs": [' + PAD + '[1, [2]], [3, 4]]}',  # a nested list: a cut inside a row
    '{"inputs": [' + PAD + '["a],", 2], [3, 4]]}',  # a bracket and comma inside a string
    '{"inputs": [' + PAD + '[1, 2],]}',  # a trailing comma
    '{"inputs": [' + PAD + '[1, 2]], "inputs": [[5, 6]]}',  # a repeated key (json.loads alone keeps the last)
    '{"inputs": [' + PAD + '[1, 2]], "inputs": [' + PAD + '[5, 6]]}',
    '{"inputs": [' + PAD + '[1, 2]], "other": 1}',
    '{"inputs": [' + PAD + '[1, 2]]} x',
    '{"inputs": [' + PAD + '[1, 2], [true, 2]]}',
    '{"inputs": [' + PAD + '[1, 2], [NaN, Infinity]]}',  # json.loads' extensions: the same in pieces
    '{"inputs": [' + PAD + '[1, 2] ,\t[3, 4]\n]\r}',
    '{"inputs": [' + PAD + '[1, 2], [3, 4]  ]}',
    '\ufeff{"inputs": [' + PAD + '[1, 2]]}',
    '{"inputs" : [' + PAD + '[1, 2, 3]]}',
    '{"inputs": [' + PAD + '[1, 2]}',
]


@pytest.mark.parametrize("case", range(len(MALFORMED)))
def test_odd_large_bodies_get_what_a_whole_parse_gives(case):
    body = MALFORMED[case].encode()
    assert len(body) > PIECE_BYTES
    assert _outcome(body) == _whole(body)


def test_a_repeated_field_is_refused_in_pieces_and_whole():
    for text in ('{"inputs": [[1, 2]], "inputs": [[5, 6]]}', '{"inputs": [' + PAD + '[1, 2]], "inputs": [[5, 6]]}'):
        with pytest.raises(LucidError, match="must not repeat a field"):
            parse_inputs(text.encode(), 10_000, 2)


def test_too_many_rows_in_pieces_is_a_413():
    body = big([[0.5, 0.5]] * 5000)
    with pytest.raises(TooLarge, match="at most 4000"):
        parse_inputs(body, 4000, 2)
    with pytest.raises(BadJson):
        parse_inputs(body[:-3], 10_000, 2)


# -- WAL checkpoints off the request path --------------------------------------------------------------
def test_the_log_is_copied_into_the_file_by_the_checkpointer(tmp_path, monkeypatch):
    monkeypatch.setattr(memo_sqlite, "CHECKPOINT_EVERY_S", 0.05)
    path = tmp_path / "m.sqlite"
    memo = Memo(path)
    assert memo._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # never inside a commit
    before = path.stat().st_size
    memo.get_or_put([f"k{i}".encode() * 8 for i in range(3000)], np.zeros(3000))
    deadline = time.monotonic() + 10
    while path.stat().st_size <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.stat().st_size > before  # the pages left the log for the database file
    thread = memo._checkpoints._thread
    memo.close()
    assert not thread.is_alive()
