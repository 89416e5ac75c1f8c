"""Two `lucid serve` replicas on one PostgreSQL memo under racing requests, beside one SQLite process.

    python benchmarks/serve_replicas.py [--database postgresql://postgres@127.0.0.1:5432/test]
                                        [--requests 10000] [--inputs 4000] [--clients 4] [--pairs 16]
                                        [--report benchmarks/results/serve_replicas.md]

Workload: `--requests` / 2 jobs (client, input), the inputs drawn with repeats from a pool of
`--inputs`, the client from `--clients` bearer tokens. Each job is sent to both replicas at the same
moment (two keep-alive connections, one per replica, per client coroutine; `--pairs` coroutines),
so every input is raced by two replicas, and repeated inputs by several clients. The per-client
`--budget` and the `--total-budget` are set below what the jobs ask (3/4 of the fewest distinct
inputs a client asks, 2/3 of the distinct inputs in all), so both refuse (429) during the race.

Checked afterwards, from the database itself:
- duplicate draws: inputs for which some 200 answer differs from the memo's one stored label (the
  run has 10 classes and every answer is a draw at epsilon 0.01, nearly uniform, so a second draw
  shows as a different label 9 times in 10); must be 0;
- budget exactness: per client, the ledger's answers (= charged / epsilon) equal the distinct
  inputs it was answered, and never exceed its budget; its refusals equal its 429s; the memo's
  draws (the all-clients row) equal the distinct inputs anyone was answered, and never exceed the
  total budget.

The same jobs then go to one `lucid serve` on a SQLite file (both requests of a job to that one
process), and to one replica on PostgreSQL, for throughput beside the two replicas. Everything
(client, servers, database) shares the machine's cores: the report says how many.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_load import ms, running_server  # noqa: E402

EPSILON = 0.01
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


def synthetic_run(scratch: Path) -> Path:
    """10 classes, nothing proved: every answer is a draw, so a duplicate draw is visible."""
    from synthetic_runs import write_synthetic_run

    return write_synthetic_run(scratch / "run", num_classes=10, input_dim=7, hidden=(50, 50),
                               bounds={c: None for c in range(10)})


@contextmanager
def replica(run: Path, scratch: Path, memo: str, keys: Path, budget: float, total: float
            ) -> Iterator[tuple[int, subprocess.Popen]]:
    """`lucid serve` on a free port with `memo`; (port, process). Stderr goes to a file."""
    cmd = [sys.executable, "-m", "lucid", "serve", str(run), "--port", "0", "-e", str(EPSILON), "--memo", memo,
           "--api-keys", str(keys), "--budget", repr(budget), "--total-budget", repr(total),
           # Every client coroutine connects from 127.0.0.1: no per-address cap (--pairs may exceed its 64).
           "--max-connections-per-ip", "100000"]
    with running_server(cmd, scratch / f"server-{uuid.uuid4().hex[:6]}.log") as started:
        yield started


async def _post(reader, writer, body: bytes, token: str) -> tuple[int, bytes]:
    writer.write(b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                 b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n" % (token.encode(), len(body)) + body)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = _LENGTH.search(head)
    return int(head.split(b" ", 2)[1]), await reader.readexactly(int(length.group(1)) if length else 0)


async def race(ports: list[int], jobs: list[tuple[int, int]], bodies: list[bytes], pairs: int) -> dict:
    """Each job to both ports at once (two requests on two connections), `pairs` coroutines."""
    results: list[tuple[int, int, int, int | None, float]] = []  # (client, input, status, label, seconds)

    async def worker(k: int) -> None:
        conns = [await asyncio.open_connection("127.0.0.1", ports[i % len(ports)]) for i in range(2)]

        async def one(conn, client: int, i: int) -> None:
            t0 = time.perf_counter()
            status, body = await _post(*conn, bodies[i], f"token-{client}")
            label = json.loads(body)["labels"][0] if status == 200 else None
            results.append((client, i, status, label, time.perf_counter() - t0))

        for client, i in jobs[k::pairs]:
            await asyncio.gather(*(one(conn, client, i) for conn in conns))
        for _, writer in conns:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(pairs)))
    return {"results": results, "seconds": time.perf_counter() - started}


def stored_labels(memo: str, schema: str | None) -> tuple[dict[bytes, int], list[tuple]]:
    """({key: label} of the memo, its ledger rows), read from the database itself."""
    from lucid.access.memo import read_memo_ledger

    if schema is None:
        with sqlite3.connect(memo) as db:
            labels = dict(db.execute("SELECT key, label FROM memo").fetchall())
    else:
        import psycopg

        with psycopg.connect(memo) as db:
            labels = {bytes(k): int(v) for k, v in db.execute("SELECT key, label FROM memo").fetchall()}
    return labels, read_memo_ledger(memo)


def check(out: dict, keys: list[bytes], labels: dict[bytes, int], ledger: list[tuple], clients: int,
          budget_answers: int, total_answers: int) -> dict:
    """Duplicate draws and budget exactness of one run (module docstring)."""
    results = out["results"]
    ok = [(c, i, label) for c, i, status, label, _ in results if status == 200]
    duplicates = {i for _, i, label in ok if labels.get(keys[i]) != label}
    rows = {r[0]: r for r in ledger}
    per_client = []
    for c in range(clients):
        answered = {i for cc, i, _ in ok if cc == c}
        refusals = sum(1 for cc, _, status, _, _ in results if cc == c and status == 429)
        row = rows.get(f"c{c}", (f"c{c}", EPSILON, 0, 0, 0))
        per_client.append({"answered": len(answered), "ledger": row[2], "refused_429": refusals,
                           "ledger_refused": row[4],
                           "exact": row[2] == len(answered) and row[4] == refusals and row[2] <= budget_answers})
    drawn = {i for _, i, _ in ok}
    total_row = rows.get("*", ("*", EPSILON, 0, 0, 0))
    latencies = np.array([s for *_, s in results])
    statuses = [status for _, _, status, _, _ in results]
    return {
        "requests": len(results), "ok": statuses.count(200), "refused": statuses.count(429),
        "errors": sum(s not in (200, 429) for s in statuses), "duplicates": len(duplicates),
        "clients": per_client, "clients_exact": all(p["exact"] for p in per_client),
        "draws": total_row[2], "memo_rows": len(labels), "answered_inputs": len(drawn),
        "total_exact": total_row[2] == len(drawn) == len(labels) and total_row[2] <= total_answers,
        "per_second": len(results) / out["seconds"], "seconds": out["seconds"],
        "p50": float(np.percentile(latencies, 50)), "p99": float(np.percentile(latencies, 99)),
    }


def report(args, rows: dict[str, dict], budget_answers: int, total_answers: int, loads: list[str],
           server_version: str) -> str:
    command = (f"python benchmarks/serve_replicas.py --requests {args.requests} --inputs {args.inputs} "
               f"--clients {args.clients} --pairs {args.pairs}")
    lines = [
        "# Two `lucid serve` replicas on one PostgreSQL memo (`benchmarks/serve_replicas.py`)",
        "",
        f"Command: `{command}` (database: a fresh schema in `{args.database}`, dropped afterwards).",
        "",
        f"Machine: {os.cpu_count()} cores, shared by the client (one asyncio process), the server processes and "
        f"PostgreSQL ({server_version}); load average {loads[0]} at the start, {loads[1]} at the end. "
        "Every figure is therefore a lower bound of what the servers alone would do, and the PostgreSQL rows "
        "show the cost of sharing the memo on one machine, not what a second machine adds.",
        "",
        f"Workload: {args.requests} single-row requests: {args.requests // 2} jobs (client, input) over a pool of "
        f"{args.inputs} inputs (with repeats) and {args.clients} clients, each job sent to both replicas at the same "
        f"moment by {args.pairs} coroutines (to the one process twice for the single-server rows). Run: 7 features, "
        f"2x50, 10 classes, nothing proved (every answer is a draw), epsilon {EPSILON}. Budgets: "
        f"`--budget` {budget_answers} answers per client, `--total-budget` {total_answers} draws in all, both below "
        "what the jobs ask, so both refuse during the race.",
        "",
        "| setup | requests/s | p50 | p99 | 200 | 429 | errors | **duplicate draws** | per-client ledger = answers "
        "delivered, <= budget | all-clients draws = memo rows = inputs delivered, <= total |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        clients = "; ".join(f"c{k}: {p['ledger']} = {p['answered']}, refused {p['ledger_refused']} = "
                            f"{p['refused_429']} 429s" for k, p in enumerate(r["clients"]))
        lines.append(
            f"| {name} | {r['per_second']:.0f} | {ms(r['p50'])} | {ms(r['p99'])} | {r['ok']} | {r['refused']} | "
            f"{r['errors']} | **{r['duplicates']}** | {'exact' if r['clients_exact'] else 'NOT EXACT'} ({clients}) | "
            f"{'exact' if r['total_exact'] else 'NOT EXACT'} ({r['draws']} = {r['memo_rows']} = "
            f"{r['answered_inputs']}, cap {total_answers}) |")
    lines += [
        "",
        "Duplicate draws: inputs for which some 200 answer differs from the memo's one stored label (at 10 classes "
        "and epsilon 0.01 a second draw differs 9 times in 10). Exact: each client's ledger counts exactly the "
        "distinct inputs it was answered (charged = that x epsilon) and its refusals exactly its 429s; the "
        "all-clients row counts exactly the memo's entries, which are exactly the inputs anyone was answered.",
        "",
        "Where the time goes: every request that is not a repeat for its client (a new input, a memo hit new to "
        "the client, or a refusal) is one PostgreSQL transaction of about ten statements whose COMMIT waits for the WAL flush, and requests that "
        "draw queue on one row (the memo's count, lock 3 in `lucid/access/memo/store.py`) until they commit; "
        "SQLite's WAL file is not flushed per commit (`synchronous=NORMAL`). The `synchronous_commit=off` row "
        "shows the flush's share; it is not a setting to serve with, since a database crash could then lose "
        "draws already given out. Repeats take no lock and no transaction.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--inputs", type=int, default=4_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=16, help="coroutines, each with one connection per replica")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "serve_replicas.md")
    args = parser.parse_args()
    import psycopg

    from lucid.access import LabelOnlyClassifier

    scratch = Path(tempfile.mkdtemp(prefix="serve-replicas-"))
    schemas: list[str] = []
    try:
        run = synthetic_run(scratch)
        keys_file = scratch / "keys.txt"
        keys_file.write_text("".join(f"c{c} token-{c}\n" for c in range(args.clients)))
        rng = np.random.default_rng(0)
        clf = LabelOnlyClassifier.from_run(run, epsilon=EPSILON)  # in memory: only to compute the memo keys
        lower, upper = clf.domain_lower, clf.domain_upper
        xn = lower + rng.random((args.inputs, len(lower))) * (upper - lower)
        raw = xn / clf.scale + clf.offset
        points = clf.to_network_space(clf.validate(raw))
        keys = [(np.ascontiguousarray(row, dtype=np.float64) + 0.0).tobytes() for row in points]
        bodies = [json.dumps({"inputs": [row]}).encode() for row in raw.tolist()]
        clf.close()
        jobs = [(int(c), int(i)) for c, i in zip(rng.integers(0, args.clients, args.requests // 2),
                                                 rng.integers(0, args.inputs, args.requests // 2))]
        pairs_per_client = [len({i for c, i in jobs if c == k}) for k in range(args.clients)]
        budget_answers = min(pairs_per_client) * 3 // 4  # below what each client asks
        total_answers = len({i for _, i in jobs}) * 2 // 3  # below what the clients' budgets allow together
        budget, total = budget_answers * EPSILON, total_answers * EPSILON
        with psycopg.connect(args.database) as conn:
            server_version = "PostgreSQL " + conn.execute("SHOW server_version").fetchone()[0].split()[0]
        loads = [" / ".join(f"{x:.1f}" for x in os.getloadavg())]
        rows: dict[str, dict] = {}
        setups = [("SQLite, 1 process", "sqlite", 1, ""), ("PostgreSQL, 1 replica", "pg", 1, ""),
                  ("PostgreSQL, 2 replicas", "pg", 2, ""),
                  # Not a recommended setting (a database crash can lose the last commits, and with them
                  # draws already given out): the row only shows what the commit's WAL flush costs.
                  ("PostgreSQL, 2 replicas, synchronous_commit=off (not durable)", "pg", 2,
                   "%20-csynchronous_commit%3Doff")]
        for name, kind, count, options in setups:
            schema = None
            if kind == "sqlite":
                memo = str(scratch / f"memo-{uuid.uuid4().hex[:6]}.sqlite")
            else:
                schema = f"lucid_bench_{uuid.uuid4().hex[:10]}"
                with psycopg.connect(args.database, autocommit=True) as conn:
                    conn.execute(f"CREATE SCHEMA {schema}")
                schemas.append(schema)
                memo = (f"{args.database}{'&' if '?' in args.database else '?'}options=-csearch_path%3D{schema}"
                        f"{options}")
            with ExitStack() as stack:
                ports = [stack.enter_context(replica(run, scratch, memo, keys_file, budget, total))[0]
                         for _ in range(count)]
                out = asyncio.run(race(ports, jobs, bodies, args.pairs))
            labels, ledger = stored_labels(memo, schema)
            rows[name] = check(out, keys, labels, ledger, args.clients, budget_answers, total_answers)
            print(f"{name}: " + json.dumps({k: v for k, v in rows[name].items() if k != "clients"}), file=sys.stderr)
        loads.append(" / ".join(f"{x:.1f}" for x in os.getloadavg()))
        text = report(args, rows, budget_answers, total_answers, loads, server_version)
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
        print(text)
        if any(r["duplicates"] or not r["clients_exact"] or not r["total_exact"] or r["errors"] for r in rows.values()):
            sys.exit(1)
    finally:
        for schema in schemas:
            with psycopg.connect(args.database, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
