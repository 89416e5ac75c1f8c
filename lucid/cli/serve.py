"""`lucid serve RUN --epsilon E`: label-only, iDP-protected predictions over HTTP.

`--workers N` forks N server processes after the listening socket is bound: they accept on that one
socket (the kernel hands each connection to one of them) and share the memo, whose transactions keep
answers and budgets exact across processes (lucid/access/memo_store.py). With `--memo postgresql://...`
several `lucid serve` replicas, on several machines, share one memo the same way. Forking, not
SO_REUSEPORT: a second `lucid serve` started by mistake on the same port fails with one line
instead of silently taking a share of the connections. The parent only forwards SIGTERM / Ctrl-C;
a worker that ends on its own stops the others, so the service never runs with fewer workers than
it announced.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import click

from lucid.access.guard import LOOPBACK_HOSTS
from lucid.access.ledger import EpsilonPlan
from lucid.access.limits import ServeLimits, ensure_open_files
from lucid.access.memo import DEFAULT_MEMO_SIZE, memo_target
from lucid.access.server import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY
from lucid.errors import LucidError

_DEFAULTS = ServeLimits()


def read_api_keys(path: Path) -> dict[str, str]:
    """`NAME TOKEN` per line (blank lines and # comments ignored) -> {name: token}."""
    from lucid.access.ledger import ALL_CLIENTS, check_client_name

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise LucidError(f"--api-keys: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise LucidError(f"--api-keys: {path} line {number}: expected 'NAME TOKEN'")
        name, token = parts
        try:
            check_client_name(name)
        except LucidError as exc:
            raise LucidError(f"--api-keys: {path} line {number}: {exc}") from None
        if name == ALL_CLIENTS or name in keys:
            raise LucidError(f"--api-keys: {path} line {number}: client {name!r} is listed twice or reserved")
        if token in keys.values():
            raise LucidError(f"--api-keys: {path} line {number}: this token is already another client's")
        keys[name] = token
    if not keys:
        raise LucidError(f"--api-keys: {path} lists no clients")
    return keys


def startup_warnings(budget: float | None, host: str, allowed_hosts: str | None,
                     total_budget: float | None = None) -> list[str]:
    """One line per risky setting the operator may not have meant."""
    out = []
    if budget is None and total_budget is None:
        out.append(
            "no --budget or --total-budget: clients may collect unlimited fresh draws on neighbouring inputs (at "
            "epsilon 1, a majority vote over 101 inputs one float step apart recovers a 2-class N's label 99 % of "
            "the time); set --budget TOTAL (or --target-epsilon E --queries Q) and --total-budget, see "
            "docs/access.md#neighbouring-inputs"
        )
    if allowed_hosts is None and host in ("0.0.0.0", "::", ""):
        out.append(f"--host {host} without --allowed-hosts: only requests whose Host header names localhost, "
                   "127.0.0.1, [::1] or this address are answered; list the names clients use with --allowed-hosts")
    return out


def resolve_epsilon(epsilon: float | None, budget: float | None, target: float | None, delta: float | None,
                    queries: int | None) -> tuple[float, float | None, EpsilonPlan | None]:
    """(epsilon, per-client budget, the plan they came from) from --epsilon/--budget or from
    --target-epsilon/--delta/--queries, which choose both (lucid.access.ledger.plan_epsilon)."""
    from lucid.access.ledger import DEFAULT_DELTA, check_plan, plan_epsilon

    if target is None:
        if delta is not None or queries is not None:
            raise LucidError("--delta and --queries go with --target-epsilon")
        if epsilon is None:
            raise LucidError("give --epsilon E, or --target-epsilon E --queries Q")
        return epsilon, budget, None
    if epsilon is not None or budget is not None:
        raise LucidError("--target-epsilon chooses --epsilon and --budget: give one or the other, not both")
    if queries is None:
        raise LucidError("--target-epsilon needs --queries Q: the distinct answers per client it is planned for")
    plan = plan_epsilon(*check_plan(target, DEFAULT_DELTA if delta is None else delta, queries))
    return plan.epsilon, plan.budget, plan


LISTEN_BACKLOG = 2048  # uvicorn's own default, which it passes to listen() again when it starts


def _listen(host: str, port: int) -> socket.socket:
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


def _budget_note(budget: float | None, total_budget: float | None, plan: EpsilonPlan | None) -> str:
    """The budgets' part of the start line."""
    note = ""
    if budget is not None:
        note += f", budget {budget:g} per client"
    if plan is not None:
        note += f" ({plan.queries} answers: ({plan.target:g}, {plan.delta:g})-iDP)"
    if total_budget is not None:
        note += f", total budget {total_budget:g}"
    return note


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM after uvicorn's graceful stop (uvicorn raises it again once done): end normally, so the
    prediction pool and the memo are closed, instead of dying on the default handler."""
    raise SystemExit(0)


def _serve_process(clf: Any, app: Any, sock: socket.socket, host: str, port: int, limits: ServeLimits) -> None:
    """Serve `app` on `sock` in this process until SIGTERM or Ctrl-C, then close the pool and the memo."""
    import uvicorn

    from lucid.access.protocol import guarded_protocol

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, server_header=False,
        http=guarded_protocol(limits), ws="none", timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=limits.shutdown_timeout,  # type: ignore[arg-type]
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
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
    except BaseException:
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
                    click.echo(f"lucid: error: a worker process ended unexpectedly (exit status {ended}); "
                               "stopping the others", err=True)
                code = max(ended, 1)
                stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _serve_workers(open_classifier: Callable[[], Any], app_options: dict, sock: socket.socket, host: str,
                   port: int, limits: ServeLimits) -> int:
    """Fork `limits.workers` processes serving on `sock`, each with its own classifier (an SQLite
    connection must not cross a fork) and one shared fail-closed flag; wait for them."""
    from lucid.access.server import create_app

    failed = multiprocessing.RawValue(ctypes.c_bool, False)

    def start() -> None:
        clf = open_classifier()
        _serve_process(clf, create_app(clf, **app_options, failed=failed), sock, host, port, limits)

    pids = []
    for _ in range(limits.workers):
        pid = os.fork()
        if pid == 0:
            _worker(start)
        pids.append(pid)
    sock.close()
    return _supervise(pids)


@click.command(name="serve")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--epsilon", "-e", type=float, default=None,
              help="Privacy budget of the exponential mechanism (or choose it with --target-epsilon).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind; 0: a free one, named in the line on stderr.")
@click.option("--memo", default=None, metavar="FILE|URL",
              help="Memo of answers and privacy ledger: a SQLite file [default: RUN/memo.sqlite], or a "
                   "postgresql://user@host:port/db URL that several replicas share. Keep it: deleting it lets "
                   "clients re-sample noisy labels and forgets what they were charged.")
@click.option("--memo-size", default=DEFAULT_MEMO_SIZE, show_default=True, type=click.IntRange(min=1),
              help="Most inputs the memo keeps (least recently used are evicted).")
@click.option("--clip", is_flag=True, help="Clip inputs outside the verified domain into it instead of refusing them.")
@click.option("--api-key-env", metavar="VAR", default=None,
              help="Require 'Authorization: Bearer <token>' with the token read from this environment variable "
                   "(one client, ledger 'default').")
@click.option("--api-keys", type=click.Path(path_type=Path), default=None,
              help="File of 'NAME TOKEN' lines: one bearer token, and one privacy ledger, per client.")
@click.option("--budget", type=float, default=None, metavar="TOTAL",
              help="Most epsilon charged per client (epsilon per distinct input answered, released or noised); "
                   "further new inputs get HTTP 429. See `lucid budget`.")
@click.option("--total-budget", type=float, default=None, metavar="TOTAL",
              help="Most epsilon charged to all clients together (epsilon per input the memo draws for any "
                   "client: `lucid budget`'s all-clients row); further new inputs get HTTP 429.")
@click.option("--target-epsilon", type=float, default=None, metavar="E",
              help="Choose --epsilon and --budget so that --queries distinct answers per client compose to "
                   "(E, --delta)-iDP (as `lucid budget --plan` prints); not with --epsilon or --budget.")
@click.option("--delta", type=float, default=None, metavar="D",
              help="delta of --target-epsilon [default: 1e-6].")
@click.option("--queries", type=int, default=None, metavar="Q",
              help="Distinct answers per client that --target-epsilon plans for (the budget is Q answers).")
@click.option("--deadline-ms", type=float, default=0.0, show_default=True,
              help="Hold every prediction response until this many ms after its request arrived (0: off; "
                   "at most 60000).")
@click.option("--max-rows", "--max-batch", "max_batch", default=DEFAULT_MAX_BATCH, show_default=True,
              type=click.IntRange(min=1), help="Most inputs (rows) per request (413 above).")
@click.option("--max-body", default=DEFAULT_MAX_BODY, show_default=True, type=click.IntRange(min=1),
              help="Largest request body in bytes.")
@click.option("--allowed-hosts", metavar="H1,H2", default=None,
              help="Host header names answered, comma-separated, each with an optional :port (others get 400: "
                   "DNS rebinding) [default: the --host address, localhost, 127.0.0.1, [::1]].")
@click.option("--workers", type=int, default=_DEFAULTS.workers, show_default=True,
              help="Server processes sharing the port, the memo and the ledger.")
@click.option("--threads", type=int, default=_DEFAULTS.threads, show_default=True,
              help="Threads per worker that parse and answer request bodies, off the event loop (as many again "
                   "for bodies up to 64 KiB, so that batches never hold up small requests).")
@click.option("--max-connections", type=int, default=_DEFAULTS.max_connections, show_default=True,
              help="Open connections per worker; further ones get 503 and are closed.")
@click.option("--max-connections-per-ip", type=int, default=_DEFAULTS.max_connections_per_ip, show_default=True,
              metavar="N", help="Open connections per worker from one client address (an IPv6 client: its /64); "
                                "further ones get 503 and are closed. Behind a reverse proxy every client has "
                                "the proxy's address: raise it to --max-connections there.")
@click.option("--max-header-bytes", type=int, default=_DEFAULTS.max_header_bytes, show_default=True,
              help="Largest request line plus headers (431 above).")
@click.option("--idle-timeout", type=float, default=_DEFAULTS.idle_timeout, show_default=True, metavar="S",
              help="Close a connection without a request under way after S seconds.")
@click.option("--header-timeout", type=float, default=_DEFAULTS.header_timeout, show_default=True, metavar="S",
              help="A request line and headers must arrive within S seconds of their first byte (408).")
@click.option("--body-timeout", type=float, default=_DEFAULTS.body_timeout, show_default=True, metavar="S",
              help="A request body must arrive within S seconds of its headers (408); a response the client "
                   "stops reading is dropped after S seconds.")
@click.option("--shutdown-timeout", type=float, default=_DEFAULTS.shutdown_timeout, show_default=True,
              metavar="S", help="On SIGTERM, requests already received get S seconds to be answered.")
def command(run: Path, epsilon: float | None, host: str, port: int, memo: str | None, memo_size: int, clip: bool,
            api_key_env: str | None, api_keys: Path | None, budget: float | None, total_budget: float | None,
            target_epsilon: float | None, delta: float | None, queries: int | None, deadline_ms: float,
            max_batch: int, max_body: int, allowed_hosts: str | None, workers: int, threads: int,
            max_connections: int, max_connections_per_ip: int, max_header_bytes: int, idle_timeout: float,
            header_timeout: float, body_timeout: float, shutdown_timeout: float) -> None:
    """Serve RUN's classifier: POST /v1/predict {"inputs": [[...]]} -> {"labels": [...]}."""
    from lucid.access.classifier import LabelOnlyClassifier
    from lucid.access.guard import check_deadline_ms, parse_allowed_hosts
    from lucid.access.server import create_app

    limits = ServeLimits(idle_timeout=idle_timeout, header_timeout=header_timeout, body_timeout=body_timeout,
                         shutdown_timeout=shutdown_timeout, max_header_bytes=max_header_bytes,
                         max_connections=max_connections, max_connections_per_ip=max_connections_per_ip,
                         threads=threads, workers=workers)
    ensure_open_files(limits.max_connections)
    epsilon, budget, plan = resolve_epsilon(epsilon, budget, target_epsilon, delta, queries)
    deadline_ms = check_deadline_ms(deadline_ms)
    hosts = parse_allowed_hosts(allowed_hosts) if allowed_hosts is not None else None
    if api_key_env is not None and api_keys is not None:
        raise LucidError("give --api-key-env or --api-keys, not both")
    key_table = read_api_keys(api_keys) if api_keys is not None else None
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise LucidError(f"--api-key-env: the environment variable {api_key_env} is not set or empty")
    if not run.is_dir():
        raise LucidError(f"run directory {run} does not exist")
    memo_path = memo_target(run, memo)  # a URL as typed: the memo layer tells it from a SQLite file
    open_classifier = functools.partial(LabelOnlyClassifier.from_run, run, epsilon=epsilon, memo=memo_path,
                                        clip=clip, memo_size=memo_size, budget=budget, total_budget=total_budget)
    clf = open_classifier()  # also refuses a memo of another epsilon or other bounds, before listening
    sock = _listen(host, port)
    port = sock.getsockname()[1]
    if hosts is None:
        hosts = [*LOOPBACK_HOSTS, f"[{host}]" if ":" in host else host]
    app_options = dict(api_key=api_key, max_body=max_body, max_batch=max_batch, api_keys=key_table,
                       deadline_ms=deadline_ms, allowed_hosts=hosts, threads=limits.threads)
    app = create_app(clf, **app_options)
    for line in startup_warnings(budget, host, allowed_hosts, total_budget):
        click.echo(f"lucid: warning: {line}", err=True)
    click.echo(f"lucid: limits: {limits.describe()}; requests up to {max_batch} rows and {max_body} B", err=True)
    auth = f", {len(key_table)} clients" if key_table else (", auth on" if api_key else "")
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address needs its brackets
    click.echo(
        f"lucid: serving {run} on http://{netloc}/v1/predict (epsilon={clf.epsilon:g}, memo={clf.memo.name}"
        f"{auth}{', clipping' if clip else ''}{_budget_note(budget, total_budget, plan)}"
        f"{f', deadline {deadline_ms:g} ms' if deadline_ms else ''}); Ctrl-C stops",
        err=True,
    )
    if limits.workers == 1:
        _serve_process(clf, app, sock, host, port, limits)
        return
    for pool in app.state.pools:
        pool.shutdown()
    clf.close()  # each worker opens its own: a connection (or a pool's threads) must not cross a fork
    code = _serve_workers(open_classifier, app_options, sock, host, port, limits)
    if code:
        sys.exit(code)
