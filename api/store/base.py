"""The store interface: plans (cached by request hash), graphs, and jobs.

Two implementations share the SQL (:mod:`api.store.sql`): SQLite, one file
in WAL mode (the default), and PostgreSQL (several service replicas).  Every
method is safe to call from many threads; each call borrows a connection from
a bounded pool and returns it before it returns, and writes are durable when
they return, so a restart loses nothing.

Jobs belong to the replica that runs them (``JobRecord.instance``, a replica
id unique to one start of one process).  The owner refreshes its unfinished
jobs' ``updated_at`` (the heartbeat); any replica's reaper marks failed the
unfinished jobs whose heartbeat is older than a bound (their owner died).
Every change of a job's state is a conditional UPDATE on an unfinished job,
so a job finishes exactly once: whoever changes it first (owner, reaper or a
cancel on another replica) wins, and the others' updates are no-ops.
"""

from __future__ import annotations

import abc
import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobStatus(StrEnum):
    """Where a job is.  A ``StrEnum``: the store keeps the strings, and rows
    read back compare equal to the members."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Jobs in these states have not finished.
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING)


class StoreUnavailable(Exception):
    """The database cannot serve this call now: every pooled connection stayed
    busy for the pool's timeout, or the database did not answer.  The service
    answers 503 with ``Retry-After``; the next call may well succeed.  The
    message names no host, port or credential."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class PlanRecord:
    """A stored plan: the summary columns and the plan's JSON text."""

    id: str
    request_hash: str
    created_at: float
    graph_hash: str
    summary: dict[str, Any]
    plan_json: str = ""  # empty in listings

    @property
    def plan(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.plan_json)
        return value


@dataclass(frozen=True)
class JobRecord:
    """A job row.  ``request`` is the plan request without its graph (the
    graph is in the graphs table under ``request['graph_hash']``);
    ``instance`` is the owning replica's id."""

    id: str
    request_hash: str
    status: str  # a JobStatus (canonicalized)
    phase: str
    progress: float
    created_at: float
    updated_at: float
    instance: str
    request: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    plan_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED


@dataclass(frozen=True)
class MeasurementRecord:
    """A measured training step of a stored plan on some hardware profile:
    ``measured_s`` next to what the plan predicted (``predicted_s``);
    ``detail`` holds the rest (backend, layout, steps, per-op profile)."""

    id: str
    plan_id: str
    hardware: str
    backend: str
    measured_s: float
    predicted_s: float
    created_at: float
    detail: dict[str, Any] = field(default_factory=dict)


class Store(abc.ABC):
    """Where plans, graphs and jobs live."""

    #: "sqlite" or "postgresql"
    kind: str = ""

    @abc.abstractmethod
    def put_graph(self, graph_hash: str, name: str, graph_json: str) -> None:
        """Stores a graph document (a no-op if that hash is stored)."""

    @abc.abstractmethod
    def get_graph(self, graph_hash: str) -> str | None:
        """The graph document's JSON text, or None."""

    @abc.abstractmethod
    def put_plan(self, record: PlanRecord) -> PlanRecord:
        """Stores a plan; if one with the same request hash exists (another
        replica solved it first), returns that one instead."""

    @abc.abstractmethod
    def get_plan(self, plan_id: str) -> PlanRecord | None: ...

    @abc.abstractmethod
    def get_plan_by_hash(self, request_hash: str) -> PlanRecord | None: ...

    @abc.abstractmethod
    def list_plans(self, limit: int, offset: int = 0) -> tuple[list[PlanRecord], int]:
        """Newest first, without plan_json; and the total count."""

    @abc.abstractmethod
    def put_scale_plan(self, record: PlanRecord) -> PlanRecord:
        """Stores a scale plan (``graph_hash`` unused); if one with the same
        request hash exists, returns that one instead."""

    @abc.abstractmethod
    def get_scale_plan(self, plan_id: str) -> PlanRecord | None: ...

    @abc.abstractmethod
    def get_scale_plan_by_hash(self, request_hash: str) -> PlanRecord | None: ...

    @abc.abstractmethod
    def list_scale_plans(
        self, limit: int, offset: int = 0
    ) -> tuple[list[PlanRecord], int]:
        """Newest first, without plan_json; and the total count."""

    @abc.abstractmethod
    def create_job(self, job: JobRecord) -> JobRecord:
        """Stores ``job`` and returns it; but if ``job`` is unfinished and an
        unfinished job for the same request hash exists (on any replica),
        stores nothing and returns that one: one request, one solve."""

    @abc.abstractmethod
    def update_job(self, job_id: str, **fields: Any) -> bool:
        """Sets ``status``, ``phase``, ``progress``, ``error``, ``plan_id``
        (and ``updated_at`` to now) of an *unfinished* job; False (and nothing
        changed) if the job has finished, e.g. was reaped or cancelled."""

    @abc.abstractmethod
    def get_job(self, job_id: str) -> JobRecord | None: ...

    @abc.abstractmethod
    def active_job(self, request_hash: str) -> JobRecord | None:
        """The unfinished job for this request hash, if any."""

    @abc.abstractmethod
    def list_jobs(self, limit: int) -> list[JobRecord]:
        """Newest first."""

    @abc.abstractmethod
    def heartbeat(self, instance: str, job_ids: list[str]) -> set[str]:
        """Marks ``instance``'s unfinished jobs alive (updated_at = now) and
        returns which of ``job_ids`` (the jobs it runs) have finished in the
        store meanwhile: cancelled from another replica, or reaped."""

    @abc.abstractmethod
    def reap_stale_jobs(self, stale_before: float, message: str) -> int:
        """Marks failed, with ``message``, every unfinished job whose last
        heartbeat is older than ``stale_before`` (its replica died); returns
        how many.  Safe to run on every replica at once: each job is reaped
        once."""

    @abc.abstractmethod
    def cancel_job(self, job_id: str, message: str) -> bool:
        """Marks an unfinished job cancelled (its owner stops the solve at its
        next heartbeat); False if it had finished."""

    @abc.abstractmethod
    def put_measurement(self, record: MeasurementRecord) -> None:
        """Stores a measured step (ids are unique)."""

    @abc.abstractmethod
    def list_measurements(
        self,
        plan_id: str | None = None,
        hardware: str | None = None,
        limit: int = 100,
        backend: str | None = None,
    ) -> list[MeasurementRecord]:
        """Newest first, of one plan and/or one hardware profile and/or one
        backend."""

    @abc.abstractmethod
    def measurement_stamps(self) -> dict[tuple[str, str], tuple[int, float]]:
        """``(hardware, backend) -> (count, newest created_at)`` of the stored
        measurements: what changes whenever one is added (one cheap query,
        so a replica can tell that a refitted profile is out of date)."""

    def now(self) -> float:
        """Seconds since the epoch on the store's clock (the database server's,
        for PostgreSQL), for every time written into or compared with job
        rows, so that replicas on hosts whose clocks disagree agree on which
        heartbeat is stale."""
        return time.time()

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The highest migration applied to the database."""

    @abc.abstractmethod
    def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether the database answers within ``timeout_s``."""

    @abc.abstractmethod
    def close(self) -> None: ...
