"""The memo and ledger on PostgreSQL (`lucid serve --memo postgresql://...`), against a real server.

Skipped as a whole when no server answers on 127.0.0.1:5432 (or at $LUCID_TEST_POSTGRES). Each test
gets a schema of its own (the memo's tables go into the connection's search_path), dropped at the
end, so parallel workers (pytest -n 2) and reruns never share tables.
"""

from __future__ import annotations

import contextlib
import os
import socket
import json
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("psycopg_pool")

from lucid.access import Charge, ClassifierOptions, LabelOnlyClassifier  # noqa: E402
from lucid.access.ledger import BudgetExceeded  # noqa: E402
from lucid.access.memo import SqliteMemo, open_memo, read_memo_ledger  # noqa: E402
from lucid.access.memo import turns as memo_turns  # noqa: E402
from lucid.access.memo.postgres import PostgresMemo  # noqa: E402
from lucid.errors import LucidError  # noqa: E402
from serve_helpers import free_port, get, post, server, to_orig, write_run  # noqa: E402
from thread_helpers import run_threads  # noqa: E402
from synthetic_runs import write_bounds  # noqa: E402


CANDIDATES = [os.environ["LUCID_TEST_POSTGRES"]] if os.environ.get("LUCID_TEST_POSTGRES") else [
    "postgresql://postgres@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test"]


def _server_url() -> str | None:
    for url in CANDIDATES:
        try:
            psycopg.connect(url, connect_timeout=3).close()
            return url
        except psycopg.Error:
            continue
    return None


BASE_URL = _server_url()
if BASE_URL is None:
    pytest.skip(f"no PostgreSQL server answers at {' or '.join(CANDIDATES)}", allow_module_level=True)


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@pytest.fixture()
def pg_url():
    """A memo URL whose tables land in a fresh schema of this test's own, dropped afterwards."""
    schema = f"lucid_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _with_schema(BASE_URL, schema)
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture()
def run_dir(tmp_path):
    # Every class unproved: every answer is a draw, so a second draw for an input would show.
    return write_run(tmp_path / "run", bounds={0: None, 1: None, 2: None})


# -- two store objects (two replicas in one process) ---------------------------------------------------
@pytest.mark.parametrize("in_turns", [False, True])
def test_two_stores_race_one_draw_per_input_and_exact_budgets(pg_url, in_turns, monkeypatch):
    """Two PostgresMemo objects opened at the same moment on an empty schema, six threads racing
    the same 200 keys in batches, three clients with a budget and a total budget below the keys.
    `in_turns`: each batch of 7 answered in turns of 3 keys (memo_turns.TURN_ROWS), its budgets
    reserved once (memo/budget.py)."""
    if in_turns:
        monkeypatch.setattr(memo_turns, "TURN_ROWS", 3)
    turn = (lambda rows: contextlib.nullcontext()) if in_turns else None
    memos: list[PostgresMemo] = []
    openers = [threading.Thread(target=lambda: memos.append(PostgresMemo(pg_url, epsilon=0.5))) for _ in range(2)]
    for th in openers:
        th.start()
    for th in openers:
        th.join()
    assert len(memos) == 2  # schema creation raced and both opened
    keys = [f"k{i}".encode() for i in range(200)]
    answers: dict[int, dict[bytes, int]] = {}
    refused = {f"c{t}": 0 for t in range(3)}

    def worker(t: int) -> None:
        memo, client, got = memos[t % 2], f"c{t % 3}", {}
        order = list(keys)
        np.random.default_rng(t).shuffle(order)
        for i in range(0, len(order), 7):
            part = order[i : i + 7]
            try:
                out = memo.get_or_put(part, np.full(len(part), t), turn=turn,
                                      charge=Charge(client=client, epsilon=0.5, budget=60.0, total_budget=80.0))
            except BudgetExceeded:
                refused[client] += 1
                continue
            got.update(zip(part, out.tolist()))
        answers[t] = got

    errors = run_threads(worker, 6)
    assert not errors, errors
    merged: dict[bytes, int] = {}
    for got in answers.values():
        for key, label in got.items():
            assert merged.setdefault(key, label) == label  # one draw per input, whoever asked
    rows = {r[0]: r for r in memos[0].ledger_rows()}
    # The memo's draws: exactly the keys anyone was answered, never above the total budget (80 / 0.5).
    assert len(memos[0]) == len(memos[1]) == len(merged) == rows["*"][2] <= 160
    for t in range(3):
        client = f"c{t}"
        mine = set(answers[t]) | set(answers[t + 3])
        # Charged: exactly the distinct keys it was answered, never above its budget (60 / 0.5).
        assert rows[client][2] == rows[client][3] == len(mine) <= 120
        assert rows[client][4] == refused[client] > 0
    assert read_memo_ledger(pg_url) == memos[1].ledger_rows()
    with memos[0]._transaction() as db:
        assert db.execute("SELECT COUNT(*) FROM reserved").fetchone()[0] == 0  # every reservation released
    for memo in memos:
        memo.close()


def test_eviction_is_shared_and_charges_a_fresh_draw_again(pg_url):
    a, b = PostgresMemo(pg_url, max_size=2), PostgresMemo(pg_url, max_size=2)
    charge = Charge(client="c", epsilon=1.0)
    a.get_or_put([b"a", b"b"], np.array([0, 1]), charge=charge)
    assert b.get_or_put([b"a"], np.array([2]), charge=charge).tolist() == [0]  # the other replica's draw, free
    b.get_or_put([b"c"], np.array([2]), charge=charge)  # evicts b, the least recently used (a was just asked)
    assert a.lookup(b"b") is None and a.lookup(b"a") == 0 and len(a) == 2
    assert a.get_or_put([b"b"], np.array([2]), charge=charge).tolist() == [2]  # drawn afresh: charged again
    assert a.ledger_rows() == [("*", 1.0, 4, 4, 0), ("c", 1.0, 4, 4, 0)]
    a.close()
    b.close()
    assert len(PostgresMemo(pg_url, max_size=1)) == 1  # a smaller size on reopening trims at once


def test_racing_replicas_evict_without_deadlock_or_dangling_charges(pg_url):
    """A memo far smaller than the keys: every write evicts and writes LRU positions while the other
    replica reads and charges. No deadlock or error, and the bookkeeping stays whole: the count is
    the rows, and no client is recorded as answered an input the memo no longer holds (its next
    answer would be a fresh draw it was not charged for)."""
    memos = [PostgresMemo(pg_url, max_size=15, epsilon=1.0) for _ in range(2)]
    keys = [f"k{i}".encode() for i in range(60)]

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        for _ in range(40):
            part = [keys[i] for i in rng.choice(len(keys), size=int(rng.integers(1, 6)), replace=False)]
            memos[t % 2].get_or_put(part, np.full(len(part), t % 3), charge=Charge(client=f"c{t % 3}", epsilon=1.0))

    errors = run_threads(worker, 6)
    assert not errors, errors
    for memo in memos:
        memo.close()
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM memo").fetchone()[0]
        count = int(conn.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()[0])
        dangling = conn.execute(
            "SELECT COUNT(*) FROM seen s WHERE NOT EXISTS (SELECT 1 FROM memo m WHERE m.key = s.key)").fetchone()[0]
    assert rows == count <= 15 and dangling == 0


# -- two real `lucid serve` replicas ------------------------------------------------------------------
def test_two_serve_replicas_race_one_draw_and_exact_budgets(run_dir, pg_url, tmp_path):
    """Two `lucid serve` processes on one database; three clients send every one of 60 inputs to
    both replicas at once. Each input has one answer everywhere; each client is charged exactly
    its distinct answered inputs, never above --budget; the memo's draws never exceed --total-budget."""
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(f"c{t} token-{t}\n" for t in range(3)))
    inputs = to_orig(np.random.default_rng(5).random((60, 2)))
    args = ("--epsilon", "0.5", "--memo", pg_url, "--api-keys", str(keys), "--budget", "20",
            "--total-budget", "25")  # 40 distinct inputs per client, 50 draws in all
    said: list[str] = []
    got: dict[tuple[int, int], set] = {}  # (client, input) -> labels answered
    statuses: dict[int, list[int]] = {t: [] for t in range(3)}
    errors: list[str] = []
    with server(run_dir, *args, stderr_lines=said) as url_a, server(run_dir, *args) as url_b:
        ports = [int(url_a.rsplit(":", 1)[1]), int(url_b.rsplit(":", 1)[1])]

        def client(t: int, replica: int) -> None:
            # c0 sends the same order to both replicas: each input reaches both at about the same moment.
            order = np.random.default_rng(10 * t + (replica if t else 0)).permutation(len(inputs))
            try:
                for i in order.tolist():
                    status, body = post(ports[replica], [inputs[i]], f"token-{t}")
                    statuses[t].append(status)
                    if status == 200:
                        got.setdefault((t, i), set()).add(body["labels"][0])
                    elif status != 429:
                        errors.append(f"{status} {body}")
            except Exception as exc:  # surfaced below
                errors.append(repr(exc))

        threads = [threading.Thread(target=client, args=(t, r)) for t in range(3) for r in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=240)
        assert not any(th.is_alive() for th in threads)
    assert not errors, errors[:3]
    assert "memo=postgresql://" in "".join(said)
    per_input: dict[int, set] = {}
    for (t, i), labels in got.items():
        per_input.setdefault(i, set()).update(labels)
    assert all(len(labels) == 1 for labels in per_input.values())  # one draw per input, across replicas
    rows = {r[0]: r for r in read_memo_ledger(pg_url)}
    for t in range(3):
        answered = {i for (c, i) in got if c == t}
        assert rows[f"c{t}"][2] == rows[f"c{t}"][3] == len(answered) <= 40  # charged = noised answers delivered
        assert rows[f"c{t}"][4] == statuses[t].count(429)  # every refusal counted, nothing else
    assert rows["*"][2] == len(per_input) <= 50  # the memo's draws: the inputs anyone was answered
    assert len(per_input) == 50  # the total budget was reached, exactly
    memo = PostgresMemo(pg_url)
    assert len(memo) == 50
    memo.close()


# -- the epsilon and bounds record ---------------------------------------------------------------------
def test_a_restart_with_another_epsilon_or_bounds_refuses_in_one_line(run_dir, pg_url, capsys):
    from lucid.cli import main

    asked = to_orig(np.random.default_rng(0).random((20, 2)))
    first = LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=pg_url)
    answers = first.predict(asked, client="alice").tolist()
    first.close()
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(run_dir), "--epsilon", "0.1", "--budget", "2", "--memo", pg_url])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "epsilon = 10.0" in err and "--epsilon 10.0" in err and "Traceback" not in err
    write_bounds(run_dir, {0: 0.5, 1: None, 2: None})  # a continued verification: tighter, recorded
    LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=pg_url).close()
    write_bounds(run_dir, {0: None, 1: None, 2: None})  # back up: not tighter than the record
    with pytest.raises(LucidError, match="other bounds"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=pg_url)
    write_bounds(run_dir, {0: 0.5, 1: None, 2: None})
    again = LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=pg_url, options=ClassifierOptions(budget=200.0))
    assert again.predict(asked, client="bob").tolist() == answers  # the stored draws, at their epsilon
    bob = {t.client: t for t in again.ledger()}["bob"]
    assert (bob.answers, bob.noised, bob.charged) == (20, 20, 200.0)
    again.close()


# -- an unreachable database: fail closed ------------------------------------------------------------
def test_an_unreachable_database_at_start_is_one_line_and_exit_2(run_dir):
    port = free_port()  # nothing listens there
    for memo, words in [(f"postgresql://lucid:s3cret@127.0.0.1:{port}/test", "cannot connect to the memo database"),
                        ("postgresql://postgres@127.0.0.1:5432/test?bogus=1", "not a PostgreSQL URL"),
                        # libpq quotes what it cannot parse, password included; urlsplit raised on this one
                        ("postgresql://lucid:s3cr%zzet@127.0.0.1:5432/test", "not a PostgreSQL URL"),
                        ("postgresql://lucid:s3cret@[::1/test", "not a PostgreSQL URL"),
                        ("mysql://u@h/db", "only postgresql://")]:
        r = subprocess.run([sys.executable, "-m", "lucid", "serve", str(run_dir), "--epsilon", "1", "--port", "0",
                            "--memo", memo], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "s3cret" not in r.stderr and "s3cr%zzet" not in r.stderr


class _Proxy:
    """A TCP forwarder to the database that can be cut (listener and every connection closed) and
    restored on the same port: the database becomes unreachable for the memo, and only for it."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.port, self.upstream = port, upstream
        self.sockets: list[socket.socket] = []
        self.listener: socket.socket | None = None

    def start(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen()
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        except OSError:
            pass
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.sockets = []


def test_a_database_lost_at_request_time_answers_503_and_charges_nothing(run_dir, pg_url):
    from urllib.parse import urlsplit

    target = urlsplit(BASE_URL)
    proxy = _Proxy(free_port(), (target.hostname or "127.0.0.1", target.port or 5432))
    proxy.start()
    via_proxy = pg_url.replace(f"{target.hostname}:{target.port or 5432}", f"127.0.0.1:{proxy.port}")
    assert via_proxy != pg_url
    inputs = to_orig(np.random.default_rng(9).random((4, 2)))
    with server(run_dir, "--epsilon", "1", "--memo", via_proxy, "--budget", "10") as url:
        port = int(url.rsplit(":", 1)[1])
        assert post(port, [inputs[0]], "")[0] == 200
        proxy.cut()
        for row in (inputs[1], inputs[0]):  # a new input, and one answered before: the memo is needed for both
            status, body = post(port, [row], "")
            assert (status, body) == (503, {"error": "service unavailable"})
        proxy.start()
        deadline = time.monotonic() + 60
        while (status := post(port, [inputs[2]], "")[0]) != 200 and time.monotonic() < deadline:
            assert status == 503
            time.sleep(0.5)
        assert status == 200  # not latched: back with the database
        assert post(port, [inputs[1]], "")[0] == 200
    proxy.cut()
    rows = {r[0]: r for r in read_memo_ledger(pg_url)}
    assert rows["default"][2] == rows["*"][2] == 3  # inputs 0, 2, 1: the 503s were neither stored nor charged


def _with_password(url: str, password: str = "s3cret") -> str:
    """`url` with a password in its user part (trust authentication ignores it), or as it is without a user."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    return urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:{password}@{host}"))


def test_healthz_reports_an_unreachable_database_with_a_fixed_503(run_dir, pg_url):
    """Measured before: /healthz said 200 while every prediction got 503, so a load balancer kept
    sending clients to a replica cut off from its database. Now GET and HEAD /healthz answer 503 with
    one fixed body (no URL, password or driver text) within a few seconds of the cut, and 200 again
    once the database is back."""
    from urllib.parse import urlsplit

    target = urlsplit(BASE_URL)
    proxy = _Proxy(free_port(), (target.hostname or "127.0.0.1", target.port or 5432))
    proxy.start()
    via_proxy = _with_password(pg_url.replace(f"{target.hostname}:{target.port or 5432}",
                                              f"127.0.0.1:{proxy.port}"))
    said: list[str] = []
    with server(run_dir, "--epsilon", "1", "--memo", via_proxy, "--budget", "10", stderr_lines=said) as url:
        port = int(url.rsplit(":", 1)[1])
        assert get(port, "/healthz") == (200, b'{"status":"ok"}')
        proxy.cut()
        started = time.monotonic()
        while (answer := get(port, "/healthz"))[0] == 200 and time.monotonic() - started < 10:
            time.sleep(0.2)
        assert answer == (503, b'{"error":"memo database unreachable"}'), answer
        assert time.monotonic() - started < 5
        for _ in range(3):  # each within the probe's timeout, whatever the pool is doing
            t0 = time.monotonic()
            assert get(port, "/healthz", "HEAD") == (503, b"")
            assert get(port, "/healthz") == answer
            assert time.monotonic() - t0 < 4
        proxy.start()
        deadline = time.monotonic() + 60
        while (answer := get(port, "/healthz"))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert answer == (200, b'{"status":"ok"}')
        assert get(port, "/healthz", "HEAD") == (200, b"")
    proxy.cut()
    assert "s3cret" not in "".join(said)


def test_budget_and_report_read_a_postgresql_memo(run_dir, pg_url, tmp_path, capsys):
    """Measured before: `lucid budget --memo postgresql://...` and `lucid report --memo ...` took the
    URL for a file path ('postgresql:/...' does not exist) and printed it with its password."""
    from lucid.cli import main

    url = _with_password(pg_url)
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=url)
    clf.predict(to_orig(np.random.default_rng(4).random((7, 2))), client="alice")
    clf.close()

    def lucid(*argv: str) -> tuple[int, str, str]:
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = lucid("budget", str(run_dir), "--memo", url, "--json")
    assert code == 0, err
    doc = json.loads(out)
    alice = {c["client"]: c for c in doc["clients"]}["alice"]
    assert (alice["answers"], alice["noised"], alice["charged"]) == (7, 7, 3.5)
    assert doc["memo"].startswith("postgresql://") and "s3cret" not in out
    code, out, err = lucid("budget", str(run_dir), "--memo", url)
    assert code == 0 and "alice" in out and "s3cret" not in out + err

    report = tmp_path / "report.md"
    code, out, err = lucid("report", str(run_dir), "--memo", url, "-o", str(report), "-e", "1")
    assert code == 0, err
    text = report.read_text()
    assert "alice" in text and "postgresql://" in text and "s3cret" not in text + out + err

    port = free_port()  # nothing listens there
    for memo, words in [(f"postgresql://lucid:s3cret@127.0.0.1:{port}/test", "cannot read the ledger"),
                        ("postgresql://lucid:s3cr%zzet@127.0.0.1:5432/test", "not a PostgreSQL URL"),
                        ("postgresql://lucid:s3cret@[::1/test", "not a PostgreSQL URL"),
                        ("mysql://lucid:s3cret@db/test", "only postgresql://")]:
        for command in (["budget", str(run_dir)], ["report", str(run_dir), "-o", str(tmp_path / "r.md")]):
            code, out, err = lucid(*command, "--memo", memo)
            assert code == 2 and out == "", (command, memo, err)
            assert len(err.strip().splitlines()) == 1 and err.startswith("lucid: error:") and words in err, err
            assert "s3cret" not in err and "s3cr%zzet" not in err and "Traceback" not in err
    assert not (tmp_path / "r.md").exists()


# -- the backend is chosen by what --memo names ----------------------------------------------------------
def test_a_path_keeps_sqlite_and_a_url_selects_postgresql(tmp_path, pg_url):
    memo = open_memo(tmp_path / "m.sqlite")
    assert isinstance(memo, SqliteMemo) and (tmp_path / "m.sqlite").is_file()
    memo.close()
    memo = open_memo(str(tmp_path / "n.sqlite"))
    assert isinstance(memo, SqliteMemo)
    memo.close()
    memo = open_memo(pg_url)
    assert isinstance(memo, PostgresMemo) and "@" in memo.name
    memo.close()
    with pytest.raises(LucidError, match="only postgresql://"):
        open_memo("sqlite:///x.db")
