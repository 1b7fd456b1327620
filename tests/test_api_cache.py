"""Cached plans are found by the canonical request, not its bytes: the same
request in other bytes (keys in another order, other spacing, the mesh as an
object, defaults spelled out) is answered from memory, without the database;
a request that differs in anything that changes the answer is not."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient

from api.main import create_app

pytestmark = pytest.mark.solver


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = service_settings(tmp_path_factory.mktemp("cache"))
    with TestClient(create_app(settings)) as c:
        yield c


def post(client: TestClient, text: str) -> dict:
    r = client.post(
        "/v1/plans", content=text, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_same_request_in_other_bytes_is_answered_from_memory(client):
    graph = mlp_doc(hidden=48)
    first = post(client, json.dumps({"graph": graph, "mesh_shape": "x:2;y:2"}))
    assert first["cached"] is False
    store = client.app.state.service.store
    lookups: list[str] = []
    original = store.get_plan_by_hash

    def counting(request_hash: str):
        lookups.append(request_hash)
        return original(request_hash)

    store.get_plan_by_hash = counting
    try:
        variants = [
            # keys reordered, indented, the mesh as an object
            json.dumps({"mesh_shape": {"x": 2, "y": 2}, "graph": graph}, indent=2),
            # the defaults spelled out
            json.dumps(
                {
                    "graph": graph,
                    "mesh_shape": "x:2;y:2",
                    "hardware": "cpu-host",
                    "objective": "time",
                    "top_k": 5,
                    "time_limit_s": 10,
                }
            ),
            # the graph's own keys in another order
            json.dumps(
                {
                    "graph": dict(reversed(list(graph.items()))),
                    "mesh_shape": "x:2;y:2",
                },
                sort_keys=True,
            ),
        ]
        for text in variants:
            again = post(client, text)
            assert again["cached"] is True
            assert again["id"] == first["id"]
            assert again["request_hash"] == first["request_hash"]
            assert again["plan"] == first["plan"]
        assert lookups == []  # memory answered; the database was not asked
        store.get_plan = lambda plan_id: lookups.append(plan_id)  # must not run
        got = client.get(f"/v1/plans/{first['id']}")
        assert got.status_code == 200 and got.json()["plan"] == first["plan"]
        assert lookups == []  # GET by id: memory too
        del store.get_plan
        # Another question (top_k 4) is not the same request.
        other = post(
            client, json.dumps({"graph": graph, "mesh_shape": "x:2;y:2", "top_k": 4})
        )
        assert other["request_hash"] != first["request_hash"]
        assert other["cached"] is False
        assert set(lookups) == {other["request_hash"]}  # only the new one
    finally:
        store.get_plan_by_hash = original


def test_a_plan_stored_by_another_replica_is_found_by_its_hash(client, tmp_path):
    # A second app on the same SQLite file: its memory is empty, the store not.
    graph = mlp_doc(hidden=40)
    body = {"graph": graph, "mesh_shape": "x:4"}
    first = post(client, json.dumps(body))
    data_dir = client.app.state.service.settings.data_dir
    with TestClient(create_app(service_settings(data_dir))) as other:
        reordered = json.dumps(dict(reversed(list(body.items()))))
        again = post(other, reordered)
        assert again["cached"] is True and again["id"] == first["id"]


def test_response_cache_keeps_each_body_once_and_bounds_bytes_and_aliases():
    from api.service import ResponseCache

    cache = ResponseCache(max_bytes=4000, max_aliases=5)
    body = b"x" * 900
    for i in range(5):  # five spellings of one request: one body, five aliases
        cache.put(cache.key(b"spelling %d" % i), "req-a", body, "plan-a")
    assert cache._bytes == 900
    assert all(cache.get(cache.key(b"spelling %d" % i)) is body for i in range(5))
    assert cache.get_request("req-a") is body and cache.get_plan("plan-a") is body
    cache.put(cache.key(b"sixth"), "req-a", body, "plan-a")  # the oldest alias goes
    assert cache.get(cache.key(b"spelling 0")) is None
    for name in "bcde":  # 4 more bodies of 900 bytes: over 4000, "a" goes
        cache.put(None, f"req-{name}", b"y" * 900, f"plan-{name}")
    assert cache._bytes <= 4000
    assert cache.get_request("req-a") is None and cache.get_plan("plan-a") is None
    assert cache.get_plan("plan-e") == b"y" * 900
    assert cache.get(cache.key(b"sixth")) is None  # an alias of a gone body
    cache.put(cache.key(b"huge"), "req-huge", b"z" * 1001, "p")  # > max_bytes / 4
    assert cache.get_request("req-huge") is None
