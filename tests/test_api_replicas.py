"""Three replicas of the service (``mtf-planner serve`` processes on loopback
ports) on one real PostgreSQL, started together on an empty database, driven
with concurrent reads and writes for a few seconds each phase:

* within the pools' bound (as many clients per replica as it has pooled
  connections): not one failed request;
* overloaded (four times as many clients as connections): any refusal is a
  503 with ``Retry-After``, never a 500, and every replica serves again
  within seconds once the load stops, holding no more connections than its
  pool allows (and the one its heartbeats keep);
* one request sent to every replica at once is solved once;
* a job is cancelled from another replica than the one running it;
* a replica killed with SIGKILL while it runs a job: another replica's
  reaper marks the job failed within seconds.

Skipped (saying why) when PostgreSQL is not installed, unless CI is set.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_cases import free_port, long_job_request, mlp_doc, wait_healthy, wait_job
from pg_server import PostgresMissing, postgres_server
from services import service_missing

from api.store.sql import MIGRATIONS

pytestmark = [pytest.mark.solver, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
POOL_SIZE = 4
N_REPLICAS = 3
#: Reaper bounds for the test: a dead replica's job fails within seconds.  The
#: stale bound leaves a live owner room for a late heartbeat: with the whole
#: suite on 2 busy cores, 3 s was once too short, and a live job was reaped and
#: solved a second time.  With 8 s the same request was once answered with
#: two jobs; the cause was not recorded (the check below now prints what the
#: store says of each job), but a heartbeat that finds every pooled
#: connection busy waited the pool's 2 s before it gave up its round, so four
#: such rounds made a live job look dead (heartbeats now have a connection of
#: their own: tests/test_api_store.py).  The product's default is 20 s.
HEARTBEAT_S, STALE_JOB_S = 0.5, 15.0


@dataclass
class Replica:
    name: str
    url: str
    proc: subprocess.Popen[bytes]


def start_replica(name: str, database_url: str, log_dir: Path) -> Replica:
    port = free_port()
    env = dict(
        os.environ,
        MTF_PLANNER_INSTANCE_NAME=name,
        MTF_PLANNER_DB_POOL_SIZE=str(POOL_SIZE),
        MTF_PLANNER_DB_POOL_TIMEOUT_S="2",
        MTF_PLANNER_HEARTBEAT_S=str(HEARTBEAT_S),
        MTF_PLANNER_STALE_JOB_S=str(STALE_JOB_S),
        MTF_PLANNER_SYNC_WAIT_S="60",
        # One client address drives every request here: no per-client limit.
        MTF_PLANNER_CLIENT_MAX_CONCURRENT="10000",
        MTF_PLANNER_CLIENT_RATE_PER_S="1000000",
        MTF_PLANNER_CLIENT_BURST="1000000",
    )
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return Replica(name, f"http://127.0.0.1:{port}", proc)


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    # Few connections on purpose: replicas that leaked them would exhaust it.
    try:
        with postgres_server(max_connections=30) as url:
            yield url
    except PostgresMissing as e:
        service_missing(str(e))


@pytest.fixture(scope="module")
def replicas(database_url, tmp_path_factory) -> Iterator[list[Replica]]:
    logs = tmp_path_factory.mktemp("replicas")
    # All at once, on the empty database: the migrations race.
    started = [start_replica(f"r{i}", database_url, logs) for i in range(N_REPLICAS)]
    try:
        for r in started:
            try:
                wait_healthy(r.url, timeout_s=120)
            except TimeoutError:
                raise AssertionError(
                    f"{r.name} did not become ready:\n"
                    + (logs / f"{r.name}.log").read_text()[-3000:]
                ) from None
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
        for r in started:  # a password or a host:port must not be printed
            text = (logs / f"{r.name}.log").read_text()
            assert "Traceback" not in text, text[-3000:]


def sql(database_url: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        return list(conn.execute(query).fetchall())


def server_connections(database_url: str) -> int:
    """Client connections to PostgreSQL, not counting this one."""
    rows = sql(
        database_url,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    return int(rows[0][0])


def jobs_in_store(database_url: str, ids: set[str]) -> list[tuple[Any, ...]]:
    """(id, instance, status, phase, error) of the jobs ``ids``."""
    quoted = ", ".join(f"'{i}'" for i in sorted(ids) if i.isalnum())
    if not quoted:
        return []
    return sql(
        database_url,
        f"SELECT id, instance, status, phase, error FROM jobs WHERE id IN ({quoted})",
    )


def solves(replicas: list[Replica]) -> int:
    """Solves finished, summed over the replicas (their Prometheus counters)."""
    total = 0.0
    for r in replicas:
        for line in httpx.get(f"{r.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("mtf_planner_solve_duration_seconds_count"):
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def shuffled_body(body: dict[str, Any], rng: random.Random) -> bytes:
    """The same request in other bytes: keys in another order, other spacing."""
    items = list(body.items())
    rng.shuffle(items)
    return json.dumps(dict(items), indent=rng.choice([None, 1])).encode()


@dataclass
class Outcome:
    statuses: Counter[int]
    errors: list[str]


def drive(
    replicas: list[Replica],
    clients_per_replica: int,
    seconds: float,
    plan_id: str,
    cached_body: dict[str, Any],
) -> Outcome:
    """Concurrent clients, each on one replica, reading and writing in a loop
    for ``seconds``; returns every status and every unexpected answer."""
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(replica: Replica, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=replica.url, timeout=30) as c:
            while time.monotonic() < deadline:
                kind = rng.choice(["plan", "list", "jobs", "post", "job"])
                try:
                    if kind == "plan":
                        r = c.get(f"/v1/plans/{plan_id}")
                    elif kind == "list":
                        r = c.get("/v1/plans", params={"limit": 5})
                    elif kind == "jobs":
                        r = c.get("/v1/jobs", params={"limit": 5})
                    else:  # writes: a cached plan asked for, a job row made
                        path = "/v1/plans" if kind == "post" else "/v1/jobs"
                        r = c.post(
                            path,
                            content=shuffled_body(cached_body, rng),
                            headers={"Content-Type": "application/json"},
                        )
                except httpx.HTTPError as e:
                    with lock:
                        errors.append(f"{replica.name} {kind}: {type(e).__name__}")
                    continue
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code not in (200, 202):
                        errors.append(
                            f"{replica.name} {kind}: {r.status_code} "
                            f"retry-after={r.headers.get('retry-after')} {r.text[:200]}"
                        )

    threads = [
        threading.Thread(target=client, args=(r, i * 100 + j))
        for i, r in enumerate(replicas)
        for j in range(clients_per_replica)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Outcome(statuses, errors)


@pytest.fixture(scope="module")
def stored(replicas) -> tuple[str, dict[str, Any]]:
    """A plan solved once (on the first replica) for the clients to ask for."""
    body = {"graph": mlp_doc(), "mesh_shape": "x:2;y:2", "hardware": "tpu-v4"}
    r = httpx.post(f"{replicas[0].url}/v1/plans", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["id"], body


def test_replicas_started_together_on_an_empty_database_share_one_schema(
    replicas, database_url
):
    versions = sql(database_url, "SELECT version FROM schema_version ORDER BY 1")
    # Each migration applied once.
    assert [v for (v,) in versions] == [v for v, _ in MIGRATIONS]
    ids = {httpx.get(f"{r.url}/healthz").json()["replica"] for r in replicas}
    assert len(ids) == N_REPLICAS  # one unique id per replica
    for r in replicas:
        ready = httpx.get(f"{r.url}/readyz").json()
        assert ready["status"] == "ready" and ready["store"] == "postgresql"


def test_load_within_the_pool_bound_has_no_failed_request(
    replicas, stored, database_url
):
    plan_id, body = stored
    out = drive(replicas, POOL_SIZE, 3.0, plan_id, body)
    assert out.errors == [], out.errors[:10]
    assert sum(out.statuses.values()) > 50  # it did run
    assert server_connections(database_url) <= N_REPLICAS * (POOL_SIZE + 1)


def test_overload_is_refused_with_retry_after_and_recovers_within_seconds(
    replicas, stored, database_url
):
    plan_id, body = stored
    out = drive(replicas, 4 * POOL_SIZE, 3.0, plan_id, body)
    assert set(out.statuses) <= {200, 202, 503}, out.statuses
    refused = [e for e in out.errors if " 503 " in e]
    assert all("retry-after=None" not in e for e in refused), refused[:5]
    assert len(refused) == len(out.errors), out.errors[:10]  # no transport errors
    assert server_connections(database_url) <= N_REPLICAS * (POOL_SIZE + 1)
    # Recovery: within a few seconds every replica answers every request.
    t0 = time.monotonic()
    while True:
        check = drive(replicas, 2, 0.5, plan_id, body)
        if not check.errors:
            break
        assert time.monotonic() - t0 < 5, check.errors[:5]
    after = drive(replicas, POOL_SIZE, 1.0, plan_id, body)
    assert after.errors == [], after.errors[:10]


def post_everywhere(
    replicas: list[Replica], path: str, body: dict[str, Any], times: int = 3
) -> list[httpx.Response]:
    """``body`` POSTed to ``path``, ``times`` times on every replica, all at
    once (a barrier); the answers."""
    barrier = threading.Barrier(times * len(replicas))
    answers: list[httpx.Response] = []

    def submit(replica: Replica) -> None:
        barrier.wait()
        answers.append(httpx.post(f"{replica.url}{path}", json=body, timeout=120))

    threads = [
        threading.Thread(target=submit, args=(r,))
        for r in replicas
        for _ in range(times)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == times * len(replicas)
    return answers


def test_one_request_sent_to_every_replica_at_once_is_solved_once(
    replicas, database_url
):
    body = {
        "graph": mlp_doc(hidden=96),
        "mesh_shape": "x:2;y:2",
        "hardware": "h100-nvlink-ib",
        "top_k": 3,
    }
    before = solves(replicas)
    answers = post_everywhere(replicas, "/v1/jobs", body)
    assert [r.status_code for r in answers] == [202] * len(answers), answers
    ids = {r.json()["id"] for r in answers}
    # Every answer's job ends done, on one plan.  An answer may name a job
    # other than the solving one, and that job may have looked queued when
    # answered: a request that missed the plan cache just before the solve
    # stored its plan makes a job that finds the plan at once and is done
    # (cached); a request on another replica can join it in that moment.
    with httpx.Client(base_url=replicas[-1].url, timeout=30) as c:
        done = [wait_job(c, i, ("done", "failed", "cancelled")) for i in ids]
    in_store = jobs_in_store(database_url, ids)
    assert [j["status"] for j in done] == ["done"] * len(done), (done, in_store)
    assert len({j["plan_id"] for j in done}) == 1, (done, in_store)
    # One solve, counted by the solvers, and one job that ran it (else: what
    # the store says of each, e.g. a live job reaped for want of a heartbeat).
    assert solves(replicas) - before == 1, in_store
    (request_hash,) = {
        h
        for (h,) in sql(
            database_url,
            f"SELECT request_hash FROM plans WHERE id = '{done[0]['plan_id']}'",
        )
    }
    rows = sql(
        database_url,
        f"SELECT id, status, phase, error FROM jobs WHERE request_hash = "
        f"'{request_hash}'",
    )
    assert [phase for _, _, phase, _ in rows].count("done") == 1, rows
    assert all(error is None for *_, error in rows), rows


def test_one_scale_request_sent_to_every_replica_at_once_is_planned_once(
    replicas, database_url
):
    """Scale plans are jobs too: one request on every replica at once is one
    job and one run, and every replica answers with that plan."""
    body = {
        "model": {
            "num_layers": 2, "d_model": 128, "heads": 4, "d_kv": 32,
            "d_ff": 512, "vocab": 512, "length": 32, "batch": 16,
        },
        "devices": 8,
        "stages": [1, 2],
        "tensor": [1, 2],
        "time_limit_s": 3,
    }  # fmt: skip
    before = solves(replicas)
    posted = post_everywhere(replicas, "/v1/scale-plans", body)
    assert [r.status_code for r in posted] == [200] * len(posted), posted
    answers = [r.json() for r in posted]
    assert len({a["id"] for a in answers}) == 1
    assert solves(replicas) - before == 1  # one run, counted by the solvers
    request_hash = answers[0]["request_hash"]
    rows = sql(
        database_url,
        f"SELECT status, phase FROM jobs WHERE request_hash = '{request_hash}'",
    )
    assert [phase for _, phase in rows].count("done") == 1, rows
    assert len(sql(database_url, "SELECT id FROM scale_plans")) >= 1


def test_a_job_is_cancelled_from_another_replica_than_its_own(replicas):
    owner, other = replicas[0], replicas[1]
    with httpx.Client(base_url=owner.url, timeout=60) as c:
        job = c.post("/v1/jobs", json=long_job_request()).json()
        wait_job(c, job["id"], ("running",))
    r = httpx.delete(f"{other.url}/v1/jobs/{job['id']}", timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    # The owner stops the solve at its next heartbeat; liveness never fails.
    deadline = time.monotonic() + 10
    while True:
        live = httpx.get(f"{owner.url}/healthz", timeout=5)
        assert live.status_code == 200
        if live.json()["running"] == 0:
            break
        assert time.monotonic() < deadline, live.json()
        time.sleep(0.1)
    assert httpx.get(f"{owner.url}/v1/jobs/{job['id']}").json()["status"] == (
        "cancelled"
    )
    wait_healthy(owner.url, timeout_s=60)  # its worker is back


def test_a_killed_replicas_running_job_is_failed_by_the_others(replicas):
    victim, survivor = replicas[-1], replicas[0]
    body = {**long_job_request(), "time_limit_s": 29}
    with httpx.Client(base_url=victim.url, timeout=60) as c:
        job = c.post("/v1/jobs", json=body).json()
        wait_job(c, job["id"], ("running",))
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    t0 = time.monotonic()
    with httpx.Client(base_url=survivor.url, timeout=30) as c:
        failed = wait_job(c, job["id"], ("failed", "done", "cancelled"), 30)
        took = time.monotonic() - t0
        assert failed["status"] == "failed", failed
        assert "no heartbeat" in failed["error"]
        assert took < STALE_JOB_S + 10
        assert c.delete(f"/v1/jobs/{job['id']}").status_code == 409  # finished
        # The same request is taken over by a live replica.
        again = c.post("/v1/jobs", json=body).json()
        assert again["id"] != job["id"] and again["status"] in ("queued", "running")
        assert c.delete(f"/v1/jobs/{again['id']}").json()["status"] == "cancelled"
