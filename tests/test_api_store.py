"""The store contract, on SQLite and on a real PostgreSQL server that this
module starts (skipped, saying why, when PostgreSQL is not installed)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from api_cases import free_port, mlp_doc, service_settings
from fastapi.testclient import TestClient
from services import service_missing

from api.main import create_app
from api.store import JobRecord, PlanRecord, Store, open_store
from api.store.postgres import PostgresStore
from api.store.sqlite import SqliteStore
from mtf_core.errors import ConfigError


def _pg_bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(initdb)) if initdb else None


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 (run as the 'postgres'
    user when we are root: PostgreSQL refuses to run as root)."""
    bindir = _pg_bindir()
    if bindir is None:
        service_missing(
            "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
        )
    prefix: list[str] = []
    root = tempfile.mkdtemp(prefix="mtf-planner-pg-")
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            service_missing(
                "running as root and there is no 'postgres' user to run PostgreSQL"
            )
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(root, "data"), free_port()

    def run(*cmd: str) -> None:
        subprocess.run(prefix + list(cmd), check=True, capture_output=True, timeout=120)

    try:
        run(
            f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-o",
            opts,
            "-l",
            f"{root}/log",
            "-w",
            "start",
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        log = Path(root, "log")
        shutil.rmtree(root, ignore_errors=True)
        detail = getattr(e, "stderr", b"") or b""
        pytest.fail(f"could not start PostgreSQL: {e}: {detail.decode()[-500:]} {log}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            prefix + [f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def _empty_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS plans, jobs, graphs")


@pytest.fixture(params=["sqlite", "postgresql"])
def open_again(request, tmp_path) -> Iterator[Callable[[], Store]]:
    """Opens the store; calling it again opens the same database anew (a
    restarted service)."""
    if request.param == "sqlite":
        path = tmp_path / "planner.sqlite3"
        factory: Callable[[], Store] = lambda: SqliteStore(path)  # noqa: E731
    else:
        url = request.getfixturevalue("postgres_url")
        _empty_postgres(url)
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
    job_id: str, instance: str, status: str = "running", at: float = 0.0
) -> JobRecord:
    now = at or time.time()
    return JobRecord(
        id=job_id,
        request_hash="h" * 64,
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


def test_jobs_are_updated_and_listed_newest_first(open_again):
    store = open_again()
    store.create_job(job_record("j1", "me", "queued", at=1000.0))
    store.create_job(job_record("j2", "me", "queued", at=1001.0))
    store.update_job("j1", status="done", phase="done", progress=1.0, plan_id="p1")
    j1 = store.get_job("j1")
    assert (j1.status, j1.progress, j1.plan_id, j1.request) == (
        "done",
        1.0,
        "p1",
        {"mesh_shape": "x:2"},
    )
    assert j1.updated_at > 1000.0
    assert [j.id for j in store.list_jobs(10)] == ["j2", "j1"]
    with pytest.raises(ValueError, match="cannot update job fields"):
        store.update_job("j1", instance="someone-else")


def test_restart_fails_this_replicas_unfinished_jobs_and_dead_replicas_jobs(open_again):
    store = open_again()
    now = time.time()
    store.create_job(job_record("mine-running", "me"))
    store.create_job(job_record("mine-queued", "me", "queued"))
    store.create_job(job_record("mine-done", "me", "done"))
    store.create_job(job_record("alive-replica", "other", at=now))
    store.create_job(job_record("dead-replica", "gone", at=now - 3600))
    failed = store.fail_unfinished_jobs(
        "me", stale_before=now - 600, message="restarted"
    )
    assert failed == 3
    status = {j.id: (j.status, j.error) for j in store.list_jobs(10)}
    assert status == {
        "mine-running": ("failed", "restarted"),
        "mine-queued": ("failed", "restarted"),
        "mine-done": ("done", None),
        "alive-replica": ("running", None),
        "dead-replica": ("failed", "restarted"),
    }


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


def test_heartbeat_keeps_a_live_replicas_jobs_from_being_failed(open_again):
    store = open_again()
    old = time.time() - 3600
    store.create_job(job_record("busy", "other", "queued", at=old))
    store.create_job(job_record("silent", "other", "running", at=old))
    store.heartbeat(["busy"])
    assert store.fail_unfinished_jobs("me", time.time() - 600, "stale") == 1
    assert store.get_job("busy").status == "queued"
    assert store.get_job("silent").status == "failed"


def test_sqlite_store_uses_write_ahead_logging(tmp_path):
    store = SqliteStore(tmp_path / "p.sqlite3")
    try:
        assert store._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_unknown_database_url_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="mysql://x"):
        open_store(service_settings(tmp_path, database_url="mysql://x"))


@pytest.mark.solver
def test_two_replicas_on_one_postgresql_share_plans(postgres_url, tmp_path):
    _empty_postgres(postgres_url)
    body = {"graph": mlp_doc(), "mesh_shape": "x:2;y:2", "hardware": "tpu-v4"}
    one = service_settings(
        tmp_path / "a", database_url=postgres_url, instance_name="r1"
    )
    two = service_settings(
        tmp_path / "b", database_url=postgres_url, instance_name="r2"
    )
    with TestClient(create_app(one)) as r1, TestClient(create_app(two)) as r2:
        assert r1.get("/healthz").json()["store"] == "postgresql"
        solved = r1.post("/v1/plans", json=body).json()
        assert solved["cached"] is False
        cached = r2.post("/v1/plans", json=body).json()
        assert cached["cached"] is True and cached["id"] == solved["id"]
        assert r2.get(f"/v1/plans/{solved['id']}").json()["plan"] == solved["plan"]
