"""Load test of the planner service on loopback: concurrent clients asking for
a mix of cached plans and new ones, bounded in time, reporting p50/p99 latency
and requests/s; with ``--write`` it also writes the "Service" section of
docs/benchmarks.md (without it, the docs are left alone).

    .venv/bin/python bench/load.py --write             # 50 clients, 60 s
    .venv/bin/python bench/load.py --clients 5 --duration 3

It starts the real server (``python -m api.cli serve``, one solve worker) on a
free 127.0.0.1 port with a fresh data dir, plans the cached set once, then
runs the clients (one asyncio process, httpx).  Each client sleeps a random
think time between requests (a CI pipeline, not a tight loop); the new-plan
requests are paced at ``--new-per-s`` (each is a distinct request, so a real
solve in the worker).  A ``--think-ms 0`` run measures saturation instead.
Any non-2xx answer or transport error counts as an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import command_line, machine_summary, markdown_table, replace_section  # noqa: E402

from api.examples import example_graph  # noqa: E402


@dataclass
class Stats:
    cached_s: list[float] = field(default_factory=list)
    new_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def start_server(data: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, MTF_PLANNER_WORKERS=str(workers), MTF_PLANNER_QUEUE_SIZE="64"
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data),
        ],
        cwd=ROOT,
        env=env,
        stdout=open(data / "server.log", "wb"),  # noqa: SIM115 - the child writes it
        stderr=subprocess.STDOUT,
    )


def wait_healthy(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become healthy")


def server_histogram(url: str) -> dict[float, float]:
    """The service's own POST /v1/plans latency histogram: {le: count}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[float, float] = {}
    for line in text.splitlines():
        if (
            line.startswith("mtf_planner_request_duration_seconds_bucket{")
            and 'route="/v1/plans"' in line
        ):
            le = line.split('le="')[1].split('"')[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_pct(
    before: dict[float, float], after: dict[float, float], p: float
) -> float:
    """The upper bound of the bucket holding the p-th percentile."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
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


class Connection:
    """One keep-alive HTTP/1.1 connection, written by hand: a load generator
    that shares 2 cores with the server must cost it as little as possible
    (with httpx's AsyncClient, the client's own CPU time dominated the
    measured latency here: a cached p99 of ~1 s against ~40 ms with this)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port
            )
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
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
    port: int, args: argparse.Namespace, cached: list[dict], new: list[dict]
) -> tuple[Stats, float]:
    stats = Stats()
    rng = random.Random(1)
    new_iter = iter(new)
    # Pre-encoded bodies: the client's JSON encoding is not the server's latency.
    cached_bodies = [json.dumps(b).encode() for b in cached]
    t_end = time.monotonic() + args.duration
    next_new = time.monotonic() if args.new_per_s > 0 else float("inf")
    interval = 1.0 / args.new_per_s if args.new_per_s > 0 else float("inf")

    async def client() -> None:
        nonlocal next_new
        conn = Connection("127.0.0.1", port)
        await asyncio.sleep(rng.random() * args.think_ms / 1000)
        while time.monotonic() < t_end:
            is_new = time.monotonic() >= next_new
            if is_new:
                next_new += interval
                body = next(new_iter, None)
                if body is None:
                    is_new = False
            content = json.dumps(body).encode() if is_new else rng.choice(cached_bodies)
            t0 = time.perf_counter()
            try:
                status, data = await conn.post("/v1/plans", content)
                dt = time.perf_counter() - t0
                stats.statuses[status] = stats.statuses.get(status, 0) + 1
                if status != 200:
                    stats.errors.append(f"{status}: {data[:200]!r}")
                elif is_new:
                    stats.new_s.append(dt)
                else:
                    stats.cached_s.append(dt)
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                stats.errors.append(f"{type(e).__name__}: {e}")
                conn.close()
            if args.think_ms:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * args.think_ms / 1000)
        conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    return stats, time.monotonic() - t0


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
    p.add_argument("--workers", type=int, default=1, help="solve worker processes")
    p.add_argument(
        "--write",
        action="store_true",
        help="write the results into docs/benchmarks.md (default: only print them)",
    )
    args = p.parse_args(argv)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cached, new = requests_for(args)
    with tempfile.TemporaryDirectory(prefix="mtf-planner-load-") as tmp:
        server = start_server(Path(tmp), port, args.workers)
        try:
            wait_healthy(url)
            t0 = time.perf_counter()
            with httpx.Client(base_url=url, timeout=300) as http:
                for body in cached:  # plan the cached set once
                    r = http.post("/v1/plans", json=body)
                    r.raise_for_status()
            print(
                f"planned {len(cached)} cached requests in {time.perf_counter() - t0:.1f} s"
            )
            before = server_histogram(url)
            stats, wall = asyncio.run(run_load(port, args, cached, new))
            after = server_histogram(url)
        finally:
            server.terminate()
            server.wait(timeout=30)
    total = len(stats.cached_s) + len(stats.new_s) + len(stats.errors)
    ms = lambda v: f"{v * 1e3:.1f}"  # noqa: E731
    rows = [
        [
            "cached plans",
            len(stats.cached_s),
            ms(pct(stats.cached_s, 50)),
            ms(pct(stats.cached_s, 99)),
            ms(max(stats.cached_s, default=float("nan"))),
            f"{len(stats.cached_s) / wall:.1f}",
        ],
        [
            "new plans (solved)",
            len(stats.new_s),
            ms(pct(stats.new_s, 50)),
            ms(pct(stats.new_s, 99)),
            ms(max(stats.new_s, default=float("nan"))),
            f"{len(stats.new_s) / wall:.2f}",
        ],
        ["all", total, "", "", "", f"{total / wall:.1f}"],
    ]
    server_p50 = histogram_pct(before, after, 50)
    server_p99 = histogram_pct(before, after, 99)
    server_line = (
        f"Server side (the service's own histogram of POST /v1/plans, cached and "
        f"solved requests together; bucket upper bounds): "
        f"p50 <= {server_p50 * 1e3:g} ms, p99 <= {server_p99 * 1e3:g} ms."
    )
    table = markdown_table(
        ["requests", "count", "p50 ms", "p99 ms", "max ms", "req/s"], rows
    )
    print(table)
    print(server_line)
    print(f"errors: {len(stats.errors)}; statuses {stats.statuses}")
    for e in stats.errors[:5]:
        print("  ", e)
    if stats.cached_s:
        print(f"cached mean {statistics.mean(stats.cached_s) * 1e3:.1f} ms")
    if args.write:
        body = f"""Command: `{command_line()}`

Machine: {machine_summary()}.  The server (`mtf-planner serve`, one uvicorn
process, {args.workers} solve worker process) and the load generator (one asyncio
process, one hand-written keep-alive HTTP/1.1 connection per client) share the
machine, on 127.0.0.1.

{args.clients} clients for {args.duration:g} s; each pauses {args.think_ms:g} ms on
average (uniform 0.5x-1.5x) between requests.  Requests are POST /v1/plans
with a whole graph (an MLP, {len(cached[0]["graph"]["operations"])} ops, about
{len(json.dumps(cached[0])) // 1024} KiB of JSON): {len(cached)} distinct requests planned
beforehand (cache hits), and distinct new requests at {args.new_per_s:g}/s (each a real
solve in the worker).  Errors (any non-200 answer or transport error): **{len(stats.errors)}**.

{table}

{server_line}
"""
        replace_section("service", body, title=SECTION)
        print(f"wrote the {SECTION!r} section of docs/benchmarks.md")
    return 1 if stats.errors else 0


SECTION = "Service"


if __name__ == "__main__":
    sys.exit(main())
