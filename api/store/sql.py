"""The SQL both stores run, written with ``?`` placeholders.

Each call borrows an autocommit connection from the store's bounded pool
(:meth:`SqlStore._connection`) for the one statement it runs and gives it
back, so a replica never holds more than ``db_pool_size`` connections for its
requests however many threads serve them.  Job heartbeats and the reaper run
on one connection of their own (:meth:`SqlStore._maintenance_connection`):
requests that keep every pooled connection busy must not make a live job's
heartbeat late, or other replicas reap it and solve its request again.

The schema is created by numbered migrations (:data:`MIGRATIONS`, recorded in
``schema_version``), applied under a lock that each backend provides, so
replicas starting together on an empty database apply each migration once.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from api.store.base import (
    UNFINISHED,
    JobRecord,
    JobStatus,
    MeasurementRecord,
    PlanRecord,
    Store,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

_ACTIVE = "status IN ('queued', 'running')"
#: No id has a NUL, and PostgreSQL cannot even compare one (a 500): an id
#: with one is not found, whoever asks (the dashboard's pages, the jobs).
_NUL = "\x00"

#: (version, statements).  Append only; never edit an applied migration.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,  # the tables (IF NOT EXISTS: databases made before versioning adopt it)
        (
            """CREATE TABLE IF NOT EXISTS graphs (
                hash TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                doc TEXT NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS plans (
                id TEXT PRIMARY KEY,
                request_hash TEXT NOT NULL UNIQUE,
                created_at DOUBLE PRECISION NOT NULL,
                graph_hash TEXT NOT NULL,
                summary TEXT NOT NULL,
                plan TEXT NOT NULL)""",
            "CREATE INDEX IF NOT EXISTS plans_created ON plans (created_at)",
            """CREATE TABLE IF NOT EXISTS jobs (
                id TEXT PRIMARY KEY,
                request_hash TEXT NOT NULL,
                status TEXT NOT NULL,
                phase TEXT NOT NULL,
                progress DOUBLE PRECISION NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                instance TEXT NOT NULL,
                request TEXT NOT NULL,
                error TEXT,
                plan_id TEXT)""",
            "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at)",
            "CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status)",
        ),
    ),
    (
        2,  # one unfinished job per request, across replicas
        (
            # Duplicates left by older versions (in-memory dedup only) go first.
            f"""UPDATE jobs SET status = 'failed', phase = 'failed',
                error = 'superseded by an identical job' WHERE {_ACTIVE}
                AND id NOT IN (SELECT MAX(id) FROM jobs WHERE {_ACTIVE}
                GROUP BY request_hash)""",
            f"""CREATE UNIQUE INDEX IF NOT EXISTS jobs_active_request
                ON jobs (request_hash) WHERE {_ACTIVE}""",
            "CREATE INDEX IF NOT EXISTS jobs_instance ON jobs (instance)",
        ),
    ),
    (
        3,  # measured steps of plans (the cost model learns from them)
        (
            """CREATE TABLE IF NOT EXISTS measurements (
                id TEXT PRIMARY KEY,
                plan_id TEXT NOT NULL,
                hardware TEXT NOT NULL,
                backend TEXT NOT NULL,
                measured_s DOUBLE PRECISION NOT NULL,
                predicted_s DOUBLE PRECISION NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                detail TEXT NOT NULL)""",
            "CREATE INDEX IF NOT EXISTS measurements_plan ON measurements (plan_id)",
            "CREATE INDEX IF NOT EXISTS measurements_hw ON measurements (hardware)",
        ),
    ),
    (
        4,  # scale plans (POST /v1/scale-plans): a Transformer shape, no graph
        (
            """CREATE TABLE IF NOT EXISTS scale_plans (
                id TEXT PRIMARY KEY,
                request_hash TEXT NOT NULL UNIQUE,
                created_at DOUBLE PRECISION NOT NULL,
                summary TEXT NOT NULL,
                plan TEXT NOT NULL)""",
            "CREATE INDEX IF NOT EXISTS scale_plans_created ON scale_plans (created_at)",
        ),
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]

_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    applied_at DOUBLE PRECISION NOT NULL)"""

_JOB_COLUMNS = (
    "id, request_hash, status, phase, progress, created_at, updated_at, instance, "
    "request, error, plan_id"
)
_UPDATABLE = ("status", "phase", "progress", "error", "plan_id")


def apply_migrations(execute: Callable[..., Any]) -> list[int]:
    """Applies the migrations the database lacks, through ``execute(sql,
    params) -> cursor`` on one connection that the caller holds under its
    backend's lock, inside one transaction.  Returns the versions applied."""
    execute(_VERSION_TABLE, ())
    row = execute("SELECT COALESCE(MAX(version), 0) FROM schema_version", ()).fetchone()
    current = int(row[0])
    if current > SCHEMA_VERSION:
        log.warning(
            "the database's schema is version %d, newer than this service's %d",
            current,
            SCHEMA_VERSION,
        )
    applied = []
    for version, statements in MIGRATIONS:
        if version <= current:
            continue
        for statement in statements:
            execute(statement, ())
        execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
            (version, time.time()),
        )
        applied.append(version)
    return applied


class BoundedPool:
    """At most ``size`` connections made by ``connect``, lent one at a time
    (most recently returned first); a borrower waits up to ``timeout_s`` for
    one, then gets :class:`StoreUnavailable`.  A connection whose use raised
    one of ``broken`` is closed instead of returned."""

    def __init__(
        self,
        connect: Callable[[], Any],
        size: int,
        timeout_s: float,
        broken: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._connect = connect
        self.size = size
        self.timeout_s = timeout_s
        self._broken = broken
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self, timeout_s: float | None = None) -> Iterator[Any]:
        wait = self.timeout_s if timeout_s is None else timeout_s
        if not self._slots.acquire(timeout=wait):
            raise StoreUnavailable(
                f"all {self.size} database connections of this replica stayed busy "
                f"for {wait:g} s (db_pool_size={self.size}); try again"
            )
        try:
            with self._lock:
                if self._closed:
                    raise StoreUnavailable("the store is closed")
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            reuse = True
            try:
                yield conn
            except self._broken:
                reuse = False
                raise
            finally:
                with self._lock:
                    if reuse and not self._closed:
                        self._idle.append(conn)
                        conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


class SqlStore(Store):
    """A :class:`Store` over a pool of DB-API connections."""

    #: the driver's placeholder ("?" for sqlite3, "%s" for psycopg)
    placeholder = "?"

    #: The database's clock minus this host's (PostgreSQL measures it): job
    #: heartbeats and the reaper compare times written by several hosts.
    clock_offset_s = 0.0

    def now(self) -> float:
        return time.time() + self.clock_offset_s

    @abc.abstractmethod
    def _connection(self, timeout_s: float | None = None) -> Any:
        """A context manager lending one autocommit connection from the pool;
        raises StoreUnavailable when none frees up in time."""

    @abc.abstractmethod
    def _maintenance_connection(self, timeout_s: float | None = None) -> Any:
        """As :meth:`_connection`, from a pool of one connection kept for
        heartbeats and the reaper (opened on first use)."""

    @abc.abstractmethod
    def _unavailable(self, error: Exception) -> StoreUnavailable | None:
        """``error`` as a StoreUnavailable if it means the database cannot
        answer now (not a bug of ours), else None."""

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _run(
        self,
        sql: str,
        params: tuple[Any, ...] = (),
        fetch: str = "",
        timeout_s: float | None = None,
        maintenance: bool = False,
    ) -> Any:
        """Runs one statement on a borrowed connection (``maintenance``: the
        heartbeats' own): ``fetch`` "one" or "all" returns rows, "" the row
        count."""
        borrow = self._maintenance_connection if maintenance else self._connection
        try:
            with borrow(timeout_s) as conn:
                cur = conn.cursor()
                try:
                    cur.execute(self._sql(sql), params)
                    if fetch == "one":
                        return cur.fetchone()
                    if fetch == "all":
                        return cur.fetchall()
                    return cur.rowcount
                finally:
                    cur.close()
        except StoreUnavailable:
            raise
        except Exception as e:
            unavailable = self._unavailable(e)
            if unavailable is None:
                raise
            # The driver's message may name the host and port: it goes to the
            # log (by _unavailable), never into an answer.
            raise unavailable from None

    # -- graphs ---------------------------------------------------------------------------
    def put_graph(self, graph_hash: str, name: str, graph_json: str) -> None:
        self._run(
            "INSERT INTO graphs (hash, name, created_at, doc) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (hash) DO NOTHING",
            (graph_hash, name, self.now(), graph_json),
        )

    def get_graph(self, graph_hash: str) -> str | None:
        row = self._run("SELECT doc FROM graphs WHERE hash = ?", (graph_hash,), "one")
        return None if row is None else str(row[0])

    # -- plans ----------------------------------------------------------------------------
    def put_plan(self, record: PlanRecord) -> PlanRecord:
        self._run(
            "INSERT INTO plans (id, request_hash, created_at, graph_hash, summary, plan) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                record.id,
                record.request_hash,
                record.created_at,
                record.graph_hash,
                json.dumps(record.summary),
                record.plan_json,
            ),
        )
        stored = self.get_plan_by_hash(record.request_hash)
        assert stored is not None, "a plan just inserted must be there"
        return stored

    _PLAN = "SELECT id, request_hash, created_at, graph_hash, summary, plan FROM plans "

    def get_plan(self, plan_id: str) -> PlanRecord | None:
        if _NUL in plan_id:
            return None
        return self._plan(self._run(self._PLAN + "WHERE id = ?", (plan_id,), "one"))

    def get_plan_by_hash(self, request_hash: str) -> PlanRecord | None:
        row = self._run(self._PLAN + "WHERE request_hash = ?", (request_hash,), "one")
        return self._plan(row)

    def list_plans(self, limit: int, offset: int = 0) -> tuple[list[PlanRecord], int]:
        rows = self._run(
            "SELECT id, request_hash, created_at, graph_hash, summary, '' FROM plans "
            "ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset),
            "all",
        )
        total = self._run("SELECT COUNT(*) FROM plans", (), "one")[0]
        return [p for p in map(self._plan, rows) if p is not None], int(total)

    @staticmethod
    def _plan(row: Any) -> PlanRecord | None:
        if row is None:
            return None
        return PlanRecord(
            id=row[0],
            request_hash=row[1],
            created_at=float(row[2]),
            graph_hash=row[3],
            summary=json.loads(row[4]),
            plan_json=row[5],
        )

    # -- scale plans (PlanRecord rows without a graph) ------------------------------------
    def put_scale_plan(self, record: PlanRecord) -> PlanRecord:
        self._run(
            "INSERT INTO scale_plans (id, request_hash, created_at, summary, plan) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                record.id,
                record.request_hash,
                record.created_at,
                json.dumps(record.summary),
                record.plan_json,
            ),
        )
        stored = self.get_scale_plan_by_hash(record.request_hash)
        assert stored is not None, "a scale plan just inserted must be there"
        return stored

    _SCALE = "SELECT id, request_hash, created_at, '', summary, plan FROM scale_plans "

    def get_scale_plan(self, plan_id: str) -> PlanRecord | None:
        if _NUL in plan_id:
            return None
        return self._plan(self._run(self._SCALE + "WHERE id = ?", (plan_id,), "one"))

    def get_scale_plan_by_hash(self, request_hash: str) -> PlanRecord | None:
        row = self._run(self._SCALE + "WHERE request_hash = ?", (request_hash,), "one")
        return self._plan(row)

    def list_scale_plans(
        self, limit: int, offset: int = 0
    ) -> tuple[list[PlanRecord], int]:
        rows = self._run(
            "SELECT id, request_hash, created_at, '', summary, '' FROM scale_plans "
            "ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset),
            "all",
        )
        total = self._run("SELECT COUNT(*) FROM scale_plans", (), "one")[0]
        return [p for p in map(self._plan, rows) if p is not None], int(total)

    # -- measurements ---------------------------------------------------------------------
    _MEASUREMENT = (
        "SELECT id, plan_id, hardware, backend, measured_s, predicted_s, created_at, "
        "detail FROM measurements "
    )

    def put_measurement(self, record: MeasurementRecord) -> None:
        self._run(
            "INSERT INTO measurements (id, plan_id, hardware, backend, measured_s, "
            "predicted_s, created_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.plan_id,
                record.hardware,
                record.backend,
                record.measured_s,
                record.predicted_s,
                record.created_at,
                json.dumps(record.detail),
            ),
        )

    def list_measurements(
        self,
        plan_id: str | None = None,
        hardware: str | None = None,
        limit: int = 100,
        backend: str | None = None,
    ) -> list[MeasurementRecord]:
        where, params = [], []
        for column, value in (
            ("plan_id", plan_id),
            ("hardware", hardware),
            ("backend", backend),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._run(
            self._MEASUREMENT + clause + "ORDER BY created_at DESC, id LIMIT ?",
            (*params, limit),
            "all",
        )
        return [
            MeasurementRecord(
                id=r[0],
                plan_id=r[1],
                hardware=r[2],
                backend=r[3],
                measured_s=float(r[4]),
                predicted_s=float(r[5]),
                created_at=float(r[6]),
                detail=json.loads(r[7]),
            )
            for r in rows
        ]

    def measurement_stamps(self) -> dict[tuple[str, str], tuple[int, float]]:
        rows = self._run(
            "SELECT hardware, backend, COUNT(*), MAX(created_at) FROM measurements "
            "GROUP BY hardware, backend",
            (),
            "all",
        )
        return {(str(r[0]), str(r[1])): (int(r[2]), float(r[3])) for r in rows}

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, job: JobRecord) -> JobRecord:
        for _ in range(5):
            # ON CONFLICT: the partial unique index on unfinished jobs' request
            # hash (migration 2) says another replica is solving it already.
            inserted = self._run(
                f"INSERT INTO jobs ({_JOB_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    job.id,
                    job.request_hash,
                    job.status,
                    job.phase,
                    job.progress,
                    job.created_at,
                    job.updated_at,
                    job.instance,
                    json.dumps(job.request),
                    job.error,
                    job.plan_id,
                ),
            )
            if inserted == 1:
                return job
            other = self.active_job(job.request_hash) if not job.finished else None
            if other is not None:
                return other
            if self.get_job(job.id) is not None:
                raise ValueError(f"job id {job.id!r} is taken")
            # The other job finished between the two statements: insert again.
        raise StoreUnavailable("jobs for this request kept changing; try again")

    def update_job(self, job_id: str, **fields: Any) -> bool:
        unknown = set(fields) - set(_UPDATABLE)
        if unknown:
            raise ValueError(f"cannot update job fields {sorted(unknown)}")
        names = list(fields)
        sets = ", ".join(f"{n} = ?" for n in names + ["updated_at"])
        changed = self._run(
            f"UPDATE jobs SET {sets} WHERE id = ? AND {_ACTIVE}",
            (*(fields[n] for n in names), self.now(), job_id),
        )
        return bool(changed)

    def get_job(self, job_id: str) -> JobRecord | None:
        if _NUL in job_id:
            return None
        row = self._run(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,), "one"
        )
        return None if row is None else self._job(row)

    def active_job(self, request_hash: str) -> JobRecord | None:
        row = self._run(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE request_hash = ? AND {_ACTIVE}",
            (request_hash,),
            "one",
        )
        return None if row is None else self._job(row)

    def list_jobs(self, limit: int) -> list[JobRecord]:
        rows = self._run(
            f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY created_at DESC, id LIMIT ?",
            (limit,),
            "all",
        )
        return [self._job(r) for r in rows]

    @staticmethod
    def _job(row: Any) -> JobRecord:
        return JobRecord(
            id=row[0],
            request_hash=row[1],
            status=row[2],
            phase=row[3],
            progress=float(row[4]),
            created_at=float(row[5]),
            updated_at=float(row[6]),
            instance=row[7],
            request=json.loads(row[8]),
            error=row[9],
            plan_id=row[10],
        )

    def heartbeat(self, instance: str, job_ids: list[str]) -> set[str]:
        self._run(
            f"UPDATE jobs SET updated_at = ? WHERE instance = ? AND {_ACTIVE}",
            (self.now(), instance),
            maintenance=True,
        )
        if not job_ids:
            return set()
        marks = ", ".join("?" for _ in job_ids)
        rows = self._run(
            f"SELECT id FROM jobs WHERE id IN ({marks}) AND NOT {_ACTIVE}",
            tuple(job_ids),
            "all",
            maintenance=True,
        )
        return {str(r[0]) for r in rows}

    def reap_stale_jobs(self, stale_before: float, message: str) -> int:
        # One conditional UPDATE: two reapers at once change each row once
        # (the second re-checks the status after the first commits).
        changed = self._run(
            "UPDATE jobs SET status = 'failed', phase = 'failed', progress = 0, "
            f"error = ?, updated_at = ? WHERE {_ACTIVE} AND updated_at < ?",
            (message, self.now(), stale_before),
            maintenance=True,
        )
        return int(changed)

    def cancel_job(self, job_id: str, message: str) -> bool:
        return self.update_job(
            job_id,
            status=JobStatus.CANCELLED,
            phase="cancelled",
            progress=0.0,
            error=message,
        )

    def schema_version(self) -> int:
        row = self._run(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version", (), "one"
        )
        return int(row[0])

    def ping(self, timeout_s: float = 1.0) -> bool:
        try:
            return bool(self._run("SELECT 1", (), "one", timeout_s=timeout_s)[0] == 1)
        except Exception:  # any driver error means "not answering"
            return False


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "BoundedPool", "SqlStore", "UNFINISHED"]
