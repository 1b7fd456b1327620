"""``/v1/scale-plans`` and the dashboard's scale-plan pages: the real app, the
real SQLite store and a real solve worker process, against
``layout_planner.choices.plan_transformer`` run here on the same input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_cases import ServerThread, service_settings, wait_job
from fastapi.testclient import TestClient

from api.cli import main as cli_main
from api.client import PlannerClient
from api.main import create_app
from api.scale_planning import ScaleSpec, scale_spec
from api.scale_schemas import ScalePlanRequest
from api.settings import Settings
from cost_models.costs import evaluate
from cost_models.hardware import PRESETS
from layout_planner.choices import ScaleChoice, plan_transformer, price_layout
from mtf_core.layout import convert_to_layout_rules
from mtf_core.models import TransformerConfig, build_lm

pytestmark = pytest.mark.solver

MODEL = {
    "num_layers": 2,
    "d_model": 256,
    "heads": 4,
    "d_kv": 64,
    "d_ff": 1024,
    "vocab": 1024,
    "length": 32,
    "batch": 16,
}
#: Data parallel on 8 devices with 22 MB each: both blocks recomputed and the
#: ffn weights stored sharded (gathered on read) are needed to fit.
REQUEST: dict[str, Any] = {
    "model": MODEL,
    "devices": 8,
    "hardware": "h100-nvlink-ib",
    "activation_dtype": "bfloat16",
    "master_dtype": "float32",
    "stages": [1],
    "tensor": [1],
    "memory_limit_bytes": 22_000_000,
    "time_limit_s": 2,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("scale"))
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def served(client: TestClient) -> dict[str, Any]:
    r = client.post("/v1/scale-plans", json=REQUEST)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _cfg() -> TransformerConfig:
    return TransformerConfig(**MODEL, activation_dtype="bfloat16")


def test_scale_plan_over_http_equals_plan_transformer(served):
    local = plan_transformer(
        _cfg(),
        8,
        PRESETS["h100-nvlink-ib"].with_memory(22_000_000),
        stages=[1],
        tensor=[1],
        time_limit_s=2,
    )
    plan = served["plan"]
    c, p = local.choice, local.pipeline
    assert served["cached"] is False
    assert plan["mesh"] == {"pp": c.stages, "dp": c.data, "sp": 1, "tp": c.tensor}
    assert plan["mesh_shape"] == c.full_mesh == "pp:1;dp:8;tp:1"
    assert plan["micro_batches"] == c.micro_batches
    assert plan["schedule"] == c.schedule == "1f1b"
    assert plan["dtypes"] == {
        "activations": "bfloat16",
        "master_weights_and_slots": "float32",
    }
    assert plan["stage_layout_rules"] == local.layout_rules
    assert plan["sharded_classes"] == list(local.sharded_classes)
    assert "ffn" in plan["sharded_classes"]  # 22 MB forces it
    assert plan["slot_sharded_classes"] == list(local.slot_sharded_classes)
    assert (plan["recompute"]["attention"], plan["recompute"]["ffn"]) == (
        c.recompute_attention,
        c.recompute_ffn,
    )
    step = plan["step"]
    assert step["step_time_s"] == pytest.approx(local.step_time_s, rel=1e-9)
    assert step["bubble_s"] == pytest.approx(p.bubble_s, rel=1e-9, abs=1e-15)
    assert step["once_per_step_s"] == pytest.approx(p.once_s, rel=1e-9)
    assert step["per_micro_batch_s"] == pytest.approx(p.per_micro_batch_s, rel=1e-9)
    parts = ("micro_batch_work_s", "sends_s", "bubble_s", "once_per_step_s")
    assert sum(step[k] for k in parts) == pytest.approx(step["step_time_s"])
    assert plan["memory"]["peak_memory_bytes"] == local.peak_memory_bytes
    assert plan["memory"]["memory_capacity_bytes"] == 22_000_000
    assert plan["mfu"] == pytest.approx(local.mfu, rel=1e-9)
    assert plan["fits"] is True and served["fits"] is True
    assert len(plan["trials"]) == len(local.trials)
    assert plan["explain"].splitlines()[0] == local.explain().splitlines()[0]


def test_sharded_class_savings_are_the_stage_priced_whole(served):
    """What sharding the ffn weights saves: the stage graph priced by
    ``evaluate`` with that storage name kept whole, minus the chosen rules."""
    plan = served["plan"]
    ffn = next(
        w for w in plan["weight_classes"] if w["storage_dim"] == "d_model_stored_ffn"
    )
    assert ffn["sharded"] and ffn["mesh_axis"] == "dp"
    cfg = _cfg().replace(
        shardable_weights=True,
        shardable_slots=True,
        batch=16 // plan["micro_batches"],
    )
    model = build_lm(cfg, optimizer="adam")
    hw = PRESETS["h100-nvlink-ib"].with_memory(22_000_000)
    rules = dict(convert_to_layout_rules(plan["stage_layout_rules"]))
    chosen = evaluate(model.graph, "dp:8;tp:1", rules, hw, [model.loss])
    del rules["d_model_stored_ffn"]
    whole = evaluate(model.graph, "dp:8;tp:1", rules, hw, [model.loss])
    assert ffn["saves_peak_memory_bytes"] == (
        whole.peak_memory_bytes - chosen.peak_memory_bytes
    )
    assert ffn["saves_peak_memory_bytes"] > 0
    assert ffn["saves_step_time_s"] == pytest.approx(whole.time_s - chosen.time_s)
    # Every class of the graph is listed, sharded or not.
    assert {w["weight_class"] for w in plan["weight_classes"]} >= {
        "ffn",
        "self_attention",
        "embedding",
        "logits",
    }


def test_every_recompute_option_is_priced_on_the_chosen_mesh(served):
    plan = served["plan"]
    options = {(o["attention"], o["ffn"]): o for o in plan["recompute"]["options"]}
    assert set(options) == {("none", "none"), ("scores", "none"), ("block", "block")}
    chosen = [o for o in options.values() if o["chosen"]]
    assert len(chosen) == 1 and chosen[0]["step_time_delta_s"] == 0
    assert chosen[0]["attention"] == chosen[0]["ffn"] == "block"
    kept = options[("none", "none")]
    if kept["source"] == "priced with the chosen stage rules":
        c = ScaleChoice(1, 8, 1, plan["micro_batches"], "1f1b", "none", "none")
        priced = price_layout(
            _cfg(),
            c,
            plan["stage_layout_rules"],
            PRESETS["h100-nvlink-ib"].with_memory(22_000_000),
        )
        assert kept["step_time_s"] == pytest.approx(priced.step_time_s, rel=1e-9)
        assert kept["peak_memory_bytes"] == priced.peak_memory_bytes
    # Keeping every activation holds more and runs less than recomputing both
    # blocks.
    assert kept["peak_memory_delta_bytes"] > 0
    assert kept["step_time_delta_s"] < 0


def test_get_by_id_list_and_repeat_are_the_stored_plan(client, served):
    again = client.post("/v1/scale-plans", json=REQUEST)
    assert again.status_code == 200
    assert again.json()["cached"] is True
    assert again.json()["id"] == served["id"]
    assert again.json()["plan"] == served["plan"]
    got = client.get(f"/v1/scale-plans/{served['id']}")
    assert got.status_code == 200 and got.json()["plan"] == served["plan"]
    listed = client.get("/v1/scale-plans").json()
    assert served["id"] in [p["id"] for p in listed["plans"]]
    assert client.get("/v1/scale-plans/nope").status_code == 404


def _with(**changes: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(REQUEST))
    for key, value in changes.items():
        if key in MODEL:
            body["model"][key] = value
        else:
            body[key] = value
    return body


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"hardware": "tpu-v4", "activation_dtype": "float16"}, "'float16'"),
        ({"activation_dtype": "int8"}, "'int8'"),
        ({"stages": [4]}, "4 pipeline stages for 2 layers"),
        ({"stages": [3]}, "3"),
        ({"micro_batches": 3}, "3 micro-batches do not divide the batch of 16"),
        ({"hardware": "no-such-gpu"}, "'no-such-gpu'"),
        ({"schedule": "zigzag"}, "'zigzag'"),
        ({"num_layers": 10**30}, "num_layers"),
        ({"devices": 2**40}, "devices"),
        ({"d_model": True}, "d_model"),
        ({"tensor": [3]}, "tensor axis size 3"),
        ({"sequence": [3]}, "sequence axis size 3 does not divide the length 32"),
        ({"sequence": [16]}, "sequence axis size 16 does not divide 8 devices"),
        ({"sequence": []}, "sequence"),
        ({"time_limit_s": 1e9}, "time_limit_s"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_value(client, changes, named):
    r = client.post("/v1/scale-plans", json=_with(**changes))
    assert r.status_code == 422, r.text
    assert named in r.text
    assert set(r.json()) >= {"error", "detail"}


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
def test_non_finite_numbers_are_422(client, number):
    text = json.dumps(REQUEST).replace('"time_limit_s": 2', f'"time_limit_s": {number}')
    assert number in text
    r = client.post(
        "/v1/scale-plans", content=text, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert "time_limit_s" in r.text


def test_dashboard_page_shows_the_choices(client, served):
    page = client.get(f"/scale-plans/{served['id']}")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    plan = served["plan"]
    assert '<code class="chosen" id="scale-mesh">pp:1;dp:8;tp:1</code>' in html
    assert f">{plan['micro_batches']} of " in html
    assert "activations bfloat16" in html
    assert "d_model_stored_ffn" in html
    assert 'id="scale-recompute-options"' in html and "attention=none ffn=none" in html
    assert 'id="parts-chart"' in html and "/static/scale.js" in html
    data = html.split('<script id="scale-data" type="application/json">')[1]
    chart = json.loads(data.split("</script>")[0])
    assert sum(chart["parts"].values()) == pytest.approx(plan["step"]["step_time_s"])
    index = client.get("/scale-plans").text
    assert f'href="/scale-plans/{served["id"]}"' in index
    assert 'href="/scale-plans"' in client.get("/").text
    assert client.get("/static/scale.js").status_code == 200


def test_dashboard_escapes_markup_in_names(client):
    evil = "<script>alert(1)</script>"
    in_path = "<script>alert(1)"  # a path segment has no '/'
    page = client.get(f"/scale-plans/{in_path}")
    assert page.status_code == 404
    assert in_path not in page.text and "&lt;script&gt;alert(1)" in page.text
    form = {"num_layers": evil, "hardware": evil, "devices": "8"}
    r = client.post("/scale-plans", data=form)
    assert r.status_code == 422
    assert evil not in r.text and "&lt;script&gt;" in r.text
    assert 'id="form-error"' in r.text


def test_form_plans_and_forwards_to_the_page(client, served):
    form = {
        **{k: str(v) for k, v in MODEL.items()},
        "devices": "8",
        "hardware": "h100-nvlink-ib",
        "activation_dtype": "bfloat16",
        "master_dtype": "float32",
        "stages": "1",
        "tensor": "1",
        "memory_limit_gib": "1",
    }
    r = client.post("/scale-plans", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    # To the job's page (its progress), which forwards to the plan when done.
    job_url = r.headers["location"]
    assert job_url.startswith("/jobs/")
    job = wait_job(client, job_url.removeprefix("/jobs/"), ("done", "failed"))
    assert job["status"] == "done" and job["kind"] == "scale", job
    page = client.get(job_url, follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == f"/scale-plans/{job['plan_id']}"
    assert job["result_url"] == f"/v1/scale-plans/{job['plan_id']}"
    # The same form again: the stored plan, at once.
    r = client.post("/scale-plans", data=form, follow_redirects=False)
    assert r.headers["location"] == f"/scale-plans/{job['plan_id']}"
    # The index lists the scale jobs, with their phase and progress.
    index = client.get("/scale-plans").text
    assert 'id="scale-jobs"' in index and f'href="/jobs/{job["id"]}"' in index
    assert 'name="use_measurements"' in index
    bad = client.post("/scale-plans", data={**form, "use_measurements": "maybe"})
    assert bad.status_code == 422 and "use_measurements &#39;maybe&#39;" in bad.text
    bad = client.post("/scale-plans", data={**form, "micro_batches": "3"})
    assert bad.status_code == 422
    assert "3 micro-batches do not divide the batch of 16" in bad.text
    assert 'name="sequence"' in index
    bad = client.post("/scale-plans", data={**form, "sequence": "1,3"})
    assert bad.status_code == 422
    assert "sequence axis size 3 does not divide the length 32" in bad.text


#: Within every range the API checks, but a million one-sequence
#: micro-batches of 65,536 tokens make a step whose picoseconds overflow int64.
HUGE = {
    "model": {
        "num_layers": 1, "d_model": 64, "heads": 1024, "d_kv": 64, "d_ff": 64,
        "vocab": 64, "length": 65536, "batch": 1048576,
    },
    "devices": 1,
    "time_limit_s": 2,
}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (HUGE, "64-bit integers, up to 2**62 ps"),
        (_with(stages=[2], tensor=[8]), "pp 2 x tp 8 = 16 does not divide 8"),
        (_with(batch=12, stages=[1], tensor=[1]), "dp 8, which does not divide"),
    ],
    ids=["too-large-to-count", "no-mesh", "batch-not-split"],
)
def test_a_request_no_plan_can_be_made_for_is_a_422_naming_why(client, body, named):
    # Before: the first was a 503 "solve_failed" (our bug, retried forever
    # by a client that obeys Retry-After), the others a 422 blaming memory.
    r = client.post("/v1/scale-plans", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "planner_error"
    assert named in r.json()["detail"]
    assert "B per device" not in r.json()["detail"]


def test_a_request_nothing_fits_is_a_422_saying_so(client, capsys):
    r = client.post("/v1/scale-plans", json=_with(memory_limit_bytes=100_000))
    assert r.status_code == 422, r.text
    assert "no plan for 2 layers on 8 devices" in r.json()["detail"]
    assert "100,000 B per device" in r.json()["detail"]
    argv = ["scale", *(f"--{k.replace('_', '-')}={v}" for k, v in MODEL.items())]
    argv = [a.replace("--num-layers", "--layers") for a in argv]
    code = cli_main(
        [
            *argv,
            "--devices=8",
            "--stages=1",
            "--tensor=1",
            "--memory-limit-bytes=100000",
        ]
    )
    assert code == 3
    assert "nothing fits" in capsys.readouterr().out
    # Devices that leave no mesh to search are bad input (exit 1), not
    # "nothing fits" (exit 3).
    code = cli_main([*argv, "--devices=7"])
    captured = capsys.readouterr()
    assert code == 1, captured.out
    assert "no mesh of 7 devices to try" in captured.err
    assert "nothing fits" not in captured.out + captured.err
    # Locally, the same tables as the service's.
    code = cli_main(
        [
            *argv,
            "--devices=8",
            "--stages=1",
            "--tensor=1",
            "--memory-limit-bytes=22000000",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "planned on this machine" in text
    assert "d_model_stored_ffn: split over dp; keeping it whole: +" in text
    assert "attention=none ffn=none: " in text


def test_every_number_out_of_range_is_a_422(client):
    """Each numeric field of the request schema (walked from OpenAPI), set to
    a non-finite, huge, negative or boolean value: a 422 naming the field."""
    from test_api_numbers import numeric_paths

    paths = numeric_paths(client.get("/openapi.json").json(), "ScalePlanRequest")
    assert ("model", "num_layers") in paths and ("time_limit_s",) in paths
    assert len(paths) == 13  # 9 of the model, devices, micro-batches, memory, time
    # The walk does not enter arrays: the stage, tensor and sequence sizes'
    # items too.
    for path in [*paths, ("stages",), ("tensor",), ("sequence",)]:
        for bad in ("NaN", "1e400", "-1", str(2**70), "true"):
            body = json.loads(json.dumps(REQUEST))
            node = body
            for key in path[:-1]:
                node = node[key]
            items = path[-1] in ("stages", "tensor", "sequence")
            node[path[-1]] = ["@"] if items else "@"
            text = json.dumps(body).replace('"@"', bad)
            r = client.post(
                "/v1/scale-plans",
                content=text,
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 422, (path, bad, r.text)
            assert path[-1] in r.text, (path, bad, r.text)


def test_tokens_are_checked_before_the_body(tmp_path):
    settings = service_settings(
        tmp_path, api_tokens="secret-token", max_time_limit_s=0.3
    )
    with TestClient(create_app(settings)) as c:
        r = c.post(
            "/v1/scale-plans",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/scale-plans", json=_with(stages=[4]))
        assert r.status_code == 401
        r = c.post(
            "/v1/scale-plans",
            json=_with(stages=[4], time_limit_s=0.3),
            headers={"Authorization": "Bearer secret-token"},
        )
        assert r.status_code == 422 and "4 pipeline stages" in r.text
        form = c.post("/scale-plans", data={"num_layers": "2"})
        assert form.status_code == 401
        assert "a valid API token is needed" in form.text
        # A run past the service's cap (0.3 s here) is stopped: a 422 saying so.
        r = c.post(
            "/v1/scale-plans",
            json=_with(time_limit_s=0.3),
            headers={"Authorization": "Bearer secret-token"},
        )
        assert r.status_code == 422 and r.json()["error"] == "too_slow"
        assert "did not finish within 0.3 s" in r.json()["detail"]
        # Its job failed saying so (its worker was stopped at 0.3 s).
        job = c.get("/v1/jobs").json()["jobs"][0]
        assert job["kind"] == "scale" and job["status"] == "failed"
        assert job["error"] == r.json()["detail"]
        # Reads stay open.
        assert c.get("/v1/scale-plans").status_code == 200
        assert c.get("/scale-plans").status_code == 200


def test_spec_hash_ignores_spelling():
    a = scale_spec(ScalePlanRequest.model_validate(REQUEST), Settings())
    b = scale_spec(
        ScalePlanRequest.model_validate({**REQUEST, "stages": [1, 1]}), Settings()
    )
    assert a.request_hash == b.request_hash
    assert ScaleSpec.from_canonical(a.canonical()) == a


def test_client_and_cli_on_a_server(tmp_path, served, capsys):
    with ServerThread(service_settings(tmp_path)) as server:
        with PlannerClient(server.url, timeout_s=120) as c:
            out = c.scale_plan(REQUEST)
            assert (
                out["plan"]["stage_layout_rules"]
                == served["plan"]["stage_layout_rules"]
            )
            assert c.get_scale_plan(out["id"])["id"] == out["id"]
        argv = ["scale", *(f"--{k.replace('_', '-')}={v}" for k, v in MODEL.items())]
        argv = [a.replace("--num-layers", "--layers") for a in argv]
        code = cli_main(
            [
                *argv,
                "--devices=8",
                "--stages=1",
                "--tensor=1",
                "--memory-limit-bytes=22000000",
                "--time-limit=2",
                f"--server={server.url}",
            ]
        )
        text = capsys.readouterr().out
        assert code == 0, text
        assert "cached" in text and "pp=1 dp=8 tp=1" in text
        assert "d_model_stored_ffn: split over dp; keeping it whole: +" in text
        code = cli_main([*argv, "--devices=8", "--stages=4"])
        assert code == 1
        assert "4 pipeline stages for 2 layers" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [{"encoder_decoder": True}, {"experts": 4}])
def test_encoder_decoder_and_experts_equal_plan_transformer(client, extra):
    model = {**MODEL, "d_model": 64, "d_ff": 256, "d_kv": 16, "vocab": 128, **extra}
    body = {**REQUEST, "model": model, "memory_limit_bytes": None}
    r = client.post("/v1/scale-plans", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    cfg_fields = {k: v for k, v in model.items() if k != "encoder_decoder"}
    local = plan_transformer(
        TransformerConfig(**cfg_fields, activation_dtype="bfloat16"),
        8,
        "h100-nvlink-ib",
        encoder_decoder=bool(extra.get("encoder_decoder")),
        stages=[1],
        tensor=[1],
        time_limit_s=2,
    )
    assert plan["mesh_shape"] == local.choice.full_mesh
    assert plan["stage_layout_rules"] == local.layout_rules
    assert plan["step"]["step_time_s"] == pytest.approx(local.step_time_s, rel=1e-9)
    assert plan["memory"]["peak_memory_bytes"] == local.peak_memory_bytes
    classes = {w["weight_class"] for w in plan["weight_classes"]}
    if extra.get("encoder_decoder"):
        assert "encdec_attention" in classes
        assert r.json()["model"].startswith("encoder-decoder 2 layers")


def test_an_encoder_decoder_pipeline_is_a_4xx_naming_the_stages(client):
    body = _with(stages=[1, 2])
    body["model"]["encoder_decoder"] = True
    r = client.post("/v1/scale-plans", json=body)
    assert r.status_code == 422, r.text
    assert "stages [1, 2] for an encoder-decoder; expected [1]" in r.text
    assert set(r.json()) >= {"error", "detail"}


def test_a_sequence_axis_over_http_equals_plan_transformer(client, capsys):
    """``sequence: [1, 2]`` searches meshes with and without a sequence axis;
    the answer is plan_transformer's, each trial says its sequence size."""
    model = {**MODEL, "d_model": 64, "d_ff": 256, "d_kv": 16, "vocab": 128}
    body = {**REQUEST, "model": model, "memory_limit_bytes": None, "sequence": [2, 1]}
    r = client.post("/v1/scale-plans", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    local = plan_transformer(
        TransformerConfig(**model, activation_dtype="bfloat16"),
        8,
        "h100-nvlink-ib",
        stages=[1],
        tensor=[1],
        sequence=[1, 2],
        time_limit_s=2,
    )
    c = local.choice
    assert plan["mesh"] == {"pp": 1, "dp": c.data, "sp": c.sequence, "tp": 1}
    assert plan["mesh_shape"] == c.full_mesh
    assert plan["stage_layout_rules"] == local.layout_rules
    assert plan["step"]["step_time_s"] == pytest.approx(local.step_time_s, rel=1e-9)
    sizes = [(t["data"], t["sequence"]) for t in plan["trials"]]
    assert sizes == [(t.choice.data, t.choice.sequence) for t in local.trials]
    assert {(8, 1), (4, 2)} <= set(sizes)
    page = client.get(f"/scale-plans/{r.json()['id']}")
    assert page.status_code == 200 and f">{c.full_mesh}<" in page.text
    # A request without a sequence axis keeps its hash; with one it differs.
    plain = scale_spec(ScalePlanRequest.model_validate(REQUEST), Settings())
    ones = scale_spec(
        ScalePlanRequest.model_validate({**REQUEST, "sequence": [1]}), Settings()
    )
    two = scale_spec(
        ScalePlanRequest.model_validate({**REQUEST, "sequence": [1, 2]}), Settings()
    )
    assert plain.request_hash == ones.request_hash != two.request_hash
    assert ScaleSpec.from_canonical(two.canonical()) == two
    # The CLI takes the sizes too, and names a bad one.
    argv = ["scale", *(f"--{k.replace('_', '-')}={v}" for k, v in model.items())]
    argv = [a.replace("--num-layers", "--layers") for a in argv]
    code = cli_main([*argv, "--devices=8", "--stages=1", "--sequence=1,3"])
    assert code == 1
    assert "sequence axis size 3 does not divide the length 32" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_scale_page_draws_its_charts_in_chromium(tmp_path, served):
    """The page under its CSP in headless Chromium: both charts drawn, no
    script error."""
    from services import service_missing
    from test_dashboard_browser import CHROMIUM, FLAGS

    if not Path(CHROMIUM).exists():
        service_missing(f"Debian chromium is not installed at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with ServerThread(service_settings(tmp_path)) as server:
        with PlannerClient(server.url, timeout_s=120) as c:
            out = c.scale_plan(REQUEST)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=FLAGS, headless=True
            )
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "console",
                lambda m: errors.append(m.text) if m.type == "error" else None,
            )
            page.goto(f"{server.url}/scale-plans")
            page.click(f"a[href='/scale-plans/{out['id']}']")
            page.wait_for_selector("body[data-charts-ready='1']", timeout=15_000)
            assert errors == []
            assert page.inner_text("#scale-mesh") == "pp:1;dp:8;tp:1"
            for chart in ("parts-chart", "options-chart"):
                inked = page.evaluate(
                    """id => {
                        const c = document.getElementById(id);
                        const px = c.getContext('2d')
                            .getImageData(0, 0, c.width, c.height).data;
                        let n = 0;
                        for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
                        return Chart.getChart(c) ? n : -1;
                    }""",
                    chart,
                )
                assert inked > 2000, (chart, inked)
            # The form: to the job's page (progress), then to the plan's.
            seen: list[str] = []
            page.on("response", lambda r: seen.append(r.url))
            page.goto(f"{server.url}/scale-plans")
            for name, value in {
                **MODEL,
                "devices": 8,
                "stages": 1,
                "tensor": 1,
            }.items():
                page.fill(f"#scale-form input[name={name}]", str(value))
            page.fill("#scale-form input[name=memory_limit_gib]", "1")
            page.click("#scale-form button[type=submit]")
            page.wait_for_url(f"{server.url}/scale-plans/*", timeout=60_000)
            page.wait_for_selector("body[data-charts-ready='1']", timeout=15_000)
            assert any("/jobs/" in url for url in seen), seen
            assert page.inner_text("#plan-profile").startswith("Hardware profile: base")
            assert errors == []
            browser.close()
