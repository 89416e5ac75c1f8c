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
import multiprocessing
import os
import random
import re
import shutil
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
sys.path.insert(0, str(ROOT / "tests"))

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
        while not (m := re.search(r"on http://[^:]+:(\d+)/v1/predict", _read_from(log, start))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lucid serve did not start: {_read_from(log, start)}")
            time.sleep(0.1)
        port = int(m.group(1))
        asyncio.run(_wait_ready(port))
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


async def _wait_ready(port: int) -> None:
    for _ in range(300):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
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
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
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
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
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
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while not done():
        body = next_body()
        t0 = time.perf_counter()
        try:
            status, _ = await post(reader, writer, body)
        except (OSError, asyncio.IncompleteReadError):
            out["errors"] += 1
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
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
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "serve_load.md")
    parser.add_argument("--note", default="", help="a sentence on the machine's state, for the report")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="serve-load-"))
    try:
        run = args.run if args.run is not None else synthetic_run(scratch)
        run_note = str(args.run) if args.run is not None else "synthetic, 7 features, 2x50, 2 classes"
        inputs = make_inputs(run)
        loads = [" / ".join(f"{x:.1f}" for x in os.getloadavg())]
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
