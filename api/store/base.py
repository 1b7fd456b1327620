"""The store interface: plans (cached by request hash), graphs, and jobs.

Two implementations share the SQL (:mod:`api.store.sql`): SQLite, one file
in WAL mode (the default), and PostgreSQL (several service replicas).  Every
method is safe to call from many threads; writes are durable when they
return, so a restart loses nothing.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from typing import Any

#: Jobs in these states have not finished.
UNFINISHED = ("queued", "running")


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
    graph is in the graphs table under ``request['graph_hash']``)."""

    id: str
    request_hash: str
    status: str
    phase: str
    progress: float
    created_at: float
    updated_at: float
    instance: str
    request: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    plan_id: str | None = None


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
    def create_job(self, job: JobRecord) -> None: ...

    @abc.abstractmethod
    def update_job(self, job_id: str, **fields: Any) -> None:
        """Sets ``status``, ``phase``, ``progress``, ``error``, ``plan_id``
        (and ``updated_at`` to now)."""

    @abc.abstractmethod
    def get_job(self, job_id: str) -> JobRecord | None: ...

    @abc.abstractmethod
    def list_jobs(self, limit: int) -> list[JobRecord]:
        """Newest first."""

    @abc.abstractmethod
    def heartbeat(self, job_ids: list[str]) -> None:
        """Marks this replica's queued and running jobs alive (updated_at = now)."""

    @abc.abstractmethod
    def fail_unfinished_jobs(
        self, instance: str, stale_before: float, message: str
    ) -> int:
        """Marks failed the queued or running jobs of ``instance`` (a restarted
        replica) and any job whose heartbeat is older than ``stale_before``
        (a replica that died); returns how many."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """Whether the database answers."""

    @abc.abstractmethod
    def close(self) -> None: ...
