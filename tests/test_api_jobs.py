"""Jobs: the lifecycle with progress, cancellation of a running solve, the
bounded queue (429), and identical requests sharing one solve."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_cases import long_job_request, mlp_doc, service_settings, wait_job
from fastapi.testclient import TestClient

from api.main import create_app

pytestmark = pytest.mark.solver


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    # One worker and room for one waiting job: the queue fills after two.
    settings = service_settings(tmp_path_factory.mktemp("jobs"), queue_size=1)
    with TestClient(create_app(settings)) as c:
        yield c


def test_job_goes_from_queued_to_done_with_progress_and_a_plan(client):
    r = client.post("/v1/jobs", json={"graph": mlp_doc(), "mesh_shape": "x:2;y:2"})
    assert r.status_code == 202
    job = r.json()
    assert job["status"] in ("queued", "running") and job["plan_id"] is None
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    done = wait_job(client, job["id"], ("done", "failed", "cancelled"))
    assert (
        done["status"] == "done" and done["progress"] == 1.0 and done["error"] is None
    )
    plan = client.get(f"/v1/plans/{done['plan_id']}").json()
    assert plan["mesh_shape"] == "x:2;y:2" and plan["graph_name"] == "mlp"
    assert done["request"]["mesh_shape"] == "x:2;y:2"
    listed = client.get("/v1/jobs").json()["jobs"]
    assert listed[0]["id"] == job["id"]


def test_job_for_a_stored_plan_is_done_at_once(client):
    body = {"graph": mlp_doc(), "mesh_shape": "x:4"}
    first = client.post("/v1/plans", json=body).json()
    job = client.post("/v1/jobs", json=body).json()
    assert job["status"] == "done" and job["plan_id"] == first["id"]
    assert job["phase"] == "done (cached)"


def test_cancelling_a_running_job_kills_its_solve_and_frees_the_worker(client):
    job = client.post("/v1/jobs", json=long_job_request()).json()
    running = wait_job(client, job["id"], ("running",))
    assert 0 < running["progress"] < 1
    r = client.delete(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert "cancelled" in r.json()["error"]
    # Its worker is being replaced: the service is alive and still ready.
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    # Cancelling again: it has finished.
    again = client.delete(f"/v1/jobs/{job['id']}")
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    # A new worker took over: the next plan is solved.
    r = client.post("/v1/plans", json={"graph": mlp_doc(), "mesh_shape": "y:2"})
    assert r.status_code == 200 and r.json()["cached"] is False


def test_full_queue_answers_429_and_queued_jobs_can_be_cancelled(client):
    running = client.post("/v1/jobs", json=long_job_request()).json()
    wait_job(client, running["id"], ("running",))
    waiting_body = {**long_job_request(), "time_limit_s": 29}
    waiting = client.post("/v1/jobs", json=waiting_body)
    assert waiting.status_code == 202 and waiting.json()["status"] == "queued"
    full = client.post("/v1/jobs", json={"graph": mlp_doc(), "mesh_shape": "q:2"})
    assert full.status_code == 429
    assert full.headers["retry-after"] == "5"
    assert "queue_size=1" in full.json()["detail"]
    assert client.get("/healthz").json()["queue_depth"] == 1
    for job in (waiting.json(), running):
        assert client.delete(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"
    assert client.get("/healthz").json()["queue_depth"] == 0


def test_identical_requests_in_flight_share_one_job(client):
    body = {**long_job_request(), "time_limit_s": 28}
    a = client.post("/v1/jobs", json=body).json()
    b = client.post("/v1/jobs", json=body).json()
    assert a["id"] == b["id"]
    assert client.delete(f"/v1/jobs/{a['id']}").json()["status"] == "cancelled"


def test_unknown_job_is_a_404(client):
    assert client.get("/v1/jobs/nope").status_code == 404
    assert client.delete("/v1/jobs/nope").status_code == 404


def test_only_the_planners_input_errors_blame_the_request(caplog):
    import json

    import numpy as np

    from api.worker_main import is_client_error
    from api.workers import TaskFailed, TaskInvalid, WorkerPool
    from cost_models.hardware import HardwareError
    from layout_planner.errors import PlannerError, SolverError
    from layout_planner.options import PlanOptions
    from mtf_core.errors import LayoutError, SerializationError

    try:
        np.ones(2).reshape(3)
    except ValueError as numpy_error:
        assert not is_client_error(numpy_error)
    assert not is_client_error(LayoutError("an internal layout went wrong"))
    assert not is_client_error(SolverError("CP-SAT said MODEL_INVALID"))
    for e in (PlannerError("x"), SerializationError("x"), HardwareError("x")):
        assert is_client_error(e)

    options = PlanOptions().to_dict()
    task = {
        "graph_json": json.dumps(mlp_doc()),
        "mesh_shape": "x:2",
        "num_devices": None,
        "options": options,
    }
    pool = WorkerPool(1, 4)
    pool.start()
    try:
        assert pool.wait_ready(120)
        bad = pool.submit("bad-input", {**task, "options": {**options, "top_k": 0}})
        with pytest.raises(TaskInvalid, match="top_k is 0"):
            bad.result(timeout=60)
        # A task the server should never send (no graph): a KeyError in the
        # worker is our bug, not the client's: an error id, no internals.
        bug = pool.submit(
            "our-bug", {k: v for k, v in task.items() if k != "graph_json"}
        )
        with pytest.raises(TaskFailed) as failed:
            bug.result(timeout=60)
        error_id = failed.value.error_id
        assert error_id and error_id in str(failed.value)
        assert "KeyError" not in str(failed.value)
        assert "graph_json" not in str(failed.value)
        logged = [r.getMessage() for r in caplog.records if error_id in r.getMessage()]
        assert logged and "KeyError" in logged[0]
    finally:
        pool.shutdown()
