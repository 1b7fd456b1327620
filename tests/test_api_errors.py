"""Bad input never gives a 500: every case is a 4xx with a JSON body that says
what was wrong.  The app here requires an API token for writes."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient

from api.main import create_app

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(
        tmp_path_factory.mktemp("errors"),
        api_tokens=f"other-token,{TOKEN}",
        max_graph_operations=500,
        max_body_bytes=256 * 1024,
        max_time_limit_s=20,
    )
    with TestClient(create_app(settings), headers=AUTH) as c:
        yield c


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return mlp_doc()


def check_error(r: Any, status: int, *needles: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    assert set(body) >= {"error", "detail"}
    for needle in needles:
        assert needle in body["detail"], body
    return body


def test_malformed_json_is_a_422(client):
    r = client.post(
        "/v1/plans",
        content=b'{"graph": {',
        headers={"content-type": "application/json"},
    )
    body = check_error(r, 422, "Invalid JSON: EOF while parsing")
    assert body["errors"][0]["type"] == "json_invalid"


def test_unknown_graph_format_version_is_a_422_naming_the_versions(client, doc):
    bad = {**doc, "version": 99}
    r = client.post("/v1/plans", json={"graph": bad, "mesh_shape": "x:2"})
    body = check_error(r, 422, "99")
    assert body["error"] == "serialization_error"


@pytest.mark.parametrize("size", [0, -4])
def test_zero_or_negative_dimension_sizes_in_the_graph_are_a_422(client, doc, size):
    bad = copy.deepcopy(doc)
    bad["operations"][0]["outputs"][0]["shape"][0]["size"] = size
    r = client.post("/v1/plans", json={"graph": bad, "mesh_shape": "x:2"})
    check_error(r, 422, f"has size {size}; expected a size >= 1")


@pytest.mark.parametrize(
    "mesh, needle",
    [
        ("x:0", "size 0"),
        (
            {"x": -2},
            "mesh_shape.object.x: Input should be greater than or equal to 1 (got -2)",
        ),
        (
            {"x": True},
            "mesh_shape.object.x: Input should be a valid integer (got True)",
        ),
        ({"x": 2.0}, "mesh_shape.object.x: Input should be a valid integer"),
        (5, "expected a mesh shape"),
        ("x", "has no size"),
        ("", "at least 1 character"),
        ("x:2;x:2", "repeats"),
        ("a:2;b:2;c:2;d:2;e:2", "at most 4"),
    ],
)
def test_bad_mesh_shapes_are_a_422(client, doc, mesh, needle):
    check_error(
        client.post("/v1/plans", json={"graph": doc, "mesh_shape": mesh}), 422, needle
    )


def test_a_tensor_that_does_not_exist_is_a_422_naming_it(client, doc):
    bad = copy.deepcopy(doc)
    bad["operations"][3]["inputs"][0] = "ghost:0"
    r = client.post("/v1/plans", json={"graph": bad, "mesh_shape": "x:2"})
    check_error(r, 422, "operations[3].inputs[0]", "ghost:0")


def test_layout_rules_naming_a_dim_or_axis_that_does_not_exist_are_a_422(client, doc):
    r = client.post(
        "/v1/evaluate",
        json={"graph": doc, "mesh_shape": "x:2", "layout_rules": "nodim:x"},
    )
    check_error(r, 422, "'nodim', which no tensor of the graph has")
    r = client.post(
        "/v1/evaluate",
        json={"graph": doc, "mesh_shape": "x:2", "layout_rules": "batch:y"},
    )
    check_error(r, 422, "mesh axis 'y'")


def test_a_mesh_that_does_not_divide_is_not_a_server_error(client, doc):
    r = client.post(
        "/v1/evaluate",
        json={"graph": doc, "mesh_shape": "x:5", "layout_rules": "batch:x"},
    )
    assert r.status_code == 200 and r.json()["valid"] is False
    # Planning on it keeps every dim whole over x (5 divides nothing).
    r = client.post("/v1/plans", json={"graph": doc, "mesh_shape": "x:5"})
    assert r.status_code == 200 and r.json()["layout_rules"] == ""


def test_absurdly_large_graphs_are_refused_before_parsing(client, doc):
    many = {**doc, "operations": doc["operations"] * 6}  # over max_graph_operations=500
    r = client.post("/v1/plans", json={"graph": many, "mesh_shape": "x:2"})
    assert r.status_code in (413, 422)
    huge = {**doc, "metadata": {"name": "x" * 300_000}}  # over max_body_bytes
    check_error(
        client.post("/v1/plans", json={"graph": huge, "mesh_shape": "x:2"}),
        413,
        "at most 262144 bytes",
    )
    bad = copy.deepcopy(doc)
    bad["operations"][0]["outputs"][0]["shape"][0]["size"] = 2**50
    check_error(
        client.post("/v1/plans", json={"graph": bad, "mesh_shape": "x:2"}),
        422,
        "max_dim_size",
    )


def test_too_many_operations_is_a_422_naming_the_limit(client):
    many = mlp_doc(layers=32)  # more than 500 ops, fewer than 256 KiB
    assert len(many["operations"]) > 500
    for path in ("/v1/plans", "/v1/jobs", "/v1/evaluate"):
        body = check_error(
            client.post(
                path, json={"graph": many, "mesh_shape": "x:2", "layout_rules": ""}
            ),
            422,
            f"the graph has {len(many['operations'])} operations",
            "at most 500 (max_graph_operations)",
        )
        # Counted in the raw bytes, before the body was decoded.
        assert body["error"] == "request_too_complex"


def test_a_chunked_body_over_the_limit_is_a_413(client):
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 10_000

    r = client.post(
        "/v1/plans", content=chunks(), headers={"content-type": "application/json"}
    )
    check_error(r, 413, "at most 262144 bytes")


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"mesh_shape": "x:2", "num_devices": 2}, "exactly one of"),
        ({}, "exactly one of"),
        ({"mesh_shape": "x:2", "time_limit_s": 50}, "at most 20 s"),
        ({"mesh_shape": "x:2", "time_limit_s": 0}, "greater than or equal to 0.001"),
        ({"mesh_shape": "x:2", "top_k": 0}, "greater than or equal to 1"),
        ({"mesh_shape": "x:2", "objective": "speed"}, "'time' or 'memory'"),
        ({"mesh_shape": "x:2", "hardware": "gpu-9000"}, "(got 'gpu-9000')"),
        (
            {"mesh_shape": "x:2", "hardware": {"name": "h"}},
            "hardware.object.peak_flops: Field required",
        ),
        ({"mesh_shape": "x:2", "memory_limit_bytes": -1}, "greater than or equal to 1"),
        (
            {"mesh_shape": "x:2", "memory_limit_bytes": 5, "max_memory_fraction": 0.5},
            "at most one of",
        ),
        ({"mesh_shape": "x:2", "unexpected": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_plan_parameters_are_a_422(client, doc, fields, needle):
    check_error(client.post("/v1/plans", json={"graph": doc, **fields}), 422, needle)


def test_the_service_reads_no_file_a_client_names(client, doc, tmp_path):
    profile = tmp_path / "hw.json"
    profile.write_text('{"name": "from-a-file"}')
    r = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "x:2", "hardware": str(profile)}
    )
    check_error(r, 422, "body.hardware.string: Input should be 'a100-nvlink-ib'")


def test_write_endpoints_need_a_valid_token(client, doc):
    body = {"graph": doc, "mesh_shape": "x:2"}
    for method, path, payload in (
        ("POST", "/v1/plans", body),
        ("POST", "/v1/jobs", body),
        ("DELETE", "/v1/jobs/abc", None),
    ):
        r = client.request(method, path, json=payload, headers={"Authorization": ""})
        check_error(r, 401, "needs an API token")
        assert r.headers["www-authenticate"] == "Bearer"
        r = client.request(
            method, path, json=payload, headers={"Authorization": "Bearer wrong"}
        )
        check_error(r, 401, "not valid")
    # Reads stay open; the right token writes.
    assert client.get("/v1/plans", headers={"Authorization": ""}).status_code == 200
    assert client.post("/v1/plans", json=body).status_code == 200


def test_unknown_routes_and_methods_answer_json(client):
    check_error(client.get("/v1/nothing-here"), 404, "Not Found")
    check_error(client.put("/v1/plans"), 405, "Method Not Allowed")
    check_error(client.get("/v1/plans", params={"limit": 0}), 422, "limit")


def test_an_unknown_id_is_named_in_its_404_but_not_echoed_whole(client):
    for route, what in (
        ("/v1/plans", "plan"),
        ("/v1/jobs", "job"),
        ("/v1/scale-plans", "scale plan"),
    ):
        check_error(client.get(f"{route}/nope"), 404, f"there is no {what} 'nope'")
        r = client.get(f"{route}/{'a' * 10_000}")
        detail = check_error(r, 404, f"there is no {what} '{'a' * 200}'... ")["detail"]
        assert "(10,000 characters)" in detail and len(detail) < 300
    page = client.get(f"/plans/{'b' * 10_000}")
    assert page.status_code == 404 and "b" * 200 + "\u2026" in page.text
    assert "b" * 201 not in page.text
