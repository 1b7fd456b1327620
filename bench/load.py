"""Load test of the planner service on loopback: concurrent clients asking for
a mix of cached plans and new ones, bounded in time, reporting p50/p99 latency,
requests/s and errors; with ``--write`` (or ``--write-docs``) it also writes
its section of docs/benchmarks.md (without it, the docs are left alone).

    .venv/bin/python bench/load.py --write             # 50 clients, 60 s
    .venv/bin/python bench/load.py --clients 5 --duration 3
    .venv/bin/python bench/load.py --postgres --replicas 2 --clients 32 \\
        --other-bytes-share 0.2 --get-share 0.2 --list-share 0.2 --new-per-s 0

It starts the real servers (``python -m api.cli serve``, one solve worker
each) on free 127.0.0.1 ports: one on a fresh SQLite data dir, or with
``--postgres`` ``--replicas`` of them on one throwaway PostgreSQL server
(tests/pg_server.py; Debian's ``postgresql`` package).  It plans the cached
set once, then runs the clients (one asyncio process, spread round-robin over
the replicas).  Each request is one of:

* ``cached plans``: POST /v1/plans with the exact bytes of a planned request;
* ``cached, other bytes`` (``--other-bytes-share``): the same requests in
  bytes never sent before (keys reordered, the mesh as an object, defaults
  spelled out, and unique trailing whitespace): the canonical-request path;
* ``GET /v1/plans/{id}`` (``--get-share``): a stored plan by id (memory,
  else the database);
* ``GET /v1/plans (list)`` (``--list-share``): a read from the database;
* ``new plans (solved)``, paced at ``--new-per-s``: each a distinct request,
  a real solve in a worker.

Each client sleeps a random think time between requests (a CI pipeline, not a
tight loop); ``--think-ms 0`` measures saturation instead.  Any non-2xx answer
or transport error counts as an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from common import command_line, machine_summary, markdown_table, replace_section  # noqa: E402

from api.examples import example_graph  # noqa: E402

KINDS = (
    "cached plans",
    "cached, other bytes",
    "GET /v1/plans/{id}",
    "GET /v1/plans (list)",
)
NEW = "new plans (solved)"


@dataclass
class Stats:
    seconds: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in (*KINDS, NEW)}
    )
    errors: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    data: Path,
    port: int,
    workers: int,
    database_url: str = "",
    name: str = "load",
    pool_size: int = 8,
) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        MTF_PLANNER_WORKERS=str(workers),
        MTF_PLANNER_QUEUE_SIZE="64",
        MTF_PLANNER_INSTANCE_NAME=name,
        MTF_PLANNER_DB_POOL_SIZE=str(pool_size),
        # Every client here is one address (127.0.0.1): the per-client limit
        # would measure itself, not the service.
        MTF_PLANNER_CLIENT_MAX_CONCURRENT="100000",
        MTF_PLANNER_CLIENT_RATE_PER_S="1000000",
        MTF_PLANNER_CLIENT_BURST="1000000",
    )
    cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port)]
    cmd += ["--database-url", database_url] if database_url else []
    cmd += ["--data-dir", str(data)]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=open(data / f"{name}.log", "wb"),  # noqa: SIM115 - the child writes it
        stderr=subprocess.STDOUT,
    )


def wait_ready(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become ready")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far (Linux /proc)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def server_histogram(urls: list[str]) -> dict[float, float]:
    """The services' own POST /v1/plans latency histograms, summed: {le: count}."""
    out: dict[float, float] = {}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for line in text.splitlines():
            if (
                line.startswith("mtf_planner_request_duration_seconds_bucket{")
                and 'route="/v1/plans"' in line
            ):
                le = float(line.split('le="')[1].split('"')[0])
                out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def histogram_pct(
    before: dict[float, float], after: dict[float, float], p: float
) -> float:
    """The upper bound of the bucket holding the p-th percentile."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    for b, c in zip(bounds, counts):
        if total and c >= p / 100 * total:
            return b
    return float("inf")


def requests_for(
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cached set, and a supply of distinct new requests."""
    graph = example_graph(
        "mlp", optimizer="sgd", layers=2, hidden=256, batch=64, features=64, classes=10
    )
    meshes = ["x:2", "x:4", "x:2;y:2", "x:8", "x:4;y:2"]
    hws = ["cpu-host", "tpu-v4", "h100-nvlink-ib"]
    cached = [
        {"graph": graph, "mesh_shape": m, "hardware": h} for m in meshes for h in hws
    ][: args.cached_set]
    new = [
        {"graph": graph, "mesh_shape": m, "hardware": h, "top_k": k}
        for k in range(1, 21)
        for m in meshes
        for h in hws
    ]
    random.Random(0).shuffle(new)
    return cached, new


def other_spelling(body: dict[str, Any], rng: random.Random, n: int) -> bytes:
    """``body`` in bytes never sent before: the same request (keys in another
    order, the mesh as an object, the defaults spelled out) and trailing
    whitespace that spells ``n`` in base 4."""
    spelled = dict(body)
    if rng.random() < 0.5:
        spelled["mesh_shape"] = dict(
            (name, int(size))
            for name, size in (a.split(":") for a in body["mesh_shape"].split(";"))
        )
    if rng.random() < 0.5:
        spelled.update(objective="time", top_k=5, time_limit_s=10)
    items = list(spelled.items())
    rng.shuffle(items)
    tail = b""
    while True:
        n, digit = divmod(n, 4)
        tail += b" \t\n\r"[digit : digit + 1]
        if not n:
            return json.dumps(dict(items)).encode() + tail


class Connection:
    """One keep-alive HTTP/1.1 connection, written by hand: a load generator
    that shares 2 cores with the server must cost it as little as possible
    (with httpx's AsyncClient, the client's own CPU time dominated the
    measured latency here: a cached p99 of ~1 s against ~40 ms with this)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port
            )
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def run_load(
    ports: list[int],
    args: argparse.Namespace,
    cached: list[dict[str, Any]],
    plan_ids: list[str],
    new: list[dict[str, Any]],
) -> tuple[Stats, float]:
    stats = Stats()
    rng = random.Random(1)
    new_iter = iter(new)
    # Pre-encoded bodies: the client's JSON encoding is not the server's latency.
    cached_bodies = [json.dumps(b).encode() for b in cached]
    other_bodies = iter(
        other_spelling(cached[i % len(cached)], rng, i) for i in range(10**9)
    )
    t_end = time.monotonic() + args.duration
    next_new = time.monotonic() if args.new_per_s > 0 else float("inf")
    interval = 1.0 / args.new_per_s if args.new_per_s > 0 else float("inf")

    async def client(port: int) -> None:
        nonlocal next_new
        conn = Connection("127.0.0.1", port)
        await asyncio.sleep(rng.random() * args.think_ms / 1000)
        while time.monotonic() < t_end:
            kind, method, path, content = "cached plans", "POST", "/v1/plans", b""
            if time.monotonic() >= next_new:
                next_new += interval
                body = next(new_iter, None)
                if body is not None:
                    kind, content = NEW, json.dumps(body).encode()
            if kind != NEW:
                draw = rng.random()
                if draw < args.other_bytes_share:
                    kind, content = KINDS[1], next(other_bodies)
                elif draw < args.other_bytes_share + args.get_share:
                    kind, method = KINDS[2], "GET"
                    path = f"/v1/plans/{rng.choice(plan_ids)}"
                elif draw < args.other_bytes_share + args.get_share + args.list_share:
                    kind, method, path = KINDS[3], "GET", "/v1/plans?limit=10"
                else:
                    content = rng.choice(cached_bodies)
            t0 = time.perf_counter()
            try:
                status, data = await conn.request(method, path, content)
                dt = time.perf_counter() - t0
                stats.statuses[status] = stats.statuses.get(status, 0) + 1
                if status != 200:
                    stats.errors.append(f"{kind} {status}: {data[:200]!r}")
                else:
                    stats.seconds[kind].append(dt)
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                stats.errors.append(f"{kind} {type(e).__name__}: {e}")
                conn.close()
            if args.think_ms:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think_ms / 1000)
        conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(client(ports[i % len(ports)]) for i in range(args.clients)))
    return stats, time.monotonic() - t0


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    """A throwaway PostgreSQL server's URL with --postgres, else ''."""
    if not args.postgres:
        yield ""
        return
    from pg_server import postgres_server

    with postgres_server() as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument(
        "--think-ms",
        type=float,
        default=500.0,
        help="mean pause between a client's requests",
    )
    p.add_argument(
        "--new-per-s", type=float, default=1.0, help="new (uncached) plans per second"
    )
    p.add_argument(
        "--cached-set", type=int, default=12, help="distinct cached requests"
    )
    p.add_argument(
        "--other-bytes-share",
        type=float,
        default=0.0,
        help="share of cached requests sent in bytes never seen before",
    )
    p.add_argument(
        "--get-share",
        type=float,
        default=0.0,
        help="share of requests that are GET /v1/plans/{id}",
    )
    p.add_argument(
        "--list-share",
        type=float,
        default=0.0,
        help="share of requests that are GET /v1/plans?limit=10 (a database read)",
    )
    p.add_argument("--workers", type=int, default=1, help="solve workers per replica")
    p.add_argument(
        "--postgres",
        action="store_true",
        help="replicas on one throwaway PostgreSQL server (default: SQLite)",
    )
    p.add_argument("--replicas", type=int, default=1, help="service processes")
    p.add_argument(
        "--pool-size", type=int, default=8, help="database connections per replica"
    )
    p.add_argument(
        "--write",
        "--write-docs",
        action="store_true",
        help="write the results into docs/benchmarks.md (default: only print them)",
    )
    args = p.parse_args(argv)
    if args.replicas > 1 and not args.postgres:
        p.error("--replicas > 1 needs --postgres (SQLite is one file on one host)")

    cached, new = requests_for(args)
    ports = [free_port() for _ in range(args.replicas)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    with (
        tempfile.TemporaryDirectory(prefix="mtf-planner-load-") as tmp,
        database(args) as database_url,
    ):
        servers = [
            start_server(
                Path(tmp), port, args.workers, database_url, f"r{i}", args.pool_size
            )
            for i, port in enumerate(ports)
        ]
        try:
            for url in urls:
                wait_ready(url)
            t0 = time.perf_counter()
            plan_ids = []
            with httpx.Client(timeout=300) as http:
                for i, body in enumerate(cached):  # plan the cached set once
                    r = http.post(f"{urls[i % len(urls)]}/v1/plans", json=body)
                    r.raise_for_status()
                    plan_ids.append(r.json()["id"])
            print(
                f"planned {len(cached)} cached requests in {time.perf_counter() - t0:.1f} s"
            )
            before = server_histogram(urls)
            cpu0 = cpu_seconds([s.pid for s in servers])
            stats, wall = asyncio.run(run_load(ports, args, cached, plan_ids, new))
            cpu = cpu_seconds([s.pid for s in servers]) - cpu0
            after = server_histogram(urls)
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(timeout=30)
    total = sum(map(len, stats.seconds.values())) + len(stats.errors)
    ms = lambda v: f"{v * 1e3:.1f}"  # noqa: E731
    rows: list[list[Any]] = []
    for kind, seconds in stats.seconds.items():
        if not seconds and kind not in ("cached plans", NEW):
            continue
        rate = len(seconds) / wall
        rows.append(
            [
                kind,
                len(seconds),
                ms(pct(seconds, 50)),
                ms(pct(seconds, 99)),
                ms(max(seconds, default=float("nan"))),
                f"{rate:.2f}" if kind == NEW else f"{rate:.1f}",
            ]
        )
    rows.append(["all", total, "", "", "", f"{total / wall:.1f}"])
    server_p50 = histogram_pct(before, after, 50)
    server_p99 = histogram_pct(before, after, 99)
    server_line = (
        f"Server side (the services' own histogram of the /v1/plans route: POSTs, "
        f"cached and solved together, and GET lists; bucket upper bounds): "
        f"p50 <= {server_p50 * 1e3:g} ms, p99 <= {server_p99 * 1e3:g} ms."
        if server_p50 != float("inf")
        else "No request to the /v1/plans route in this run."
    )
    table = markdown_table(
        ["requests", "count", "p50 ms", "p99 ms", "max ms", "req/s"], rows
    )
    served = total - len(stats.errors)
    server_line += (
        f"  The servers' processes used {cpu:.1f} CPU seconds for {served} answers: "
        f"{cpu / max(served, 1) * 1e3:.2f} ms of CPU per answer (a measure that "
        "other work on the machine changes little)."
    )
    print(table)
    print(server_line)
    print(f"errors: {len(stats.errors)}; statuses {stats.statuses}")
    for e in stats.errors[:5]:
        print("  ", e)
    if stats.seconds["cached plans"]:
        mean = statistics.mean(stats.seconds["cached plans"])
        print(f"cached mean {mean * 1e3:.1f} ms")
    if args.write:
        store = (
            f"{args.replicas} replicas (`mtf-planner serve` processes, one uvicorn "
            f"process each, {args.workers} solve worker each, at most "
            f"{args.pool_size} database connections each) on one PostgreSQL "
            "server"
            if args.postgres
            else f"One server (`mtf-planner serve`, one uvicorn process, "
            f"{args.workers} solve worker) on SQLite"
        )
        cached_share = 1 - args.other_bytes_share - args.get_share - args.list_share
        body = f"""Command: `{command_line()}`

Machine: {machine_summary()}.  {store}, and the load generator (one asyncio
process, one hand-written keep-alive HTTP/1.1 connection per client, spread
round-robin over the replicas) share the machine, on 127.0.0.1.

{args.clients} clients for {args.duration:g} s; each pauses {args.think_ms:g} ms on
average (uniform 0.5x-1.5x) between requests.  Plan requests carry a whole graph
(an MLP, {len(cached[0]["graph"]["operations"])} ops, about
{len(json.dumps(cached[0])) // 1024} KiB of JSON) and ask for one of {len(cached)} requests
planned beforehand: {max(cached_share, 0):.0%} of all requests in the bytes that
planned them, {args.other_bytes_share:.0%} in bytes never sent before (keys
reordered, the mesh as an object, defaults spelled out).  The rest:
{args.get_share:.0%} GET /v1/plans/{{id}}, {args.list_share:.0%} GET /v1/plans?limit=10 (a
database read each time), and new requests at {args.new_per_s:g}/s (each a real
solve in a worker).  Errors (any non-200 answer or transport error):
**{len(stats.errors)}**.

{table}

{server_line}
"""
        key, title = (
            ("service-replicas", "Service: replicas on PostgreSQL")
            if args.postgres
            else ("service", "Service")
        )
        replace_section(key, body, title=title)
        print(f"wrote the {title!r} section of docs/benchmarks.md")
    return 1 if stats.errors else 0


if __name__ == "__main__":
    sys.exit(main())
