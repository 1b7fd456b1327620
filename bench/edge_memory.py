"""Many large requests at once against one real server: its memory and its
liveness while they run.

    .venv/bin/python bench/edge_memory.py --clients 32 --layers 48

Starts ``mtf-planner serve`` (uvicorn, SQLite, one worker) in a subprocess,
posts ``--clients`` concurrent ``POST /v1/evaluate`` requests of a
Transformer LM graph (``--layers`` layers: 48 make a ~6 MB body), polls
``/healthz`` every 0.1 s meanwhile, and prints the server's resident memory
before, at its peak (VmHWM) and after, the answers by status, and the
slowest ``/healthz``.  The body budget (``max_inflight_body_bytes``) is what
bounds the peak: requests over it are answered 503 + Retry-After at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--inflight-mib", type=int, help="max_inflight_body_bytes")
    p.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout whose server runs"
    )
    args = p.parse_args()

    from api.examples import example_graph

    graph = example_graph("transformer-lm", layers=args.layers)
    body = json.dumps(
        {"graph": graph, "mesh_shape": "x:2;y:4", "layout_rules": "batch:x;d_ff:y"}
    ).encode()
    env = dict(os.environ, MTF_PLANNER_WORKERS="1")
    if args.inflight_mib:
        env["MTF_PLANNER_MAX_INFLIGHT_BODY_BYTES"] = str(args.inflight_mib * 2**20)
    data = tempfile.mkdtemp(prefix="edge-memory-")
    server = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--port", str(args.port),
         "--data-dir", data],
        cwd=args.root, env=dict(env, PYTHONPATH=str(args.root)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(1200):
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2).status_code
                if ready == 200 or (  # a version without /readyz
                    ready == 404
                    and httpx.get(f"{url}/healthz", timeout=2).status_code == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit(f"the server at {args.root} did not start")
        before = rss_mb(server.pid)
        statuses: Counter[int | str] = Counter()
        health: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                try:
                    httpx.get(f"{url}/healthz", timeout=60)
                except httpx.HTTPError:
                    pass
                health.append(time.perf_counter() - t0)
                time.sleep(0.1)

        def post() -> None:
            try:
                r = httpx.post(
                    f"{url}/v1/evaluate",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=600,
                )
                statuses[r.status_code] += 1
            except httpx.HTTPError as e:
                statuses[type(e).__name__] += 1

        poller = threading.Thread(target=poll)
        poller.start()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=post) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        done.set()
        poller.join()
        time.sleep(1)
        print(
            f"{args.clients} concurrent POST /v1/evaluate of {len(body) / 1e6:.1f} MB "
            f"({len(graph['operations'])} ops) in {wall:.1f} s: answers "
            f"{dict(sorted(statuses.items(), key=str))}"
        )
        print(
            f"server RSS: {before:.0f} MB before, {rss_mb(server.pid, 'VmHWM'):.0f} MB "
            f"peak, {rss_mb(server.pid):.0f} MB after"
        )
        health.sort()
        print(
            f"/healthz during the load: {len(health)} polls, p50 "
            f"{1e3 * health[len(health) // 2]:.0f} ms, max {1e3 * health[-1]:.0f} ms"
        )
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
