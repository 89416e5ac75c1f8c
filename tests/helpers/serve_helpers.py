"""What the `lucid serve` tests share: the synthetic run they serve, a real server process on a free
port, `lucid serve` run in process up to the point where uvicorn would start, and raw-socket
clients (connections that stall, send odd bytes or come from another loopback address)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from synthetic_runs import write_synthetic_run

OFFSET = np.array([10.0, -5.0])
SCALE = np.array([0.5, 2.0])
LABELS = ["low", "mid", "high"]
JSON = {"content-type": "application/json"}
BOUNDS = {0: 0.3, 1: None, 2: -1.0}  # class 0 and 2 released above a confidence, class 1 always noised


def write_run(path: Path, bounds: dict | None = None) -> Path:
    """The 2-feature, 3-class synthetic run every serve test answers from."""
    return write_synthetic_run(path, labels=LABELS, offset=OFFSET, scale=SCALE,
                               bounds=BOUNDS if bounds is None else bounds)


def to_orig(xn) -> list[list[float]]:
    """Network-space points as the original units a client sends."""
    return (np.asarray(xn) / SCALE + OFFSET).tolist()


def one_line(exc: pytest.ExceptionInfo) -> str:
    """An exception's message, checked to be one line."""
    message = str(exc.value)
    assert "\n" not in message
    return message


# -- a real server ------------------------------------------------------------------------------------
@contextlib.contextmanager
def server(run_dir: Path, *args: str, env: dict | None = None, stderr_lines: list[str] | None = None,
           procs: list | None = None):
    """`lucid serve` on a port the system picks (--port 0; the server names it on stderr). The
    lines it printed up to its URL are appended to `stderr_lines`, its process to `procs`."""
    cmd = [sys.executable, "-m", "lucid", "serve", str(run_dir), "--port", "0", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    if procs is not None:
        procs.append(proc)
    try:
        said = []
        watchdog = threading.Timer(60, proc.kill)  # a server that never says its URL ends the wait
        watchdog.start()
        try:
            while not (found := re.search(r" on (http://127\.0\.0\.1:\d+)/v1/predict", "".join(said))):
                line = proc.stderr.readline()  # the server's stderr closes when it exits
                if not line:
                    raise AssertionError(f"server exited early: {''.join(said)}")
                said.append(line)
        finally:
            watchdog.cancel()
        if stderr_lines is not None:
            stderr_lines.extend(said)
        url = found.group(1)
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited early: {''.join(said)}{proc.stderr.read()}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("server did not start")
            time.sleep(0.1)
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, SIGKILL after 10 s; its stderr pipe closed."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def started_url(proc: subprocess.Popen, scheme: str = "http") -> str:
    """The URL a `lucid serve --port 0` names on stderr (`scheme`://127.0.0.1:PORT), read line by line."""
    while True:
        line = proc.stderr.readline()
        assert line, "the server ended before naming its address"
        found = re.search(rf" on ({scheme}://127\.0\.0\.1:\d+)/v1/predict", line)
        if found:
            return found.group(1)


def serve_cli(run_dir: Path, args: list[str], capsys, monkeypatch) -> tuple[object, str]:
    """`lucid serve` in process up to the point where uvicorn would run: (exit code or 'started',
    stderr)."""
    import uvicorn

    from lucid.cli import main

    class Started(Exception):
        pass

    def config(*args, **kwargs):  # before uvicorn configures logging onto the captured stderr
        raise Started

    monkeypatch.setattr(uvicorn, "Config", config)
    try:
        main(["serve", str(run_dir), "--port", "0", *args])
        code: object = 0
    except Started:
        code = "started"
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- clients ---------------------------------------------------------------------------------------------
def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def connect(url: str, data: bytes = b"", source: str | None = None) -> socket.socket:
    """A raw connection to the server (from loopback address `source`, e.g. 127.0.0.2), `data` sent."""
    sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10,
                                    source_address=None if source is None else (source, 0))
    if data:
        sock.sendall(data)
    return sock


def until_closed(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (AssertionError after `limit` s)."""
    got = b""
    sock.settimeout(limit)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except socket.timeout:
        raise AssertionError(f"still open after {limit} s; received {got[:60]!r}") from None
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return got


def read_response(sock: socket.socket, limit: float = 5.0) -> bytes:
    """One whole response (head and Content-Length body) from a raw connection, which stays open."""
    sock.settimeout(limit)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before a whole response head: {got[:60]!r}")
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
    while length and len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def request(url: str, body: bytes, extra: bytes = b"") -> bytes:
    """The bytes of a POST /v1/predict with `body` (and `extra` header lines)."""
    return (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n" + extra
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def httpx_post(url: str, doc: dict) -> tuple[int, dict]:
    r = httpx.post(url + "/v1/predict", json=doc)
    return r.status_code, r.json()


def post(port: int, rows: list, token: str = "") -> tuple[int, dict]:
    """One POST /v1/predict of `rows` on a new connection: (status, JSON body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {**JSON, **({"authorization": f"Bearer {token}"} if token else {})}
        conn.request("POST", "/v1/predict", json.dumps({"inputs": rows}), headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """One request without a body on a new connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()
