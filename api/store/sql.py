"""The SQL both stores run: written with ``?`` placeholders, one connection per
thread (both sqlite3 and psycopg connections are per-thread objects here), in
autocommit mode so that every write is durable when the call returns."""

from __future__ import annotations

import abc
import json
import threading
import time
from typing import Any

from api.store.base import UNFINISHED, JobRecord, PlanRecord, Store

SCHEMA = (
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
)

_JOB_COLUMNS = (
    "id, request_hash, status, phase, progress, created_at, updated_at, instance, "
    "request, error, plan_id"
)
_UPDATABLE = ("status", "phase", "progress", "error", "plan_id")


class SqlStore(Store):
    """A :class:`Store` over a DB-API connection factory."""

    #: the driver's placeholder ("?" for sqlite3, "%s" for psycopg)
    placeholder = "?"

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    @abc.abstractmethod
    def _connect(self) -> Any:
        """A new autocommit connection."""

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise RuntimeError("the store is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        cur = self._conn().cursor()
        cur.execute(self._sql(sql), params)
        return cur

    def create_schema(self) -> None:
        for statement in SCHEMA:
            self._execute(statement)

    # -- graphs ---------------------------------------------------------------------------
    def put_graph(self, graph_hash: str, name: str, graph_json: str) -> None:
        self._execute(
            "INSERT INTO graphs (hash, name, created_at, doc) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (hash) DO NOTHING",
            (graph_hash, name, time.time(), graph_json),
        )

    def get_graph(self, graph_hash: str) -> str | None:
        row = self._execute(
            "SELECT doc FROM graphs WHERE hash = ?", (graph_hash,)
        ).fetchone()
        return None if row is None else str(row[0])

    # -- plans ----------------------------------------------------------------------------
    def put_plan(self, record: PlanRecord) -> PlanRecord:
        self._execute(
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
        return self._plan(
            self._execute(self._PLAN + "WHERE id = ?", (plan_id,)).fetchone()
        )

    def get_plan_by_hash(self, request_hash: str) -> PlanRecord | None:
        row = self._execute(
            self._PLAN + "WHERE request_hash = ?", (request_hash,)
        ).fetchone()
        return self._plan(row)

    def list_plans(self, limit: int, offset: int = 0) -> tuple[list[PlanRecord], int]:
        rows = self._execute(
            "SELECT id, request_hash, created_at, graph_hash, summary, '' FROM plans "
            "ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
            (limit, offset),
        ).fetchall()
        total = self._execute("SELECT COUNT(*) FROM plans").fetchone()[0]
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

    # -- jobs -----------------------------------------------------------------------------
    def create_job(self, job: JobRecord) -> None:
        self._execute(
            f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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

    def update_job(self, job_id: str, **fields: Any) -> None:
        unknown = set(fields) - set(_UPDATABLE)
        if unknown:
            raise ValueError(f"cannot update job fields {sorted(unknown)}")
        names = list(fields)
        sets = ", ".join(f"{n} = ?" for n in names + ["updated_at"])
        self._execute(
            f"UPDATE jobs SET {sets} WHERE id = ?",
            (*(fields[n] for n in names), time.time(), job_id),
        )

    def get_job(self, job_id: str) -> JobRecord | None:
        row = self._execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        return None if row is None else self._job(row)

    def list_jobs(self, limit: int) -> list[JobRecord]:
        rows = self._execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY created_at DESC, id LIMIT ?",
            (limit,),
        ).fetchall()
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

    def heartbeat(self, job_ids: list[str]) -> None:
        now = time.time()
        for job_id in job_ids:
            self._execute(
                "UPDATE jobs SET updated_at = ? WHERE id = ? AND status IN (?, ?)",
                (now, job_id, *UNFINISHED),
            )

    def fail_unfinished_jobs(
        self, instance: str, stale_before: float, message: str
    ) -> int:
        cur = self._execute(
            "UPDATE jobs SET status = 'failed', phase = 'failed', error = ?, "
            "updated_at = ? WHERE status IN (?, ?) AND (instance = ? OR updated_at < ?)",
            (message, time.time(), *UNFINISHED, instance, stale_before),
        )
        return int(cur.rowcount)

    def ping(self) -> bool:
        try:
            return bool(self._execute("SELECT 1").fetchone()[0] == 1)
        except Exception:  # any driver error means "not answering"
            return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except Exception:  # pragma: no cover - closing is best effort
                pass
