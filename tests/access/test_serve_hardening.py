"""`lucid serve` on an open network: the memo's epsilon and bounds, request checks, fixed error
messages, minimum response time limits (and their deprecated flag --deadline-ms) and the startup
warnings (the issue "`lucid serve` ready for an open network"). Most checks run the ASGI app in
process; one test starts real servers."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import numpy as np
import pytest

from lucid.access import Charge, ClassifierOptions, LabelOnlyClassifier, Memo
from lucid.errors import LucidError
from serve_helpers import one_line, serve_cli, server, to_orig
from synthetic_runs import write_bounds


# -- 1. the memo records its epsilon and bounds -------------------------------------------------
def test_a_memo_refuses_another_epsilon_after_a_restart(run_dir, tmp_path):
    """The issue's case: 20 draws at epsilon 10, then a restart at 0.1 with a budget of 2 would
    hand a second client the epsilon = 10 draws charged 0.1 each (200-iDP, ledger 2)."""
    write_bounds(run_dir, {0: None, 1: None, 2: None})  # every input noised
    path = tmp_path / "m.sqlite"
    asked = to_orig(np.random.default_rng(0).random((20, 2)))
    first = LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=path)
    answers = first.predict(asked, client="alice").tolist()
    first.close()
    for memo in (path, Memo(path)):  # a file name, and an open Memo
        with pytest.raises(LucidError) as exc:
            LabelOnlyClassifier.from_run(run_dir, epsilon=0.1, memo=memo, options=ClassifierOptions(budget=2.0))
        message = one_line(exc)
        assert "epsilon = 10.0" in message and "--epsilon 10.0" in message and "new --memo" in message
    # The same epsilon is served, and the ledger charges the stored draws at their epsilon.
    again = LabelOnlyClassifier.from_run(run_dir, epsilon=10.0, memo=path, options=ClassifierOptions(budget=200.0))
    assert again.predict(asked, client="bob").tolist() == answers
    bob = {t.client: t for t in again.ledger()}["bob"]
    assert (bob.answers, bob.noised, bob.charged) == (20, 20, 200.0)
    again.close()
    # A raw Memo writes at its file's epsilon only.
    memo = Memo(path)
    with pytest.raises(LucidError, match="epsilon = 10.0"):
        memo.get_or_put([b"new"], np.array([0]), charge=Charge(client="carol", epsilon=0.1))
    assert memo.lookup(b"new") is None
    memo.close()


def test_a_memo_accepts_tighter_bounds_and_refuses_other_ones(run_dir, tmp_path):
    path = tmp_path / "m.sqlite"
    LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=path).close()
    write_bounds(run_dir, {0: 0.2, 1: 5.0, 2: -1.0})  # a continued verification: each bound lower
    LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=path).close()
    for bounds in ({0: 0.3, 1: 5.0, 2: -1.0}, {0: 0.2, 1: None, 2: -1.0}):  # back up: not tighter
        write_bounds(run_dir, bounds)
        with pytest.raises(LucidError) as exc:
            LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=path)
        assert "bounds" in one_line(exc) and "new --memo" in str(exc.value)


def _legacy(path, epsilons: list[float], unlogged: bool = False) -> None:
    """A lucid-memo/2 file (no epsilon record) whose memo draws were made at `epsilons`.
    (lucid-memo/1 files: tests/access/test_access.py::test_old_memo_files_are_migrated.)"""
    memo = Memo(path)
    for i, eps in enumerate(epsilons):
        memo._db.execute("DELETE FROM meta WHERE name IN ('epsilon', 'bounds')")
        memo._epsilon = None
        memo.get_or_put([bytes([i])], np.array([1]), charge=Charge(client="c", epsilon=eps))
    if unlogged:
        memo._db.execute("INSERT INTO memo (key, label, used, noised) VALUES (x'ff', 0, 0, 1)")
    memo._db.execute("DELETE FROM meta WHERE name IN ('epsilon', 'bounds')")
    memo._db.execute("UPDATE meta SET value = 'lucid-memo/2' WHERE name = 'format'")
    memo.close()


def test_memos_without_an_epsilon_record_are_adopted_only_when_their_ledger_proves_one(run_dir, tmp_path):
    _legacy(tmp_path / "one.sqlite", [0.5, 0.5])  # one epsilon in the draws' ledger: adopted
    with pytest.raises(LucidError, match="epsilon = 0.5"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=tmp_path / "one.sqlite")
    LabelOnlyClassifier.from_run(run_dir, epsilon=0.5, memo=tmp_path / "one.sqlite").close()
    for name, epsilons, unlogged in [("two", [0.5, 2.0], False), ("unlogged", [0.5], True)]:
        _legacy(tmp_path / f"{name}.sqlite", epsilons, unlogged)
        for eps in (0.5, 2.0):
            with pytest.raises(LucidError) as exc:
                LabelOnlyClassifier.from_run(run_dir, epsilon=eps, memo=tmp_path / f"{name}.sqlite")
            assert "cannot be established" in one_line(exc) and "new --memo" in str(exc.value)
    _legacy(tmp_path / "empty.sqlite", [])  # nothing drawn yet: takes the first epsilon
    LabelOnlyClassifier.from_run(run_dir, epsilon=3.0, memo=tmp_path / "empty.sqlite").close()
    with pytest.raises(LucidError, match="epsilon = 3.0"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, memo=tmp_path / "empty.sqlite")


def test_serve_refuses_a_memo_of_another_epsilon_end_to_end(run_dir, tmp_path):
    """Real servers: 20 noised answers at --epsilon 10, then `--epsilon 0.1 --budget 2` on the same
    memo exits 2 with one line before it listens."""
    write_bounds(run_dir, {0: None, 1: None, 2: None})
    memo = tmp_path / "m.sqlite"
    asked = to_orig(np.random.default_rng(3).random((20, 2)))
    with server(run_dir, "--epsilon", "10", "--memo", str(memo)) as url:
        r = httpx.post(url + "/v1/predict", json={"inputs": asked})
        assert r.status_code == 200 and len(r.json()["labels"]) == 20
    cmd = [sys.executable, "-m", "lucid", "serve", str(run_dir), "--port", "0", "--epsilon", "0.1",
           "--budget", "2", "--memo", str(memo)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        while first and not first.startswith("lucid: "):  # anything the interpreter says first
            first = proc.stderr.readline()
        assert first.startswith("lucid: error:"), f"the server started on the memo of another epsilon: {first}"
        assert proc.wait(timeout=60) == 2 and "lucid:" not in proc.stderr.read()
        assert "epsilon = 10.0" in first and "--epsilon 10.0" in first
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


# -- 2. the minimum response time is finite, >= 0 and at most 60 s -------------------------------
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e30", "-1", "60001"])
def test_bad_minimum_response_times_are_refused_everywhere(run_dir, tmp_path, capsys, monkeypatch, text):
    from lucid.access.server import ServiceOptions, create_app

    with pytest.raises(LucidError, match="minimum response time"):
        LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=ClassifierOptions(min_response_ms=float(text)))
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    with pytest.raises(LucidError, match="minimum response time"):
        create_app(clf, options=ServiceOptions(min_response_ms=float(text)))
    clf.close()
    for flag in ("--min-response-ms", "--deadline-ms"):  # the new name, and the deprecated one
        code, err = serve_cli(run_dir, ["-e", "1", "--memo", str(tmp_path / "m.sqlite"), f"{flag}={text}"],
                               capsys, monkeypatch)
        errors = [line for line in err.splitlines() if not line.startswith("lucid: warning:")]
        assert code == 2 and errors == [errors[0]] and errors[0].startswith("lucid: error:")
        assert "minimum response time" in errors[0]


def test_a_minimum_response_time_up_to_the_maximum_is_accepted(run_dir, tmp_path, capsys, monkeypatch):
    from lucid.access.guard import MAX_MIN_RESPONSE_MS
    from lucid.access.server import ServiceOptions, create_app

    assert MAX_MIN_RESPONSE_MS == 60_000
    options = ClassifierOptions(min_response_ms=MAX_MIN_RESPONSE_MS)
    LabelOnlyClassifier.from_run(run_dir, epsilon=1.0, options=options).close()
    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    create_app(clf, options=ServiceOptions(min_response_ms=0))
    create_app(clf, options=ServiceOptions(min_response_ms=MAX_MIN_RESPONSE_MS))
    clf.close()
    code, _ = serve_cli(run_dir, ["-e", "1", "--memo", str(tmp_path / "m.sqlite"), "--min-response-ms", "60000",
                                   "--budget", "5"], capsys, monkeypatch)
    assert code == "started"


def test_deadline_ms_is_a_deprecated_name_of_min_response_ms(run_dir, tmp_path, capsys, monkeypatch):
    """--deadline-ms still works for one version: one warning line on stderr, then the same service
    (the same minimum response time handed to the app, the same start line) as --min-response-ms."""
    import re

    import lucid.access.server as server

    handed: list[float] = []
    create_app = server.create_app

    def recording(clf, options=None, **kwargs):
        handed.append(options.min_response_ms)
        return create_app(clf, options=options, **kwargs)

    monkeypatch.setattr(server, "create_app", recording)
    common = ["-e", "1", "--memo", str(tmp_path / "m.sqlite"), "--budget", "5"]
    new_code, new_err = serve_cli(run_dir, [*common, "--min-response-ms", "25"], capsys, monkeypatch)
    old_code, old_err = serve_cli(run_dir, [*common, "--deadline-ms", "25"], capsys, monkeypatch)
    assert new_code == old_code == "started" and handed == [25.0, 25.0]
    assert "warning" not in new_err
    warnings = [line for line in old_err.splitlines() if line.startswith("lucid: warning:")]
    assert len(warnings) == 1 and "--deadline-ms is deprecated" in warnings[0] and "--min-response-ms" in warnings[0]

    def started(err: str) -> list[str]:  # the start lines, whatever free port each run was given
        lines = [line for line in err.splitlines() if "warning" not in line]
        return [re.sub(r":\d+/v1/predict", ":PORT/v1/predict", line) for line in lines]

    assert started(old_err) == started(new_err)
    assert any("minimum response time 25 ms" in line for line in started(new_err))
    # without either name the service has none; with both, one error line
    code, _ = serve_cli(run_dir, common, capsys, monkeypatch)
    assert code == "started" and handed[-1] == 0.0
    code, err = serve_cli(run_dir, [*common, "--min-response-ms", "5", "--deadline-ms", "5"], capsys, monkeypatch)
    errors = [line for line in err.splitlines() if not line.startswith("lucid: warning:")]
    assert code == 2 and len(errors) == 1 and "not both" in errors[0]


def test_serve_help_names_min_response_ms_not_its_deprecated_name(capsys):
    from lucid.cli import main

    main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--min-response-ms" in out and "--deadline-ms" not in out


# -- 5. the startup warnings ----------------------------------------------------------------------
def test_serve_warns_without_a_budget(run_dir, tmp_path, capsys, monkeypatch):
    code, err = serve_cli(run_dir, ["-e", "1", "--memo", str(tmp_path / "m.sqlite")], capsys, monkeypatch)
    warnings = [line for line in err.splitlines() if line.startswith("lucid: warning:")]
    assert code == "started" and len(warnings) == 1
    assert "--budget" in warnings[0] and "docs/access.md" in warnings[0] and "neighbour" in warnings[0]
    code, err = serve_cli(run_dir, ["-e", "1", "--memo", str(tmp_path / "m.sqlite"), "--budget", "10"],
                           capsys, monkeypatch)
    assert code == "started" and "warning" not in err
    from lucid.cli.serve import startup_warnings

    assert startup_warnings(1.0, "127.0.0.1", None) == [] and startup_warnings(1.0, "0.0.0.0", "h") == []
    (line,) = startup_warnings(1.0, "0.0.0.0", None)
    assert "--allowed-hosts" in line and "\n" not in line


def test_serve_refuses_bad_allowed_hosts(run_dir, tmp_path, capsys, monkeypatch):
    for value in ("", "a b", "[::1", "host:port", ","):
        code, err = serve_cli(run_dir, ["-e", "1", "--budget", "1", "--memo", str(tmp_path / "m.sqlite"),
                                         f"--allowed-hosts={value}"], capsys, monkeypatch)
        assert code == 2 and "--allowed-hosts" in err and len(err.splitlines()) == 1, value


# -- 3 and 4. fixed error messages and the request checks -----------------------------------------
def _client(app, host: str = "localhost") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}")


def _app(run_dir, **kw):
    from lucid.access.server import ServiceOptions, create_app

    clf = LabelOnlyClassifier.from_run(run_dir, epsilon=1.0)
    return create_app(clf, options=ServiceOptions(**kw))


def test_no_error_message_echoes_the_request(run_dir):
    secret = "Q" * 3_000_000
    json_type = {"content-type": "application/json"}
    bodies = [
        ('{"inputs": [[10.5, -4.8]], "' + secret + '": 1}', 422),
        ('{"' + secret + '": 1}', 422),
        ('{"inputs": [["' + secret + '"]]}', 422),
        ('{"inputs": [[10.5, -4.8], [10.5, -4.8, 1, 2, 3, 4, 5, 6, 7, 8, 9]]}', 422),
        ('{"inputs": [[' + ", ".join(["10.5"] * 1000) + "]]}", 422),
        ('{"inputs": [[10.5, -4.8]], "' + secret[:100] + '": ' + '"x"}', 422),
        ('{"inputs": "' + secret + '"}', 422),
        ("\xff" + secret, 400),
        ('{"inputs": [[' + "9" * 5000 + "]]}", 400),
    ]

    async def check() -> None:
        async with _client(_app(run_dir, max_body=8_000_000)) as client:
            for body, status in bodies:
                r = await client.post("/v1/predict", content=body.encode("utf-8", "surrogatepass"), headers=json_type)
                assert r.status_code == status, body[:60]
                assert len(r.content) < 200 and "QQQQ" not in r.text and "1, 2, 3" not in r.text, r.text[:200]
                assert set(r.json()) == {"error"}
            r = await client.post("/v1/predict", json={"inputs": [[10.5, -4.8]], "debugging": True})
            assert "debugging" not in r.text and r.status_code == 422
            r = await client.post("/v1/predict", json={"inputs": [[10.5, -4.8, 3.0]]})
            assert r.status_code == 422 and "3" not in r.json()["error"].replace("input 0", "")

    asyncio.run(check())


def test_only_json_bodies_are_accepted(run_dir):
    body = b'{"inputs": [[10.5, -4.8]]}'

    async def check() -> None:
        async with _client(_app(run_dir)) as client:
            for content_type in ["application/json", "application/json; charset=utf-8", "Application/JSON",
                                 "application/json;charset=UTF-8", "APPLICATION/JSON ; Charset=\"utf-8\""]:
                r = await client.post("/v1/predict", content=body, headers={"content-type": content_type})
                assert r.status_code == 200, content_type
            for content_type in [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                 "application/jsonx", "application/json; charset=latin-1", "text/json", ""]:
                headers = {} if content_type is None else {"content-type": content_type}
                r = await client.post("/v1/predict", content=body, headers=headers)
                assert r.status_code == 415, content_type
                assert r.json() == {"error": "the request body must be application/json"}

    asyncio.run(check())


def test_hosts_redirects_head_and_the_bearer_scheme(run_dir):
    body = {"inputs": to_orig([[0.5, 0.5]])}

    async def check() -> None:
        app = _app(run_dir, api_key="s3cret")
        auth = {"authorization": "Bearer s3cret"}
        for host in ["localhost", "127.0.0.1", "localhost:8000", "127.0.0.1:1", "[::1]", "[::1]:8000", "LocalHost"]:
            async with _client(app, host) as client:
                assert (await client.get("/healthz")).status_code == 200, host
                assert (await client.post("/v1/predict", json=body, headers=auth)).status_code == 200, host
        for host in ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.2", "[::2]:8000"]:
            async with _client(app, host) as client:
                for r in [await client.get("/healthz"), await client.post("/v1/predict", json=body, headers=auth),
                          await client.get("/nope")]:
                    assert r.status_code == 400 and r.json() == {"error": "unknown host"}, host
                    assert "evil" not in r.text
        async with _client(app) as client:
            r = await client.post("/v1/predict/", json=body, headers=auth)
            assert r.status_code == 404 and "location" not in r.headers
            r = await client.head("/healthz")
            assert r.status_code == 200
            for header in ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret", "bEaReR s3cret"]:
                r = await client.post("/v1/predict", json=body, headers={"authorization": header})
                assert r.status_code == 200, header
            for header in ["Bearer s3cret2", "Basic s3cret", "s3cret", "Bearers3cret", "Bearer", "bearer S3CRET"]:
                r = await client.post("/v1/predict", json=body, headers={"authorization": header})
                assert r.status_code == 401, header
        async with _client(_app(run_dir, allowed_hosts=["api.example.com", "10.0.0.5:8443"]), "api.example.com") as c:
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/healthz", headers={"host": "API.example.com:443"})).status_code == 200
            assert (await c.get("/healthz", headers={"host": "10.0.0.5:8443"})).status_code == 200
            assert (await c.get("/healthz", headers={"host": "10.0.0.5"})).status_code == 400
            assert (await c.get("/healthz", headers={"host": "localhost"})).status_code == 400

    asyncio.run(check())


def test_the_health_probe_is_cheap_and_bounded():
    """/healthz's memo probe (MemoHealth): a database that does not answer makes it say "unreachable"
    within its timeout, however long the query hangs; twenty checks at once start one probe, not
    twenty; an answer is reused for the cache time; a probe that raises counts as unreachable."""
    import threading
    import time

    from lucid.access.health import MemoHealth

    class Store:
        name = "postgresql://lucid@db/lucid"

        def __init__(self, answer, delay: float = 0.0) -> None:
            self.answer, self.delay, self.calls = answer, delay, 0
            self.release = threading.Event()

        def reachable(self, timeout: float) -> bool:
            self.calls += 1
            if self.delay:
                self.release.wait(self.delay)
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    async def check() -> None:
        hung = Store(True, delay=30)
        health = MemoHealth(hung, timeout=0.2, cache_s=0.0)
        started = time.monotonic()
        assert await asyncio.gather(*(health.ok() for _ in range(20))) == [False] * 20
        assert time.monotonic() - started < 2 and hung.calls == 1
        assert not await health.ok() and hung.calls == 1  # still the one probe, still hung
        hung.release.set()
        fine = Store(True)
        health = MemoHealth(fine, timeout=0.2, cache_s=60.0)
        assert await health.ok() and await health.ok() and fine.calls == 1  # the cached answer
        assert not await MemoHealth(Store(OSError("boom")), timeout=0.2).ok()
        assert await MemoHealth(object()).ok()  # a store without a probe: nothing to check

    asyncio.run(check())


def test_the_hardened_server_over_real_sockets(run_dir, tmp_path):
    """HEAD without a body, a foreign Host refused, no redirect for a trailing slash, and the
    startup warning, on a real `lucid serve`."""
    import http.client

    said: list[str] = []
    with server(run_dir, "--epsilon", "1", "--memo", str(tmp_path / "m.sqlite"), stderr_lines=said) as url:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        json_type = {"content-type": "application/json"}
        try:
            for method, path, headers, status, body in [
                ("HEAD", "/healthz", {}, 200, b""),
                ("GET", "/healthz", {"Host": "rebound.example"}, 400, b'{"error":"unknown host"}'),
                ("POST", "/v1/predict/", json_type, 404, b'{"error":"not found"}'),
                ("POST", "/v1/predict", {"content-type": "text/plain"}, 415, None),
            ]:
                conn.request(method, path, body=b'{"inputs": []}' if method == "POST" else None, headers=headers)
                r = conn.getresponse()
                got = r.read()
                assert r.status == status and r.getheader("location") is None and body in (None, got), path
        finally:
            conn.close()
    assert sum(line.startswith("lucid: warning:") and "--budget" in line for line in said) == 1

