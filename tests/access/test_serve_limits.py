"""`lucid serve` against stalled and heavy clients, over real sockets: a deadline for every phase
in which the server waits on a client, the header and connection caps, a stop that does not wait
for stalled clients, predictions off the event loop (single-row clients beside 10 000-row batches),
the new options' checks and start line, and `--workers` sharing one memo with exact budgets."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from lucid.access.limits import ServeLimits
from serve_helpers import (JSON, connect, httpx_post, port_of, read_response, request, serve_cli, server,
                           started_url, to_orig, until_closed)


# -- 1. every connection phase has a deadline ---------------------------------------------------
def test_every_phase_in_which_the_server_waits_on_a_client_has_a_deadline(run_dir, tmp_path):
    """Measured before: each of these connections stayed open indefinitely. Now: idle (new or after a
    response) closes at --idle-timeout, a head or body still arriving gets 408 at its deadline,
    however steadily its bytes trickle in."""
    args = ["-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite"), "--idle-timeout", "0.6",
            "--header-timeout", "1", "--body-timeout", "1.5", "--max-rows", "5"]
    with server(run_dir, *args) as url:
        started = time.monotonic()
        drips = {  # (opening bytes, then one of these every 0.1 s)
            "headers": (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\nx-a: ", b"a"),
            "body": (request(url, b"{" + b" " * 999)[:-999], b" "),
            "chunked": (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                        b"transfer-encoding: chunked\r\n\r\n", b"1\r\n \r\n"),
        }
        still = {name: connect(url, first) for name, (first, _) in drips.items()}
        quiet = {"new": connect(url), "half line": connect(url, b"POST /v1/pre")}
        kept = connect(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        closed_at: dict[str, float] = {}
        answers: dict[str, bytes] = {}

        def drip(name: str) -> None:
            sock = still[name]
            try:
                while time.monotonic() - started < 8:
                    sock.sendall(drips[name][1])
                    time.sleep(0.1)
            except OSError:  # the server closed it
                pass

        def watch(name: str, sock: socket.socket) -> None:
            answers[name] = until_closed(sock)
            closed_at[name] = time.monotonic() - started

        threads = [threading.Thread(target=drip, args=(n,)) for n in drips]
        threads += [threading.Thread(target=watch, args=item) for item in [*still.items(), *quiet.items()]]
        threads.append(threading.Thread(target=watch, args=("after a response", kept)))
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=20)
        # The row cap (--max-rows): a fixed 413.
        r = httpx_post(url, {"inputs": to_orig(np.full((6, 2), 0.5))})
        assert r == (413, {"error": "at most 5 inputs per request"})
    deadline = {"new": 0.6, "after a response": 0.6, "half line": 1.0, "headers": 1.0, "body": 1.5, "chunked": 1.5}
    for name, seconds in deadline.items():
        assert seconds - 0.1 <= closed_at[name] < seconds + 3, (name, closed_at[name])
    timed_out = b'HTTP/1.1 408 Request Timeout'
    for name in ("half line", "headers", "body", "chunked"):
        assert answers[name].startswith(timed_out) and answers[name].endswith(
            b'{"error":"the request did not arrive in time"}'), name
    assert answers["new"] == b"" and answers["after a response"].startswith(b"HTTP/1.1 200")


# -- 1. the header cap and the connection cap ---------------------------------------------------
def test_request_heads_and_connections_are_capped(run_dir, tmp_path):
    args = ["-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite"), "--max-header-bytes", "4096",
            "--max-connections", "4"]
    body = json.dumps({"inputs": to_orig([[0.5, 0.5]])}).encode()
    with server(run_dir, *args) as url:
        time.sleep(0.3)  # the start-up probes' connections are gone
        fits = until_closed(connect(url, request(url, body, b"x-pad: " + b"a" * 3000 + b"\r\nconnection: close\r\n")))
        assert fits.startswith(b"HTTP/1.1 200")
        over = until_closed(connect(url, request(url, body, b"x-pad: " + b"a" * 8000 + b"\r\n")))
        assert over.startswith(b"HTTP/1.1 431") and over.endswith(b'{"error":"the request headers are too large"}')
        # Measured before: a 50 MB header was read in full. Now the server stops reading it.
        sock, sent = connect(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nx-big: "), 0
        with pytest.raises(OSError):
            while sent < 50_000_000:
                sock.sendall(b"a" * 65536)
                sent += 65536
        sock.close()
        assert sent < 25_000_000  # what the socket buffers took before the reset, not 50 MB
        # The cap full of idle sockets: a newcomer is answered, and the socket idle longest is closed
        # for it (measured before: 503 while idle sockets held every slot).
        held = []
        for _ in range(4):
            held.append(connect(url))
            time.sleep(0.05)
        healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n"
        assert until_closed(connect(url, healthz)).startswith(b"HTTP/1.1 200")
        assert until_closed(held[0]) == b""
        # Connections busy with a request (a head under way) are never closed for a newcomer: once
        # they fill the cap, a newcomer gets 503 at once.
        busy = []
        for _ in range(4):
            busy.append(connect(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"))
            time.sleep(0.1)
        assert all(until_closed(sock) == b"" for sock in held[1:])  # the idle ones made room
        refused = until_closed(connect(url))
        assert refused.startswith(b"HTTP/1.1 503") and refused.endswith(b'{"error":"too many connections"}')
        busy[0].sendall(b"connection: close\r\n\r\n")
        assert until_closed(busy[0]).startswith(b"HTTP/1.1 200")
        for sock in busy[1:]:
            sock.close()


def test_a_body_framed_twice_is_refused_and_never_smuggles_a_second_request(run_dir, tmp_path):
    """Content-Length and Transfer-Encoding together: one 400 and the connection closes, so the
    bytes after the chunks are never read as a request (measured before: two answers). The check
    holds for a head split across reads and for a pipelined second request too."""
    args = ["-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite")]
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    head = (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    with server(run_dir, *args) as url:
        got = until_closed(connect(url, head + body))
        assert got.startswith(b"HTTP/1.1 400") and got.count(b"HTTP/1.1") == 1, got
        sock = connect(url, head[:40])  # the head in two reads
        time.sleep(0.2)
        sock.sendall(head[40:] + body)
        got = until_closed(sock)
        assert got.startswith(b"HTTP/1.1 400") and got.count(b"HTTP/1.1") == 1, got
        honest = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        got = until_closed(connect(url, honest + head + body))  # pipelined behind an honest request
        assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1") == 2 and b"HTTP/1.1 400" in got, got
        # either header alone still frames a body as usual
        doc = json.dumps({"inputs": to_orig([[0.5, 0.5]])}).encode()
        chunked = (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\nconnection: close\r\n\r\n"
                   + f"{len(doc):x}".encode() + b"\r\n" + doc + b"\r\n0\r\n\r\n")
        assert until_closed(connect(url, chunked)).startswith(b"HTTP/1.1 200")


def test_one_address_cannot_take_every_connection(run_dir, tmp_path):
    """Measured before: one address could open every connection the worker allows, shutting out
    every other client. Now its --max-connections-per-ip + 1-th open connection gets 503 and is
    closed at once; another address (127.0.0.2, also loopback) is still served, and a closed
    connection gives its address the slot back."""
    args = ["-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite"), "--max-connections", "50",
            "--max-connections-per-ip", "3", "--idle-timeout", "30"]
    healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n"
    with server(run_dir, *args) as url:
        time.sleep(0.3)  # the start-up probes' connections are gone
        held = [connect(url) for _ in range(3)]  # idle: they hold their slots
        time.sleep(0.2)
        refused = until_closed(connect(url, healthz), limit=5)
        assert refused.startswith(b"HTTP/1.1 503") and refused.endswith(
            b'{"error":"too many connections from this address"}'), refused
        other = [connect(url, source="127.0.0.2") for _ in range(3)]  # its own 3
        answered = until_closed(connect(url, healthz, source="127.0.0.3"), limit=5)
        assert answered.startswith(b"HTTP/1.1 200") and answered.endswith(b'{"status":"ok"}')
        held.pop().close()
        # the slot comes back once the server has seen the close: ask again until it has (a server
        # descheduled for a while may take the next connection before it reads the close)
        deadline = time.monotonic() + 10.0
        while (again := until_closed(connect(url, healthz), limit=5)).startswith(b"HTTP/1.1 503") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert again.startswith(b"HTTP/1.1 200"), again
        for sock in [*held, *other]:
            assert sock.fileno() != -1
            sock.close()


def test_client_addresses_are_grouped_for_the_cap():
    from lucid.access.limits import client_group

    assert client_group("203.0.113.7") == "203.0.113.7"
    assert client_group("::ffff:203.0.113.7") == "203.0.113.7"  # an IPv4 client on a dual-stack socket
    assert client_group("2001:db8:1:2:aaaa::1") == client_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert client_group("2001:db8:1:3::1") != client_group("2001:db8:1:2::1")
    assert client_group("fe80::1%eth0") == "fe80::/64"
    assert client_group(None) is None and client_group("/run/lucid.sock") is None


# -- 1. request bodies: refused at --max-body before they are read -------------------------------
def test_a_body_over_max_body_is_refused_before_it_is_read(run_dir, tmp_path):
    """A Content-Length over --max-body gets 413 at once, before a byte of the body is sent (so none
    is buffered); the slow body that follows is read and dropped until --body-timeout closes the
    connection. A chunked body (no length to check) gets 413 as soon as it passes the cap, while it is
    still arriving, and the worker's memory does not grow with what a client sends after that."""
    procs: list[subprocess.Popen] = []
    args = ["-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite"), "--max-body", "1000",
            "--body-timeout", "2"]
    too_large = b'{"error":"the request body must be at most 1000 bytes"}'
    with server(run_dir, *args, procs=procs) as url:
        sock = connect(url, b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                            b"content-length: 10000000000\r\n\r\n")
        started = time.monotonic()
        answer = read_response(sock, limit=2)
        assert answer.startswith(b"HTTP/1.1 413") and answer.endswith(too_large), answer
        assert time.monotonic() - started < 1
        try:  # the slow body: a byte every 0.1 s, until the server closes the connection
            while time.monotonic() - started < 8:
                sock.sendall(b" ")
                time.sleep(0.1)
        except OSError:
            pass
        closed = time.monotonic() - started
        sock.close()
        assert 1.5 < closed < 5, closed

        chunked = connect(url, b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\n"
                               b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        chunked.settimeout(0.3)
        for _ in range(10):  # 1000 bytes: at the cap, not over it
            chunked.sendall(b"64\r\n" + b" " * 100 + b"\r\n")
            time.sleep(0.03)
        with pytest.raises(socket.timeout):
            chunked.recv(65536)  # no answer yet: the body may still end within the cap
        chunked.sendall(b"1\r\n \r\n")  # byte 1001
        answer = read_response(chunked, limit=2)
        assert answer.startswith(b"HTTP/1.1 413") and answer.endswith(too_large), answer
        worker = psutil.Process(procs[0].pid)
        before = worker.memory_info().rss
        sent = 0
        try:  # 64 MB more, as fast as the server reads: read and dropped, never held
            while sent < 64_000_000:
                chunked.sendall(b"10000\r\n" + b" " * 65536 + b"\r\n")
                sent += 65536
        except OSError:
            pass
        chunked.close()
        assert worker.memory_info().rss - before < 16_000_000


# -- 1. a stop does not wait for stalled clients ------------------------------------------------
def test_sigterm_stops_at_once_whatever_clients_are_still_sending(run_dir, tmp_path):
    """Measured before: one half-sent request held up the stop indefinitely. Default (long) timeouts,
    so only the stop itself can close these."""
    procs: list[subprocess.Popen] = []
    with server(run_dir, "-e", "1", "--budget", "100", "--memo", str(tmp_path / "m.sqlite"), procs=procs) as url:
        stalled = [connect(url), connect(url, b"POST /v1/pre"), connect(url, request(url, b"{" + b" " * 999)[:-500])]
        answered = connect(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answered.recv(100)
        time.sleep(0.3)
        started = time.monotonic()
        procs[0].terminate()
        assert procs[0].wait(timeout=10) == 0
        assert time.monotonic() - started < 3
        for sock in [*stalled, answered]:
            until_closed(sock, limit=1)


# -- 2. predictions off the event loop ----------------------------------------------------------
def test_single_row_clients_are_not_starved_by_10000_row_batches(run_dir, tmp_path):
    """Two clients post new 10 000-row batches in a loop; a single-row client's requests wait for at
    most about one batch's decision (the memo takes one writer at a time), never for a queue of them.

    The bounds are relative to the batches beside it, which wait for each other's decision, so that
    other work on the machine (another test, another job) does not fail them: the single-row p90
    stays below the batches' median latency, and the p99 below 1.5 times it and below 1 s. Measured on
    a 2-core machine busy with other work, p90 / p99 / batch median: before the change (decisions on
    the event loop, a plain lock) 573 / 652 / 515, 557 / 578 / 516 and 600 / 707 / 547 ms; after it
    285 / 299 / 465, 286 / 340 / 486 and 355 / 410 / 486 ms. benchmarks/serve_load.py measures the
    real numbers."""
    rng = np.random.default_rng(0)
    # Built before the load: the client's own JSON encoding would take CPU from the server.
    bodies = [json.dumps({"inputs": to_orig(rng.random((10_000, 2)))}) for _ in range(32)]
    singles = [json.dumps({"inputs": to_orig(rng.random((1, 2)))}) for _ in range(400)]
    with server(run_dir, "-e", "1", "--budget", "1e9", "--memo", str(tmp_path / "m.sqlite")) as url:
        def post(conn: http.client.HTTPConnection, body: str) -> tuple[int, bytes]:
            conn.request("POST", "/v1/predict", body, JSON)
            r = conn.getresponse()
            return r.status, r.read()

        conn = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=60)
        assert post(conn, json.dumps({"inputs": to_orig(rng.random((10_001, 2)))})) == (
            413, b'{"error":"at most 10000 inputs per request"}')
        stop, errors, batches = threading.Event(), [], []

        def large(first: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=60)
            for body in itertools.cycle(bodies[first::2]):  # new inputs, then memo hits
                if stop.is_set():
                    break
                t0 = time.perf_counter()
                status, _ = post(c, body)
                batches.append(time.perf_counter() - t0)
                if status != 200:
                    errors.append(status)

        threads = [threading.Thread(target=large, args=(k,)) for k in (0, 1)]
        for th in threads:
            th.start()
        time.sleep(0.5)
        latencies: list[float] = []
        end = time.monotonic() + 20
        for body in singles:
            if (len(latencies) >= 30 and len(batches) >= 16) or time.monotonic() > end:
                break
            t0 = time.perf_counter()
            status, _ = post(conn, body)
            latencies.append(time.perf_counter() - t0)
            assert status == 200
            time.sleep(float(rng.uniform(0, 0.03)))  # arrivals at random points of the batches
        stop.set()
        for th in threads:
            th.join(timeout=60)
    p90, p99 = (float(np.percentile(latencies, q)) for q in (90, 99))
    batch = float(np.median(batches))
    note = (f"single-row p90 {p90 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms ({len(latencies)} requests), "
            f"batches {batch * 1e3:.0f} ms (median)")
    print(note)
    assert not errors
    assert p90 < batch and p99 < min(1.5 * batch, 1.0), note


def test_small_requests_pass_queued_batches_at_the_gate():
    """The decision gate: a single row queued after a 10 000-row batch goes first; a batch is passed
    only by requests arriving within rows x ROW_COST_S of it."""
    from lucid.access.server import SizeOrderedGate

    gate, order = SizeOrderedGate(row_cost=1e-3), []

    def take(name: str, rows: int) -> None:
        with gate.hold(rows):
            order.append(name)

    def waiting(n: int) -> None:  # until n threads wait at the gate (a fixed sleep let a loaded
        deadline = time.monotonic() + 10  # machine start the next thread before this one arrived)
        while len(gate._waiting) < n:
            assert time.monotonic() < deadline, "a thread never reached the gate"
            time.sleep(0.005)

    with gate.hold(1):  # a decision under way
        batch = threading.Thread(target=take, args=("batch", 10_000))
        batch.start()
        waiting(1)
        single = threading.Thread(target=take, args=("single", 1))
        single.start()
        waiting(2)
    batch.join(5)
    single.join(5)
    assert order == ["single", "batch"]
    with gate.hold(1):
        old = threading.Thread(target=take, args=("old batch", 10))  # waits beyond 10 x 1 ms
        old.start()
        waiting(1)
        time.sleep(0.1)  # at least 0.1 s after the old batch arrived (its key is its arrival)
        late = threading.Thread(target=take, args=("late single", 1))
        late.start()
        waiting(2)
    old.join(5)
    late.join(5)
    assert order[2:] == ["old batch", "late single"]


def test_a_response_the_client_stops_reading_is_dropped():
    """The send deadline, at the protocol level: once the transport's buffer stays full (the client
    reads nothing) for --body-timeout, the connection is aborted."""
    import uvicorn
    from uvicorn.server import ServerState

    from lucid.access.protocol import guarded_protocol

    class Transport(asyncio.Transport):
        aborted = closing = False

        def get_extra_info(self, name, default=None):
            return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

        def is_closing(self) -> bool:
            return self.closing or self.aborted

        def abort(self) -> None:
            self.aborted = True

        def write(self, data) -> None:
            pass

    async def run() -> Transport:
        config = uvicorn.Config(lambda *a: None, http=guarded_protocol(ServeLimits(body_timeout=0.1)), ws="none")
        config.load()
        proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
        transport = Transport()
        proto.connection_made(transport)
        proto.pause_writing()
        await asyncio.sleep(0.3)
        assert transport.aborted
        resumed = Transport()
        proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
        proto.connection_made(resumed)
        proto.pause_writing()
        proto.resume_writing()  # the client read: no deadline
        await asyncio.sleep(0.3)
        return resumed

    assert not asyncio.run(run()).aborted


# -- 3. the options: checked, and named in the start line -------------------------------------
@pytest.mark.parametrize("option, value", [
    ("--idle-timeout", "0"), ("--idle-timeout", "nan"), ("--header-timeout", "inf"), ("--body-timeout", "-1"),
    ("--shutdown-timeout", "3601"), ("--shutdown-timeout", "nan"), ("--workers", "0"), ("--workers", "65"),
    ("--threads", "0"), ("--max-connections", "0"), ("--max-header-bytes", "100"), ("--max-rows", "0"),
    ("--max-connections-per-ip", "0"), ("--max-connections-per-ip", "100001"), ("--max-connections-per-ip", "x"),
])
def test_bad_limits_are_refused_in_one_line(run_dir, tmp_path, capsys, monkeypatch, option, value):
    code, err = serve_cli(run_dir, ["-e", "1", "--budget", "1", "--memo", str(tmp_path / "m.sqlite"),
                                     f"{option}={value}"], capsys, monkeypatch)
    assert code == 2 and err.startswith("lucid: error:") and option in err and len(err.splitlines()) == 1, err


def test_the_start_lines_name_the_limits(run_dir, tmp_path, capsys, monkeypatch):
    code, err = serve_cli(run_dir, ["-e", "1", "--budget", "1", "--memo", str(tmp_path / "m.sqlite")],
                           capsys, monkeypatch)
    assert code == "started"
    assert ("lucid: limits: 1 worker x 4 threads (+4 for small requests), 1024 connections per worker (64 per client "
            "address), headers up to 16384 B; timeouts: idle 5 s, headers 10 s, body 30 s, stop 10 s; requests up to "
            "10000 rows and 4194304 B") in err
    assert ServeLimits().describe() in err


# -- 4. worker processes share the memo, and budgets stay exact ---------------------------------
def test_workers_race_one_budget_and_it_stays_exact(run_dir, tmp_path):
    """3 processes, 8 threads x 12 requests of one new input each, for one client with a budget of
    30 answers: exactly 30 are answered, and the ledger says so."""
    memo = tmp_path / "m.sqlite"
    inputs = to_orig(np.random.default_rng(5).random((96, 2)))
    statuses: list[int] = []
    procs: list[subprocess.Popen] = []
    with server(run_dir, "-e", "1", "--budget", "30", "--memo", str(memo), "--workers", "3", procs=procs) as url:
        workers = psutil.Process(procs[0].pid).children()
        assert len(workers) == 3

        def client(t: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port_of(url), timeout=60)
            for i in range(12):
                conn.request("POST", "/v1/predict", json.dumps({"inputs": [inputs[t * 12 + i]]}), JSON)
                r = conn.getresponse()
                r.read()
                statuses.append(r.status)

        threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        procs[0].terminate()
        assert procs[0].wait(timeout=15) == 0
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert sorted(set(statuses)) == [200, 429] and statuses.count(200) == 30 and len(statuses) == 96
    r = subprocess.run([sys.executable, "-m", "lucid", "budget", str(run_dir), "--memo", str(memo), "--json"],
                       capture_output=True, text=True)
    default = {c["client"]: c for c in json.loads(r.stdout)["clients"]}["default"]
    assert (default["answers"], default["refused"], default["charged"]) == (30, 66, 30.0)


def test_the_address_accepts_connections_as_soon_as_it_is_printed(run_dir, tmp_path):
    """Measured before: connections were refused for up to 55 ms after the start line on 2 of 5
    starts. The socket now listens before the line is printed."""
    for attempt in range(3):
        cmd = [sys.executable, "-m", "lucid", "serve", str(run_dir), "--port", "0", "-e", "1", "--budget", "10",
               "--memo", str(tmp_path / f"m{attempt}.sqlite")]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        try:
            url = started_url(proc)
            sock = connect(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n")
            assert until_closed(sock, limit=30).startswith(b"HTTP/1.1 200")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            proc.stderr.close()


def test_a_half_closed_connection_gets_the_answer_it_is_charged_for(run_dir, tmp_path):
    """A client that shuts its sending side after a complete request (`nc -N`) gets that request's
    answer, then the connection closes (measured before: no answer, but charged). A request still
    incomplete at the shutdown is neither answered nor charged."""
    memo = tmp_path / "m.sqlite"
    inputs = to_orig(np.random.default_rng(7).random((3, 2)))
    with server(run_dir, "-e", "1", "--budget", "100", "--memo", str(memo)) as url:
        for row in inputs:
            sock = connect(url, request(url, json.dumps({"inputs": [row]}).encode()))
            sock.shutdown(socket.SHUT_WR)
            got = until_closed(sock)
            assert got.startswith(b"HTTP/1.1 200") and b'"labels":[' in got, got
        half = request(url, json.dumps({"inputs": to_orig([[0.3, 0.9]])}).encode())
        sock = connect(url, half[:-5])  # the body's last bytes never come
        sock.shutdown(socket.SHUT_WR)
        assert until_closed(sock) == b""
    r = subprocess.run([sys.executable, "-m", "lucid", "budget", str(run_dir), "--memo", str(memo), "--json"],
                       capture_output=True, text=True)
    default = {c["client"]: c for c in json.loads(r.stdout)["clients"]}["default"]
    assert default["answers"] == 3, default


def test_requests_pipelined_behind_unread_answers_go_after_a_client_that_waits(run_dir, tmp_path):
    """40 connections pipeline 150 single-row requests each and never read an answer; a client that
    waits for each answer is then answered before almost all of them. Measured on the memo's order of
    writes (`used`), not on a clock: before, each honest request queued behind one request of every
    such connection (about 40 answered ahead of it); now it starts at once. The median over seven
    honest requests, because a test process descheduled on a loaded machine lets the server answer
    the flood between the memo's read and the honest request's arrival."""
    import sqlite3

    memo = tmp_path / "m.sqlite"
    rng = np.random.default_rng(0)
    flood_size = 40 * 150
    with server(run_dir, "-e", "1", "--memo", str(memo), "--max-connections-per-ip", "1000") as url:
        flood = []
        for _ in range(40):
            rows = rng.uniform(0.01, 0.99, size=(150, 2))
            flood.append(connect(url, b"".join(
                request(url, json.dumps({"inputs": to_orig(row[None])}).encode()) for row in rows)))
        deadline = time.monotonic() + 20.0
        while not memo.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        db = sqlite3.connect(memo, timeout=10.0)
        while _memo_rows(db) <= 100 and time.monotonic() < deadline:  # until the flood is being answered
            time.sleep(0.02)
        ahead = []
        for k in range(7):
            honest = [[k / 8 + 0.0625, 0.5]]  # exact in the run's scaling, so its memo key is these bytes
            before = db.execute("SELECT max(used) FROM memo").fetchone()[0]
            sock = connect(url, request(url, json.dumps({"inputs": to_orig(honest)}).encode()))
            assert read_response(sock).startswith(b"HTTP/1.1 200")
            sock.close()
            used = db.execute("SELECT used FROM memo WHERE key = ?", (np.asarray(honest, np.float64).tobytes(),)).fetchone()
            ahead.append(db.execute("SELECT count(*) FROM memo WHERE used > ? AND used < ?", (before, used[0])).fetchone()[0])
        total = _memo_rows(db)
        db.close()
        for s in flood:
            s.close()
    assert total < flood_size  # the flood was still being answered
    assert sorted(ahead)[3] <= 5, f"{ahead} pipelined requests were answered ahead of a client that waits"


def _memo_rows(db) -> int:
    import sqlite3

    try:
        return db.execute("SELECT count(*) FROM memo").fetchone()[0]
    except sqlite3.OperationalError:  # the server has not created the table yet
        return 0
