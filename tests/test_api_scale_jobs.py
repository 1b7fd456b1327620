"""Scale plans as jobs: ``POST /v1/scale-plans`` that does not finish within
``sync_wait_s`` answers 202 with a job (``kind: "scale"``) whose progress is
``plan_transformer``'s (each mesh of the search), on ``GET /v1/jobs/{id}``
and the job's page; cancel stops it; identical requests at once, on one
service or on two services over one store, plan once.  A real server
(uvicorn on loopback), the real SQLite store and solve worker processes."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_cases import ServerThread, service_settings, wait_job
from fastapi.testclient import TestClient
from test_api_scale_plans import MODEL

from api.main import create_app

pytestmark = pytest.mark.solver

#: About a second of planning: 2 x 2 meshes of a small LM.
SHORT: dict[str, Any] = {
    "model": MODEL,
    "devices": 8,
    "hardware": "h100-nvlink-ib",
    "stages": [1, 2],
    "tensor": [1, 2],
    "time_limit_s": 2,
}
#: Seconds of planning: 19 meshes of 64 devices.
MEDIUM: dict[str, Any] = {
    "model": {
        "num_layers": 8,
        "d_model": 512,
        "heads": 8,
        "d_kv": 64,
        "d_ff": 2048,
        "vocab": 8192,
        "length": 256,
        "batch": 64,
    },
    "devices": 64,
    "hardware": "h100-nvlink-ib",
    "time_limit_s": 5,
}
#: Longer: 25 meshes of 512 devices, a mixture of experts.
LONG: dict[str, Any] = {
    "model": {
        "num_layers": 16,
        "d_model": 1024,
        "heads": 16,
        "d_kv": 64,
        "d_ff": 4096,
        "vocab": 32000,
        "length": 1024,
        "batch": 512,
        "experts": 8,
    },
    "devices": 512,
    "hardware": "h100-nvlink-ib",
    "time_limit_s": 5,
}
MESH_PHASE = re.compile(r"^mesh (\d+) of (\d+): pp \d+ x dp \d+ x tp \d+$")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale-jobs")


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[ServerThread]:
    # Answers 202 at once: every request that plans becomes a job to poll.
    with ServerThread(service_settings(data_dir, sync_wait_s=0.05)) as s:
        yield s


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _submit(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/scale-plans", json=body)
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["kind"] == "scale" and job["result_url"] is None
    return job


def _watch(
    http: httpx.Client, job_id: str, until: Any, timeout_s: float = 120
) -> list[dict[str, Any]]:
    """Polls the job every 20 ms until ``until(job)``; every answer seen."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}").json()
        seen.append(job)
        if until(job):
            return seen
        time.sleep(0.02)
    raise TimeoutError(f"job {job_id}: {seen[-1]}")


def test_a_scale_job_reports_each_mesh_and_ends_with_the_scale_plan(
    http: httpx.Client,
) -> None:
    job = _submit(http, MEDIUM)
    assert job["request"]["model"] == "lm 8 layers, d_model 512"
    assert job["request"]["devices"] == 64
    seen = _watch(http, job["id"], lambda j: j["status"] not in ("queued", "running"))
    done = seen[-1]
    assert done["status"] == "done", done
    assert done["progress"] == 1.0 and done["error"] is None
    assert done["result_url"] == f"/v1/scale-plans/{done['plan_id']}"
    # Progress never goes back, and shows the search's meshes as it goes.
    fractions = [j["progress"] for j in seen]
    assert fractions == sorted(fractions)
    meshes = [
        (m, j["progress"])
        for j in seen
        if (m := MESH_PHASE.match(j["phase"])) and j["status"] == "running"
    ]
    assert len({m.group(1) for m, _ in meshes}) >= 2, [j["phase"] for j in seen]
    for m, fraction in meshes:
        assert m.group(2) == "19"  # 19 meshes of 64 devices to try
        i = int(m.group(1))
        # plan_transformer's fraction 0.8 (i - 1) / 19 (its first pass takes
        # 0.8 of the search), mapped into 0.1 .. 0.8
        assert fraction == pytest.approx(0.1 + 0.7 * 0.8 * (i - 1) / 19)
    plan = http.get(done["result_url"]).json()
    assert plan["id"] == done["plan_id"] and plan["devices"] == 64
    # Asked again: the stored plan, at once.
    again = http.post("/v1/scale-plans", json=MEDIUM)
    assert again.status_code == 200 and again.json()["cached"] is True
    assert again.json()["id"] == plan["id"]
    # The finished job's page forwards to the scale plan's page.
    page = http.get(f"/jobs/{job['id']}", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == f"/scale-plans/{plan['id']}"


def test_cancelling_a_running_scale_job_stops_it_and_stores_nothing(
    http: httpx.Client,
) -> None:
    before = http.get("/v1/scale-plans").json()["total"]
    job = _submit(http, LONG)
    seen = _watch(http, job["id"], lambda j: MESH_PHASE.match(j["phase"]))
    running = seen[-1]
    assert running["status"] == "running"
    assert 0.1 <= running["progress"] < 0.8
    # The job's page shows what it plans, the phase and the progress bar.
    page = http.get(f"/jobs/{job['id']}")
    assert page.status_code == 200
    assert (
        "Scale plan: lm 16 layers, d_model 1024, 8 experts on 512 devices" in page.text
    )
    assert 'id="job-progress"' in page.text and 'id="cancel-form"' in page.text
    assert re.search(
        r'id="job-phase">(mesh \d+ of 25|planning meshes|starting)', page.text
    )

    r = http.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled" and "cancelled" in r.json()["error"]
    assert http.delete(f"/v1/jobs/{job['id']}").status_code == 409
    assert http.get("/v1/scale-plans").json()["total"] == before
    # The worker was replaced: the next scale plan is made.
    short = _submit(http, {**SHORT, "time_limit_s": 3})
    assert wait_job(http, short["id"], ("done", "failed"))["status"] == "done"


def test_identical_requests_at_once_share_one_job_and_one_plan(
    http: httpx.Client, server: ServerThread
) -> None:
    body = {**SHORT, "time_limit_s": 4}
    barrier = threading.Barrier(4)
    answers: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            barrier.wait()
            answers.append(c.post("/v1/scale-plans", json=body))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1, answers
    done = wait_job(http, ids.pop(), ("done", "failed", "cancelled"))
    assert done["status"] == "done", done
    plan = http.get(done["result_url"]).json()
    # One job row for this request in the store, and one plan.
    jobs = http.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
    mine = [j for j in jobs if j["plan_id"] == plan["id"]]
    assert [j["id"] for j in mine] == [done["id"]]
    listed = http.get("/v1/scale-plans", params={"limit": 500}).json()["plans"]
    assert [p["id"] for p in listed].count(plan["id"]) == 1


def test_a_second_service_on_the_store_joins_the_first_ones_job(
    http: httpx.Client, data_dir: Path
) -> None:
    """Two services (replicas) on one SQLite file: the second finds the
    first's unfinished job by the request's hash (the store's unique index)
    and waits for it through the store instead of planning again."""
    body = {**MEDIUM, "time_limit_s": 4}
    job = _submit(http, body)  # on the first service's worker
    other = service_settings(data_dir, instance_name="other", sync_wait_s=60)
    with TestClient(create_app(other)) as second:
        _watch(http, job["id"], lambda j: MESH_PHASE.match(j["phase"]))
        r = second.post("/v1/scale-plans", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["cached"] is False  # it waited for the job, not the store
        first = wait_job(http, job["id"], ("done", "failed"))
        assert first["status"] == "done" and first["plan_id"] == out["id"]
        assert second.get(f"/v1/jobs/{job['id']}").json()["status"] == "done"
        store = second.app.state.service.store  # type: ignore[attr-defined]
        hashes = [j.request_hash for j in store.list_jobs(500)]
        assert hashes.count(out["request_hash"]) == 1  # one run, the first's
