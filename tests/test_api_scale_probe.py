"""Hostile or careless scale-plan requests found by probing the service:
empty size lists are refused in the server (a 422 naming the field) before a
job is made, not sent to a solve worker to come back as a misleading "no
plan fits ... (0 trials)"; the dashboard form's errors name the bad value as
the JSON API's do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_cases import service_settings
from fastapi.testclient import TestClient
from test_api_scale_plans import REQUEST

from api.main import create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    # sync_wait_s=0: a request that wrongly reaches a worker answers 202 at
    # once instead of waiting for the solve.
    settings = service_settings(tmp_path_factory.mktemp("probe"), sync_wait_s=0)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize("field", ["stages", "tensor"])
def test_an_empty_list_of_sizes_is_a_422_naming_it(client, field):
    # [] tries no mesh at all; omitting the field is how a client asks for
    # the default search.
    body: dict[str, Any] = {**REQUEST, field: []}
    r = client.post("/v1/scale-plans", json=body)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == "invalid_request"
    assert field in out["detail"] and "at least 1 item" in out["detail"]
    assert out["errors"][0]["loc"] == ["body", field]
    assert client.get("/v1/jobs").json()["jobs"] == []  # nothing was queued


def test_the_form_leaves_an_empty_field_to_the_search(client):
    # The dashboard's form sends "" for a field left empty: still no list.
    from api.routes.scale import form_request

    req = form_request({"stages": "", "tensor": " ", "devices": "8"})
    assert req.stages is None and req.tensor is None


@pytest.mark.parametrize(
    ("field", "value"), [("devices", "999999"), ("num_layers", "0")]
)
def test_the_form_names_the_value_out_of_range(client, field, value):
    # As the JSON API's 422 does: "devices: ... 4096 (got 999999)".
    form = {"devices": "8", "stages": "1", "tensor": "1", field: value}
    r = client.post("/scale-plans", data=form)
    assert r.status_code == 422
    error = r.text.split('id="form-error">', 1)[1].split("</p>", 1)[0]
    assert field in error and f"(got {value})" in error, error


def test_a_form_memory_limit_below_one_byte_names_the_form_field(client):
    # 1e-10 GiB is 0 bytes: the error was about memory_limit_bytes, a field
    # the form does not have.
    form = {"devices": "8", "stages": "1", "tensor": "1", "memory_limit_gib": "1e-10"}
    r = client.post("/scale-plans", data=form)
    assert r.status_code == 422
    error = r.text.split('id="form-error">', 1)[1].split("</p>", 1)[0]
    assert "memory_limit_gib &#39;1e-10&#39;" in error, error
    assert "memory_limit_bytes" not in error
