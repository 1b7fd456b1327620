"""The planner service's plan, evaluate, hardware, health and metrics endpoints,
with the real app, the real SQLite store and a real solve worker process."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from api_cases import long_job_request, mlp_doc, service_settings, wait_job
from fastapi.testclient import TestClient

import mtf_core as mtf
from api.main import create_app
from api.plan_detail import plan_detail
from api.routes.dashboard import chart_data
from cost_models import evaluate
from layout_planner.plan import LayoutPlan

pytestmark = pytest.mark.solver


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("plans"))
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return mlp_doc()


def metric(client: TestClient, name: str, **labels: str) -> float:
    """One sample's value from /metrics (0.0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = (
        re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    )
    for line in client.get("/metrics").text.splitlines():
        m = re.fullmatch(pattern, line)
        if m:
            return float(m.group(1))
    return 0.0


def local_plan(doc: dict[str, Any], mesh: Any, **kw: Any) -> LayoutPlan:
    loaded = mtf.graph_from_dict(doc)
    return mtf.auto_layout(loaded.graph, mesh, outputs=loaded.outputs, **kw)


def test_plan_returns_the_same_layout_and_costs_as_local_planning(client, doc):
    body = {
        "graph": doc,
        "mesh_shape": "x:2;y:2",
        "hardware": "h100-nvlink-ib",
        "top_k": 3,
    }
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["cached"] is False
    assert out["mesh_shape"] == "x:2;y:2" and out["hardware"] == "h100-nvlink-ib"
    served = LayoutPlan.from_dict(out["plan"])
    local = local_plan(doc, "x:2;y:2", hardware="h100-nvlink-ib", top_k=3)
    # Equal but for the solver's timings and thread count.
    assert replace(served, solver=local.solver) == local
    assert out["layout_rules"] == str(local.layout_rules)
    assert out["plan"]["rules"] == local.layout_rules.as_dict()
    assert out["time_s"] == pytest.approx(local.cost.time_s)
    assert out["peak_memory_bytes"] == local.cost.peak_memory_bytes
    assert [c["rank"] for c in out["plan"]["candidates"]] == [1, 2, 3]
    assert out["plan"]["solver"]["verified"] is True
    assert {b["name"] for b in out["plan"]["baselines"]} == {
        b.name for b in local.baselines
    }


def test_identical_request_is_answered_from_the_store_without_solving(client, doc):
    first = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "a:4", "objective": "memory"}
    )
    assert first.status_code == 200
    solves = metric(client, "mtf_planner_solve_duration_seconds_count")
    hits = metric(client, "mtf_planner_cache_hits_total")
    # Same meaning, other spelling: the mesh as an object, fields reordered.
    again = client.post(
        "/v1/plans", json={"objective": "memory", "mesh_shape": {"a": 4}, "graph": doc}
    )
    assert again.status_code == 200
    assert again.json()["cached"] is True
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["plan"] == first.json()["plan"]
    # The very same bytes again: answered from memory (ResponseCache).
    third = client.post(
        "/v1/plans", json={"objective": "memory", "mesh_shape": {"a": 4}, "graph": doc}
    )
    assert third.content == again.content
    assert metric(client, "mtf_planner_solve_duration_seconds_count") == solves
    assert metric(client, "mtf_planner_cache_hits_total") == hits + 2


def test_a_different_request_is_solved_again(client, doc):
    a = client.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:2"}).json()
    b = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "x:2", "top_k": 2}
    ).json()
    assert a["id"] != b["id"] and b["cached"] is False


def test_plans_are_listed_newest_first_and_fetched_by_id(client, doc):
    created = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "m:2", "hardware": "tpu-v4"}
    ).json()
    listing = client.get("/v1/plans", params={"limit": 500}).json()
    assert listing["total"] >= 1 and listing["plans"][0]["id"] == created["id"]
    assert "plan" not in listing["plans"][0]  # summaries only
    got = client.get(f"/v1/plans/{created['id']}").json()
    assert (
        got["plan"] == created["plan"]
        and got["layout_rules"] == created["layout_rules"]
    )


def test_device_count_searches_mesh_shapes(client, doc):
    r = client.post(
        "/v1/plans", json={"graph": doc, "num_devices": 4, "hardware": "cpu-host"}
    )
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    tried = [t["mesh_shape"] for t in plan["mesh_trials"]]
    assert tried == ["x:4", "x:2;y:2"]
    assert plan["mesh_shape"] in tried


def test_plan_that_cannot_fit_says_by_how_much(client, doc):
    r = client.post(
        "/v1/plans",
        json={"graph": doc, "mesh_shape": "x:2", "memory_limit_bytes": 4096},
    )
    assert r.status_code == 200
    out = r.json()
    assert out["fits"] is False and out["status"] == "infeasible"
    assert out["memory_capacity_bytes"] == 4096
    assert "nothing fits in 4 KiB per device" in out["plan"]["reason"]
    # The dashboard's chart still leads with the plan's own layout.
    chart = chart_data(out["plan"], {})
    assert chart["labels"][0][0] == "smallest peak (does not fit):"
    assert chart["chosen"] == 0 and chart["rows"][0]["fits"] is False
    assert chart["peak"][0] == out["peak_memory_bytes"] and chart["capacity"] == 4096
    # ... and its page does not call that layout "chosen".
    html = client.get(f"/plans/{out['id']}").text
    assert "Chosen layout" not in html
    assert (
        '<h2 id="chosen-title">No layout fits: the one with the smallest peak memory'
        in html
    )


def test_max_memory_fraction_scales_the_hardware_capacity(client, doc):
    r = client.post(
        "/v1/plans",
        json={
            "graph": doc,
            "mesh_shape": "x:2",
            "hardware": "tpu-v5e",
            "max_memory_fraction": 0.5,
        },
    )
    assert r.json()["memory_capacity_bytes"] == 8 * 2**30


def test_evaluate_prices_a_layout_exactly_like_the_cost_model(client, doc):
    r = client.post(
        "/v1/evaluate",
        json={
            "graph": doc,
            "mesh_shape": "x:2",
            "layout_rules": {"batch": "x"},
            "hardware": "tpu-v4",
        },
    )
    assert r.status_code == 200, r.text
    out = r.json()
    loaded = mtf.graph_from_dict(doc)
    want = evaluate(loaded.graph, "x:2", "batch:x", "tpu-v4", loaded.outputs)
    assert out["valid"] is True and out["fits"] is True
    assert out["cost"]["time_s"] == pytest.approx(want.time_s)
    assert out["cost"]["peak_memory_bytes"] == want.peak_memory_bytes
    kinds = [(c["kind"], c["mesh_axes"]) for c in out["cost"]["collectives"]]
    assert kinds == [(c.kind, list(c.mesh_axes)) for c in want.collectives]
    assert (
        "allreduce",
        ["x"],
    ) in kinds  # data parallelism: gradients are summed over x


def test_evaluate_says_why_a_layout_that_does_not_divide_is_illegal(client, doc):
    r = client.post(
        "/v1/evaluate",
        json={"graph": doc, "mesh_shape": "x:3", "layout_rules": "batch:x"},
    )
    assert r.status_code == 200
    out = r.json()
    assert out["valid"] is False and out["cost"] is None
    assert (
        "'batch' of size 32 is not divisible by mesh dimension 'x' of size 3"
        in out["reason"]
    )


def test_hardware_lists_every_preset(client):
    presets = client.get("/v1/hardware").json()["presets"]
    assert {"h100-nvlink-ib", "a100-nvlink-ib", "tpu-v4", "tpu-v5e", "cpu-host"} <= set(
        presets
    )
    assert presets["tpu-v5e"]["memory_bytes"] == 16 * 2**30


def test_healthz_is_liveness_and_readyz_checks_store_and_workers(client):
    # The solve worker is a spawned interpreter: alive once it has started
    # (this test may be the first of its module to run).
    deadline = time.monotonic() + 90
    while client.get("/healthz").json()["workers_alive"] < 1:
        assert time.monotonic() < deadline, "the solve worker never started"
        time.sleep(0.05)
    live = client.get("/healthz")
    assert live.status_code == 200
    body = live.json()
    assert body.pop("replica").startswith("test/")
    assert body == {
        "status": "ok",
        "workers": 1,
        "workers_alive": 1,
        "queue_depth": 0,
        "running": 0,
    }
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"
    assert (ready.json()["store"], ready.json()["store_ok"]) == ("sqlite", True)
    assert ready.json()["workers_up"] is True


def test_metrics_count_requests_by_route_template(client):
    before = metric(
        client,
        "mtf_planner_requests_total",
        method="GET",
        route="/v1/plans/{plan_id}",
        status="404",
    )
    for _ in range(3):
        assert client.get("/v1/plans/no-such-plan").status_code == 404
    after = metric(
        client,
        "mtf_planner_requests_total",
        method="GET",
        route="/v1/plans/{plan_id}",
        status="404",
    )
    assert after == before + 3
    text = client.get("/metrics").text
    assert "mtf_planner_queue_depth 0.0" in text
    assert "mtf_planner_request_duration_seconds_bucket" in text


def test_dashboard_lists_plans_and_shows_a_plans_rules_dims_and_chart_data(client, doc):
    out = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "x:4", "hardware": "cpu-host"}
    ).json()
    index = client.get("/")
    assert index.status_code == 200 and f'href="/plans/{out["id"]}"' in index.text
    page = client.get(f"/plans/{out['id']}")
    assert page.status_code == 200
    html = page.text
    assert (
        f'<code id="chosen-rules" class="chosen">{out["layout_rules"] or "(nothing split)"}</code>'
        in html
    )
    assert 'id="cost-chart"' in html and 'id="memory-chart"' in html
    assert '<script src="/static/chart.umd.min.js">' in html
    for d in out["plan"]["dims"]:
        assert f"<td><code>{d['name']}</code></td>" in html
    assert html.count('class="dim-node"') == len(
        out["plan"]["dimension_graph"]["nodes"]
    )
    js = client.get("/static/chart.umd.min.js")
    assert js.status_code == 200 and "Chart.js v4" in js.text[:200]
    assert '<h2 id="chosen-title">Chosen layout</h2>' in html
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_plan_page_shows_collectives_by_op_and_peak_memory_by_tensor(client):
    doc = mlp_doc(hidden=1024, batch=256)
    out = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "x:4", "hardware": "cpu-host"}
    ).json()
    assert out["layout_rules"] == "hidden_0:x"
    detail = plan_detail(doc, out["plan"])
    evaluation = out["plan"]["evaluation"]
    # Every collective of the evaluation is in one op's row, with its bytes,
    # and the seconds add up to the plan's communication time.
    assert sum(len(r["collectives"]) for r in detail["ops"]) == len(
        evaluation["collectives"]
    )
    assert sum(r["bytes"] for r in detail["ops"]) == sum(
        c["bytes_per_device"] for c in evaluation["collectives"]
    )
    assert sum(r["seconds"] for r in detail["ops"]) == pytest.approx(
        out["plan"]["cost"]["comm_s"]
    )
    seconds = [r["seconds"] for r in detail["ops"]]
    assert seconds == sorted(seconds, reverse=True)
    # The peak live set's tensors add up to the peak, but for the largest
    # collective's result buffer.
    assert (
        detail["peak_bytes"]
        == evaluation["peak_memory_bytes"] - evaluation["collective_buffer_bytes"]
    )
    assert sum(t["share"] for t in detail["tensors"]) == pytest.approx(1.0)
    assert detail["ops"] and all(r["collectives"] for r in detail["ops"])
    split = [t for t in detail["tensors"] if t["layout"] == "hidden_0:x"]
    assert split and all(t["bytes"] > 0 for t in split), detail["tensors"]
    html = client.get(f"/plans/{out['id']}").text
    assert html.count("<tr><td><code>") >= len(detail["tensors"])
    for r in detail["ops"]:
        assert f"<code>{r['op']}</code>" in html
    assert 'id="peak-tensors"' in html and 'id="op-collectives"' in html
    assert 'id="log-scale"' in html and 'id="diff-a"' in html


def test_dashboard_form_plans_the_same_graph_on_another_mesh(client, doc):
    out = client.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:2"}).json()
    r = client.post(
        f"/plans/{out['id']}/try",
        data={"mesh_shape": "x:2;y:4", "hardware": "tpu-v4", "objective": "time"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].startswith("/jobs/")
    job = wait_job(client, r.headers["location"].rsplit("/", 1)[1], ("done", "failed"))
    assert job["status"] == "done", job
    assert (
        job["request"]["mesh_shape"] == "x:2;y:4"
        and job["request"]["hardware"] == "tpu-v4"
    )
    page = client.get(r.headers["location"])  # the job page forwards to its plan
    assert page.url.path == f"/plans/{job['plan_id']}"
    bad = client.post(f"/plans/{out['id']}/try", data={"mesh_shape": "x:0"})
    assert bad.status_code == 422 and "size 0" in bad.text
    bad = client.post(f"/plans/{out['id']}/try", data={"num_devices": "eight"})
    assert bad.status_code == 422 and "device count &#39;eight&#39;" in bad.text


def test_job_page_shows_elapsed_time_and_cancels_a_running_job(client):
    r = client.post("/v1/jobs", json=long_job_request())
    job_id = r.json()["id"]
    wait_job(client, job_id, ("running",))
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert 'id="job-elapsed"' in page.text and "so far" in page.text
    assert f'action="/jobs/{job_id}/cancel"' in page.text
    r = client.post(
        f"/jobs/{job_id}/cancel", data={"token": ""}, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job_id}"
    job = wait_job(client, job_id, ("cancelled", "failed", "done"))
    assert job["status"] == "cancelled"
    page = client.get(f"/jobs/{job_id}")
    assert "in all" in page.text and "cancel-form" not in page.text
    again = client.post(f"/jobs/{job_id}/cancel", data={"token": ""})
    assert again.status_code == 409 and "only queued or running" in again.text
    assert client.post("/jobs/nope/cancel", data={"token": ""}).status_code == 404
