"""HTTP/1.1 connections of `lucid serve`: a deadline on every phase in which the server waits on the
client, a cap on the request head, caps on connections (in all, and per client address), and a stop
that does not wait for requests still arriving.

uvicorn covers part of this: `timeout_keep_alive` closes a connection idle *between* requests, h11's
`max_incomplete_event_size` caps the request head, and `timeout_graceful_shutdown` bounds the wait
for running requests at a stop. It does not time a new connection that sends nothing, a request
line or headers that trickle in, or a body that never ends (each held a connection forever), and
its `limit_concurrency` answers 503 to *every* request once that many connections are open, so a
few stalled connections would refuse all honest clients. This subclass of uvicorn's h11 protocol
adds the rest, driven by h11's view of the client:

    idle   (no request under way, nothing buffered)  --idle-timeout     close
    head   (part of a request line or headers)       --header-timeout   408, close
    body   (headers read, body still arriving)       --body-timeout     408, close
    (request read: the server's turn)                no deadline; --shutdown-timeout at a stop

A deadline runs from the start of its phase and is not extended by further bytes, so a client that
sends one byte at a time gains nothing. A response the client stops reading (the send buffer stays
full) is dropped after --body-timeout. The head cap is checked on the raw bytes before h11 parses
them: h11's own `max_incomplete_event_size` only bounds a head still incomplete, so a larger one
that arrives in one read would pass. A head with both Content-Length and Transfer-Encoding is
refused (400, close) at the same point, before h11 frames its body (request smuggling).

An answer sent before its request's body was read (404, 405, 400 for an unknown Host, 401, 413, 415:
the application need not read a body it refuses) ends the connection: the response says
`connection: close`, the server shuts its sending side, and whatever the client still sends is read
and dropped, never parsed, until the client closes, DRAIN_BYTES have come or the body's deadline
passes. uvicorn would instead read the rest of the body by its own framing and go on to the next
request with none of the head checks above, so a request hidden in or after that body was answered
and charged (request smuggling behind an early answer). Dropping rather than closing at once lets
the answer reach the client: a socket closed with unread bytes sends a reset, which may destroy
the answer before the client reads it. A client that shuts its sending side after a complete
request gets the answer it is charged for (`eof_received`). h11 rather than httptools because
httptools buffered a 50 MB header before any check could run; h11 costs tens of microseconds per
request.

Pipelined requests go last. A client that sends its next request before reading the answer to the
last one (HTTP/1.1 pipelining; browsers and API clients wait) gets it started only when at most
PIPELINED_IN_FLIGHT other requests are being answered; until then its connection is not read. So
connections that pipeline hundreds of requests and never read the answers get the server's spare
turns, and a client that waits for each answer is never queued behind them (measured before: 300
such connections took an honest client's p50 from 3.7 ms to 300-557 ms).

A worker process keeps at most --max-connections open connections, at most
--max-connections-per-ip of them from one client address (IPv6: one /64), so that one address cannot
take every slot. A newcomer over the per-address cap is refused (503, closed at once) before anything
is done for it. When a newcomer would pass the total cap, room is made fairly: a connection is closed
at the address holding the most connections, if it holds more than the newcomer's address will
with the newcomer (its connection idle longest, else its oldest partial request: a head or a body still
arriving); failing that, the connection idle longest at the newcomer's own address or one as large.
So connections that stall, idle or a byte into a request, from however many addresses, cannot shut
out a client from an address below its fair share (29 addresses x 38 one-byte connections, reopened
when closed, left an honest client 2 answers of 195 before, every one now:
benchmarks/results/serve_network.md). A connection whose request is being answered is never
closed for a newcomer; only when no connection can give way is the newcomer refused: 503 and close at
once, so a refused connection holds nothing. The address is the TCP peer's, or, from a trusted proxy
(--forwarded-allow-ips), not counted here at all: the proxy carries every client's connections and
caps them per client itself (lucid/access/transport.py).
A request body is capped by the application (--max-body: 413 on a larger Content-Length before any
of the body is read, and as soon as a chunked body passes the cap; meanwhile uvicorn buffers at most
64 KiB plus one socket read of 256 KiB before it stops reading the socket).

Every answer given here is one of a few fixed JSON bodies, like the application's own errors.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lucid.access.limits import ServeLimits, client_group
from lucid.access.transport import ServeTransport


def _raw_response(status: int, reason: str, message: str) -> bytes:
    """A complete response that ends the connection (written outside h11, which is then closed)."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_HEAD_END = re.compile(rb"\r?\n\r?\n")  # h11 also accepts bare LF line endings

_HEADER_NAME = re.compile(rb"^([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*:", re.MULTILINE)


def _frames_twice(head: bytes) -> bool:
    """Whether a request head has both Content-Length and Transfer-Encoding. h11 frames such a body
    by the chunked encoding, but a proxy in front may frame it by Content-Length, and the bytes
    after the chunks would then reach this server as a request the proxy never saw (request
    smuggling). RFC 9112 section 6.1 allows rejecting it: 400 and close, whatever comes after."""
    names = {m.group(1).lower() for m in _HEADER_NAME.finditer(head)}
    return b"content-length" in names and b"transfer-encoding" in names


# A request pipelined behind an unread answer starts only while at most this many others are being
# answered: a request from a client that waited for its last answer starts at once.
PIPELINED_IN_FLIGHT = 1

# After an early answer (module docstring), at most this many bytes are read and dropped before the
# connection is closed: enough for the rest of a body up to the default --max-body.
DRAIN_BYTES = 4 * 1024 * 1024

TIMED_OUT = _raw_response(408, "Request Timeout", "the request did not arrive in time")
HEAD_TOO_LARGE = _raw_response(431, "Request Header Fields Too Large", "the request headers are too large")
BAD_REQUEST = _raw_response(400, "Bad Request", "invalid HTTP request")
TOO_MANY_CONNECTIONS = _raw_response(503, "Service Unavailable", "too many connections")
TOO_MANY_FROM_ADDRESS = _raw_response(503, "Service Unavailable", "too many connections from this address")


class _ClosingH11Connection(h11.Connection):
    """h11's server side that marks an answer begun before its request's body was read
    `connection: close` (h11 then ends the connection after it; module docstring)."""

    def send(self, event: Any) -> bytes | None:  # type: ignore[override]
        if isinstance(event, h11.Response) and self.their_state is h11.SEND_BODY:
            headers = list(event.headers)
            if (b"connection", b"close") not in headers:
                headers.append((b"connection", b"close"))
            event = h11.Response(
                status_code=event.status_code, headers=headers, reason=event.reason, http_version=event.http_version
            )
        return super().send(event)


class _AnswerTransport:
    """The transport as a request's cycle (uvicorn's RequestResponseCycle) sees it: its close(),
    which uvicorn calls after an answer that ends the connection, leaves the choice between closing
    and dropping the rest of an unread body to the protocol."""

    def __init__(self, protocol: GuardedH11Protocol) -> None:
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        self._protocol.transport.write(data)

    def is_closing(self) -> bool:
        return self._protocol.transport.is_closing() or self._protocol._draining

    def close(self) -> None:
        self._protocol._close_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and caps of the module docstring. Use
    `guarded_protocol(limits)`, which binds the limits, as uvicorn's `http=` class."""

    limits: ServeLimits = ServeLimits()
    transport_options: ServeTransport = ServeTransport()
    # The open connections of each client address (client_group; "" for those not counted per address:
    # a Unix socket, a trusted proxy), oldest first, in this process; one dict per bound class.
    members: ClassVar[dict[str, dict[GuardedH11Protocol, None]]] = {}
    # The connections now idle, longest idle first (a dict keeps insertion order); one per bound class.
    idle: ClassVar[dict[GuardedH11Protocol, None]] = {}
    # Connections closed by this process whose close uvicorn has not seen yet (still in `connections`).
    closing: ClassVar[dict[GuardedH11Protocol, None]] = {}
    # Connections whose next request was pipelined behind an answer, waiting their turn, oldest first.
    waiting: ClassVar[dict[GuardedH11Protocol, None]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _ClosingH11Connection(h11.SERVER, self.limits.max_header_bytes)
        self._draining = False  # an early answer was sent: what the client sends is dropped
        self._drained = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._phase: str | None = None
        self._phase_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        self._group: str | None = None  # set once counted in `members`
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        # A trusted proxy carries every client's connections: the proxy caps them per client.
        address = None if self.transport_options.trusts(host) else client_group(host)
        group = address or ""
        held = len(self.members.get(group, ()))
        # The per-address cap first: a newcomer it refuses must not close another client's connection.
        if address is not None and held >= self.limits.max_connections_per_ip:
            self._refuse(TOO_MANY_FROM_ADDRESS)
            return
        if len(self.connections) - len(self.closing) > self.limits.max_connections and not self._make_room(group):
            self._refuse(TOO_MANY_CONNECTIONS)  # at once: it must not hold a slot until a timeout
            return
        self.members.setdefault(group, {})[self] = None
        self._group = group
        self._watch()

    def _make_room(self, group: str) -> bool:
        """Close a connection for a newcomer from `group`, fairly (module docstring); False when none
        may give way."""
        mine = len(self.members.get(group, ())) + 1  # the newcomer's address, the newcomer counted
        heavier = sorted(((len(m), g) for g, m in self.members.items() if g != group and len(m) > mine), reverse=True)
        for _, other in heavier:
            victim = self._victim(self.members[other])
            if victim is not None:
                victim._close_for_room()
                return True
        for victim in self.idle:
            if victim is not self and (
                victim._group == group or len(self.members.get(victim._group or "", ())) >= mine
            ):
                victim._close_for_room()
                return True
        return False

    @staticmethod
    def _victim(connections: dict[GuardedH11Protocol, None]) -> GuardedH11Protocol | None:
        """Of one address's connections: the one idle longest, else the oldest partial request (a head
        or a body still arriving, no answer begun), else None."""
        idle = partial = None
        for connection in connections:
            phase = connection._phase
            if phase == "idle" and (idle is None or connection._phase_since < idle._phase_since):
                idle = connection
            elif (
                phase in ("head", "body")
                and not (connection.cycle and connection.cycle.response_started)
                and (partial is None or connection._phase_since < partial._phase_since)
            ):
                partial = connection
        return idle or partial

    def _close_for_room(self) -> None:
        self._set_phase(None)  # out of `idle` now: the next newcomer picks another
        self._leave()
        self.closing[self] = None
        self.transport.close()

    def _leave(self) -> None:
        """No longer counted at its address."""
        if self._group is not None:
            connections = self.members.get(self._group)
            if connections is not None:
                connections.pop(self, None)
                if not connections:
                    del self.members[self._group]
            self._group = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.pop(self, None)
        self.closing.pop(self, None)
        self._set_phase(None)
        self._cancel_send_deadline()
        self._leave()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._draining:
            self._drained += len(data)
            if self._drained > DRAIN_BYTES:
                self.transport.close()
            return
        if self.conn.their_state is h11.IDLE and self._refused_head(data):
            return
        super().data_received(data)
        self._watch()

    def handle_events(self) -> None:
        if self._draining:  # nothing after an early answer is parsed
            return
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not None and self.cycle is not cycle:  # a request was read: its cycle's transport
            self.cycle.transport = _AnswerTransport(self)  # type: ignore[assignment]

    def _close_after_answer(self) -> None:
        """An answer that ends the connection was sent: close, or, if the request's body was not read
        to its end, drop what the client still sends (module docstring)."""
        if self.transport.is_closing() or self._draining:
            return
        if self.conn.their_state is not h11.SEND_BODY:
            self.transport.close()
            return
        self._draining = True
        self.waiting.pop(self, None)
        self.flow.resume_reading()  # reading stopped at uvicorn's high-water mark must go on, to drop
        if self.transport.can_write_eof():  # the client sees the answer end (TLS cannot half-close)
            self.transport.write_eof()
        if self._phase != "body":
            self._set_phase("body")  # else the body's deadline, already running, stays

    def on_response_complete(self) -> None:
        if self._draining:
            return
        # A pipelined request read while this one was answered is parsed now: check its head first.
        if self.conn.their_state is h11.DONE and self._refused_head(b""):
            return
        if self.conn.trailing_data[0] and self._in_flight() > PIPELINED_IN_FLIGHT:
            # The client sent its next request before reading this answer: it waits until the
            # server has a free turn (module docstring), with reading stopped meanwhile.
            self.waiting[self] = None
            self.loop.call_soon(self._wake_waiting)
            # and again later, in case the requests in flight end without an answer (a client gone)
            self.loop.call_later(0.05, self._wake_waiting)
            return
        self._next_request()

    def _next_request(self) -> None:
        super().on_response_complete()
        self._watch()
        if self.waiting:
            self.loop.call_soon(self._wake_waiting)

    def _in_flight(self) -> int:
        """Requests of this process being answered now (uvicorn's tasks, the finished ones not yet removed)."""
        return sum(1 for task in self.tasks if not task.done())

    def _wake_waiting(self) -> None:
        """Start the pipelined requests that waited longest, while turns are free."""
        while self.waiting and self._in_flight() <= PIPELINED_IN_FLIGHT:
            connection = next(iter(self.waiting))
            del self.waiting[connection]
            if not connection.transport.is_closing():
                connection._next_request()

    def _refused_head(self, data: bytes) -> bool:
        """Refuse (and close) a request head being received that is too large or that frames its
        body twice; checked before h11 parses it, on its buffer and `data`."""
        pending = self.conn.trailing_data[0]
        buffered = pending + data if pending else data
        end = _HEAD_END.search(buffered)
        if (end.end() if end else len(buffered)) > self.limits.max_header_bytes:
            self._refuse(HEAD_TOO_LARGE)
            return True
        if end is not None and _frames_twice(buffered[: end.start()]):
            self._refuse(BAD_REQUEST)
            return True
        return False

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's protocol returns bool | None
        """The client shut its sending side (`nc -N`, `shutdown(SHUT_WR)`). A request it completed
        before is answered (it is being charged), then the connection closes: the transport stays
        open for writing. Anything else closes at once: a request still arriving can never complete,
        and an idle connection has nothing to wait for. (uvicorn's answer, close at once, charged a
        complete request whose answer was then never written.)"""
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.DONE:
            self.cycle.keep_alive = False
            self._set_phase(None)
            return True
        return None

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request as malformed HTTP: a fixed JSON 400, like every other error."""
        self._refuse(BAD_REQUEST)

    def _refuse(self, response: bytes) -> None:
        self.transport.write(response)
        self.transport.close()
        if self in self.connections:
            self.closing[self] = None

    def shutdown(self) -> None:
        """A stop closes at once every connection whose request is still arriving: it cannot be
        answered before it arrives, and a stalled client would hold the stop up to --shutdown-timeout."""
        if self._draining or (
            self.cycle is not None and not self.cycle.response_started and self.conn.their_state is h11.SEND_BODY
        ):
            self.transport.close()
            return
        super().shutdown()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(self.limits.body_timeout, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_deadline()

    # -- the phase deadlines ------------------------------------------------------------------
    def _current_phase(self) -> str | None:
        """What the server is waiting on the client for, from h11's state (None: nothing)."""
        if self.transport.is_closing():
            return None
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return "body"
        if state is h11.IDLE:
            return "head" if self.conn.trailing_data[0] else "idle"
        return None

    def _watch(self) -> None:
        phase = self._current_phase()
        if phase != self._phase:
            self._set_phase(phase)

    def _set_phase(self, phase: str | None) -> None:
        """Enter `phase`: its deadline starts now (the previous phase's is cancelled)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.idle.pop(self, None)
        self._phase_since = self.loop.time()
        if phase == "idle":
            self.idle[self] = None  # at the end: the longest idle stay first
        self._phase = phase
        if phase is not None:
            timeout = {
                "idle": self.limits.idle_timeout,
                "head": self.limits.header_timeout,
                "body": self.limits.body_timeout,
            }[phase]
            self._deadline = self.loop.call_later(timeout, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # A 408 only where no response has begun on this request; an idle connection just closes.
        if self._phase == "head" or (self._phase == "body" and not (self.cycle and self.cycle.response_started)):
            self._refuse(TIMED_OUT)
        else:
            self.transport.close()

    def _cancel_send_deadline(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None


def tls_protocol(
    protocol_class: Callable[..., asyncio.Protocol], context: ssl.SSLContext, handshake_timeout: float
) -> Callable[..., asyncio.BaseProtocol]:
    """`protocol_class` (uvicorn's `http=` factory) behind TLS, with a handshake deadline. The HTTP
    protocol, and so the connection caps and phase deadlines, only sees a connection once its
    handshake is done; uvicorn leaves TLS to asyncio, whose handshake timeout is 60 s, so a client
    that opens TCP connections and never completes a handshake would hold sockets uncounted for a
    minute each. Here the handshake gets --header-timeout, like a request head."""

    def factory(*args: Any, **kwargs: Any) -> asyncio.BaseProtocol:
        loop = kwargs.get("_loop") or asyncio.get_event_loop()
        return sslproto.SSLProtocol(
            loop,
            protocol_class(*args, **kwargs),
            context,
            None,  # type: ignore[arg-type]  # no waiter: asyncio's own servers pass None too
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]  # seconds, a float in asyncio
        )

    return factory


def guarded_protocol(limits: ServeLimits, transport: ServeTransport | None = None) -> type[GuardedH11Protocol]:
    """GuardedH11Protocol bound to `limits` and `transport` (uvicorn instantiates the class itself,
    per connection)."""
    attributes: dict[str, Any] = {
        "limits": limits,
        "transport_options": transport or ServeTransport(),
        "members": {},
        "idle": {},
        "closing": {},
        "waiting": {},
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attributes)
