"""HTTP front end of the label-only classifier (FastAPI; `lucid serve` runs it under uvicorn).

    POST /v1/predict  {"inputs": [[...], ...]}  ->  {"labels": [...]}   (original label values)
    GET  /healthz                                ->  {"status": "ok"}    (HEAD: the status only)

/healthz answers 503 (one fixed body) once the service has failed closed, and while a PostgreSQL
memo's database does not answer a pooled `SELECT 1` within HEALTH_TIMEOUT_S (lucid/access/health.py: one probe
at a time, its result kept for HEALTH_CACHE_S, so probes cost the database at most one query a second
per worker process, however often /healthz is asked).

What a client can learn is limited to the labels: no scores, confidences, bounds or which
branch (released / noised) was taken appear in bodies, headers or errors. Input errors are
detected before N is evaluated, so their messages depend only on the kind of error, positions
in the request and the public domain, never echo what the client sent (lucid/access/guard.py).
For an open network: only application/json bodies (415 otherwise), only allowed Host headers
(400 otherwise: DNS rebinding), and no redirects (a trailing slash is 404). If answering fails
after that point (e.g. the memo database breaks) the error could depend on the branch, so the
service fails closed: it answers 503 to every later prediction until restarted, with one fixed
message. One failure is told apart: a memo database that cannot
be reached (MemoUnavailable: a PostgreSQL memo's server down or cut off) gets the same 503 for
that request only, since nothing was answered or charged and the outage says nothing about the
request; the service answers again once the database is back.

Timing: the classifier does the same work for released and noised rows (same forward pass,
one mechanism draw per row, the same memo read/write and ledger charge; see classifier.py), and
the response differs only in the label values it carries. `min_response_ms`, a minimum response
time, additionally holds every /v1/predict response (answers, refusals, errors) until that long
after the request arrived, for deployments that also want memo hits, batch sizes or machine noise
hidden behind one fixed time.

Load: a request's body is read on the event loop, then parsed, checked and answered in a bounded
pool of threads (numpy and SQLite release the GIL for the heavy parts), so a 10 000-row batch does
not hold up other connections. The work on the memo, and the parsing of a large body, take turns
through a gate that lets small requests pass queued turns (SizeOrderedGate, lucid/access/memo/turns.py),
and a batch takes many short turns (a piece of its body, or TURN_ROWS of its inputs) rather than one
long one, so a single-row request waits for at most one short turn, never for a whole batch. A client address
has one body over SMALL_BODY parsed and answered at a time, failed parses included, so a sender of
large bodies (valid or not) waits for its own work and cannot take every thread; with `rate`, each
client (its token, or its address without tokens) gets at most that many prediction requests per
second, 429 with Retry-After beyond it, before the body is read. A client's address comes from
lucid/access/transport.py (X-Forwarded-For only from a trusted proxy). Connection deadlines and
caps are in lucid/access/protocol.py.

Accounting: each bearer token names a client; its answers are charged to that client's ledger
(lucid.access.ledger; one ledger, "default", without tokens). With a budget, a request whose new
inputs would take the client's worst-case charge above it gets 429 and one fixed message; the
decision counts distinct new inputs, never which branch would have answered them. A total budget
(all clients together) is refused the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lucid.access.classifier import LabelOnlyClassifier
from lucid.access.guard import (
    NOT_JSON_MEDIA,
    UNKNOWN_HOST,
    BadJson,
    HostCheck,
    RequestRate,
    TooLarge,
    bearer_client,
    check_min_response_ms,
    input_pieces,
    is_json_media,
)
from lucid.access.health import MemoHealth
from lucid.access.ledger import DEFAULT_CLIENT, BudgetExceeded, check_client_name
from lucid.access.memo import MemoUnavailable, SizeOrderedGate
from lucid.access.transport import ServeTransport
from lucid.errors import LucidError

DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_MAX_BATCH = 10_000
DEFAULT_THREADS = 4
# Bodies up to this size (a few hundred rows) are parsed and answered by their own threads, so that
# batches filling the other pool never make a small request wait for a thread.
SMALL_BODY = 64 * 1024
# The share of one core that one client address's large bodies (over SMALL_BODY) may use, failed ones
# included: after a large body took t CPU seconds, the address's next one starts no sooner than
# t x (1 / share - 1) after it ended. A 10 000-row batch costs a few hundred ms, so an honest batch
# client still gets several a second; a sender of back-to-back 4 MB bodies that fail no longer keeps a
# thread (and the GIL) busy all the time.
LARGE_BODY_SHARE = 0.25

log = logging.getLogger("lucid.serve")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class FairPool:
    """Runs jobs in `executor` at most `width` at a time; when more wait, the next slot goes to the
    waiting client with the fewest jobs running, among those the one served longest ago (a client with
    nothing running or waiting is forgotten, so it comes first), a client's own jobs in arrival order.
    So a client sending one request at a time waits for at most one job to finish, however many
    requests other clients queue: direct connections that pipeline are held back by the protocol
    (lucid/access/protocol.py), but a reverse proxy forwards each pipelined request as an ordinary one,
    on its own upstream connection. Used from the event loop only."""

    def __init__(self, executor: ThreadPoolExecutor, width: int) -> None:
        self.executor, self.width = executor, width
        self.busy = 0
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future]] = {}  # client -> its tickets, oldest first
        self.served: dict[str, int] = {}  # client -> when it was last given a slot (a count of slots given)
        self._slots = itertools.count()

    async def run(self, client: str, fn: Any, *args: Any) -> Any:
        ticket = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append(ticket)
        self._dispatch()
        try:
            await ticket
        except BaseException:
            if ticket.done() and not ticket.cancelled():  # granted just before the cancellation
                self._release(client)
            raise
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self._release(client)

    def _release(self, client: str) -> None:
        self.busy -= 1
        left = self.running[client] - 1
        if left:
            self.running[client] = left
        else:
            del self.running[client]
            if client not in self.waiting:
                self.served.pop(client, None)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.busy < self.width and self.waiting:
            client = min(self.waiting, key=lambda c: (self.running.get(c, 0), self.served.get(c, -1)))
            queue = self.waiting[client]
            ticket = queue.popleft()
            if not queue:
                del self.waiting[client]
            if ticket.cancelled():
                if client not in self.waiting and client not in self.running:
                    self.served.pop(client, None)
                continue
            self.busy += 1
            self.running[client] = self.running.get(client, 0) + 1
            self.served[client] = next(self._slots)
            ticket.set_result(None)


class FailFlag:
    """Set once a prediction failed after N was evaluated: every later prediction gets 503. In
    several worker processes, pass one shared flag (`multiprocessing.RawValue`) to each."""

    value = False


class _HostGuard:
    """ASGI wrapper: a request whose Host header is not allowed gets 400 and one fixed message,
    whatever its path (DNS rebinding: lucid/access/guard.py)."""

    def __init__(self, app: Any, hosts: HostCheck) -> None:
        self.app, self.hosts = app, hosts
        self.refusal = json.dumps({"error": UNKNOWN_HOST}, separators=(",", ":")).encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = next((value for key, value in scope["headers"] if key.lower() == b"host"), None)
            if not self.hosts.allows(host):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(self.refusal)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": self.refusal})
                return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class ServiceOptions:
    """What the operator sets about the HTTP service (`lucid serve`'s flags). `api_key`: one bearer
    token (ledger "default"); `api_keys`: client name -> token, one ledger per client. `max_body`
    bytes and `max_batch` rows per request. `min_response_ms` (0 to MAX_MIN_RESPONSE_MS) > 0 holds
    each prediction response until that long after its request arrived. `allowed_hosts`: the Host
    names answered (default: the loopback names). `threads`: the threads that parse and answer
    request bodies off the event loop, as many again for bodies up to SMALL_BODY (`app.state.pools`;
    shut them down after serving). `rate`: most prediction requests per second per client (its
    token's client, or its address without tokens; None: no limit). `transport`: the trusted
    proxies whose X-Forwarded-For names a request's address."""

    api_key: str | None = None
    api_keys: dict[str, str] | None = None
    max_body: int = DEFAULT_MAX_BODY
    max_batch: int = DEFAULT_MAX_BATCH
    min_response_ms: float = 0.0
    allowed_hosts: Sequence[str] | None = None
    threads: int = DEFAULT_THREADS
    rate: float | None = None
    transport: ServeTransport = ServeTransport()


def _json(status: int, doc: dict, extra: list | None = None) -> tuple[int, bytes, list]:
    return status, json.dumps(doc, separators=(",", ":")).encode(), extra or []


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    messages = {404: "not found", 405: "method not allowed"}
    return _error(exc.status_code, messages.get(exc.status_code, "bad request"))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(500, "internal error")


class _RawRoute:
    """A coroutine (scope, receive, send) routed as a raw ASGI app behind a plain Starlette route:
    given a function or a method, Starlette would wrap it in its Request/Response adapter, and
    FastAPI's dependency solving and those objects cost more than the prediction itself (in-process:
    0.436 ms per request with a FastAPI route, 0.215 ms with a Starlette one)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.handler(scope, receive, send)


class PredictionService:
    """What one served classifier's HTTP service holds (the classifier, its memo's health, the
    fail-closed flag, the clients' tokens and limits, the decision gate and the thread pools) and
    its routes, one method each: `healthz`, and `predict` (POST /v1/predict) with the steps of an
    answer (`answer` on the event loop, `work` in a pool thread). `app` is the FastAPI app serving
    them (module docstring)."""

    def __init__(self, clf: LabelOnlyClassifier, options: ServiceOptions | None = None, failed: Any = None) -> None:
        options = ServiceOptions() if options is None else options
        self.clf = clf
        self.labels: list[Any] = clf.labels
        self.max_body, self.max_batch = options.max_body, options.max_batch
        self.min_response = check_min_response_ms(options.min_response_ms) / 1e3  # seconds; 0: off
        threads = options.threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise LucidError(f"the prediction pool needs at least 1 thread, got {threads!r}")
        hosts = HostCheck.default() if options.allowed_hosts is None else HostCheck(options.allowed_hosts)
        if options.api_key is not None and options.api_keys:
            raise LucidError("give one API key or a table of per-client keys, not both")
        clients = {DEFAULT_CLIENT: options.api_key} if options.api_key is not None else dict(options.api_keys or {})
        if len(set(clients.values())) != len(clients) or not all(clients.values()):
            raise LucidError("API keys must be non-empty and distinct")
        self.tokens = [(token.encode(), check_client_name(name)) for name, token in clients.items()]
        self.failed = FailFlag() if failed is None else failed
        # One decision at a time, small requests first; the memo takes its turns through it (`turn`).
        self.gate = SizeOrderedGate()
        self.health = MemoHealth(clf.memo)
        # Bounded: at most 2 x `threads` bodies are parsed and answered at once; the rest wait in a queue
        # (at most one request per connection, and connections are capped: lucid/access/protocol.py).
        self.small, self.large = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"lucid-{lane}") for lane in ("small", "large")
        )
        self.small_turns = FairPool(self.small, threads)
        self.rate = RequestRate(options.rate) if options.rate is not None else None
        self.transport = options.transport
        # One large body parsed and answered at a time per client address, failed parses included, so a
        # sender of many large bodies waits for its own work instead of taking every thread and the GIL:
        # address -> (its lock, the requests holding or waiting for it).
        self.large_turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self.rest_until: dict[str, float] = {}  # address -> when its next large body may start (loop time)
        self.app = self._app(hosts)

    def _app(self, hosts: HostCheck) -> FastAPI:
        # Telemetry off: it reads the environment on every request, and the service must not export
        # request data anywhere by default. No slash redirects: their Location is built from the
        # client's Host header.
        app = FastAPI(
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
            title="LUCID",
            redirect_slashes=False,
            telemetry={"tracing": False, "metrics": False, "logs": False},
        )
        app.add_middleware(_HostGuard, hosts=hosts)
        app.state.pools = (self.small, self.large)
        app.state.large_turns = self.large_turns
        app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]  # typed for Exception
        app.add_exception_handler(Exception, _internal_error)
        app.add_api_route("/healthz", self.healthz, methods=["GET", "HEAD"])
        app.add_route("/v1/predict", _RawRoute(self.predict), methods=["POST"])  # type: ignore[arg-type]  # an ASGI app
        return app

    async def healthz(self, request: Request) -> Response:
        # Fixed bodies: neither the database's name nor its error reaches a client (the log has them).
        if self.failed.value:
            status, body = 503, {"error": "service unavailable"}
        elif not await self.health.ok():
            status, body = 503, {"error": "memo database unreachable"}
        else:
            status, body = 200, {"status": "ok"}
        if request.method == "HEAD":  # the status alone, for probes
            return Response(status_code=status, media_type="application/json")
        return JSONResponse(body, status_code=status)

    async def predict(self, scope: dict, receive: Any, send: Any) -> None:
        """POST /v1/predict, as a raw ASGI app (`_RawRoute`)."""
        started = time.perf_counter()
        headers: dict[bytes, bytes] = {}
        forwarded: list[bytes] = []
        for key, value in scope["headers"]:
            key = key.lower()
            headers.setdefault(key, value)  # the first value wins, as in Starlette
            if key == b"x-forwarded-for":
                forwarded.append(value)  # every line: a proxy may add its own
        peer = scope.get("client")
        address = self.transport.client_address(peer[0] if peer else None, forwarded) or ""
        out = await self.answer(headers, receive, address)
        if out is None:
            return
        status, body, extra = out
        if self.min_response:
            left = self.min_response - (time.perf_counter() - started)
            if left > 0:
                await asyncio.sleep(left)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def answer(self, headers: dict[bytes, bytes], receive: Any, address: str) -> tuple[int, bytes, list] | None:
        """(status, JSON body, extra headers) for one POST /v1/predict from client `address`
        (lucid.access.transport; "" when it has none); None if the client left."""
        client: str | None = DEFAULT_CLIENT
        if self.tokens:
            client = bearer_client(headers.get(b"authorization"), self.tokens)
            if client is None:
                return _json(401, {"error": "missing or invalid bearer token"}, [(b"www-authenticate", b"Bearer")])
        if self.rate is not None:
            wait = self.rate.wait(f"token:{client}" if self.tokens else f"address:{address}", time.monotonic())
            if wait > 0:  # before the body is read: a refused request costs next to nothing
                return _json(
                    429,
                    {"error": f"too many requests: at most {self.rate.rate:g} per second per client"},
                    [(b"retry-after", str(max(1, math.ceil(wait))).encode())],
                )
        if not is_json_media(headers.get(b"content-type")):
            return _json(415, {"error": NOT_JSON_MEDIA})
        too_big = _json(413, {"error": f"the request body must be at most {self.max_body} bytes"})
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return too_big
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return too_big
            if not message.get("more_body", False):
                break
        if self.failed.value:
            return _json(503, {"error": "service unavailable"})
        # Parsing a 4 MB body and a 10 000-row decision take tens of milliseconds: on the event loop
        # they would hold up every other connection, single-row clients included.
        if len(body) <= SMALL_BODY:
            return await self.small_turns.run(address, self.work, bytes(body), client)
        return await self._answer_large(bytes(body), client, address)

    async def _answer_large(self, body: bytes, client: str | None, address: str) -> tuple[int, bytes, list]:
        """`work` on a body over SMALL_BODY: one at a time per client address, each after a rest in
        proportion to the CPU time of the address's last one (LARGE_BODY_SHARE)."""
        loop = asyncio.get_running_loop()
        lock, users = self.large_turns.get(address) or (asyncio.Lock(), 0)
        self.large_turns[address] = (lock, users + 1)
        try:
            async with lock:
                rest = self.rest_until.pop(address, 0.0) - loop.time()
                if rest > 0:
                    await asyncio.sleep(rest)
                out, cpu = await loop.run_in_executor(self.large, self.timed_work, body, client)
                self.rest_until[address] = loop.time() + cpu * (1.0 / LARGE_BODY_SHARE - 1.0)
                if len(self.rest_until) > 4 * len(self.large_turns) + 1024:  # forget the addresses that rested enough
                    now = loop.time()
                    for stale in [a for a, until in self.rest_until.items() if until <= now]:
                        del self.rest_until[stale]
                return out
        finally:
            lock, users = self.large_turns[address]
            if users > 1:
                self.large_turns[address] = (lock, users - 1)
            else:
                del self.large_turns[address]

    def network_inputs(self, body: bytes) -> np.ndarray | None:
        """The body's rows in network space (None if there are none). A large body is parsed and checked
        a piece at a time, each piece a turn at the gate: a thread that runs Python for tens of
        milliseconds, even outside the gate, slows the thread holding it (each of its database
        steps gives the GIL up and must win it back), and so every request queued behind it."""
        clf = self.clf
        pieces = input_pieces(body, self.max_batch, clf.input_dim)
        if len(body) <= SMALL_BODY:
            parts = [clf.validate(piece) for piece in pieces if piece]
        else:
            parts = []
            for piece in pieces:
                with self.gate.hold(len(piece)):
                    if piece:
                        parts.append(clf.validate(piece))
        return clf.to_network_space(np.concatenate(parts)) if parts else None

    def timed_work(self, body: bytes, client: str | None) -> tuple[tuple[int, bytes, list], float]:
        """`work`, and the CPU seconds its thread spent on it."""
        started = time.thread_time()
        out = self.work(body, client)
        return out, time.thread_time() - started

    def work(self, body: bytes, client: str | None) -> tuple[int, bytes, list]:
        """(status, JSON body, extra headers) for one complete request body; runs in the pool."""
        if self.failed.value:  # failed while this request waited for a thread
            return _json(503, {"error": "service unavailable"})
        try:
            xn = self.network_inputs(body)
        except TooLarge as exc:
            return _json(413, {"error": str(exc)})
        except BadJson as exc:
            return _json(400, {"error": str(exc)})
        except LucidError as exc:
            return _json(422, {"error": str(exc)})
        if xn is None:
            return _json(200, {"labels": []})
        try:
            # One memo step at a time, a batch's in turns of a few hundred rows; small requests pass queued ones.
            idx = self.clf.predict_network_space(xn, client=client, turn=self.gate.hold)
        except BudgetExceeded as exc:
            return _json(429, {"error": str(exc)})
        except MemoUnavailable as exc:
            # The database could not be reached (lucid/access/memo/postgres.py): nothing was answered or
            # charged, and when it fails depends on the network, not on the request or its branch, so
            # this request alone gets the 503 and the next one tries the database again.
            log.warning("%s: answered 503", exc)
            return _json(503, {"error": "service unavailable"})
        except Exception:
            self.failed.value = True
            log.exception("prediction failed; refusing further predictions until restarted")
            return _json(503, {"error": "service unavailable"})
        return _json(200, {"labels": [self.labels[i] for i in idx.tolist()]})


def create_app(clf: LabelOnlyClassifier, options: ServiceOptions | None = None, failed: Any = None) -> FastAPI:
    """The service answering with `clf` as `options` say (ServiceOptions). `failed`: the fail-closed
    flag (a `FailFlag`, or one shared by several processes)."""
    return PredictionService(clf, options, failed).app
