"""The general planning endpoints probed as a hostile or careless client:
measured steps out of any sensible range, measurements no fit can be made
of, operations too large for the cost model's floats, NUL characters in
bodies and URLs (PostgreSQL's text columns cannot hold one).  Each answer is
a 4xx naming the bad value, and one client's bad upload never breaks other
clients' plans."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient
from pg_server import PostgresMissing, postgres_server
from services import service_missing

import mtf_core as mtf
from api.main import create_app
from api.store.base import MeasurementRecord
from cost_models.hardware import PRESETS
from mtf_core.serialization import graph_to_dict

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("probe"))
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _error(r: Any, status: int, *needles: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    for needle in needles:
        assert needle in body["detail"], body
    return body


def _plan(client: TestClient, hardware: str, **fields: Any) -> dict[str, Any]:
    body = {"graph": mlp_doc(), "mesh_shape": "x:2", "hardware": hardware, **fields}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _measure(client: TestClient, plan_id: str, step_s: float) -> Any:
    # json.dumps writes 5e-324 as it is (httpx's json= would too; explicit here).
    raw = json.dumps({"plan_id": plan_id, "step_s": step_s})
    return client.post("/v1/measurements", content=raw.encode(), headers=JSON)


def _store_measurement(
    client: TestClient, plan: dict[str, Any], measured_s: float
) -> None:
    """A measurement put straight into the store (as one stored before the
    service checked its range would be), and the replica told of it."""
    service = client.app.state.service  # type: ignore[attr-defined]
    service.store.put_measurement(
        MeasurementRecord(
            id=uuid.uuid4().hex,
            plan_id=plan["id"],
            hardware=plan["hardware"],
            backend="placement",
            measured_s=measured_s,
            predicted_s=plan["time_s"],
            created_at=time.time(),
            detail={},
        )
    )
    service.refresh_measurements()


# -- measurements ---------------------------------------------------------------


@pytest.mark.parametrize("step_s", [5e-324, 1e-300, 1e-7])
def test_a_measured_step_under_a_microsecond_is_a_422_naming_step_s(client, step_s):
    plan = _plan(client, "tpu-v5e")
    body = _error(_measure(client, plan["id"], step_s), 422, "step_s")
    assert body["errors"][0]["loc"] == ["body", "step_s"]
    # Nothing was stored: the preset's plans and measurements go on as before
    # (a 5e-324 s step made every later plan on the preset a 500).
    assert _measure(client, plan["id"], 1e-3).status_code == 201
    r = client.post(
        "/v1/plans",
        json={"graph": mlp_doc(hidden=32), "mesh_shape": "x:2", "hardware": "tpu-v5e"},
    )
    assert r.status_code == 200, r.text
    r = client.get("/v1/measurements/profile", params={"hardware": "tpu-v5e"})
    assert r.status_code == 200, r.text


def test_a_step_a_million_times_off_its_prediction_is_a_422_and_stored_nowhere(
    client,
):
    plan = _plan(client, "h100-nvlink-ib")
    # 1e6 s for a plan predicted at well under a millisecond: stored, it made
    # every later plan of the preset "too slow for the planner" (a 422
    # blaming the graph's dims) for every client.
    _error(
        _measure(client, plan["id"], 1e6),
        422,
        "step_s 1e+06 s is",
        "times plan",
        "expected a step within a factor of 1e+06",
    )
    rows = client.get("/v1/measurements", params={"plan_id": plan["id"]}).json()
    assert rows["measurements"] == []


def test_measurements_stored_out_of_range_break_no_plan(client):
    plan = _plan(client, "cpu-host", mesh_shape="x:4")
    _store_measurement(client, plan, 5e-324)
    r = client.post(
        "/v1/plans",
        json={"graph": mlp_doc(hidden=48), "mesh_shape": "x:2", "hardware": "cpu-host"},
    )
    assert r.status_code == 200, r.text
    r = client.get("/v1/measurements/profile", params={"hardware": "cpu-host"})
    assert r.status_code == 404, r.text  # its only measurement is left out


def test_a_refit_that_fails_plans_with_the_base_profile(client, monkeypatch):
    plan = _plan(client, "a100-nvlink-ib", mesh_shape="x:8")
    _store_measurement(client, plan, 1e-3)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise np.linalg.LinAlgError("SVD did not converge in Linear Least Squares")

    monkeypatch.setattr("api.learned.refit", broken)
    r = client.post(
        "/v1/plans",
        json={
            "graph": mlp_doc(hidden=80),
            "mesh_shape": "x:2",
            "hardware": "a100-nvlink-ib",
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["profile"]["source"] == "base"
    r = client.get("/v1/measurements/profile", params={"hardware": "a100-nvlink-ib"})
    _error(r, 422, "'a100-nvlink-ib'", "could not be fitted")


def test_a_plan_refused_with_a_refitted_profile_says_which_profile(client):
    plan = _plan(client, "tpu-v4")
    assert _measure(client, plan["id"], 2e-3).status_code == 201
    huge = mlp_doc(batch=2**30, hidden=2**30)  # tensors over 2**55 bytes
    r = client.post(
        "/v1/plans", json={"graph": huge, "mesh_shape": "x:2", "hardware": "tpu-v4"}
    )
    _error(
        r,
        422,
        "2**55",
        "tpu-v4 refitted from 1 measurement on placement",
        '"use_measurements": false',
    )


# -- operations the cost model's floats cannot price -----------------------------


def _sizes(value: Any, size: int) -> None:
    if isinstance(value, dict):
        if set(value) == {"name", "size"}:
            value["size"] = size
        for v in value.values():
            _sizes(v, size)
    elif isinstance(value, list):
        for v in value:
            _sizes(v, size)


def wide_einsum_doc(size: int) -> dict[str, Any]:
    """An einsum of two rank-16 tensors with no dim in common, into a rank-16
    output: 32 dims of ``size`` in one operation (built small, then resized:
    mtf_core itself cannot build it)."""
    g = mtf.Graph()
    mesh = mtf.Mesh(g, "mesh")
    a_dims = [mtf.Dimension(f"a{i}", 2) for i in range(16)]
    b_dims = [mtf.Dimension(f"b{i}", 2) for i in range(16)]
    a = mtf.zeros(mesh, mtf.Shape(a_dims))
    b = mtf.zeros(mesh, mtf.Shape(b_dims))
    out = mtf.einsum([a, b], output_shape=mtf.Shape(a_dims[:8] + b_dims[:8]))
    doc = graph_to_dict(g, outputs=[mtf.reduce_sum(out)])
    _sizes(doc, size)
    return doc


@pytest.mark.parametrize(
    "path, extra",
    [
        ("/v1/evaluate", {"layout_rules": "a0:x"}),  # was a 500
        ("/v1/plans", {}),  # was a 503
        ("/v1/jobs", {}),  # was a job that failed as the service's bug
    ],
)
def test_an_operation_too_large_for_float_flops_is_a_422_naming_it(client, path, extra):
    # 32 dims of 2**33: 2**1056 points, past the largest float.
    doc = wide_einsum_doc(2**33)
    r = client.post(path, json={"graph": doc, "mesh_shape": "x:2", **extra})
    _error(
        r,
        422,
        "operation 'zeros' (Constant)",
        "2**528",
        "at most 2**128 points",
        "expected smaller dims",
    )


# -- NUL characters ---------------------------------------------------------------


def test_a_nul_character_in_a_json_string_is_a_422(client):
    doc = mlp_doc()
    doc["metadata"]["name"] = "mlp\u0000"
    r = client.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:2"})
    _error(r, 422, "NUL character", "expected names and text without NUL")
    hw = {**PRESETS["cpu-host"].to_dict(), "name": "host\u0000"}
    r = client.post(
        "/v1/evaluate",
        json={
            "graph": mlp_doc(),
            "mesh_shape": "x:2",
            "layout_rules": "batch:x",
            "hardware": hw,
        },
    )
    _error(r, 422, "NUL character")
    r = client.post(
        "/v1/measurements",
        json={"plan_id": "p", "step_s": 0.1, "source": "\u0000"},
    )
    _error(r, 422, "NUL character")
    # A backslash followed by the text u0000 is no NUL.
    doc = mlp_doc()
    doc["metadata"]["name"] = "mlp\\u0000"
    r = client.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:2"})
    assert r.status_code == 200, r.text
    assert r.json()["graph_name"] == "mlp\\u0000"


@pytest.mark.parametrize(
    "method, url, status, needle",
    [
        ("GET", "/v1/plans/%00", 404, "path has a NUL character"),
        ("GET", "/v1/jobs/a%00b", 404, "path has a NUL character"),
        ("DELETE", "/v1/jobs/%00", 404, "path has a NUL character"),
        ("GET", "/v1/scale-plans/%00", 404, "path has a NUL character"),
        ("GET", "/v1/measurements?hardware=%00", 422, "query string has a NUL"),
        ("GET", "/v1/measurements/profile?hardware=a%00", 422, "query string has"),
    ],
)
def test_a_nul_character_in_an_api_url_is_a_4xx_naming_it(
    client, method, url, status, needle
):
    _error(client.request(method, url), status, needle)


def test_nul_characters_never_reach_postgresql(tmp_path):
    # PostgreSQL's text columns refuse NUL, and it cannot compare one: each of
    # these was a 500 there.
    try:
        with postgres_server() as url:
            settings = service_settings(tmp_path, database_url=url)
            with TestClient(create_app(settings), raise_server_exceptions=False) as c:
                doc = mlp_doc()
                doc["metadata"]["name"] = "mlp\u0000"
                r = c.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:2"})
                _error(r, 422, "NUL character")
                for path in ("/v1/plans/%00", "/v1/jobs/%00"):
                    _error(c.get(path), 404, "NUL character")
                _error(c.delete("/v1/jobs/%00"), 404, "NUL character")
                _error(c.get("/v1/measurements?hardware=%00"), 422, "NUL character")
                for path in ("/plans/%00", "/jobs/%00", "/scale-plans/%00"):
                    r = c.get(path)
                    assert r.status_code == 404, r.text
                    assert r.headers["content-type"].startswith("text/html")
                form = {"content-type": "application/x-www-form-urlencoded"}
                for path in ("/plans/%00/try", "/jobs/%00/cancel"):
                    r = c.post(path, content=b"mesh_shape=x%3A2", headers=form)
                    assert r.status_code == 404, r.text
                assert c.get("/v1/plans/nope").status_code == 404
    except PostgresMissing as e:
        service_missing(str(e))


# -- the planner's 64-bit limits, through the service -------------------------


def test_the_slowest_accepted_profile_on_a_3_axis_mesh_is_not_a_503(client):
    # The program's time coefficients (every assignment's, which CP-SAT sums
    # to check for overflow) pass 2**62 ps here: a 503 "solve_failed" before.
    hw = PRESETS["tpu-v4"].to_dict()
    hw.update(peak_flops=1e6, hbm_bandwidth_bytes_per_s=1e6)
    hw["default_link"] = dict(
        hw["default_link"], bandwidth_bytes_per_s=1e3, latency_s=1.0
    )
    r = client.post(
        "/v1/plans",
        json={
            "graph": mlp_doc(batch=2**20),
            "mesh_shape": "x:2;y:2;z:2",
            "hardware": hw,
        },
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "planner_error"
    assert "up to 2**62 ps" in r.json()["detail"]
