"""What a request (or a caller) must satisfy before N is evaluated, for `lucid serve` on an open
network: the Host header, the media type, the bearer token, the request rate, the body's shape,
and the limits on the minimum response time.

Every refusal here carries a fixed message: its text depends only on the kind of error, the
server's configuration (limits, the public input width) and positions in the request (row
indices), never on what the client sent (a 3 MB unknown field name would otherwise come back as a
3 MB error body, and whatever a client can place in an error it can place in a victim's page).
"""

from __future__ import annotations

import hmac
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence

from lucid.errors import LucidError

# A minimum response time holds every response; one far beyond any request's work only stalls the
# service (and its shutdown), and an infinite one never answers. 60 s is far above any batch's work.
MAX_MIN_RESPONSE_MS = 60_000.0
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")

BAD_JSON = "the request body is not valid JSON"
NOT_UTF8 = "the request body must be UTF-8 without a byte-order mark"
NOT_JSON_MEDIA = "the request body must be application/json"
UNKNOWN_HOST = "unknown host"
_NAME = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?$")


class TooLarge(LucidError):
    """More inputs than --max-batch (HTTP 413)."""


class BadJson(LucidError):
    """A body that is not JSON (HTTP 400)."""


def check_min_response_ms(value: object) -> float:
    """`value` as a float if 0 <= value <= MAX_MIN_RESPONSE_MS; else one line. NaN would silently
    turn the minimum response time off and infinity would hold every answer (and a shutdown) forever."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LucidError(f"the minimum response time in ms must be a number, got {value!r}") from None
    if not (math.isfinite(number) and 0.0 <= number <= MAX_MIN_RESPONSE_MS):
        raise LucidError(
            "the minimum response time in ms must be a finite number from 0 (off) to "
            f"{MAX_MIN_RESPONSE_MS:g}, got {value!r}"
        )
    return number


# Requests per second per client: far above what one client's answers could need (10 000 rows each).
MAX_RATE = 1_000_000.0
# Clients whose request rate is tracked at once; past it, those with a full allowance are forgotten
# first (they lose nothing), then the least recently seen.
RATE_CLIENTS = 100_000


def check_rate(value: object) -> float:
    """`--rate` as a float: finite, above 0, at most MAX_RATE; else one line (NaN would pass every
    comparison and turn the limit off)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LucidError(f"--rate must be a number of requests per second, got {value!r}") from None
    if not (math.isfinite(number) and 0.0 < number <= MAX_RATE):
        raise LucidError(
            f"--rate must be a finite number of requests per second above 0 up to {MAX_RATE:g}, got {value!r}"
        )
    return number


class RequestRate:
    """At most `rate` requests per second per client, in bursts of up to max(1, rate): one allowance
    (a token bucket) per client, refilled continuously. Not thread-safe: the event loop asks it."""

    def __init__(self, rate: float, clients: int = RATE_CLIENTS) -> None:
        self.rate = check_rate(rate)
        self.burst = max(1.0, self.rate)
        self.clients = clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (allowance, when), least recent first

    def wait(self, client: str, now: float) -> float:
        """0.0 if `client` may send a request at `now` (it is counted); else the seconds until it may."""
        allowance, then = self._buckets.pop(client, (self.burst, now))
        allowance = min(self.burst, allowance + (now - then) * self.rate)
        wait = 0.0
        if allowance >= 1.0:
            allowance -= 1.0
        else:
            wait = (1.0 - allowance) / self.rate
        self._buckets[client] = (allowance, now)
        if len(self._buckets) > self.clients:
            self._forget(now)
        return wait

    def _forget(self, now: float) -> None:
        full = [c for c, (a, t) in self._buckets.items() if a + (now - t) * self.rate >= self.burst]
        for client in full:
            del self._buckets[client]
        while len(self._buckets) > self.clients:
            del self._buckets[next(iter(self._buckets))]


def _split_host(text: str) -> tuple[str, int | None] | None:
    """'name[:port]' or '[v6][:port]' -> (lower-case name, port or None); None if malformed."""
    m = _NAME.match(text)
    if m is None or (m.group(2) is not None and int(m.group(2)) > 65535):
        return None
    return m.group(1).lower(), None if m.group(2) is None else int(m.group(2))


class HostCheck:
    """The Host names a request may carry (DNS rebinding: a page on another site whose name
    resolves to this server must not be answered). An entry without a port allows any port."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.allowed: set[tuple[str, int | None]] = set()
        for entry in entries:
            parsed = _split_host(entry.strip())
            if parsed is None:
                raise LucidError(
                    f"--allowed-hosts: {entry.strip()!r} is not a host name or address "
                    "(with an optional :port; IPv6 in brackets)"
                )
            self.allowed.add(parsed)
        if not self.allowed:
            raise LucidError("--allowed-hosts names no host")

    @classmethod
    def default(cls, bound_host: str | None = None) -> HostCheck:
        """The loopback names and, if given, the address the server is bound to."""
        names = list(LOOPBACK_HOSTS)
        if bound_host:
            names.append(f"[{bound_host}]" if ":" in bound_host else bound_host)
        return cls(names)

    def allows(self, header: bytes | None) -> bool:
        if not header:
            return False
        parsed = _split_host(header.decode("latin-1"))
        return parsed is not None and ((parsed[0], None) in self.allowed or parsed in self.allowed)


def parse_allowed_hosts(text: str) -> list[str]:
    """`--allowed-hosts a,b:8000,[::1]` -> its entries (checked by HostCheck)."""
    entries = [e.strip() for e in text.split(",")]
    if not any(entries) or not all(entries):
        raise LucidError("--allowed-hosts must be a comma-separated list of host names")
    HostCheck(entries)
    return entries


def is_json_media(header: bytes | None) -> bool:
    """application/json, any case, optionally with parameters; a charset, if named, is UTF-8
    (what JSON is, RFC 8259). Only such a body cannot be sent cross-site by a browser without a
    CORS preflight, which this service never answers."""
    if not header:
        return False
    media, *params = header.decode("latin-1").split(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


def bearer_client(header: bytes | None, tokens: Sequence[tuple[bytes, str]]) -> str | None:
    """The client whose token the Authorization header carries (scheme case-insensitive, RFC
    7235), or None. Every token is compared, in constant time, whatever the header holds."""
    scheme, _, presented = (header or b"").partition(b" ")
    presented = presented.lstrip(b" ") if scheme.lower() == b"bearer" else b""
    client = None
    for expected, name in tokens:  # no early exit
        if hmac.compare_digest(presented, expected):
            client = name
    return client


# Bodies above this size are parsed a piece at a time (`input_pieces`): json.loads of a 4 MB body is
# one C call that holds the GIL for ~50 ms, and every other request's thread (a single row's memo
# commit included) would wait for it.
PIECE_BYTES = 16 * 1024
_WS = " \t\n\r"  # JSON's whitespace (Python's str.isspace allows more)
_HEAD = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"inputs"[ \t\n\r]*:[ \t\n\r]*\[')
_TAIL = re.compile(r"\][ \t\n\r]*\}[ \t\n\r]*\Z")


def _skip_ws(text: str, at: int, end: int) -> int:
    while at < end and text[at] in _WS:
        at += 1
    return at


def _piece_spans(body: bytes) -> tuple[str, list[tuple[int, int]], int] | None:
    """(text, spans, rows) for a body of the one shape clients send, {"inputs": [row, ...]}: the spans
    of its row list cut into pieces of about PIECE_BYTES, each after a row's closing bracket that a
    comma follows, and the number of closing brackets in the list (its row count if every row is a
    list of numbers; more otherwise). None for a body of any other shape. A cut anywhere but between
    two rows of the outer list leaves a piece with an open string or bracket, which json.loads
    refuses (`input_pieces` then parses the body whole): every piece that parses is a run of whole
    rows, and the pieces' concatenation is the list json.loads would give."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head, tail = _HEAD.match(text), _TAIL.search(text, max(0, len(text) - 64))
    if head is None or tail is None or tail.start() < head.end():
        return None
    end = tail.start()
    start, spans = _skip_ws(text, head.end(), end), []
    while start < end:
        cut = text.find("]", start + PIECE_BYTES, end)
        if cut < 0:
            cut = text.rfind("]", start, end)
            if cut < 0:
                return None
        after = _skip_ws(text, cut + 1, end)
        if after < end and text[after] != ",":
            return None
        spans.append((start, cut + 1))
        if after >= end:
            break
        start = _skip_ws(text, after + 1, end)
        if start >= end:  # a trailing comma: not JSON
            return None
    return text, spans, text.count("]", head.end(), end)


def input_pieces(body: bytes, max_batch: int, width: int) -> Iterator[list[list[float]]]:
    """The request's rows, checked, in pieces (a caller may let other work run between them), or a
    LucidError with a fixed message (module docstring), raised before the first piece or while
    taking one; a caller keeps nothing of a request that raised. One piece for bodies up to
    PIECE_BYTES."""
    found = _piece_spans(body) if len(body) > PIECE_BYTES else None
    if found is not None:
        text, spans, rows = found
        if rows > max_batch:
            raise TooLarge(f"at most {max_batch} inputs per request")
        done = 0
        for start, stop in spans:
            try:
                piece = json.loads(f"[{text[start:stop]}]")
            except (ValueError, RecursionError):
                break  # not the shape it looked like: parsed whole below, for the usual answer
            yield _checked(piece, done, width)
            done += len(piece)
        else:
            return
    else:
        done = 0
    inputs = _whole_inputs(body)
    if len(inputs) > max_batch:
        raise TooLarge(f"at most {max_batch} inputs per request")
    yield _checked(inputs[done:], done, width)


def parse_inputs(body: bytes, max_batch: int, width: int) -> list[list[float]]:
    """The request's rows in one list (`input_pieces`)."""
    return [row for piece in input_pieces(body, max_batch, width) for row in piece]


def _checked(rows: list, first: int, width: int) -> list[list[float]]:
    """`rows` (numbered from `first`) if each is a list of `width` numbers; else the fixed message."""
    for i, row in enumerate(rows, first):
        if not isinstance(row, list):
            raise LucidError(f"input {i} must be a list of numbers")
        if len(row) != width:
            raise LucidError(f"input {i} must have {width} features")
        for value in row:
            kind = type(value)
            # bool is an int subclass in Python; JSON true/false is not a feature value.
            if kind is not float and kind is not int:
                raise LucidError(f"input {i} contains a non-numeric value")
    return rows


class _RepeatedField(ValueError):
    pass


def _unique_fields(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's fields, refusing a repeated name: json.loads would keep the last value of
    it, and a body must mean one thing to every parser (`input_pieces` reads the first)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _RepeatedField
    return doc


def _whole_inputs(body: bytes) -> list:
    """The "inputs" list of a body parsed in one piece, or its error. UTF-8 only (RFC 8259 8.1):
    json.loads would also take UTF-16 or UTF-32 and skip a byte-order mark, so the same request would
    have several spellings that a filter in front of the service may not read as JSON at all."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadJson(NOT_UTF8) from None
    if text.startswith("\ufeff"):
        raise BadJson(NOT_UTF8)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_fields)
    except _RepeatedField:
        raise LucidError("the request body must not repeat a field") from None
    except (ValueError, RecursionError):
        raise BadJson(BAD_JSON) from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise LucidError('the request body must be a JSON object {"inputs": [[...], ...]}')
    if len(doc) != 1:
        raise LucidError('the request body must have no field but "inputs"')
    inputs = doc["inputs"]
    if not isinstance(inputs, list):
        raise LucidError('"inputs" must be a list of rows')
    return inputs
