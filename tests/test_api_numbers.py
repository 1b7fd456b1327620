"""Every number of every request, finite or not: never a 5xx.

The numeric fields are found by walking the OpenAPI schema (so a field added
later is covered without editing this test); each example puts one
hypothesis-drawn float or integer (NaN, infinities, ``1e400`` written as a
literal, subnormals, huge and negative values, booleans, and values inside
the accepted ranges, which reach the cost model and the solver) into one of
them in an otherwise valid request, and posts it to the endpoint.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.main import create_app
from api.schemas import RANGES
from cost_models.hardware import PRESETS

pytestmark = pytest.mark.solver

KEY = "*"  # a path step into a mapping's (any) key


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings_ = service_settings(
        tmp_path_factory.mktemp("numbers"), queue_size=64, max_time_limit_s=3600
    )
    with TestClient(create_app(settings_), raise_server_exceptions=False) as c:
        yield c


def numeric_paths(schema: dict[str, Any], model: str) -> list[tuple[str, ...]]:
    """Paths to every number/integer a ``model`` body can hold."""
    components = schema["components"]["schemas"]
    out: set[tuple[str, ...]] = set()

    def walk(node: dict[str, Any], path: tuple[str, ...], seen: frozenset[str]) -> None:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[1]
            if name not in seen:
                walk(components[name], path, seen | {name})
            return
        for branch in node.get("anyOf", []) + node.get("oneOf", []):
            walk(branch, path, seen)
        if node.get("type") in ("number", "integer"):
            out.add(path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, (*path, name), seen)
        extra = [node.get("additionalProperties")] + list(
            node.get("patternProperties", {}).values()
        )
        for sub in extra:
            if isinstance(sub, dict):
                walk(sub, (*path, KEY), seen)

    walk(components[model], (), frozenset({model}))
    return sorted(out)


def full_profile(path: tuple[str, ...]) -> dict[str, Any]:
    """A profile with every optional part present, so every path exists (a
    calibration only when the path is in it: it changes how steps are priced)."""
    hw = PRESETS["h100-nvlink-ib"].to_dict()
    hw["axis_links"] = {"x": dict(hw["default_link"])}
    if "calibration" in path:
        hw["calibration"] = {
            "backend": "placement",
            "coefficients": {"placement": {"matmul_flops": 1e-12}},
        }
    return hw


def base_request(endpoint: str, path: tuple[str, ...]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "graph": mlp_doc(hidden=16, batch=8, features=8, classes=2),
        "mesh_shape": {"x": 2},
        "hardware": full_profile(path),
    }
    if endpoint == "/v1/evaluate":
        body["layout_rules"] = "batch:x"
    else:
        body["time_limit_s"] = 5
        if path[0] in ("num_devices", "max_mesh_dims"):
            del body["mesh_shape"]
            body["num_devices"] = 2
    return body


def put(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = body
    for step in path[:-1]:
        node = node[next(iter(node)) if step == KEY else step]
    last = path[-1]
    node[next(iter(node)) if last == KEY else last] = value


class Literal:
    """A number written as this JSON text (``1e400`` parses as infinity)."""

    def __init__(self, text: str) -> None:
        self.text = text


def encode(body: dict[str, Any], value: Any) -> bytes:
    if isinstance(value, Literal):
        mark = "__number_literal__"
        put_text = json.dumps(body).replace(f'"{mark}"', value.text)
        return put_text.encode()
    return json.dumps(body, allow_nan=True).encode()  # NaN, Infinity


edges = sorted({v for lo, hi in RANGES.values() for v in (lo, hi)})
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(
        [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-300, 1e308, True, False]
    ),
    st.sampled_from(edges),
    st.sampled_from(edges).map(lambda v: v * 1.0000001 if v else -1e-9),
    st.sampled_from(
        ["1e400", "-1e400", "1e-400", "123456789012345678901234567890"]
    ).map(Literal),
)

ENDPOINTS = {
    "/v1/plans": "PlanRequest",
    "/v1/jobs": "PlanRequest",
    "/v1/evaluate": "EvaluateRequest",
}


def test_the_schema_walk_finds_every_numeric_field(client):
    schema = client.get("/openapi.json").json()
    plan = numeric_paths(schema, "PlanRequest")
    assert {
        ("num_devices",),
        ("memory_limit_bytes",),
        ("max_memory_fraction",),
        ("top_k",),
        ("time_limit_s",),
        ("max_mesh_dims",),
        ("mesh_shape", KEY),
        ("hardware", "peak_flops"),
        ("hardware", "memory_bytes"),
        ("hardware", "hbm_bandwidth_bytes_per_s"),
        ("hardware", "devices_per_host"),
        ("hardware", "default_link", "bandwidth_bytes_per_s"),
        ("hardware", "default_link", "latency_s"),
        ("hardware", "axis_links", KEY, "latency_s"),
        ("hardware", "intra_host_link", "bandwidth_bytes_per_s"),
        ("hardware", "inter_host_link", "latency_s"),
        ("hardware", "calibration", "coefficients", KEY, KEY),
    } <= set(plan)
    assert len(numeric_paths(schema, "EvaluateRequest")) >= 14


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_no_number_in_any_field_gives_a_server_error(client, endpoint):
    schema = client.get("/openapi.json").json()
    paths = numeric_paths(schema, ENDPOINTS[endpoint])
    statuses: dict[int, int] = {}

    @given(path=st.sampled_from(paths), value=numbers)
    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(path: tuple[str, ...], value: Any) -> None:
        body = copy.deepcopy(base_request(endpoint, path))
        put(body, path, "__number_literal__" if isinstance(value, Literal) else value)
        r = client.post(
            endpoint,
            content=encode(body, value),
            headers={"content-type": "application/json"},
        )
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (path, value, r.text[:500])
        assert r.headers["content-type"].startswith("application/json")

    check()
    # Both sides were exercised: accepted numbers and refused ones.
    assert statuses.get(422, 0) > 0
    assert sum(n for s, n in statuses.items() if s < 300) > 0, statuses


@pytest.mark.parametrize("endpoint", ["/v1/plans", "/v1/evaluate"])
def test_a_boolean_or_a_string_is_never_a_number(client, endpoint):
    """``true`` or ``"1"`` where a number belongs: a 422 naming the field (a
    lax float took them as 1.0)."""
    schema = client.get("/openapi.json").json()
    for path in numeric_paths(schema, ENDPOINTS[endpoint]):
        for value in (True, "1"):
            body = copy.deepcopy(base_request(endpoint, path))
            put(body, path, value)
            r = client.post(endpoint, json=body)
            assert r.status_code == 422, (path, value, r.text[:300])
            named = [p for p in path if p != KEY][-1]
            assert named in r.json()["detail"], (path, r.json()["detail"])
