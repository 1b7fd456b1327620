"""The service's edge: tokens before bodies, per-client limits, bounded and
shaped bodies, content types, finite numbers at the schema, opaque 500s."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_cases import ServerThread, mlp_doc, service_settings
from fastapi.testclient import TestClient

from api.limits import BodyBudget, ClientLimiter, LimitExceeded, scan_json
from api.main import create_app
from cost_models.hardware import PRESETS

TOKEN = "edge-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return mlp_doc()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(
        tmp_path_factory.mktemp("edge"),
        api_tokens=TOKEN,
        max_json_depth=12,
        max_json_string_chars=1000,
        max_json_tokens=20_000,
    )
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def profile(**changes: Any) -> dict[str, Any]:
    hw = PRESETS["tpu-v4"].to_dict()
    link = dict(hw["default_link"])
    for key in ("bandwidth_bytes_per_s", "latency_s"):
        if key in changes:
            link[key] = changes.pop(key)
    hw["default_link"] = link
    hw.update(changes)
    return hw


# -- the token comes first ------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/plans", "/v1/jobs", "/v1/evaluate"])
def test_the_token_is_checked_before_the_body_is_read(client, path):
    # Malformed JSON, a wrong content type and an oversized shape: all 401
    # without a token, so nothing of the body was decoded.
    for body, headers in (
        (b'{"graph": {', JSON),
        (b"not json at all", {"content-type": "text/plain"}),
        (b"[" * 100 + b"]" * 100, JSON),
    ):
        r = client.post(path, content=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = client.post(path, content=body, headers={**headers, **AUTH})
        assert r.status_code in (415, 422), (path, r.text)


def test_evaluate_needs_the_token_like_the_other_expensive_endpoints(client, doc):
    body = {"graph": doc, "mesh_shape": "x:2", "layout_rules": "batch:x"}
    r = client.post("/v1/evaluate", json=body)
    assert r.status_code == 401
    r = client.post("/v1/evaluate", json=body, headers={"Authorization": "Bearer no"})
    assert r.status_code == 401 and r.json()["detail"] == "the API token is not valid"
    r = client.post("/v1/evaluate", json=body, headers=AUTH)
    assert r.status_code == 200 and r.json()["valid"] is True


@pytest.mark.parametrize("path", ["/v1/plans", "/v1/jobs", "/v1/evaluate"])
@pytest.mark.parametrize(
    "media",
    ["text/plain", "application/x-www-form-urlencoded", "", "multipart/form-data"],
)
def test_json_endpoints_answer_415_to_other_content_types(client, doc, path, media):
    body = json.dumps({"graph": doc, "mesh_shape": "x:2", "layout_rules": ""})
    headers = {**AUTH, "content-type": media} if media else AUTH
    r = client.post(path, content=body.encode(), headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["error"] == "unsupported_media_type"
    assert "application/json" in r.json()["detail"]


def test_the_dashboard_form_answers_415_to_json(client):
    r = client.post("/plans/abc/try", json={"mesh_shape": "x:2"}, headers=AUTH)
    assert r.status_code == 415


# -- bodies are bounded in shape before they are decoded ------------------------


def test_deeply_nested_json_is_refused_before_decoding(client, doc):
    deep: Any = 1
    for _ in range(20):
        deep = [deep]
    graph = {**doc, "metadata": {"name": "deep", "extra": deep}}
    r = client.post(
        "/v1/plans", json={"graph": graph, "mesh_shape": "x:2"}, headers=AUTH
    )
    assert r.status_code == 422
    assert r.json()["error"] == "request_too_complex"
    assert "nests 23 levels deep" in r.json()["detail"]
    assert "at most 12 (max_json_depth)" in r.json()["detail"]


def test_long_strings_and_too_many_values_are_refused_before_decoding(client, doc):
    graph = {**doc, "metadata": {"name": "n" * 5000}}
    r = client.post(
        "/v1/plans", json={"graph": graph, "mesh_shape": "x:2"}, headers=AUTH
    )
    assert r.status_code == 422
    assert "a string of 5000 bytes" in r.json()["detail"]
    assert "max_json_string_chars" in r.json()["detail"]
    graph = {**doc, "metadata": {"name": "many", "numbers": [0] * 30_000}}
    r = client.post(
        "/v1/plans", json={"graph": graph, "mesh_shape": "x:2"}, headers=AUTH
    )
    assert r.status_code == 422
    assert "max_json_tokens" in r.json()["detail"]


def test_scan_json_counts_depth_strings_and_values_outside_strings():
    shape = scan_json(b'{"a": "[[[{,,,", "b": [1, [2, [3]]], "c": "x\\"y"}')
    assert shape.depth == 4  # {, [, [, [ ; the brackets in the string do not count
    assert shape.longest_string == 7  # '[[[{,,,'
    assert shape.tokens == 5 + 4 + 4  # 5 strings, 4 openers, 4 commas


# -- numbers are finite and in range at the schema ------------------------------


BAD_PROFILES = [
    ({"memory_bytes": 1e400}, "memory_bytes"),
    ({"memory_bytes": True}, "memory_bytes"),
    ({"latency_s": 1e400}, "latency_s"),
    ({"latency_s": float("nan")}, "latency_s"),
    ({"latency_s": 1e308}, "latency_s"),
    ({"latency_s": -1.0}, "latency_s"),
    ({"peak_flops": 1e-300}, "peak_flops"),
    ({"peak_flops": float("inf")}, "peak_flops"),
    ({"bandwidth_bytes_per_s": 1e-300}, "bandwidth_bytes_per_s"),
    ({"hbm_bandwidth_bytes_per_s": 0}, "hbm_bandwidth_bytes_per_s"),
    ({"devices_per_host": 0}, "devices_per_host"),
]


def _post_raw(client: TestClient, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps writes NaN and Infinity, which httpx's json= refuses to send.
    text = json.dumps(body, allow_nan=True)
    return client.post(path, content=text.encode(), headers={**JSON, **AUTH})


@pytest.mark.parametrize("changes, field", BAD_PROFILES)
def test_hardware_numbers_out_of_range_are_a_422_on_every_endpoint(
    client, doc, changes, field
):
    hw = profile(**changes)
    for path, extra in (
        ("/v1/plans", {}),
        ("/v1/jobs", {}),
        ("/v1/evaluate", {"layout_rules": "batch:x"}),
    ):
        r = _post_raw(
            client, path, {"graph": doc, "mesh_shape": "x:2", "hardware": hw, **extra}
        )
        assert r.status_code == 422, (path, changes, r.text)
        body = r.json()
        assert any(field in e["loc"] for e in body["errors"]), body
        assert "hardware.object" in body["detail"]


@pytest.mark.parametrize(
    "fields, needle",
    [
        (
            {"time_limit_s": float("nan")},
            "time_limit_s: Input should be a finite number",
        ),
        ({"time_limit_s": 1e400}, "time_limit_s: Input should be a finite number"),
        ({"max_memory_fraction": float("nan")}, "max_memory_fraction"),
        ({"memory_limit_bytes": 1e400}, "memory_limit_bytes"),
        ({"top_k": True}, "top_k"),
        ({"mesh_shape": {"x": True}}, "mesh_shape.object.x"),
        ({"mesh_shape": None, "num_devices": 2**40}, "num_devices"),
    ],
)
def test_plan_numbers_out_of_range_are_a_422(client, doc, fields, needle):
    r = _post_raw(client, "/v1/plans", {"graph": doc, "mesh_shape": "x:2", **fields})
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]


def test_the_widest_accepted_profile_plans_without_a_server_error(client, doc):
    # The edges of schemas.RANGES reach the solver and come back as a plan.
    for changes in (
        {"peak_flops": 1e6, "bandwidth_bytes_per_s": 1e3, "latency_s": 1.0},
        {"peak_flops": 1e20, "bandwidth_bytes_per_s": 1e15, "latency_s": 0.0},
        {"memory_bytes": 1, "hbm_bandwidth_bytes_per_s": 1e6},
        {"memory_bytes": 2**50, "hbm_bandwidth_bytes_per_s": 1e16},
    ):
        r = _post_raw(
            client,
            "/v1/plans",
            {"graph": doc, "mesh_shape": "x:2;y:2", "hardware": profile(**changes)},
        )
        assert r.status_code == 200, (changes, r.text)


# -- 500s are ours and say nothing of the cause ---------------------------------


def test_a_bug_is_an_opaque_500_with_an_error_id_in_the_body_and_the_log(
    client, doc, caplog, monkeypatch
):
    service = client.app.state.service

    def broken(body: Any) -> Any:
        raise RuntimeError("secret detail /etc/planner.conf")

    monkeypatch.setattr(service, "evaluate", broken)
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        r = client.post(
            "/v1/evaluate",
            json={"graph": doc, "mesh_shape": "x:2", "layout_rules": ""},
            headers=AUTH,
        )
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "internal_error"
    assert len(body["error_id"]) == 16 and body["error_id"] in body["detail"]
    assert "RuntimeError" not in r.text and "secret" not in r.text
    logged = [rec for rec in caplog.records if body["error_id"] in rec.getMessage()]
    assert len(logged) == 1
    assert "secret detail" in "".join(
        logging.Formatter().formatException(logged[0].exc_info)
    )


# -- per-client limits ----------------------------------------------------------


def test_client_limiter_counts_concurrency_and_rate_per_client():
    lim = ClientLimiter(max_concurrent=2, rate_per_s=0, burst=1)
    lim.acquire("a")
    lim.acquire("a")
    with pytest.raises(LimitExceeded) as e:
        lim.acquire("a")
    assert e.value.status == 429 and "client_max_concurrent" in str(e.value)
    lim.acquire("b")  # another client is not affected
    lim.release("a")
    lim.acquire("a")
    rated = ClientLimiter(max_concurrent=100, rate_per_s=0.5, burst=3)
    for _ in range(3):
        rated.acquire("a")
        rated.release("a")
    with pytest.raises(LimitExceeded) as e:
        rated.acquire("a")
    # One request's worth of tokens comes back in 2 s at 0.5/s.
    assert e.value.retry_after == "2" and 1 < e.value.retry_after_s <= 2


def test_body_budget_refuses_bytes_over_the_budget_and_frees_them():
    budget = BodyBudget(1000)
    first = budget.reserve(600)
    with pytest.raises(LimitExceeded) as e:
        budget.reserve(600)
    assert e.value.status == 503
    budget.release(first)
    assert budget.reserve(5000) == 1000  # one request alone may take it all
    assert budget.used == 1000


def test_a_client_over_its_rate_gets_429_with_retry_after(tmp_path, doc):
    settings = service_settings(
        tmp_path, api_tokens="a,b", client_rate_per_s=0.05, client_burst=2
    )
    body = {"graph": doc, "mesh_shape": "x:2", "layout_rules": ""}
    with TestClient(create_app(settings)) as c:
        a = {"Authorization": "Bearer a"}
        assert [
            c.post("/v1/evaluate", json=body, headers=a).status_code for _ in range(2)
        ] == [200, 200]
        r = c.post("/v1/evaluate", json=body, headers=a)
        assert r.status_code == 429 and r.json()["error"] == "too_many_requests"
        assert int(r.headers["retry-after"]) >= 1
        assert "client_rate_per_s" in r.json()["detail"]
        # Token b is another client; reads are not limited.
        b = {"Authorization": "Bearer b"}
        assert c.post("/v1/evaluate", json=body, headers=b).status_code == 200
        assert c.get("/v1/plans").status_code == 200


def _stalled(port: int, length: int, sent: bytes = b"") -> socket.socket:
    """A connection that sends a JSON POST's headers (and ``sent`` of its
    ``length`` bytes), then nothing more."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(
        b"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        + f"\r\nContent-Length: {length}\r\n\r\n".encode()
        + sent
    )
    return s


def _answer(s: socket.socket) -> tuple[int, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        more = s.recv(65536)
        if not more:
            break
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _requests(url: str, route: str) -> dict[str, float]:
    """/metrics' request counts of ``route`` by status."""
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("mtf_planner_requests_total{") and f'"{route}"' in line:
            status = line.split('status="')[1].split('"')[0]
            out[status] = float(line.rsplit(" ", 1)[1])
    return out


def test_stalled_uploads_hold_no_budget_and_end_in_408_and_a_client_gone_is_499(
    tmp_path, doc
):
    settings = service_settings(
        tmp_path,
        max_body_bytes=32 * 1024,
        max_inflight_body_bytes=32 * 1024,
        body_timeout_s=2.0,
    )
    body = {"graph": doc, "mesh_shape": "x:2", "layout_rules": ""}
    with ServerThread(settings) as server:
        # Three uploads that declare 32 KiB each (three times the budget)
        # and send nothing: other clients are still served.
        stalled = [_stalled(server.port, 32 * 1024) for _ in range(3)]
        time.sleep(0.3)
        r = httpx.post(f"{server.url}/v1/evaluate", json=body, timeout=30)
        assert r.status_code == 200, r.text
        start = time.monotonic()
        for s in stalled:
            status, answer = _answer(s)
            assert status == 408
            assert "did not arrive within 2 s (body_timeout_s)" in answer["detail"]
            s.close()
        assert time.monotonic() - start < 15
        # A client that leaves mid-body: counted as its own doing, not a 500.
        gone = _stalled(server.port, 100, b'{"gr')
        time.sleep(0.3)
        gone.close()
        deadline = time.monotonic() + 10
        while "499" not in _requests(server.url, "/v1/evaluate"):
            assert time.monotonic() < deadline, _requests(server.url, "/v1/evaluate")
            time.sleep(0.05)
        counts = _requests(server.url, "/v1/evaluate")
        assert counts == {"200": 1.0, "408": 3.0, "499": 1.0}


@pytest.mark.solver
def test_a_client_over_its_concurrency_gets_429_while_its_other_request_runs(
    tmp_path, doc
):
    settings = service_settings(tmp_path, api_tokens="a,b", client_max_concurrent=1)
    body = json.dumps({"graph": doc, "mesh_shape": "x:2", "layout_rules": ""}).encode()
    with ServerThread(settings) as server:
        release = threading.Event()

        def slow() -> Iterator[bytes]:
            yield body[:10]
            release.wait(60)  # the first request holds its slot until then
            yield body[10:]

        def post(token: str, content: Any) -> httpx.Response:
            return httpx.post(
                f"{server.url}/v1/evaluate",
                content=content,
                headers={**JSON, "Authorization": f"Bearer {token}"},
                timeout=60,
            )

        results: list[int] = []
        first = threading.Thread(
            target=lambda: results.append(post("a", slow()).status_code)
        )
        first.start()
        # Wait (on the server's own limiter, in this process) until the first
        # request holds its slot: its headers are in, its body is not.
        clients = server.server.config.app.state.guards.clients
        key = "token:" + hashlib.sha256(b"a").hexdigest()[:16]
        deadline = time.monotonic() + 60
        while getattr(clients._clients.get(key), "inflight", 0) != 1:
            assert time.monotonic() < deadline, "the first request never arrived"
            time.sleep(0.01)
        r = post("a", body)
        assert r.status_code == 429 and "client_max_concurrent" in r.json()["detail"]
        assert r.headers["retry-after"] == "1"
        assert post("b", body).status_code == 200  # another client is not limited
        release.set()
        first.join(60)
        assert results == [200]
        assert post("a", body).status_code == 200  # the slot came back


def test_the_dashboard_forms_need_the_token_before_anything_is_planned(client, doc):
    out = client.post(
        "/v1/plans", json={"graph": doc, "mesh_shape": "x:2"}, headers=AUTH
    ).json()
    jobs_before = len(client.get("/v1/jobs").json()["jobs"])
    for token in ("", "wrong"):
        r = client.post(
            f"/plans/{out['id']}/try", data={"mesh_shape": "x:4", "token": token}
        )
        assert r.status_code == 401
        assert "a valid API token is needed to plan" in r.text
        assert 'name="token" type="password"' in r.text  # the form asks for one
    assert len(client.get("/v1/jobs").json()["jobs"]) == jobs_before  # none made
    r = client.post(
        f"/plans/{out['id']}/try",
        data={"mesh_shape": "x:4", "token": TOKEN},
        follow_redirects=False,
    )
    assert r.status_code == 303
    job_id = r.headers["location"].rsplit("/", 1)[1]
    # Cancelling from the job page needs it too.
    r = client.post(f"/jobs/{job_id}/cancel", data={"token": "wrong"})
    assert r.status_code == 401
    assert "a valid API token is needed to cancel" in r.text


def test_a_calibrated_profile_file_is_accepted_and_its_notes_dropped(client, doc):
    hw = profile()
    hw["measured"] = {"clock": "wall", "seconds": 12.5, "fit": {"placement": {}}}
    r = client.post(
        "/v1/plans",
        json={"graph": doc, "mesh_shape": "x:2", "hardware": hw},
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    assert "measured" not in r.json()["plan"]["hardware"]
    assert r.json()["plan"]["hardware"]["name"] == "tpu-v4"
