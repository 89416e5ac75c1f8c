"""What `lucid serve` lets one connection, one request and the whole service hold, and for how long.

A public endpoint meets clients that stall on purpose (open a connection and send nothing, half a
request line, headers or a body one byte at a time) or by accident. Each such connection holds a
socket, a buffer and, once its request is read, a task; without limits a few thousand of them
exhaust the process. So every phase in which the server waits on the client has a deadline, the
request head has a size cap, and the number of connections has a cap, in all and per client address
(lucid/access/protocol.py), so that one address cannot take every connection of the service;
the model work runs in a bounded pool of threads (lucid/access/server.py). The defaults are meant
to be kept by a public deployment: docs/access.md#limits.
"""

from __future__ import annotations

import ipaddress
import math
import resource
from dataclasses import dataclass

from lucid.errors import LucidError

# An hour is far beyond any honest client's pause and any request's work; longer limits are typos.
MAX_TIMEOUT_S = 3600.0
MAX_THREADS = 64
MAX_WORKERS = 64
MAX_CONNECTIONS = 100_000
MIN_HEADER_BYTES = 1024  # a request line, Host, Content-Type, Authorization and some slack
MAX_HEADER_BYTES = 1024 * 1024
# File descriptors a server process needs besides its connections (memo, WAL, listening socket, pipes).
SPARE_FILES = 64

# option name -> (dataclass field, whether 0 is allowed)
_TIMEOUTS = {
    "--idle-timeout": ("idle_timeout", False),
    "--header-timeout": ("header_timeout", False),
    "--body-timeout": ("body_timeout", False),
    "--shutdown-timeout": ("shutdown_timeout", True),
}
_COUNTS = {
    "--workers": ("workers", 1, MAX_WORKERS),
    "--threads": ("threads", 1, MAX_THREADS),
    "--max-connections": ("max_connections", 1, MAX_CONNECTIONS),
    "--max-connections-per-ip": ("max_connections_per_ip", 1, MAX_CONNECTIONS),
    "--max-header-bytes": ("max_header_bytes", MIN_HEADER_BYTES, MAX_HEADER_BYTES),
}


@dataclass(frozen=True)
class ServeLimits:
    """Connection and concurrency limits of `lucid serve` (seconds, bytes, counts).

    idle_timeout: a connection with no request under way (new, or between requests) is closed
        after this long without a request starting.
    header_timeout: a request line and its headers must arrive within this long of their first byte.
    body_timeout: a request body must arrive within this long of its headers; a response the client
        stops reading is dropped after the same time.
    shutdown_timeout: on SIGTERM, requests already received get this long to be answered.
    max_header_bytes: the most bytes of a request line plus headers (431 above).
    max_connections: open connections per worker process (503 and close above).
    max_connections_per_ip: open connections per worker process from one client address (an IPv6
        client: its /64), 503 and close above; at max_connections or more, no separate cap.
    threads: the prediction threads of each worker process (as many again for small bodies).
    workers: server processes sharing the listening socket, the memo and the ledger.
    """

    idle_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    shutdown_timeout: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_connections: int = 1024
    max_connections_per_ip: int = 64
    threads: int = 4
    workers: int = 1

    def __post_init__(self) -> None:
        for option, (name, zero_ok) in _TIMEOUTS.items():
            _check_seconds(option, getattr(self, name), zero_ok)
        for option, (name, low, high) in _COUNTS.items():
            _check_count(option, getattr(self, name), low, high)

    def describe(self) -> str:
        """The limits' part of `lucid serve`'s start lines."""
        return (
            f"{self.workers} worker{'s' if self.workers > 1 else ''} x {self.threads} threads "
            f"(+{self.threads} for small requests), "
            f"{self.max_connections} connections per worker ({self.max_connections_per_ip} per client address), "
            f"headers up to {self.max_header_bytes} B; "
            f"timeouts: idle {self.idle_timeout:g} s, headers {self.header_timeout:g} s, "
            f"body {self.body_timeout:g} s, stop {self.shutdown_timeout:g} s"
        )


def client_group(host: object) -> str | None:
    """The address a connection from `host` (its peer address) is counted under by the per-address
    cap: an IPv4 address as is (also written IPv4-mapped, ::ffff:a.b.c.d), an IPv6 address by its /64
    (one host is usually given a whole /64, so per-address counting would not hold it back). None for
    a peer that is no IP address (a Unix socket): not counted."""
    if not isinstance(host, str):
        return None
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # without an IPv6 zone index
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _check_seconds(option: str, value: object, zero_ok: bool) -> None:
    """A finite number of seconds in (0, MAX_TIMEOUT_S] ([0, ...] if `zero_ok`). NaN would pass every
    comparison and turn the limit off unnoticed; infinity is no limit at all."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LucidError(f"{option} must be a number of seconds") from None
    low_ok = number >= 0.0 if zero_ok else number > 0.0
    if not (math.isfinite(number) and low_ok and number <= MAX_TIMEOUT_S):
        low = "from 0" if zero_ok else "above 0"
        raise LucidError(f"{option} must be a finite number of seconds {low} up to {MAX_TIMEOUT_S:g}, got {value!r}")


def _check_count(option: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LucidError(f"{option} must be an integer from {low} to {high}, got {value!r}")


def ensure_open_files(max_connections: int) -> None:
    """Raise this process's open-file limit to what `max_connections` needs, or refuse in one line:
    past the limit, accept() fails and the server logs errors instead of refusing with a 503."""
    need = max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise LucidError(
            f"--max-connections {max_connections} needs {need} open files, but this process may "
            f"open at most {hard} (ulimit -n): lower --max-connections or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
