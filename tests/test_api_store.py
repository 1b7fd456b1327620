"""The store contract, on SQLite and on a real PostgreSQL server that this
module starts (skipped, saying why, when PostgreSQL is not installed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from api_cases import mlp_doc, service_settings
from fastapi.testclient import TestClient
from pg_server import (
    PostgresMissing,
    PostgresServer,
    empty_database,
    postgres_instance,
    postgres_server,
)
from services import service_missing

from api.main import create_app
from api.settings import Settings
from api.store import JobRecord, PlanRecord, Store, StoreUnavailable, open_store
from api.store.postgres import PostgresStore
from api.store.sql import MIGRATIONS, SCHEMA_VERSION
from api.store.sqlite import SqliteStore
from mtf_core.errors import ConfigError


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 (tests/pg_server.py)."""
    try:
        with postgres_server() as url:
            yield url
    except PostgresMissing as e:
        service_missing(str(e))


@pytest.fixture(params=["sqlite", "postgresql"])
def open_again(request, tmp_path) -> Iterator[Callable[[], Store]]:
    """Opens the store; calling it again opens the same database anew (a
    restarted service)."""
    if request.param == "sqlite":
        path = tmp_path / "planner.sqlite3"
        factory: Callable[[], Store] = lambda: SqliteStore(path)  # noqa: E731
    else:
        url = request.getfixturevalue("postgres_url")
        empty_database(url)
        factory = lambda: PostgresStore(url)  # noqa: E731
    opened: list[Store] = []

    def make() -> Store:
        opened.append(factory())
        return opened[-1]

    yield make
    for s in opened:
        s.close()


def plan_record(
    request_hash: str, plan_id: str | None = None, at: float = 0.0
) -> PlanRecord:
    return PlanRecord(
        id=plan_id or request_hash[:16],
        request_hash=request_hash,
        created_at=at or time.time(),
        graph_hash="g" * 64,
        summary={"graph_name": "mlp", "layout_rules": "batch:x"},
        plan_json='{"layout_rules": "batch:x"}',
    )


def job_record(
    job_id: str,
    instance: str,
    status: str = "running",
    at: float = 0.0,
    request_hash: str = "",
) -> JobRecord:
    now = at or time.time()
    return JobRecord(
        id=job_id,
        request_hash=request_hash or f"h-{job_id}",
        status=status,
        phase=status,
        progress=0.0,
        created_at=now,
        updated_at=now,
        instance=instance,
        request={"mesh_shape": "x:2"},
    )


def test_put_plan_is_idempotent_on_the_request_hash(open_again):
    store = open_again()
    first = store.put_plan(plan_record("a" * 64))
    # Another replica solved the same request: the first stored plan wins.
    second = store.put_plan(plan_record("a" * 64, plan_id="other-id"))
    assert second == first and second.id == "a" * 16
    assert store.get_plan_by_hash("a" * 64) == first
    assert store.get_plan(first.id).plan == {"layout_rules": "batch:x"}
    assert store.get_plan("nope") is None and store.get_plan_by_hash("b" * 64) is None


def test_plans_are_listed_newest_first_with_the_total(open_again):
    store = open_again()
    for i, h in enumerate("abc"):
        store.put_plan(plan_record(h * 64, at=1000.0 + i))
    listed, total = store.list_plans(limit=2)
    assert total == 3
    assert [p.id for p in listed] == ["c" * 16, "b" * 16]
    assert listed[0].plan_json == "" and listed[0].summary["graph_name"] == "mlp"
    rest, _ = store.list_plans(limit=2, offset=2)
    assert [p.id for p in rest] == ["a" * 16]


def test_graphs_are_stored_once_by_hash(open_again):
    store = open_again()
    store.put_graph("g1", "mlp", '{"format": "mtf-graph"}')
    store.put_graph("g1", "renamed", '{"format": "other"}')
    assert store.get_graph("g1") == '{"format": "mtf-graph"}'
    assert store.get_graph("g2") is None


def test_jobs_are_updated_until_they_finish_and_listed_newest_first(open_again):
    store = open_again()
    store.create_job(job_record("j1", "me", "queued", at=1000.0))
    store.create_job(job_record("j2", "me", "queued", at=1001.0))
    assert store.update_job(
        "j1", status="done", phase="done", progress=1.0, plan_id="p1"
    )
    j1 = store.get_job("j1")
    assert (j1.status, j1.progress, j1.plan_id, j1.request) == (
        "done",
        1.0,
        "p1",
        {"mesh_shape": "x:2"},
    )
    assert j1.updated_at > 1000.0
    assert [j.id for j in store.list_jobs(10)] == ["j2", "j1"]
    # A finished job changes no more: a late update from its owner is a no-op.
    assert not store.update_job("j1", status="failed", phase="failed", error="late")
    assert store.get_job("j1").status == "done"
    with pytest.raises(ValueError, match="cannot update job fields"):
        store.update_job("j2", instance="someone-else")


def test_reaper_fails_unfinished_jobs_with_a_stale_heartbeat_once(open_again):
    store = open_again()
    now = time.time()
    store.create_job(job_record("alive-running", "r1", at=now))
    store.create_job(job_record("alive-queued", "r1", "queued", at=now))
    store.create_job(job_record("dead-running", "r2", at=now - 3600))
    store.create_job(job_record("dead-queued", "r2", "queued", at=now - 3600))
    store.create_job(job_record("dead-done", "r2", "done", at=now - 3600))
    assert store.reap_stale_jobs(now - 600, "its replica stopped") == 2
    assert store.reap_stale_jobs(now - 600, "again") == 0  # each job once
    status = {j.id: (j.status, j.error) for j in store.list_jobs(10)}
    assert status == {
        "alive-running": ("running", None),
        "alive-queued": ("queued", None),
        "dead-running": ("failed", "its replica stopped"),
        "dead-queued": ("failed", "its replica stopped"),
        "dead-done": ("done", None),
    }


def test_reapers_on_several_replicas_at_once_reap_each_job_once(open_again):
    stores = [open_again() for _ in range(4)]  # one per replica
    old = time.time() - 3600
    for i in range(40):
        stores[0].create_job(job_record(f"j{i:02d}", "dead", at=old))
    counts: list[int] = []
    barrier = threading.Barrier(len(stores))

    def reap(store: Store) -> None:
        barrier.wait()
        counts.append(store.reap_stale_jobs(time.time() - 600, "stale"))

    threads = [threading.Thread(target=reap, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 40
    assert {j.status for j in stores[1].list_jobs(100)} == {"failed"}


def test_heartbeat_keeps_its_replicas_jobs_alive_and_reports_finished_ones(
    open_again,
):
    store = open_again()
    old = time.time() - 3600
    store.create_job(job_record("busy", "r1", "queued", at=old))
    store.create_job(job_record("cancelled-elsewhere", "r1", "running", at=old))
    store.create_job(job_record("silent", "r2", "running", at=old))
    assert store.cancel_job("cancelled-elsewhere", "cancelled on r3")
    assert not store.cancel_job("cancelled-elsewhere", "twice")
    finished = store.heartbeat("r1", ["busy", "cancelled-elsewhere"])
    assert finished == {"cancelled-elsewhere"}
    assert store.reap_stale_jobs(time.time() - 600, "stale") == 1
    assert store.get_job("busy").status == "queued"
    assert store.get_job("silent").status == "failed"
    assert store.get_job("cancelled-elsewhere").error == "cancelled on r3"


def test_one_unfinished_job_per_request_across_replicas(open_again):
    stores = [open_again() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    got: list[str] = []

    def create(i: int) -> None:
        barrier.wait()
        job = job_record(f"try{i}", f"r{i}", "queued", request_hash="same" * 16)
        got.append(stores[i].create_job(job).id)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and len(set(got)) == 1  # all joined one job
    (winner,) = set(got)
    assert [j.id for j in stores[0].list_jobs(10)] == [winner]
    # Once it has finished, the same request makes a new job.
    stores[0].update_job(winner, status="failed", phase="failed")
    again = stores[1].create_job(
        job_record("later", "r1", "queued", request_hash="same" * 16)
    )
    assert again.id == "later"
    assert stores[0].active_job("same" * 16).id == "later"


def test_reopening_the_store_loses_nothing(open_again):
    store = open_again()
    store.put_plan(plan_record("d" * 64))
    store.create_job(job_record("j", "me", "done"))
    store.put_graph("g", "mlp", "{}")
    store.close()
    again = open_again()
    assert again.get_plan_by_hash("d" * 64).summary == {
        "graph_name": "mlp",
        "layout_rules": "batch:x",
    }
    assert again.get_job("j").status == "done"
    assert again.get_graph("g") == "{}"
    assert again.ping()


def test_sqlite_store_uses_write_ahead_logging(tmp_path):
    store = SqliteStore(tmp_path / "p.sqlite3")
    try:
        with store._connection() as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_unknown_database_url_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="mysql://x"):
        open_store(service_settings(tmp_path, database_url="mysql://x"))


@pytest.mark.solver
def test_two_replicas_on_one_postgresql_share_plans(postgres_url, tmp_path):
    empty_database(postgres_url)
    body = {"graph": mlp_doc(), "mesh_shape": "x:2;y:2", "hardware": "tpu-v4"}
    one = service_settings(
        tmp_path / "a", database_url=postgres_url, instance_name="r1"
    )
    two = service_settings(
        tmp_path / "b", database_url=postgres_url, instance_name="r2"
    )
    with TestClient(create_app(one)) as r1, TestClient(create_app(two)) as r2:
        assert r1.get("/readyz").json()["store"] == "postgresql"
        solved = r1.post("/v1/plans", json=body).json()
        assert solved["cached"] is False
        cached = r2.post("/v1/plans", json=body).json()
        assert cached["cached"] is True and cached["id"] == solved["id"]
        assert r2.get(f"/v1/plans/{solved['id']}").json()["plan"] == solved["plan"]


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request, tmp_path) -> Callable[..., Store]:
    """Opens a store (any number of times, from any thread) on a database that
    had no tables before this test."""
    if request.param == "sqlite":
        path = tmp_path / "planner.sqlite3"
        return lambda **kw: SqliteStore(path, **kw)
    url = request.getfixturevalue("postgres_url")
    empty_database(url)
    return lambda **kw: PostgresStore(url, **kw)


def test_replicas_starting_together_on_an_empty_database_all_come_up(empty_db):
    n = 6
    barrier = threading.Barrier(n)
    opened: list[Store] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            opened.append(empty_db())
        except BaseException as e:  # collected: the assertion shows it
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and len(opened) == n
        assert {s.schema_version() for s in opened} == {SCHEMA_VERSION}
        rows = opened[0]._run("SELECT version FROM schema_version", (), "all")
        assert sorted(r[0] for r in rows) == [v for v, _ in MIGRATIONS]
        opened[0].put_plan(plan_record("e" * 64))
        assert opened[-1].get_plan_by_hash("e" * 64) is not None
    finally:
        for s in opened:
            s.close()


def test_an_exhausted_pool_waits_then_says_busy_and_recovers(empty_db):
    store = empty_db(pool_size=2, pool_timeout_s=0.3)
    try:
        store.put_plan(plan_record("f" * 64))
        with store._connection(), store._connection():  # both lent out
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable, match="db_pool_size=2") as busy:
                store.get_plan_by_hash("f" * 64)
            waited = time.monotonic() - t0
            assert 0.25 < waited < 5
            assert busy.value.retry_after_s >= 1
            assert "127.0.0.1" not in str(busy.value)
        # Returned: every call works again, from many threads at once.
        results: list[bool] = []

        def read() -> None:
            for _ in range(20):
                results.append(store.get_plan_by_hash("f" * 64) is not None)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [True] * 160
    finally:
        store.close()


def test_heartbeats_and_the_reaper_run_while_every_request_connection_is_busy(
    empty_db,
):
    """They have a connection of their own: before, a heartbeat waited the
    pool's timeout and skipped its round, so a replica whose requests kept
    every connection busy looked dead and other replicas reaped its live
    jobs (and solved their requests again)."""
    store = empty_db(pool_size=2, pool_timeout_s=0.5)
    try:
        old = store.now() - 3600
        store.create_job(job_record("live", "r1", at=old))
        store.create_job(job_record("dead", "r2", at=old))
        with store._connection(), store._connection():  # both lent out
            with pytest.raises(StoreUnavailable, match="db_pool_size=2"):
                store.get_job("live")  # a request waits, then is refused
            t0 = time.monotonic()
            assert store.heartbeat("r1", ["live"]) == set()
            assert store.reap_stale_jobs(store.now() - 600, "stale") == 1
            assert time.monotonic() - t0 < 0.5  # neither waited for the pool
        assert store.get_job("live").status == "running"
        assert store.get_job("live").updated_at > old + 3000
        assert store.get_job("dead").status == "failed"
    finally:
        store.close()


def test_postgres_connections_stay_within_the_pool_bound(postgres_url):
    empty_database(postgres_url)
    store = PostgresStore(postgres_url, pool_size=3, pool_timeout_s=5)
    try:
        store.put_plan(plan_record("c" * 64))
        barrier = threading.Barrier(24)

        def read() -> None:
            barrier.wait()
            for _ in range(10):
                assert store.get_plan_by_hash("c" * 64) is not None

        threads = [threading.Thread(target=read) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        import psycopg

        with psycopg.connect(postgres_url, autocommit=True) as conn:
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        assert 1 <= n <= 3
    finally:
        store.close()


def test_a_busy_pool_is_a_503_with_retry_after_never_a_leak(tmp_path):
    settings = service_settings(tmp_path, db_pool_size=1, db_pool_timeout_s=0.2)
    with TestClient(create_app(settings)) as client:
        service = client.app.state.service
        assert service.pool.wait_ready(120)
        assert client.get("/readyz").status_code == 200
        with service.store._connection():  # the only connection is lent out
            r = client.get("/v1/plans")
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"] == "store_unavailable"
            assert "db_pool_size=1" in r.json()["detail"]
            assert client.get("/healthz").status_code == 200  # still alive
            not_ready = client.get("/readyz")  # but not ready
            assert not_ready.status_code == 503
            assert not_ready.json()["store_ok"] is False
        assert client.get("/v1/plans").status_code == 200
        assert client.get("/readyz").status_code == 200


def test_an_old_database_is_migrated_and_duplicate_active_jobs_resolved(tmp_path):
    import sqlite3

    path = tmp_path / "planner.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0][1]:  # the tables as version 0.1 made them
        conn.execute(statement)
    for job_id in ("a", "b"):  # two replicas solving one request (the old bug)
        conn.execute(
            "INSERT INTO jobs VALUES (?, 'same', 'running', 'solving', 0.5, 1, 1,"
            " 'host', '{}', NULL, NULL)",
            (job_id,),
        )
    conn.close()
    store = SqliteStore(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert {j.id: j.status for j in store.list_jobs(10)} == {
            "a": "failed",
            "b": "running",
        }
        assert store.active_job("same").id == "b"
    finally:
        store.close()


def test_the_database_password_is_never_printed(tmp_path, capsys):
    from api.cli import EXIT_ERROR, main

    url = "postgresql://planner:s3cret-pw@127.0.0.1:1/nope"
    assert Settings(database_url=url).store_description == (
        "postgresql://planner:***@127.0.0.1:1/nope"
    )
    with pytest.raises(ConfigError) as bad:
        open_store(service_settings(tmp_path, database_url="mysql://u:s3cret-pw@h/d"))
    assert "s3cret-pw" not in str(bad.value) and "mysql://u:***@h/d" in str(bad.value)
    # The startup line, then one error line: connecting to port 1 fails.
    assert main(["seed", "--database-url", url]) == EXIT_ERROR
    out = capsys.readouterr()
    assert "s3cret-pw" not in out.out + out.err
    assert "planner:***@127.0.0.1:1/nope" in out.out
    (line,) = out.err.strip().splitlines()
    assert line.startswith("mtf-planner seed: error: the store postgresql://")
    assert "is not usable" in line and "127.0.0.1" in line


@pytest.fixture
def restartable_postgres() -> Iterator[PostgresServer]:
    try:
        with postgres_instance() as server:
            yield server
    except PostgresMissing as e:
        service_missing(str(e))


def test_a_database_restart_is_a_503_then_the_replica_recovers_by_itself(
    restartable_postgres, tmp_path
):
    server = restartable_postgres
    settings = service_settings(
        tmp_path, database_url=server.url, db_pool_size=2, db_pool_timeout_s=0.5
    )
    with TestClient(create_app(settings)) as client:
        assert client.app.state.service.pool.wait_ready(120)
        assert client.get("/v1/plans").status_code == 200
        server.stop()
        down = client.get("/v1/plans")
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "1"
        assert down.json()["error"] == "store_unavailable"
        assert str(server.port) not in down.text and "127.0.0.1" not in down.text
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 503
        server.start()
        deadline = time.monotonic() + 15
        while client.get("/v1/plans").status_code != 200:
            assert time.monotonic() < deadline, "no recovery after the restart"
            time.sleep(0.2)
        assert client.get("/readyz").status_code == 200


def test_job_times_follow_the_database_clock_not_a_skewed_hosts(
    postgres_url, monkeypatch
):
    import types

    import api.store.postgres
    import api.store.sql

    empty_database(postgres_url)
    honest = PostgresStore(postgres_url)
    real = time.time
    behind = types.SimpleNamespace(time=lambda: real() - 3600)  # an hour slow
    monkeypatch.setattr(api.store.sql, "time", behind)
    monkeypatch.setattr(api.store.postgres, "time", behind)
    skewed = PostgresStore(postgres_url)  # a replica on that host
    try:
        assert abs(skewed.clock_offset_s - 3600) < 5
        assert abs(skewed.now() - real()) < 5
        skewed.create_job(job_record("live", "skewed-host", at=skewed.now()))
        assert skewed.heartbeat("skewed-host", ["live"]) == set()
        monkeypatch.undo()
        # Its heartbeat is fresh on the database's clock: not reaped.
        assert abs(honest.clock_offset_s) < 5
        assert honest.reap_stale_jobs(honest.now() - 20, "stale") == 0
        assert honest.get_job("live").status == "running"
    finally:
        skewed.close()
        honest.close()
