"""How `lucid serve` runs: the listening socket, and one serving process or several forked workers.

`--workers N` forks N server processes after the listening socket is bound: they accept on that one
socket (the kernel hands each connection to one of them) and share the memo, whose transactions keep
answers and budgets exact across processes (lucid/access/memo/store.py). With `--memo postgresql://...`
several `lucid serve` replicas, on several machines, share one memo the same way. Forking, not
SO_REUSEPORT: a second `lucid serve` started by mistake on the same port fails with one line
instead of silently taking a share of the connections. The parent only forwards SIGTERM / Ctrl-C;
a worker that ends on its own stops the others, so the service never runs with fewer workers than
it announced.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

import click

from lucid.access.limits import ServeLimits
from lucid.access.server import ServiceOptions
from lucid.access.transport import ServeTransport
from lucid.errors import LucidError

LISTEN_BACKLOG = 2048  # uvicorn's own default, which it passes to listen() again when it starts
# How long a thread running Python keeps the GIL while another waits (Python's default: 5 ms). A thread
# parsing a large body (valid or not) would otherwise hold up the event loop and a single row's thread
# up to 5 ms at each of their steps; measured with four 4 MB parse bombs beside a single-row client
# (benchmarks/serve_load.py --network): p99 52 ms at 5 ms, 25 ms at 1 ms.
GIL_SWITCH_S = 0.001


def listen(host: str, port: int) -> socket.socket:
    """The socket the server listens on (port 0: one the system picks). Bound and listening here,
    not in uvicorn, so that a taken port is one line before anything starts, the port named on
    stderr is the one bound, and connections are accepted from the moment it is named."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LucidError(f"cannot resolve host {host!r}: {exc}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        # listening before the start line is printed: a client that connects as soon as it reads the
        # address waits in the backlog instead of being refused until uvicorn starts (up to 55 ms)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise LucidError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM after uvicorn's graceful stop (uvicorn raises it again once done): end normally, so the
    prediction pool and the memo are closed, instead of dying on the default handler."""
    raise SystemExit(0)


def serve_process(
    clf: Any,
    app: Any,
    sock: socket.socket,
    host: str,
    port: int,
    limits: ServeLimits,
    transport: ServeTransport | None = None,
) -> None:
    """Serve `app` on `sock` in this process until SIGTERM or Ctrl-C, then close the pool and the memo."""
    import uvicorn

    from lucid.access.protocol import guarded_protocol, tls_protocol

    transport = ServeTransport() if transport is None else transport
    protocol: Any = guarded_protocol(limits, transport)
    context = transport.ssl_context()
    if context is not None:  # TLS here, not in uvicorn: its handshake needs a deadline (tls_protocol)
        protocol = tls_protocol(protocol, context, limits.header_timeout)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        server_header=False,
        http=protocol,
        ws="none",
        timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=limits.shutdown_timeout,  # type: ignore[arg-type]
        proxy_headers=False,  # X-Forwarded-For is read by lucid.access.transport alone
    )
    switch = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.setswitchinterval(switch)  # a server run inside another program (a test) leaves it as it was
        for pool in app.state.pools:
            pool.shutdown(wait=True, cancel_futures=True)  # a decision under way finishes first
        sock.close()
        clf.close()


def _worker(start: Callable[[], None]) -> None:
    """The body of a forked worker process: serve, then leave without the parent's clean-up."""
    code = 0
    try:
        start()
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal's group
        pass
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except LucidError as exc:
        click.echo(f"lucid: error: {exc}", err=True)
        code = LucidError.exit_code
    except BaseException:  # noqa: BLE001 (a worker process's last resort: the traceback is printed and it exits 1)
        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    os._exit(code)


def _supervise(pids: list[int]) -> int:
    """Wait for the workers; SIGTERM or Ctrl-C stops them all, and so does one ending on its own
    (its exit status, at least 1, is returned)."""
    alive = set(pids)
    stopping = False
    code = 0

    def stop(signum: int | None = None, frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while alive:
            pid, status = os.wait()
            alive.discard(pid)
            if not stopping:
                ended = os.waitstatus_to_exitcode(status)
                if ended != LucidError.exit_code:  # a worker's own error line was printed already
                    click.echo(
                        f"lucid: error: a worker process ended unexpectedly (exit status {ended}); stopping the others",
                        err=True,
                    )
                code = max(ended, 1)
                stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def serve_workers(
    open_classifier: Callable[[], Any],
    options: ServiceOptions,
    sock: socket.socket,
    host: str,
    port: int,
    limits: ServeLimits,
    transport: ServeTransport | None = None,
) -> int:
    """Fork `limits.workers` processes serving on `sock`, each with its own classifier (an SQLite
    connection must not cross a fork) and one shared fail-closed flag; wait for them."""
    from lucid.access.server import create_app

    failed = multiprocessing.RawValue(ctypes.c_bool, False)

    def start() -> None:
        clf = open_classifier()
        serve_process(clf, create_app(clf, options=options, failed=failed), sock, host, port, limits, transport)

    pids = []
    for _ in range(limits.workers):
        pid = os.fork()
        if pid == 0:
            _worker(start)
        pids.append(pid)
    sock.close()
    return _supervise(pids)
