"""Shared pieces of the planner service tests: graphs, settings, a real server.

Nothing here fakes the service: :class:`ServerThread` runs the real app under
uvicorn on a loopback port, with the real store and worker processes.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from api.examples import example_graph
from api.main import create_app
from api.settings import Settings


def mlp_doc(**sizes: Any) -> dict[str, Any]:
    """A small MLP training step (about 100 ops; plans in well under a second)."""
    defaults = dict(layers=1, hidden=64, batch=32, features=16, classes=4)
    defaults.update(sizes)
    return example_graph("mlp", optimizer="sgd", **defaults)


def long_job_request() -> dict[str, Any]:
    """A request whose solve runs until its time limit: a Transformer whose
    mesh shape is searched among the factorizations of 4,096 devices into up
    to 4 axes (about 30 s on a quiet host; 64 devices in 3 axes took 3.5 s,
    short enough to finish under a test that needs it still running)."""
    return {
        "graph": example_graph("transformer-lm", layers=2),
        "num_devices": 4096,
        "max_mesh_dims": 4,
        "hardware": "h100-nvlink-ib",
        "time_limit_s": 30,
    }


def service_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """One worker, a private data dir; overrides win."""
    values: dict[str, Any] = dict(
        data_dir=tmp_path, workers=1, instance_name="test", sync_wait_s=60
    )
    values.update(overrides)
    return Settings(**values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """The app under a real uvicorn server on 127.0.0.1, in a thread."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            # uvicorn's own logging config would close the handlers already on
            # the root logger, and absl's (TensorFlow's) closes its stream: a
            # stream pytest captures this session's output in.
            log_config=None,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_healthy(self.url)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def wait_healthy(url: str, timeout_s: float = 90.0) -> dict[str, Any]:
    """Polls /readyz until the store answers and every worker is up."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/readyz", timeout=5)
            last = r.json()
            if r.status_code == 200:
                return dict(last)
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s: {last!r}")


def wait_job(
    client: Any, job_id: str, until: tuple[str, ...], timeout_s: float = 120
) -> dict[str, Any]:
    """Polls GET /v1/jobs/{id} (TestClient or httpx.Client) until its status
    is one of ``until``."""
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in until:
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"job {job_id} still {job['status']} after {timeout_s} s"
            )
        time.sleep(0.1)
