"""The service killed (SIGKILL) in the middle of a job and started again:
finished plans are all there, the unfinished job is marked failed by the
reaper once its heartbeat is stale (never lost silently, never left
"running"), and the killed server's solve worker died with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from api_cases import free_port, long_job_request, mlp_doc, wait_healthy, wait_job

pytestmark = [pytest.mark.solver, pytest.mark.slow]


def start_server(data: Path, port: int) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        MTF_PLANNER_WORKERS="1",
        MTF_PLANNER_INSTANCE_NAME="restart-test",
        # A short bound, so that the dead run's job is reaped within seconds.
        MTF_PLANNER_HEARTBEAT_S="0.5",
        MTF_PLANNER_STALE_JOB_S="3",
    )
    log = open(data / f"server-{time.time_ns()}.log", "wb")  # noqa: SIM115 - the child writes it
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
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def worker_pids(server_pid: int) -> list[int]:
    """The server's child processes (its solve workers), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server_pid:
                out.append(int(entry.name))
    return out


def gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie has exited
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_killed_mid_job_the_service_restarts_with_every_plan_and_the_job_failed(
    tmp_path,
):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=60) as c:
            plans = [
                c.post(
                    "/v1/plans", json={"graph": mlp_doc(), "mesh_shape": mesh}
                ).json()
                for mesh in ("x:2", "x:2;y:2")
            ]
            job = c.post("/v1/jobs", json=long_job_request()).json()
            wait_job(c, job["id"], ("running",))
        workers = worker_pids(server.pid)
        assert workers, "the server should have a solve worker process"
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        # PR_SET_PDEATHSIG: the worker does not outlive the server.
        assert all(gone(pid) for pid in workers)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

    server = start_server(tmp_path, port)
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=60) as c:
            for plan in plans:
                again = c.get(f"/v1/plans/{plan['id']}").json()
                assert again["plan"] == plan["plan"]
            assert c.get("/v1/plans").json()["total"] == 2
            failed = wait_job(c, job["id"], ("failed", "done", "cancelled"), 30)
            assert failed["status"] == "failed"
            assert "stopped before it finished" in failed["error"]
            assert "no heartbeat for 3 s" in failed["error"]
            # Finished: it can no longer be cancelled.
            assert c.delete(f"/v1/jobs/{job['id']}").status_code == 409
            # The same request, sent again, is solved (the first try was not cached).
            retry = c.post("/v1/jobs", json=long_job_request()).json()
            assert retry["id"] != job["id"] and retry["status"] in ("queued", "running")
            c.delete(f"/v1/jobs/{retry['id']}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
