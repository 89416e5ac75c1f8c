"""`lucid serve RUN --epsilon E`: label-only, iDP-protected predictions over HTTP.

This module turns the flags into the classifier's, the service's and the connections' settings and
prints the start line; lucid/cli/serve_processes.py binds the socket and runs the server processes
(`--workers`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from lucid.access.guard import LOOPBACK_HOSTS
from lucid.access.ledger import EpsilonPlan
from lucid.access.limits import ServeLimits, ensure_open_files
from lucid.access.memo import DEFAULT_MEMO_SIZE, memo_target
from lucid.access.server import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY, ServiceOptions
from lucid.access.transport import ServeTransport, parse_forwarded_allow_ips
from lucid.cli.serve_processes import listen, serve_process, serve_workers
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


def startup_warnings(
    budget: float | None, host: str, allowed_hosts: str | None, total_budget: float | None = None
) -> list[str]:
    """One line per risky setting the operator may not have meant."""
    out = []
    if budget is None and total_budget is None:
        out.append(
            "no --budget or --total-budget: clients may collect unlimited fresh draws on neighbouring inputs (at "
            "epsilon 1, a majority vote over 101 inputs one float step apart recovers a 2-class N's label 99 % of "
            "the time); set --budget TOTAL (or --target-epsilon E --queries Q) and --total-budget, see "
            "docs/access.md#neighbouring-inputs"
        )
    if allowed_hosts is None and host in ("0.0.0.0", "::", ""):  # noqa: S104 (a check for the wildcard, not a binding)
        out.append(
            f"--host {host} without --allowed-hosts: only requests whose Host header names localhost, "
            "127.0.0.1, [::1] or this address are answered; list the names clients use with --allowed-hosts"
        )
    return out


def resolve_epsilon(
    epsilon: float | None, budget: float | None, target: float | None, delta: float | None, queries: int | None
) -> tuple[float, float | None, EpsilonPlan | None]:
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


DEADLINE_MS_DEPRECATED = (
    "--deadline-ms is deprecated and will be removed in the next version; use --min-response-ms "
    "(the same minimum response time)"
)


def _min_response_ms(min_response_ms: float | None, deadline_ms: float | None) -> float:
    """--min-response-ms, or its deprecated old name --deadline-ms (one warning line); 0 (off) without either."""
    if deadline_ms is None:
        return 0.0 if min_response_ms is None else min_response_ms
    click.echo(f"lucid: warning: {DEADLINE_MS_DEPRECATED}", err=True)
    if min_response_ms is not None:
        raise LucidError("give --min-response-ms or its deprecated name --deadline-ms, not both")
    return deadline_ms


@click.command(name="serve")
@click.argument("run", type=click.Path(path_type=Path))
@click.option(
    "--epsilon",
    "-e",
    type=float,
    default=None,
    help="Privacy budget of the exponential mechanism (or choose it with --target-epsilon).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to bind; 0: a free one, named in the line on stderr.",
)
@click.option(
    "--memo",
    default=None,
    metavar="FILE|URL",
    help="Memo of answers and privacy ledger: a SQLite file [default: RUN/memo.sqlite], or a "
    "postgresql://user@host:port/db URL that several replicas share. Keep it: deleting it lets "
    "clients re-sample noisy labels and forgets what they were charged.",
)
@click.option(
    "--memo-size",
    default=DEFAULT_MEMO_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most inputs the memo keeps (least recently used are evicted).",
)
@click.option("--clip", is_flag=True, help="Clip inputs outside the verified domain into it instead of refusing them.")
@click.option(
    "--api-key-env",
    metavar="VAR",
    default=None,
    help="Require 'Authorization: Bearer <token>' with the token read from this environment variable "
    "(one client, ledger 'default').",
)
@click.option(
    "--api-keys",
    type=click.Path(path_type=Path),
    default=None,
    help="File of 'NAME TOKEN' lines: one bearer token, and one privacy ledger, per client.",
)
@click.option(
    "--budget",
    type=float,
    default=None,
    metavar="TOTAL",
    help="Most epsilon charged per client (epsilon per distinct input answered, released or noised); "
    "further new inputs get HTTP 429. See `lucid budget`.",
)
@click.option(
    "--total-budget",
    type=float,
    default=None,
    metavar="TOTAL",
    help="Most epsilon charged to all clients together (epsilon per input the memo draws for any "
    "client: `lucid budget`'s all-clients row); further new inputs get HTTP 429.",
)
@click.option(
    "--target-epsilon",
    type=float,
    default=None,
    metavar="E",
    help="Choose --epsilon and --budget so that --queries distinct answers per client compose to "
    "(E, --delta)-iDP (as `lucid budget --plan` prints); not with --epsilon or --budget.",
)
@click.option("--delta", type=float, default=None, metavar="D", help="delta of --target-epsilon [default: 1e-6].")
@click.option(
    "--queries",
    type=int,
    default=None,
    metavar="Q",
    help="Distinct answers per client that --target-epsilon plans for (the budget is Q answers).",
)
@click.option(
    "--min-response-ms",
    type=float,
    default=None,
    metavar="MS",
    help="Minimum response time: hold every prediction response until this many ms after its request "
    "arrived (0: off; at most 60000) [default: 0].",
)
@click.option(
    "--deadline-ms",
    type=float,
    default=None,
    hidden=True,
    help="Deprecated name of --min-response-ms (kept for one version).",
)
@click.option(
    "--max-rows",
    "--max-batch",
    "max_batch",
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most inputs (rows) per request (413 above).",
)
@click.option(
    "--max-body",
    default=DEFAULT_MAX_BODY,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest request body in bytes.",
)
@click.option(
    "--allowed-hosts",
    metavar="H1,H2",
    default=None,
    help="Host header names answered, comma-separated, each with an optional :port (others get 400: "
    "DNS rebinding) [default: the --host address, localhost, 127.0.0.1, [::1]].",
)
@click.option(
    "--workers",
    type=int,
    default=_DEFAULTS.workers,
    show_default=True,
    help="Server processes sharing the port, the memo and the ledger.",
)
@click.option(
    "--threads",
    type=int,
    default=_DEFAULTS.threads,
    show_default=True,
    help="Threads per worker that parse and answer request bodies, off the event loop (as many again "
    "for bodies up to 64 KiB, so that batches never hold up small requests).",
)
@click.option(
    "--max-connections",
    type=int,
    default=_DEFAULTS.max_connections,
    show_default=True,
    help="Open connections per worker; further ones get 503 and are closed.",
)
@click.option(
    "--max-connections-per-ip",
    type=int,
    default=_DEFAULTS.max_connections_per_ip,
    show_default=True,
    metavar="N",
    help="Open connections per worker from one client address (an IPv6 client: its /64); "
    "further ones get 503 and are closed. A trusted proxy (--forwarded-allow-ips) is "
    "not held to it: cap connections per client at the proxy.",
)
@click.option(
    "--max-header-bytes",
    type=int,
    default=_DEFAULTS.max_header_bytes,
    show_default=True,
    help="Largest request line plus headers (431 above).",
)
@click.option(
    "--idle-timeout",
    type=float,
    default=_DEFAULTS.idle_timeout,
    show_default=True,
    metavar="S",
    help="Close a connection without a request under way after S seconds.",
)
@click.option(
    "--header-timeout",
    type=float,
    default=_DEFAULTS.header_timeout,
    show_default=True,
    metavar="S",
    help="A request line and headers must arrive within S seconds of their first byte (408).",
)
@click.option(
    "--body-timeout",
    type=float,
    default=_DEFAULTS.body_timeout,
    show_default=True,
    metavar="S",
    help="A request body must arrive within S seconds of its headers (408); a response the client "
    "stops reading is dropped after S seconds.",
)
@click.option(
    "--shutdown-timeout",
    type=float,
    default=_DEFAULTS.shutdown_timeout,
    show_default=True,
    metavar="S",
    help="On SIGTERM, requests already received get S seconds to be answered.",
)
@click.option(
    "--ssl-certfile",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="Serve HTTPS with this PEM certificate (chain); needs --ssl-keyfile.",
)
@click.option(
    "--ssl-keyfile",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE",
    help="The unencrypted PEM private key of --ssl-certfile.",
)
@click.option(
    "--rate",
    type=float,
    default=None,
    metavar="R",
    help="Most prediction requests per second per client (its token, or its address without tokens), "
    "per worker; further ones get 429 with Retry-After [default: no limit].",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="IP1,NET2",
    default=None,
    help="Reverse proxies (IP addresses or networks, comma-separated) whose X-Forwarded-For names the "
    "client: per-client caps and rates then count the client, not the proxy (docs/deploy.md).",
)
def command(
    run: Path,
    epsilon: float | None,
    host: str,
    port: int,
    memo: str | None,
    memo_size: int,
    clip: bool,
    api_key_env: str | None,
    api_keys: Path | None,
    budget: float | None,
    total_budget: float | None,
    target_epsilon: float | None,
    delta: float | None,
    queries: int | None,
    min_response_ms: float | None,
    deadline_ms: float | None,
    max_batch: int,
    max_body: int,
    allowed_hosts: str | None,
    workers: int,
    threads: int,
    max_connections: int,
    max_connections_per_ip: int,
    max_header_bytes: int,
    idle_timeout: float,
    header_timeout: float,
    body_timeout: float,
    shutdown_timeout: float,
    ssl_certfile: Path | None,
    ssl_keyfile: Path | None,
    rate: float | None,
    forwarded_allow_ips: str | None,
) -> None:
    """Serve RUN's classifier: POST /v1/predict {"inputs": [[...]]} -> {"labels": [...]}."""
    from lucid.access.classifier import ClassifierOptions, LabelOnlyClassifier
    from lucid.access.guard import check_min_response_ms, check_rate, parse_allowed_hosts
    from lucid.access.server import create_app

    min_response_ms = _min_response_ms(min_response_ms, deadline_ms)

    limits = ServeLimits(
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        shutdown_timeout=shutdown_timeout,
        max_header_bytes=max_header_bytes,
        max_connections=max_connections,
        max_connections_per_ip=max_connections_per_ip,
        threads=threads,
        workers=workers,
    )
    ensure_open_files(limits.max_connections)
    proxies = parse_forwarded_allow_ips(forwarded_allow_ips) if forwarded_allow_ips is not None else ()
    transport = ServeTransport(ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, forwarded_allow_ips=proxies)
    transport.ssl_context()  # the files' errors, in one line, before anything starts
    epsilon, budget, plan = resolve_epsilon(epsilon, budget, target_epsilon, delta, queries)
    min_response_ms = check_min_response_ms(min_response_ms)
    rate = check_rate(rate) if rate is not None else None
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
    served = ClassifierOptions(clip=clip, memo_size=memo_size, budget=budget, total_budget=total_budget)
    open_classifier = functools.partial(
        LabelOnlyClassifier.from_run, run, epsilon=epsilon, memo=memo_path, options=served
    )
    clf = open_classifier()  # also refuses a memo of another epsilon or other bounds, before listening
    sock = listen(host, port)
    port = sock.getsockname()[1]
    if hosts is None:
        hosts = [*LOOPBACK_HOSTS, f"[{host}]" if ":" in host else host]
    service = ServiceOptions(
        api_key=api_key,
        api_keys=key_table,
        max_body=max_body,
        max_batch=max_batch,
        min_response_ms=min_response_ms,
        allowed_hosts=hosts,
        threads=limits.threads,
        rate=rate,
        transport=transport,
    )
    app = create_app(clf, options=service)
    for line in startup_warnings(budget, host, allowed_hosts, total_budget):
        click.echo(f"lucid: warning: {line}", err=True)
    click.echo(f"lucid: limits: {limits.describe()}; requests up to {max_batch} rows and {max_body} B", err=True)
    auth = f", {len(key_table)} clients" if key_table else (", auth on" if api_key else "")
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address needs its brackets
    click.echo(
        f"lucid: serving {run} on {transport.scheme}://{netloc}/v1/predict "
        f"(epsilon={clf.epsilon:g}, memo={clf.memo.name}"
        f"{auth}{', clipping' if clip else ''}{_budget_note(budget, total_budget, plan)}"
        f"{f', minimum response time {min_response_ms:g} ms' if min_response_ms else ''}"
        f"{f', {rate:g} requests/s per client' if rate else ''}"
        f"{f', X-Forwarded-For trusted from {chr(44).join(proxies)}' if proxies else ''}); Ctrl-C stops",
        err=True,
    )
    if limits.workers == 1:
        serve_process(clf, app, sock, host, port, limits, transport)
        return
    for pool in app.state.pools:
        pool.shutdown()
    clf.close()  # each worker opens its own: a connection (or a pool's threads) must not cross a fork
    code = serve_workers(open_classifier, service, sock, host, port, limits, transport)
    if code:
        sys.exit(code)
