"""Plans that learn from runs, end to end: plan a graph on the service, run the
plan's step on logical CPU devices, report the measured step, and the
profile the service refits from it predicts the next plan closer to what was
measured.  The real app, SQLite store, solver and TensorFlow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_cases import service_settings
from fastapi.testclient import TestClient

import mtf_core as mtf
from api.main import create_app
from mtf_core.errors import ConfigError
from mtf_core.models import MlpConfig, build_mlp_classifier
from mtf_core.serialization import graph_to_dict

pytestmark = [pytest.mark.solver, pytest.mark.tf]

MESH = "x:4"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("measure"))
    with TestClient(create_app(settings)) as c:
        yield c


def _model() -> Any:
    cfg = MlpConfig(batch=256, features=64, hidden=256, classes=8)
    return build_mlp_classifier(cfg, optimizer="sgd", learning_rate=0.1)


def _plan(client: TestClient, hardware: Any) -> dict[str, Any]:
    model = _model()
    doc = graph_to_dict(model.graph, outputs=[model.loss])
    r = client.post(
        "/v1/plans",
        json={"graph": doc, "mesh_shape": MESH, "hardware": hardware, "top_k": 3},
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _run_step(rules: str, devices: list[str]) -> float:
    """The plan's training step, compiled and run: its fastest step (CPU
    seconds per usable core, which other processes on the host disturb less)."""
    from mtf_core.train.measurement import measure_step

    model = _model()
    impl = mtf.PlacementMeshImpl(MESH, rules, devices[:4])
    step = mtf.compile_function(
        model.graph,
        {model.mesh: impl},
        model.placeholders,
        [model.loss],
        model.updates,
    )
    import numpy as np

    rng = np.random.RandomState(0)
    x = rng.standard_normal([256, 64]).astype(np.float32)
    y = rng.randint(0, 8, [256]).astype(np.int32)
    m = measure_step(step, [x, y], steps=5, clock="cpu", cores=2)
    assert m.cpu_s > 0 and m.wall_s > 0 and m.step_s == m.cpu_s
    return m.step_s


def test_run_report_refit_moves_the_next_prediction_to_the_measurement(
    client: TestClient, devices: list[str]
) -> None:
    first = _plan(client, "cpu-host")
    plan = first["plan"]
    predicted = plan["cost"]["time_s"]
    measured = _run_step(plan["layout_rules"], devices)

    # Report it the way mtf-train --report does (the planner client, over the
    # app's ASGI transport instead of a socket).
    from mtf_core.train.measurement import StepMeasurement

    report = mtf.report_measurement(
        "http://testserver",
        first["id"],
        StepMeasurement(
            wall_s=measured,
            cpu_s=measured,
            steps=5,
            clock="cpu",
            op_profile={"matmul": 0.03, "elementwise": 0.01, "total": 0.04},
        ),
        source="test",
        transport=client._transport,  # the app itself, no socket
    )
    assert report["plan_id"] == first["id"]
    assert report["hardware"] == "cpu-host" and report["backend"] == "placement"
    assert report["measured_s"] == measured
    assert report["predicted_s"] == pytest.approx(predicted, rel=1e-9)
    assert report["error"] == pytest.approx(predicted / measured - 1)
    # Refitted on this one measurement, the plan's prediction is the measurement.
    assert report["refit_predicted_s"] == pytest.approx(measured, rel=0.02)

    listed = client.get("/v1/measurements", params={"plan_id": first["id"]}).json()
    assert [m["id"] for m in listed["measurements"]] == [report["id"]]

    profile = client.get(
        "/v1/measurements/profile", params={"hardware": "cpu-host"}
    ).json()
    assert profile["name"] == "cpu-host" and profile["calibration"]["backend"] == (
        "placement"
    )
    second = _plan(client, profile)
    again = second["plan"]["cost"]["time_s"]
    assert abs(again - measured) < abs(predicted - measured)
    assert abs(again / measured - 1) < 0.25
    # Collectives are counted as before: only their time is refitted.
    m = _model()
    doc = graph_to_dict(m.graph, outputs=[m.loss])
    ev = client.post(
        "/v1/evaluate",
        json={
            "graph": doc,
            "mesh_shape": MESH,
            "layout_rules": plan["layout_rules"],
            "hardware": profile,
        },
    ).json()
    ev0 = client.post(
        "/v1/evaluate",
        json={
            "graph": doc,
            "mesh_shape": MESH,
            "layout_rules": plan["layout_rules"],
            "hardware": "cpu-host",
        },
    ).json()
    assert ev["cost"]["collectives"] == ev0["cost"]["collectives"]

    # The dashboard's plan page shows predicted next to measured, with the error.
    page = client.get(f"/plans/{first['id']}")
    assert page.status_code == 200
    assert 'id="measurements"' in page.text
    assert f"{100 * report['error']:+.0f}%" in page.text
    assert "matmul 75%, elementwise 25%" in page.text  # where its time went


def test_measurement_errors_are_4xx_with_a_reason(client: TestClient) -> None:
    r = client.post("/v1/measurements", json={"plan_id": "nope", "step_s": 0.1})
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    first = _plan(client, "cpu-host")
    for bad in (0.0, -1.0, "fast"):
        r = client.post(
            "/v1/measurements", json={"plan_id": first["id"], "step_s": bad}
        )
        assert r.status_code == 422, r.text
    r = client.post(
        "/v1/measurements",
        json={"plan_id": first["id"], "step_s": 0.1, "backend": "gpu"},
    )
    assert r.status_code == 422
    r = client.get("/v1/measurements/profile", params={"hardware": "tpu-v4"})
    assert r.status_code == 404 and "tpu-v4" in r.json()["detail"]


def test_mtf_train_reports_its_fastest_step_to_the_service(
    devices: list[str], tmp_path: Any
) -> None:
    from api_cases import ServerThread, mlp_doc

    from mtf_core.train import cli

    with ServerThread(service_settings(tmp_path)) as server:
        import httpx

        r = httpx.post(
            f"{server.url}/v1/plans",
            json={"graph": mlp_doc(), "mesh_shape": "x:2", "hardware": "cpu-host"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        plan_id = r.json()["id"]
        argv = [
            "--layers", "1", "--d_model", "16", "--heads", "8", "--d_kv", "2",
            "--d_ff", "32", "--length", "8", "--batch", "8", "--vocab", "32",
            "--corpus_bytes", "20000", "--no_progress", "--no_eval", "--steps", "5",
            "--layout", "batch:x", "--mesh", "x:2",
            "--report", server.url, "--plan_id", plan_id, "--profile_ops",
        ]  # fmt: skip
        summary = cli.train(cli.parse_args(argv))
        assert summary["step_s"] > 0
        report = summary["report"]
        assert (
            report["plan_id"] == plan_id and report["measured_s"] == summary["step_s"]
        )
        listed = httpx.get(
            f"{server.url}/v1/measurements", params={"plan_id": plan_id}
        ).json()["measurements"]
        assert [m["detail"]["source"] for m in listed] == ["mtf-train"]
        # The first step traces and the last two are profiled: left out.
        assert listed[0]["detail"]["steps"] == 2
        # Where the profiled steps' time went, per op class, stored with it.
        profile = listed[0]["detail"]["profile"]
        assert profile == pytest.approx(summary["op_profile"])
        assert profile["matmul"] > 0 and profile["add_n"] > 0  # allreduce over x
        assert profile["total"] == pytest.approx(
            sum(v for k, v in profile.items() if k != "total")
        )
    with pytest.raises(ConfigError, match="--profile_ops needs at least 3 steps"):
        cli.train(cli.parse_args([*argv[:-1], "--steps", "2", "--profile_ops"]))
