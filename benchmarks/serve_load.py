"""`lucid serve` under load: stalled connections, large batches and single-row clients together
(scenario A), the throughput of new single-row requests with 1 and 2 worker processes
(scenario B), idle connections from many addresses against the connection cap (scenario C), and
connections that pipeline requests and never read the answers (scenario D).

    python benchmarks/serve_load.py [--run RUN] [--stalled 1000] [--seconds 20] [--rows 10000,1000]
                                    [--throughput-seconds 10] [--connections 16] [--report FILE.md]

Scenario A: `--stalled` connections are held open the whole time, a third each sending nothing,
half a request line, or a body one byte a second (each reopened when the server closes it, as an
attacker would); two clients post batches in a loop (8 bodies of new inputs, then repeated), of
each size in `--rows` in turn (a new server each: --max-rows is the knob of the single-row wait);
one client, in a process of its own, sends new single rows (a random pause of 0-20 ms
between them) and reports p50/p99 latency and errors; the server's peak RSS is sampled every
0.25 s (psutil if installed, else /proc). All of them connect from 127.0.0.1, so scenario A turns
the per-address connection cap off (`--max-connections-per-ip 100000`): it measures the server with
1 000 stalled connections open, which one address could otherwise not hold.

Scenario C: `--flood` idle connections (default 1 100, more than the cap of 1 024) from
`--flood-addresses` loopback addresses (127.0.0.2, ...; 55 each, under the per-address cap of 64),
each opened again at once when the server closes it; the single-row client of A measures p50/p99
and the share of its requests answered.

Scenario D: `--pipeliners` connections (default 300, from the same addresses as C) each write
`--depth` (400) pipelined single-row requests of new inputs and never read; the single-row client
of A measures p50/p99 and its answered share.

`--network` runs instead the open-network scenarios of issue 64 for each of `--fronts`: `http`
(lucid serve, plain), `https` (lucid serve with --ssl-certfile/--ssl-keyfile) and `nginx`
(docs/deploy.md's nginx, run as tests/access/test_serve_deploy.py runs it, terminating TLS in front of
lucid serve): the single-row client alone, beside C, D, a partial-request flood (`--partial-addresses`
x `--partial-per-address` connections each sending one byte of a request line, or a head and one
body byte; at the default caps and at --max-connections 64 --max-connections-per-ip 4) and four
parse-bomb connections (4 MB bodies that fail), and the smuggling probe (an early answer, then the
rest of its body and smuggled requests). Report: benchmarks/results/serve_network.md. Needs trustme,
and nginx for that front.

Scenario B: `--connections` keep-alive connections from two client processes send new single-row
requests as fast as the server answers, against `lucid serve --workers 1` and then `--workers 2`.
On a 2-core machine the two client processes share the cores with the server, so the numbers are
a lower bound of what the server alone could do; the report says how many cores there were.

The client is plain asyncio over sockets, for both scenarios: neither wrk nor hey can hold stalled
connections beside other clients, and hey repeats one body (memo hits, not new inputs), so they
would not measure these scenarios (nor were they on PATH where this was written). The run defaults
to a synthetic Crypto-shaped network (7 features, 2x50, 2 classes) written to a scratch directory:
the server's load does not depend on what N computes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import multiprocessing
import os
import random
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "helpers"), str(ROOT / "tests" / "access")]  # synthetic_runs, test_serve_deploy

_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


# -- the run and its inputs -----------------------------------------------------------------------
def make_inputs(run: Path):
    """A function n -> n new inputs of the verified domain, in original units, as JSON-ready lists."""
    from lucid.rundir import open_run, read_scaler

    r = open_run(run)
    lower, upper = r.domain
    offset, scale = read_scaler(r)
    rng = np.random.default_rng()

    def inputs(n: int) -> list:
        xn = lower + rng.random((n, len(lower))) * (upper - lower)
        return (xn / scale + offset).tolist()

    return inputs


def synthetic_run(scratch: Path) -> Path:
    from synthetic_runs import write_synthetic_run

    return write_synthetic_run(scratch / "run", num_classes=2, input_dim=7, hidden=(50, 50),
                               bounds={0: 0.5, 1: 0.5})


# -- the server -----------------------------------------------------------------------------------
@contextmanager
def serve(run: Path, scratch: Path, *args: str) -> Iterator[tuple[int, subprocess.Popen]]:
    """`lucid serve RUN` on a free port with a new memo; (port, process)."""
    memo = scratch / f"memo-{time.monotonic_ns()}.sqlite"
    cmd = [sys.executable, "-m", "lucid", "serve", str(run), "--port", "0", "-e", "1", "--budget", "1e12",
           "--memo", str(memo), *args]
    with running_server(cmd, scratch / "server.log") as started:
        yield started


@contextmanager
def running_server(cmd: list[str], log_path: Path) -> Iterator[tuple[int, subprocess.Popen]]:
    """Run `cmd` (a `lucid serve ... --port 0`) until the block ends: (its port, its process) once it
    answers. Its stderr goes to `log_path` (a pipe nobody reads would block it)."""
    log = open(log_path, "a+")
    start = log.tell()
    proc = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (m := re.search(r"on (https?)://[^:]+:(\d+)/v1/predict", _read_from(log, start))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lucid serve did not start: {_read_from(log, start)}")
            time.sleep(0.1)
        port = int(m.group(2))
        asyncio.run(_wait_ready(port, CLIENT_TLS if m.group(1) == "https" else None))
        yield port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _read_from(log, start: int) -> str:
    log.flush()
    with open(log.name) as f:
        f.seek(start)
        return f.read()


async def _wait_ready(port: int, tls: ssl.SSLContext | None = None) -> None:
    for _ in range(300):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                          server_hostname="localhost" if tls else None)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nconnection: close\r\n\r\n")
            if (await reader.read()).startswith(b"HTTP/1.1 200"):
                writer.close()
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("lucid serve did not answer /healthz")


def rss_bytes(pid: int) -> int:
    """Resident memory of the server process and its worker processes."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            return 0
    total = 0
    pids = [pid, *_children(pid)]
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
        except (OSError, AttributeError):
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    """Sample the server's RSS every 0.25 s while the block runs; the peak is out[0]."""
    out, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out[0] = max(out[0], rss_bytes(pid))
            stop.wait(0.25)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()


# -- the asyncio HTTP client ------------------------------------------------------------------------
# How clients reach the service (--network's fronts): None for plain HTTP, else the TLS context that
# trusts the benchmark's own CA (lucid serve's HTTPS, or nginx's in front of it). Forked client
# processes inherit it.
CLIENT_TLS: ssl.SSLContext | None = None


async def open_connection(port: int, source: str | None = None, tls: ssl.SSLContext | None = None,
                          ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection to 127.0.0.1:`port` (from loopback address `source`), over `tls` or CLIENT_TLS."""
    context = tls or CLIENT_TLS
    return await asyncio.open_connection("127.0.0.1", port, local_addr=None if source is None else (source, 0),
                                         ssl=context, server_hostname="localhost" if context else None)


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> tuple[int, bytes]:
    """One POST /v1/predict on a keep-alive connection: (status, body)."""
    writer.write(b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = _LENGTH.search(head)
    return int(head.split(b" ", 2)[1]), await reader.readexactly(int(length.group(1)) if length else 0)


class Stalled:
    """`count` connections held open, reopened whenever the server closes one."""

    KINDS = ("nothing", "half line", "slow body")

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.open = 0
        self.closed_by_server = 0
        self.failed_connects = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        tasks = []
        for i in range(self.count):
            tasks.append(asyncio.create_task(self._hold(self.KINDS[i % 3])))
            if i % 50 == 49:
                await asyncio.sleep(0.05)  # open them over about a second, not in one burst
        await asyncio.gather(*tasks)

    async def _hold(self, kind: str) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await open_connection(self.port)
            except OSError:
                self.failed_connects += 1
                await asyncio.sleep(0.5)
                continue
            self.open += 1
            try:
                if kind == "half line":
                    writer.write(b"POST /v1/pre")
                elif kind == "slow body":
                    writer.write(b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json"
                                 b"\r\ncontent-length: 1000000\r\n\r\n{")
                while not self.stop.is_set():
                    if kind == "slow body":
                        writer.write(b" ")
                    try:
                        if await asyncio.wait_for(reader.read(4096), timeout=1.0) == b"":
                            break
                    except asyncio.TimeoutError:
                        continue
                    # A response (408, 503): the server ends the connection after it.
                else:
                    break
                self.closed_by_server += 1
            except OSError:
                self.closed_by_server += 1
            finally:
                self.open -= 1
                writer.close()


class Flood:
    """`count` connections from `addresses` loopback addresses (127.0.0.2, 127.0.0.3, ...), each
    opened again at once when the server closes it; `use` says what one does while open."""

    def __init__(self, port: int, count: int, addresses: int) -> None:
        self.port, self.count, self.addresses = port, count, addresses
        self.open = 0
        self.closed_by_server = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._hold(f"127.0.0.{2 + i % self.addresses}") for i in range(self.count)))

    async def _hold(self, source: str) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await open_connection(self.port, source)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self.open += 1
            try:
                await self.use(reader, writer)
                if not self.stop.is_set():
                    self.closed_by_server += 1
            except OSError:
                self.closed_by_server += 1
            finally:
                self.open -= 1
                writer.close()

    async def use(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class IdleFlood(Flood):
    """Connections that send nothing; a 503 the server answers instead of accepting is counted."""

    refused = 0

    async def use(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self.stop.is_set():
            try:
                data = await asyncio.wait_for(reader.read(4096), timeout=1.0)
            except asyncio.TimeoutError:
                continue
            self.refused += data.startswith(b"HTTP/1.1 503")
            return


class PipelineFlood(Flood):
    """Connections that write `depth` pipelined single-row requests (new inputs) and never read."""

    def __init__(self, port: int, count: int, addresses: int, depth: int, inputs) -> None:
        super().__init__(port, count, addresses)
        self.depth, self.inputs = depth, inputs

    async def use(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(self.depth):
            body = json.dumps({"inputs": self.inputs(1)}).encode()
            writer.write(b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json"
                         b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        while not self.stop.is_set() and not reader.at_eof() and not writer.is_closing():
            await asyncio.sleep(0.5)  # never read: the answers pile up in the socket buffers


async def request_loop(port: int, next_body: Callable[[], bytes], done: Callable[[], bool], out: dict,
                       pause: Callable[[], float] | None = None) -> None:
    """POST `next_body()` on one keep-alive connection until `done()`, each response's latency into
    out["latencies"] and every non-200 answer or dropped connection into out["errors"] (a dropped
    connection is opened again); `pause()` seconds between requests. Every client here is this loop."""
    reader, writer = await open_connection(port)
    while not done():
        body = next_body()
        t0 = time.perf_counter()
        try:
            status, _ = await post(reader, writer, body)
        except (OSError, asyncio.IncompleteReadError):
            out["errors"] += 1
            writer.close()
            reader, writer = await open_connection(port)
            continue
        out["latencies"].append(time.perf_counter() - t0)
        out["errors"] += status != 200
        if pause is not None:
            await asyncio.sleep(pause())
    writer.close()


async def batches(port: int, bodies: list[bytes], stop: asyncio.Event, out: dict) -> None:
    """Post `bodies` in a loop (new inputs, then memo hits) until `stop`."""
    await request_loop(port, itertools.cycle(bodies).__next__, stop.is_set, out)


async def singles(port: int, inputs, seconds: float, out: dict) -> None:
    """Sequential single-row requests with a random 0-20 ms pause between them."""
    end = time.monotonic() + seconds
    await request_loop(port, lambda: json.dumps({"inputs": inputs(1)}).encode(), lambda: time.monotonic() >= end,
                       out, pause=lambda: random.uniform(0, 0.02))


def _singles_process(port: int, run: str, seconds: float, queue) -> None:
    """The single-row client in a process of its own: the batch and stalled clients' event loop
    must not add to the latencies it measures."""
    out: dict = {"latencies": [], "errors": 0}
    asyncio.run(singles(port, make_inputs(Path(run)), seconds, out))
    queue.put(out)


async def single_row_client(port: int, run: Path, seconds: float) -> dict:
    """The single-row client (`singles`) for `seconds`, in a process of its own; its latencies and errors."""
    queue = multiprocessing.Queue()
    client = multiprocessing.Process(target=_singles_process, args=(port, str(run), seconds, queue))
    client.start()
    while client.is_alive() and queue.empty():
        await asyncio.sleep(0.1)
    single = await asyncio.to_thread(queue.get)
    client.join()
    return single


async def scenario_a(port: int, run: Path, inputs, stalled: int, seconds: float, rows: int) -> dict:
    holder = Stalled(port, stalled)
    holding = asyncio.create_task(holder.run())
    for _ in range(100):  # until (nearly) all are open
        if holder.open >= stalled * 0.98:
            break
        await asyncio.sleep(0.1)
    opened = holder.open
    # Built before the clock starts, so that the client's JSON encoding does not compete with it.
    bodies = [json.dumps({"inputs": inputs(rows)}).encode() for _ in range(8)]
    stop = asyncio.Event()
    large: dict = {"latencies": [], "errors": 0}
    posting = [asyncio.create_task(batches(port, bodies[k::2], stop, large)) for k in (0, 1)]
    await asyncio.sleep(1.0)
    single = await single_row_client(port, run, seconds)
    stop.set()
    await asyncio.gather(*posting)
    still_open = holder.open
    holder.stop.set()
    await holding
    return {"single": single, "large": large, "stalled_opened": opened, "stalled_open_at_end": still_open,
            "closed_by_server": holder.closed_by_server, "failed_connects": holder.failed_connects}


async def beside_a_flood(holder: Flood, port: int, run: Path, seconds: float) -> dict:
    """The single-row client of A, in its own process, while `holder`'s connections are held."""
    holding = asyncio.create_task(holder.run())
    await asyncio.sleep(2.0)
    opened = holder.open
    single = await single_row_client(port, run, seconds)
    still_open = holder.open
    holder.stop.set()
    await holding
    return {"single": single, "opened": opened, "open_at_end": still_open, "closed_by_server": holder.closed_by_server}


async def scenario_c(port: int, run: Path, flood: int, addresses: int, seconds: float) -> dict:
    """`flood` idle connections from `addresses` addresses against the connection cap, one single-row client."""
    holder = IdleFlood(port, flood, addresses)
    return {**await beside_a_flood(holder, port, run, seconds), "refused": holder.refused}


async def scenario_d(port: int, run: Path, inputs, count: int, addresses: int, depth: int, seconds: float) -> dict:
    """`count` pipelining connections that never read, one single-row client."""
    return await beside_a_flood(PipelineFlood(port, count, addresses, depth, inputs), port, run, seconds)


def _throughput_process(port: int, connections: int, seconds: float, run: str, queue) -> None:
    """`connections` clients sending new single rows as fast as they are answered, for `seconds`."""
    inputs = make_inputs(Path(run))
    out: dict = {"latencies": [], "errors": 0}
    end = time.monotonic() + seconds

    async def main() -> None:
        await asyncio.gather(*(request_loop(port, lambda: json.dumps({"inputs": inputs(1)}).encode(),
                                            lambda: time.monotonic() >= end, out) for _ in range(connections)))

    asyncio.run(main())
    out["cpu_s"] = time.process_time()
    queue.put(out)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the server process and its worker processes so far."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def scenario_b(port: int, run: Path, connections: int, seconds: float, server_pid: int) -> dict:
    """New single-row requests from two client processes; requests per second, p50/p99, errors, and
    the CPU seconds the clients and the server used."""
    server_before = cpu_seconds(server_pid)
    queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_throughput_process, args=(port, n, seconds, str(run), queue))
             for n in (connections // 2, connections - connections // 2)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    latencies = np.array([d for part in results for d in part["latencies"]])
    return {"requests": len(latencies), "per_second": len(latencies) / seconds,
            "client_cpu_s": sum(part["cpu_s"] for part in results),
            "server_cpu_s": cpu_seconds(server_pid) - server_before,
            "errors": sum(part["errors"] for part in results),
            "p50": float(np.percentile(latencies, 50)), "p99": float(np.percentile(latencies, 99))}


# -- --network: the open-network scenarios of issue 64, per front ----------------------------------
PARTIAL_HEAD = (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                b"content-length: 100\r\n\r\n")
BENCH_KEY = "lucid-bench-token"  # the smuggling probe's server wants a bearer token (for its 401)


class PartialFlood(Flood):
    """Connections that send one byte of a request line, or a whole head and one byte of its body (in
    turn), then wait for the server to close them (and are opened again)."""

    sent = 0

    async def use(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.sent += 1
        writer.write(b"P" if self.sent % 2 else PARTIAL_HEAD + b"{")
        while not self.stop.is_set():
            try:
                if await asyncio.wait_for(reader.read(4096), timeout=1.0) == b"":
                    return
            except asyncio.TimeoutError:
                continue


def bomb_bodies(inputs) -> list[bytes]:
    """Two ~4 MB bodies that fail: more rows than --max-rows (413), and 10 000 rows of long numbers
    whose last row is not numbers (422, after every piece before it was parsed)."""
    short = b'{"inputs": [' + b",".join([b"[0.5,0.5,0.5,0.5,0.5,0.5,0.5]"] * 130_000) + b"]}"
    row = "[" + ",".join(f"{v:.45f}" for v in inputs(1)[0]) + "]"
    long = ('{"inputs": [' + ",".join([row] * 9_999) + ',["x"]]}').encode()
    return [short[:4_000_000 - 2] + b"]}" if len(short) > 4_000_000 else short, long]


async def parse_bombs(port: int, count: int, bodies: list[bytes], stop: asyncio.Event, out: dict) -> None:
    """`count` connections from one address posting `bodies` in turn until `stop`; statuses into `out`."""
    async def one() -> None:
        reader, writer = await open_connection(port, "127.0.0.200")
        for body in itertools.cycle(bodies):
            if stop.is_set():
                break
            try:
                status, _ = await post(reader, writer, body)
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                reader, writer = await open_connection(port, "127.0.0.200")
                continue
            out[status] = out.get(status, 0) + 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(count)))


async def beside_bombs(port: int, run: Path, inputs, count: int, seconds: float) -> dict:
    stop, statuses = asyncio.Event(), {}
    bombing = asyncio.create_task(parse_bombs(port, count, bomb_bodies(inputs), stop, statuses))
    await asyncio.sleep(2.0)
    single = await single_row_client(port, run, seconds)
    stop.set()
    await bombing
    return {"single": single, "statuses": statuses}


async def alone(port: int, run: Path, seconds: float) -> dict:
    return {"single": await single_row_client(port, run, seconds)}


_EARLY_PROBES = {
    404: b"POST /nope HTTP/1.1\r\nHost: localhost\r\ncontent-length: 10\r\n\r\n",
    400: b"POST /v1/predict HTTP/1.1\r\nHost: evil.example\r\ncontent-type: application/json\r\n"
         b"content-length: 10\r\n\r\n",
    401: b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
         b"content-length: 10\r\n\r\n",
    415: b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\nauthorization: Bearer " + BENCH_KEY.encode()
         + b"\r\ncontent-length: 10\r\n\r\n",
    413: b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\nauthorization: Bearer " + BENCH_KEY.encode()
         + b"\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n",
}


async def smuggle_probe(port: int, inputs) -> dict[str, int]:
    """The issue's probe: each early answer, its head and half its body sent (split) or behind an honest
    request (pipelined), then the rest with a plain prediction, one framed twice and one with a 5 KB
    head, in one write. Returns framing -> how many 200 answers to a smuggled prediction came back."""
    body = json.dumps({"inputs": inputs(1)}).encode()
    auth = b"authorization: Bearer " + BENCH_KEY.encode() + b"\r\n"

    def predict(extra: bytes = b"") -> bytes:
        return (b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n" + auth
                + extra + b"content-length: %d\r\n\r\n" % len(body) + body)

    smuggled = b"67890" + predict(b"transfer-encoding: chunked\r\n") + predict() + predict(b"x-pad: " + b"a" * 5000
                                                                                          + b"\r\n") + predict()
    healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    out: dict[str, int] = {}
    for status, head in _EARLY_PROBES.items():
        for framing, before in (("split", b""), ("pipelined", healthz)):
            reader, writer = await open_connection(port)
            writer.write(before + head + b"12345")
            got = b""
            try:
                while got.count(b"HTTP/1.1 ") < (2 if before else 1) or not got.endswith(b"}"):
                    chunk = await asyncio.wait_for(reader.read(65536), timeout=10)
                    if not chunk:
                        break
                    got += chunk
                writer.write(smuggled)
                while chunk := await asyncio.wait_for(reader.read(65536), timeout=35):
                    got += chunk
            except (OSError, asyncio.TimeoutError):
                pass
            writer.close()
            key = f"{status} {framing}"
            out[key] = got.count(b"HTTP/1.1 200") - (1 if before else 0)
    return out


@contextmanager
def serve_front(run: Path, scratch: Path, front: str, tls_files: dict, *args: str) -> Iterator[int]:
    """`lucid serve` reached as `front` says: "http" (plain, direct), "https" (its own TLS) or "nginx"
    (docs/deploy.md's nginx terminating TLS in front of it, its request rate per client raised to
    1 000/s so that the single-row client is not held back). Yields the port clients connect to."""
    global CLIENT_TLS
    CLIENT_TLS = None if front == "http" else ssl.create_default_context(cafile=str(tls_files["ca"]))
    if front == "https":
        args = (*args, "--ssl-certfile", str(tls_files["cert"]), "--ssl-keyfile", str(tls_files["key"]))
    if front != "nginx":
        with serve(run, scratch, *args) as (port, _):
            yield port
        return
    from test_serve_deploy import nginx  # docs/deploy.md's block, as its test runs it

    CLIENT_TLS, client = None, CLIENT_TLS  # lucid serve itself is plain behind nginx
    args = (*args, "--forwarded-allow-ips", "127.0.0.1", "--allowed-hosts", "localhost,127.0.0.1")
    with serve(run, scratch, *args) as (port, _):
        place = scratch / f"nginx-{time.monotonic_ns()}"
        place.mkdir()
        with nginx(place, port, tls_files["cert"], tls_files["key"], replace=(("rate=50r/s", "rate=1000r/s"),)) as front_port:
            CLIENT_TLS = client
            yield front_port


def network_suite(args, run: Path, scratch: Path, inputs) -> dict:
    """Per front: the single-row client alone, beside C, D, the partial-request flood (at the default
    caps and at 64 / 4) and four parse-bomb connections; and the smuggling probe."""
    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    tls_files = {"cert": scratch / "cert.pem", "key": scratch / "key.pem", "ca": scratch / "ca.pem"}
    issued.cert_chain_pems[0].write_to_path(tls_files["cert"])
    issued.private_key_pem.write_to_path(tls_files["key"])
    ca.cert_pem.write_to_path(tls_files["ca"])
    os.environ["LUCID_BENCH_KEY"] = BENCH_KEY
    flood = args.partial_addresses * args.partial_per_address
    results: dict = {}
    for front in args.fronts.split(","):
        rows: dict = {}
        with serve_front(run, scratch, front, tls_files) as port:
            rows["alone"] = asyncio.run(alone(port, run, args.seconds))
            if args.flood:
                rows["C: idle flood"] = asyncio.run(scenario_c(port, run, args.flood, args.flood_addresses,
                                                               args.seconds))
            rows["partial-request flood"] = asyncio.run(beside_a_flood(
                PartialFlood(port, flood, args.partial_addresses), port, run, args.seconds))
            rows["4 parse bombs"] = asyncio.run(beside_bombs(port, run, inputs, 4, args.seconds))
            if args.pipeliners:  # last: behind nginx, the requests it pipelined are still answered after it
                rows["D: pipelining"] = asyncio.run(scenario_d(port, run, inputs, args.pipeliners,
                                                               args.flood_addresses, args.depth, args.seconds))
        with serve_front(run, scratch, front, tls_files, "--max-connections", "64",
                         "--max-connections-per-ip", "4") as port:
            rows["alone, caps 64 / 4"] = asyncio.run(alone(port, run, args.seconds))
            rows["partial-request flood, caps 64 / 4"] = asyncio.run(beside_a_flood(
                PartialFlood(port, flood, args.partial_addresses), port, run, args.seconds))
        with serve_front(run, scratch, front, tls_files, "--api-key-env", "LUCID_BENCH_KEY", "--max-body",
                         "1000") as port:
            rows["smuggled"] = asyncio.run(smuggle_probe(port, inputs))
        results[front] = rows
        print(f"{front}: " + json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "single"} if k != "smuggled"
                                              else v) for k, v in rows.items()}), file=sys.stderr)
    return results


def network_report(args, results: dict, loads: list, run_note: str) -> str:
    lines = [
        "# `lucid serve` on an open network (`benchmarks/serve_load.py --network`)",
        "",
        f"Machine: {os.cpu_count()} cores; load average {loads[0]} at the start, {loads[1]} at the end. {args.note}",
        "",
        f"Run: {run_note}. Command: `python benchmarks/serve_load.py --network --fronts {args.fronts} --seconds "
        f"{args.seconds:g} --flood {args.flood} --pipeliners {args.pipeliners} --depth {args.depth} "
        f"--partial-addresses {args.partial_addresses} --partial-per-address {args.partial_per_address}`. "
        "Fronts: `http` (lucid serve, plain), `https` (lucid serve with --ssl-certfile/--ssl-keyfile), `nginx` "
        "(docs/deploy.md's configuration terminating TLS in front of lucid serve --forwarded-allow-ips 127.0.0.1, "
        "its limit_req raised to 1 000 r/s). Every client, attackers included, runs on the same 2 cores as the "
        "server (and nginx).",
        "",
        "The single-row client (new single rows, a random 0-20 ms pause between them, one keep-alive connection "
        "from 127.0.0.1) beside each load. Partial-request flood: "
        f"{args.partial_addresses} addresses x {args.partial_per_address} connections, each sending one byte of "
        "a request line or a head and one body byte, reopened when closed. Parse bombs: 4 connections from one "
        "address posting ~4 MB bodies that fail (413: over 10 000 rows; 422: the last row not numbers).",
        "",
        "| front | load | requests | answered (200) | p50 | **p99** | max | p99 / alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for front, rows in results.items():
        for name, row in rows.items():
            if name == "smuggled":
                continue
            base = rows["alone, caps 64 / 4" if "64 / 4" in name else "alone"]["single"]["latencies"]
            ratio = np.percentile(row["single"]["latencies"], 99) / np.percentile(base, 99)
            lines.append(f"| {front} | {name} {_single_client_cells(row['single'])} {ratio:.2f} |")
    lines += ["", "Smuggling probe (issue 64): 200 answers to a smuggled prediction, per early answer and framing.",
              "", "| front | " + " | ".join(next(iter(results.values()))["smuggled"]) + " |",
              "|---|" + "---|" * len(next(iter(results.values()))["smuggled"])]
    for front, rows in results.items():
        lines.append(f"| {front} | " + " | ".join(str(v) for v in rows["smuggled"].values()) + " |")
    return "\n".join(lines) + "\n"


# -- the report -----------------------------------------------------------------------------------
def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _single_client_cells(single: dict) -> str:
    """A flood scenario's table cells for the single-row client: requests, answered, p50, p99, max."""
    latencies = np.array(single["latencies"])
    answered = len(latencies) - single["errors"]
    return (f"| {len(latencies)} | {answered} ({100 * answered / max(1, len(latencies)):.1f} %) | "
            f"{ms(np.percentile(latencies, 50))} | **{ms(np.percentile(latencies, 99))}** | {ms(latencies.max())} |")


def report(args, runs_a: dict[int, tuple[dict, int]], b: dict[int, dict], b_rss: dict[int, int], loads: list,
           run_note: str, c: dict | None = None, d: dict | None = None) -> str:
    lines = [
        "# `lucid serve` under load (`benchmarks/serve_load.py`)",
        "",
        f"Machine: {os.cpu_count()} cores; load average {loads[0]} at the start, {loads[1]} at the end. "
        f"{args.note}",
        "",
        f"Run: {run_note}. Command: `python benchmarks/serve_load.py --stalled {args.stalled} --seconds "
        f"{args.seconds:g} --rows {args.rows} --throughput-seconds {args.throughput_seconds:g} --connections "
        f"{args.connections}`. Client: asyncio (wrk and hey were not on PATH; neither can hold stalled "
        "connections beside other clients anyway). Server: `lucid serve` with its default limits "
        "(`--max-rows` set to the batch size; in A `--max-connections-per-ip 100000`, since every client, "
        "the stalled ones included, comes from 127.0.0.1: with the default of 64 an attacker on one address "
        "would hold at most 64 of them).",
        "",
        f"## A: {args.stalled} stalled connections, two batch clients, one single-row client",
        "",
        "| batch rows | single-row requests (errors) | single-row p50 | **single-row p99** | max | batches "
        "(errors), median | stalled: open at start / end, closed by the server | server peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rows, (a, rss) in runs_a.items():
        single, large = np.array(a["single"]["latencies"]), np.array(a["large"]["latencies"])
        lines.append(
            f"| {rows} | {len(single)} ({a['single']['errors']}) | {ms(np.percentile(single, 50))} | "
            f"**{ms(np.percentile(single, 99))}** | {ms(single.max())} | {len(large)} ({a['large']['errors']}), "
            f"{ms(np.median(large))} | {a['stalled_opened']} / {a['stalled_open_at_end']}, {a['closed_by_server']} "
            f"(failed connects: {a['failed_connects']}) | {rss / 2**20:.0f} MiB |")
    if c is not None:
        lines += [
            "",
            f"## C: {args.flood} idle connections from {args.flood_addresses} addresses, one single-row client",
            "",
            "Each idle connection is opened again at once when the server closes it; the server keeps its "
            "default caps (1 024 connections, 64 per address). At the cap the server closes the connection "
            "idle longest for a newcomer (`lucid/access/protocol.py`).",
            "",
            "| single-row requests | answered (200) | p50 | **p99** | max | idle: open after 2 s, closed by the "
            "server, refused (503) |",
            "|---|---|---|---|---|---|",
            f"{_single_client_cells(c['single'])} {c['opened']}, {c['closed_by_server']}, {c['refused']} |"]
    if d is not None:
        lines += [
            "",
            f"## D: {args.pipeliners} connections from {args.flood_addresses} addresses pipelining "
            f"{args.depth} requests each without reading, one single-row client",
            "",
            "Each pipelining connection writes its requests (new single-row inputs) at once and never reads; a "
            "request pipelined behind an unread answer starts only while at most one other request is being "
            "answered (`lucid/access/protocol.py`).",
            "",
            "| single-row requests | answered (200) | p50 | **p99** | max | pipelining: open after 2 s / at the "
            "end, closed by the server |",
            "|---|---|---|---|---|---|",
            f"{_single_client_cells(d['single'])} {d['opened']} / {d['open_at_end']}, {d['closed_by_server']} |"]
    lines += [
        "",
        "## B: throughput of new single-row requests",
        "",
        f"{args.connections} keep-alive connections from 2 client processes, {args.throughput_seconds:g} s per "
        f"setting; every request is a new input (a memo write). With {os.cpu_count()} cores the client "
        "processes and the server share the same cores.",
        "",
        "| `--workers` | requests/s | p50 | p99 | errors | peak RSS | CPU: clients / server (of "
        f"{os.cpu_count()} × {args.throughput_seconds:g} s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for workers, row in b.items():
        lines.append(f"| {workers} | {row['per_second']:.0f} | {ms(row['p50'])} | {ms(row['p99'])} | "
                     f"{row['errors']} | {b_rss[workers] / 2**20:.0f} MiB | {row['client_cpu_s']:.1f} s / "
                     f"{row['server_cpu_s']:.1f} s |")
    return "\n".join(lines) + "\n"


def main() -> None:
    # The floods write to sockets the server has closed; asyncio logs each such write.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=None, help="a run directory with bounds.json [synthetic]")
    parser.add_argument("--stalled", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0, help="scenario A's single-row client")
    parser.add_argument("--rows", default="10000,1000", help="rows per batch in scenario A, comma-separated")
    parser.add_argument("--throughput-seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16, help="scenario B's connections")
    parser.add_argument("--flood", type=int, default=1100, help="scenario C's idle connections (0: skip C)")
    parser.add_argument("--flood-addresses", type=int, default=20, help="scenario C's client addresses")
    parser.add_argument("--pipeliners", type=int, default=300, help="scenario D's connections (0: skip D)")
    parser.add_argument("--depth", type=int, default=400, help="scenario D's pipelined requests per connection")
    parser.add_argument("--only", default="abcd", help="the scenarios to run, e.g. cd")
    parser.add_argument("--network", action="store_true",
                        help="instead: the open-network scenarios (issue 64) per front, into serve_network.md")
    parser.add_argument("--fronts", default="http,https,nginx", help="--network's fronts (nginx: if installed)")
    parser.add_argument("--partial-addresses", type=int, default=29)
    parser.add_argument("--partial-per-address", type=int, default=38)
    parser.add_argument("--report", type=Path, default=None,
                        help="[benchmarks/results/serve_load.md; with --network, serve_network.md]")
    parser.add_argument("--note", default="", help="a sentence on the machine's state, for the report")
    args = parser.parse_args()
    if args.report is None:
        args.report = ROOT / "benchmarks" / "results" / ("serve_network.md" if args.network else "serve_load.md")
    scratch = Path(tempfile.mkdtemp(prefix="serve-load-"))
    try:
        run = args.run if args.run is not None else synthetic_run(scratch)
        run_note = str(args.run) if args.run is not None else "synthetic, 7 features, 2x50, 2 classes"
        inputs = make_inputs(run)
        loads = [" / ".join(f"{x:.1f}" for x in os.getloadavg())]
        if args.network:
            results = network_suite(args, run, scratch, inputs)
            loads.append(" / ".join(f"{x:.1f}" for x in os.getloadavg()))
            text = network_report(args, results, loads, run_note)
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(text)
            print(text)
            return
        runs_a = {}
        for rows in (int(r) for r in args.rows.split(",") if "a" in args.only):
            # Every client here, the stalled ones included, comes from 127.0.0.1: without the per-address cap
            # (100 000: none below --max-connections), which would refuse all but 64 of them at once.
            with serve(run, scratch, "--max-rows", str(rows), "--max-connections-per-ip", "100000") as (port, proc), \
                    peak_rss(proc.pid) as peak:
                a = asyncio.run(scenario_a(port, run, inputs, args.stalled, args.seconds, rows))
                runs_a[rows] = (a, peak[0])
            print(f"rows {rows}: " + json.dumps({k: v for k, v in a.items() if k not in ("single", "large")}),
                  file=sys.stderr)
        c = None
        if args.flood and "c" in args.only:
            with serve(run, scratch) as (port, proc):
                c = asyncio.run(scenario_c(port, run, args.flood, args.flood_addresses, args.seconds))
            print("idle flood: " + json.dumps({k: v for k, v in c.items() if k != "single"}), file=sys.stderr)
        d = None
        if args.pipeliners and "d" in args.only:
            with serve(run, scratch) as (port, proc):
                d = asyncio.run(scenario_d(port, run, inputs, args.pipeliners, args.flood_addresses, args.depth,
                                           args.seconds))
            print("pipelining: " + json.dumps({k: v for k, v in d.items() if k != "single"}), file=sys.stderr)
        b, b_rss = {}, {}
        for workers in ((1, 2) if "b" in args.only else ()):
            with serve(run, scratch, "--workers", str(workers)) as (port, proc), peak_rss(proc.pid) as peak:
                b[workers] = scenario_b(port, run, args.connections, args.throughput_seconds, proc.pid)
                b_rss[workers] = peak[0]
            print(f"workers {workers}: {b[workers]}", file=sys.stderr)
        loads.append(" / ".join(f"{x:.1f}" for x in os.getloadavg()))
        text = report(args, runs_a, b, b_rss, loads, run_note, c, d)
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
        print(text)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
