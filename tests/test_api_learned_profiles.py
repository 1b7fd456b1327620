"""Plans use what the service measured, by default: over HTTP, a plan, a
measured step far from its prediction, and the same request again (no
profile passed) is planned with the profile refitted from that measurement;
``use_measurements: false`` keeps the preset.  The real app, SQLite store
and solve workers; the measured step is reported, not run (the TensorFlow
loop is ``tests/test_measurements_loop.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient
from test_api_scale_jobs import SHORT
from test_api_scale_plans import MODEL

from api.learned import refit_profile
from api.main import create_app
from api.scale_planning import ScaleSpec
from api.store.base import MeasurementRecord
from cost_models.hardware import HardwareProfile
from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig

pytestmark = pytest.mark.solver

BODY: dict[str, Any] = {
    "graph": mlp_doc(hidden=128, batch=64),
    "mesh_shape": "x:4",
    "hardware": "cpu-host",
    "top_k": 3,
}
#: The same request in one fixed set of bytes (the response cache keys them).
RAW = json.dumps(BODY).encode()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("learned"))
    with TestClient(create_app(settings)) as c:
        yield c


def _post(client: TestClient, raw: bytes) -> dict[str, Any]:
    r = client.post(
        "/v1/plans", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _measure(client: TestClient, plan_id: str, step_s: float) -> dict[str, Any]:
    r = client.post(
        "/v1/measurements",
        json={"plan_id": plan_id, "step_s": step_s, "source": "test"},
    )
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_measured_step_moves_the_next_plan_of_the_same_request(
    client: TestClient,
) -> None:
    first = _post(client, RAW)
    assert first["profile"] == {
        "name": "cpu-host",
        "backend": "placement",
        "source": "base",
        "measurements": 0,
        "use_measurements": True,
        "text": "cpu-host base profile (no measurements on placement)",
    }
    predicted = first["time_s"]
    measured = 4.0 * predicted  # the run was far slower than predicted
    report = _measure(client, first["id"], measured)
    assert report["predicted_s"] == pytest.approx(predicted, rel=1e-9)
    assert report["refit_measurements"] == 1

    # The very same bytes, no profile passed: planned again, refitted.
    second = _post(client, RAW)
    assert second["cached"] is False and second["id"] != first["id"]
    assert second["profile"]["source"] == "refitted"
    assert second["profile"]["measurements"] == 1
    assert second["profile"]["text"] == (
        "cpu-host refitted from 1 measurement on placement"
    )
    again = second["time_s"]
    assert abs(again - measured) < abs(predicted - measured)
    assert abs(again / measured - 1) < 0.25
    # The profile used is the one GET /v1/measurements/profile gives.
    fitted = client.get(
        "/v1/measurements/profile", params={"hardware": "cpu-host"}
    ).json()
    assert second["plan"]["hardware"] == fitted
    assert HardwareProfile.from_dict(fitted).rates is not None
    # Asked again: the refitted plan, from the store or memory.
    third = _post(client, RAW)
    assert third["cached"] is True and third["id"] == second["id"]

    # Opting out: the preset as shipped, the first plan (from the store).
    out = _post(client, json.dumps({**BODY, "use_measurements": False}).encode())
    assert out["cached"] is True and out["id"] == first["id"]
    assert out["time_s"] == predicted
    assert (
        out["plan"]["hardware"]
        == client.get("/v1/hardware").json()["presets"]["cpu-host"]
    )

    # Another measurement: the refit, the hash and the plan change again.
    _measure(client, second["id"], measured)
    fourth = _post(client, RAW)
    assert fourth["cached"] is False
    assert fourth["id"] not in (first["id"], second["id"])
    assert fourth["profile"]["measurements"] == 2
    assert abs(fourth["time_s"] / measured - 1) < 0.25

    # Measurements on the other backend leave placement plans alone.
    spmd = _post(client, json.dumps({**BODY, "backend": "spmd"}).encode())
    assert spmd["profile"]["source"] == "base" and spmd["id"] == first["id"]

    # The plan's page and its job say which profile was used.
    page = client.get(f"/plans/{fourth['id']}").text
    assert 'id="plan-profile"' in page
    assert "cpu-host refitted from 2 measurements on placement" in page
    base_page = client.get(f"/plans/{first['id']}").text
    assert "cpu-host base profile" in base_page
    jobs = client.get("/v1/jobs").json()["jobs"]
    job = next(j for j in jobs if j["plan_id"] == fourth["id"])
    assert job["request"]["profile"]["measurements"] == 2


def test_a_profile_object_is_used_as_given(client: TestClient) -> None:
    preset = client.get("/v1/hardware").json()["presets"]["cpu-host"]
    mine = {**preset, "peak_flops": preset["peak_flops"] / 2}
    out = _post(client, json.dumps({**BODY, "hardware": mine}).encode())
    assert out["profile"]["source"] == "request"
    assert out["profile"]["text"] == "cpu-host as the request gave it"
    assert out["plan"]["hardware"] == mine
    # The preset's own numbers given as an object are the preset's request:
    # the same hash, so the stored plan made with them (the base profile).
    same = _post(client, json.dumps({**BODY, "hardware": preset}).encode())
    assert same["cached"] is True and same["profile"]["source"] == "base"
    # The page's "try another mesh" form offers that profile, not the preset.
    page = client.get(f"/plans/{out['id']}").text
    assert (
        '<option value="__this_plan__" selected>cpu-host (this plan\'s profile)' in page
    )
    assert '<option value="cpu-host" selected>' not in page
    base_page = client.get(f"/plans/{same['id']}").text
    assert '<option value="cpu-host" selected>' in base_page
    assert "__this_plan__" not in base_page
    # A step measured on the profile the request gave refits nothing of the
    # preset it is named like: refused, and the preset's fit is unchanged.
    before = client.get("/v1/measurements", params={"hardware": "cpu-host"}).json()
    r = client.post(
        "/v1/measurements", json={"plan_id": out["id"], "step_s": out["time_s"]}
    )
    assert r.status_code == 422, r.text
    assert (
        f"plan {out['id']} was made with a hardware profile its request gave, "
        "named 'cpu-host' like the preset" in r.json()["detail"]
    )
    after = client.get("/v1/measurements", params={"hardware": "cpu-host"}).json()
    assert after == before
    # One stored before that refusal is left out of the preset's refit.
    store = client.app.state.service.store  # type: ignore[attr-defined]
    fit = refit_profile(store, "cpu-host", "placement")
    store.put_measurement(
        MeasurementRecord(
            "stored-before", out["id"], "cpu-host", "placement",
            100 * out["time_s"], out["time_s"], time.time(), {},
        )
    )  # fmt: skip
    assert refit_profile(store, "cpu-host", "placement") == fit
    # Named a profile of its own, it is measured and refitted as that one.
    own = _post(
        client, json.dumps({**BODY, "hardware": {**mine, "name": "mine"}}).encode()
    )
    report = _measure(client, own["id"], 2 * own["time_s"])
    assert report["hardware"] == "mine" and report["refit_measurements"] == 1


def test_use_measurements_must_be_a_boolean(client: TestClient) -> None:
    for bad in ("no", 0, None):
        r = client.post("/v1/plans", json={**BODY, "use_measurements": bad})
        assert r.status_code == 422, r.text
        assert "use_measurements" in r.text
    r = client.post("/v1/plans", json={**BODY, "backend": "gpu"})
    assert r.status_code == 422 and "backend" in r.text


def test_another_replicas_measurement_is_used_within_a_heartbeat(
    tmp_path: Path,
) -> None:
    """Two services on one SQLite file: a measurement reported to the first
    is used by the second once its heartbeat reads the store's stamps."""
    first = service_settings(tmp_path, instance_name="a")
    other = service_settings(tmp_path, instance_name="b", heartbeat_s=0.2)
    body = json.dumps({**BODY, "mesh_shape": "x:2"}).encode()
    with TestClient(create_app(first)) as a, TestClient(create_app(other)) as b:
        base = _post(a, body)
        assert _post(b, body)["id"] == base["id"]  # b answers from the store
        _measure(a, base["id"], 3 * base["time_s"])
        refitted = _post(a, body)  # a knows at once
        assert refitted["profile"]["source"] == "refitted"
        t0 = time.monotonic()
        while True:
            out = _post(b, body)
            if out["id"] == refitted["id"]:
                break
            assert out["id"] == base["id"]
            assert time.monotonic() - t0 < 5, "b never used the measurement"
            time.sleep(0.05)
        assert out["cached"] is True and out["profile"]["measurements"] == 1


SCALE = SHORT  # about a second of planning (tests/test_api_scale_jobs.py)


def test_scale_plans_use_the_refitted_profile_too(tmp_path: Path) -> None:
    settings = service_settings(tmp_path)
    with TestClient(create_app(settings)) as c:
        base = c.post("/v1/scale-plans", json=SCALE)
        assert base.status_code == 200, base.text
        assert base.json()["profile"]["source"] == "base"
        # A plan on the same hardware, measured 20x slower than predicted.
        plan = _post(c, json.dumps({**BODY, "hardware": "h100-nvlink-ib"}).encode())
        _measure(c, plan["id"], 20 * plan["time_s"])

        r = c.post("/v1/scale-plans", json=SCALE)
        assert r.status_code == 200, r.text
        learned = r.json()
        assert learned["cached"] is False and learned["id"] != base.json()["id"]
        assert learned["profile"]["source"] == "refitted"
        assert learned["profile"]["measurements"] == 1
        assert learned["step_time_s"] != base.json()["step_time_s"]
        # What plan_transformer plans with that profile, here.
        fitted = c.get(
            "/v1/measurements/profile", params={"hardware": "h100-nvlink-ib"}
        ).json()
        local = plan_transformer(
            TransformerConfig(**MODEL, activation_dtype="bfloat16"),
            8,
            HardwareProfile.from_dict(fitted),
            stages=[1, 2],
            tensor=[1, 2],
            time_limit_s=2,
        )
        assert learned["mesh_shape"] == local.choice.full_mesh
        assert learned["step_time_s"] == pytest.approx(local.step_time_s, rel=1e-9)
        # The stored request carries the refit; a worker rebuilds it exactly.
        spec = ScaleSpec.from_canonical(learned["request"])
        assert spec.hardware_profile() == HardwareProfile.from_dict(fitted)
        assert spec.request_hash == learned["request_hash"]

        out = c.post("/v1/scale-plans", json={**SCALE, "use_measurements": False})
        assert out.json()["cached"] is True
        assert out.json()["id"] == base.json()["id"]
        assert out.json()["profile"]["source"] == "base"

        page = c.get(f"/scale-plans/{learned['id']}").text
        assert "h100-nvlink-ib refitted from 1 measurement on placement" in page


def test_a_measured_step_is_a_json_number(client: TestClient) -> None:
    plan = _post(client, RAW)
    before = client.get("/v1/measurements", params={"plan_id": plan["id"]}).json()
    for field, value in (
        ("step_s", True),
        ("step_s", "0.01"),
        ("profile", {"matmul": True}),
        ("profile", {"matmul": "0.5"}),
    ):
        body = {"plan_id": plan["id"], "step_s": plan["time_s"], field: value}
        r = client.post("/v1/measurements", json=body)
        assert r.status_code == 422, (field, value, r.text)
        assert field in r.json()["detail"]
    after = client.get("/v1/measurements", params={"plan_id": plan["id"]}).json()
    assert after == before  # nothing stored
