"""The planner service's logic, under the routes: cache, jobs, evaluation.

A plan request becomes a :class:`~api.planning.PlanSpec` with a content
hash.  A stored plan with that hash is the answer (a cache hit, no solve).
Otherwise a job is created (a row in the store), its solve goes to the
:class:`~api.workers.WorkerPool`, and when the worker answers, the plan is
stored and the job marked done.  An identical request arriving while the
first is being solved joins that job instead of solving twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from api.metrics import Metrics
from api.planning import (
    PlanSpec,
    RequestError,
    load_graph,
    parse_hardware,
    parse_mesh,
    plan_spec,
)
from api.schemas import EvaluateRequest, PlanRequest
from api.settings import Settings
from api.store import JobRecord, PlanRecord, Store
from api.workers import (
    QueueFull,
    TaskCancelled,
    TaskFailed,
    TaskInvalid,
    WorkerPool,
)
from cost_models.costs import evaluate as evaluate_layout
from mtf_core.errors import LayoutError
from mtf_core.layout import convert_to_layout_rules
from mtf_core.serialization.schema import json_safe

log = logging.getLogger(__name__)

__all__ = ["JobFinished", "PlannerService", "QueueFull", "iso"]


class JobFinished(Exception):
    """A job cannot be cancelled: it finished already."""


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")


def plan_summary(
    spec_info: dict[str, Any], plan: dict[str, Any], solve_s: float
) -> dict[str, Any]:
    cost = plan["cost"]
    return {
        "graph_name": spec_info["graph_name"],
        "graph_hash": spec_info["graph_hash"],
        "mesh_shape": plan["mesh_shape"],
        "hardware": plan["hardware"]["name"],
        "objective": plan["objective"],
        "status": plan["status"],
        "layout_rules": plan["layout_rules"],
        "fits": bool(plan["fits"]),
        "time_s": float(cost["time_s"]),
        "peak_memory_bytes": int(cost["peak_memory_bytes"]),
        "memory_capacity_bytes": int(cost["memory_capacity_bytes"]),
        "solve_time_s": float(solve_s),
    }


def plan_header(record: PlanRecord) -> dict[str, Any]:
    """A plan's summary fields (``PlanSummary``)."""
    return {"id": record.id, "created_at": iso(record.created_at), **record.summary}


def plan_body(record: PlanRecord, cached: bool) -> bytes:
    """``PlanOut`` as JSON, splicing in the stored plan text unparsed (the
    cached path's cost is then one index lookup and one small dumps)."""
    head = plan_header(record)
    head["cached"] = cached
    head["request_hash"] = record.request_hash
    text = json.dumps(head, separators=(",", ":"))
    return (text[:-1] + ',"plan":' + record.plan_json + "}").encode()


def job_dict(job: JobRecord) -> dict[str, Any]:
    """``JobOut``."""
    return {
        "id": job.id,
        "status": job.status,
        "phase": job.phase,
        "progress": job.progress,
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "error": job.error,
        "plan_id": job.plan_id,
        "request": job.request,
    }


class ResponseCache:
    """Exact request bytes -> the cached ``PlanOut`` bytes, in memory (LRU,
    at most ``max_bytes`` of bodies).

    Stored plans never change, and the same bytes always mean the same
    request, so a repeated request skips parsing, hashing and the database:
    the hot path of a CI fleet asking for the same plan again and again.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        self._items: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(raw: bytes) -> bytes:
        return hashlib.sha256(raw).digest()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            body = self._items.get(key)
            if body is not None:
                self._items.move_to_end(key)
            return body

    def put(self, key: bytes, body: bytes) -> None:
        if len(body) > self.max_bytes // 4:
            return  # one huge plan must not flush everything else
        with self._lock:
            if key in self._items:
                return
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


class PlannerService:
    """Owns the store, the worker pool and the metrics of one app."""

    def __init__(self, settings: Settings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.pool = WorkerPool(settings.workers, settings.queue_size)
        self.responses = ResponseCache(settings.response_cache_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[str, str] = {}  # request hash -> job id
        self._futures: dict[str, concurrent.futures.Future[PlanRecord]] = {}
        self._running: set[str] = set()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, daemon=True, name="heartbeat"
        )
        metrics.track(lambda: self.pool.queue_depth, lambda: self.pool.running)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> int:
        """Fails the jobs a previous run of this replica left unfinished (and
        jobs of dead replicas); starts the workers.  Returns how many failed."""
        failed = self.store.fail_unfinished_jobs(
            self.settings.instance_name,
            time.time() - self.settings.stale_job_s,
            "the planner service stopped before this job finished; submit it again",
        )
        if failed:
            log.warning("marked %d unfinished job(s) of a previous run failed", failed)
        self.pool.start()
        self._heartbeat.start()
        return failed

    def stop(self) -> None:
        self._stop.set()
        self.pool.shutdown()
        self.store.close()

    def _beat(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            with self._lock:
                unfinished = list(self._futures)  # queued or running here
            if unfinished:
                try:
                    self.store.heartbeat(unfinished)
                except Exception:  # a database blip must not kill the thread
                    log.exception("heartbeat failed")

    # -- plans ----------------------------------------------------------------------------
    def spec(self, req: PlanRequest) -> PlanSpec:
        return plan_spec(req, self.settings)

    def cached(self, spec: PlanSpec) -> PlanRecord | None:
        record = self.store.get_plan_by_hash(spec.request_hash)
        (self.metrics.cache_hits if record else self.metrics.cache_misses).inc()
        return record

    def validate(self, spec: PlanSpec) -> None:
        """Loads the graph here, so that a bad one is a 422 now, not a failed job."""
        load_graph(json.loads(spec.graph_json), self.settings)

    def submit(
        self, spec: PlanSpec
    ) -> tuple[JobRecord, concurrent.futures.Future[PlanRecord] | None]:
        """A job for ``spec`` (the one already solving it, or a new one) and
        the future of its plan, taken before the job can finish (None only
        when joining a job that finished meanwhile).  Raises QueueFull when
        the queue is full."""
        with self._lock:
            job_id = self._inflight.get(spec.request_hash)
            if job_id is not None:
                job = self.store.get_job(job_id)
                if job is not None:
                    return job, self._futures.get(job_id)
            if self.pool.queue_depth >= self.settings.queue_size:
                raise QueueFull(
                    f"{self.pool.queue_depth} jobs are waiting (queue_size="
                    f"{self.settings.queue_size}); try again later"
                )
            self.store.put_graph(spec.graph_hash, spec.graph_name, spec.graph_json)
            now = time.time()
            job = JobRecord(
                id=uuid.uuid4().hex[:16],
                request_hash=spec.request_hash,
                status="queued",
                phase="queued",
                progress=0.0,
                created_at=now,
                updated_at=now,
                instance=self.settings.instance_name,
                request=spec.describe(),
            )
            self.store.create_job(job)
            done: concurrent.futures.Future[PlanRecord] = concurrent.futures.Future()
            try:
                fut = self.pool.submit(
                    job.id,
                    spec.task(self.settings.solver_threads),
                    on_start=lambda: self._started(job.id),
                    on_progress=lambda phase, frac: self.store.update_job(
                        job.id, phase=phase, progress=frac
                    ),
                )
            except QueueFull as e:
                self.store.update_job(
                    job.id, status="failed", phase="failed", error=str(e)
                )
                raise
            self._inflight[spec.request_hash] = job.id
            self._futures[job.id] = done
        fut.add_done_callback(lambda f: self._finished(job, spec, f, done))
        return job, done

    def future(self, job_id: str) -> concurrent.futures.Future[PlanRecord] | None:
        """Resolves to the job's plan (or raises why not); None once finished."""
        with self._lock:
            return self._futures.get(job_id)

    def _started(self, job_id: str) -> None:
        with self._lock:
            self._running.add(job_id)
        self.store.update_job(job_id, status="running", phase="starting", progress=0.05)

    def _finished(
        self,
        job: JobRecord,
        spec: PlanSpec,
        fut: concurrent.futures.Future[Any],
        done: concurrent.futures.Future[PlanRecord],
    ) -> None:
        try:
            try:
                result = fut.result()
            except TaskCancelled as e:
                self._close_job(job.id, spec, "cancelled", str(e))
                done.set_exception(e)
                return
            except (TaskInvalid, TaskFailed) as e:
                self._close_job(job.id, spec, "failed", str(e))
                done.set_exception(e)
                return
            self.metrics.solve.observe(result["solve_time_s"])
            plan = result["plan"]
            record = self.store.put_plan(
                PlanRecord(
                    id=spec.request_hash[:16],
                    request_hash=spec.request_hash,
                    created_at=time.time(),
                    graph_hash=spec.graph_hash,
                    summary=plan_summary(spec.describe(), plan, result["solve_time_s"]),
                    plan_json=json.dumps(plan, separators=(",", ":"), allow_nan=False),
                )
            )
            self._close_job(job.id, spec, "done", None, plan_id=record.id)
            done.set_result(record)
        except Exception as e:  # storing failed: report it, never lose the waiter
            log.exception("finishing job %s failed", job.id)
            if not done.done():
                self._close_job(job.id, spec, "failed", f"{type(e).__name__}: {e}")
                done.set_exception(TaskFailed(f"storing the plan failed: {e}"))

    def _close_job(
        self,
        job_id: str,
        spec: PlanSpec,
        status: str,
        error: str | None,
        plan_id: str | None = None,
    ) -> None:
        self.store.update_job(
            job_id,
            status=status,
            phase=status,
            progress=1.0 if status == "done" else 0.0,
            error=error,
            plan_id=plan_id,
        )
        self.metrics.jobs.labels(status).inc()
        with self._lock:
            self._running.discard(job_id)
            self._futures.pop(job_id, None)
            if self._inflight.get(spec.request_hash) == job_id:
                del self._inflight[spec.request_hash]

    def cancel(self, job_id: str) -> JobRecord | None:
        """Cancels a queued or running job; None if there is no such job;
        JobFinished if it has finished."""
        job = self.store.get_job(job_id)
        if job is None:
            return None
        if job.status not in ("queued", "running"):
            raise JobFinished(
                f"job {job_id} is {job.status}; only queued or running jobs can be cancelled"
            )
        fut = self.future(job_id)
        if not self.pool.cancel(job_id) or fut is None:
            # Another replica's job, or one that just finished.
            raise JobFinished(
                f"job {job_id} is not running on this replica ({job.instance})"
            )
        try:
            fut.exception(timeout=10)
        except concurrent.futures.TimeoutError:  # pragma: no cover - a hung worker
            pass
        return self.store.get_job(job_id)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, req: EvaluateRequest) -> dict[str, Any]:
        """Cost and validity of one layout (``EvaluateOut``)."""
        loaded = load_graph(req.graph, self.settings)
        mesh = parse_mesh(req.mesh_shape, self.settings)
        hw = parse_hardware(req.hardware)
        if req.memory_limit_bytes is not None:
            hw = hw.with_memory(req.memory_limit_bytes)
        rules = convert_to_layout_rules(
            req.layout_rules
            if isinstance(req.layout_rules, str)
            else ";".join(f"{k}:{v}" for k, v in req.layout_rules.items())
        )
        dims = {
            d.name
            for op in loaded.graph.operations
            for t in op.outputs
            for d in t.shape
        }
        axes = set(mesh.dimension_names)
        for dim, axis in rules.pairs:
            if dim not in dims:
                raise RequestError(
                    f"layout rule {dim}:{axis} names dimension {dim!r}, which no tensor "
                    f"of the graph has; the graph's dimensions are {sorted(dims)}"
                )
            if axis not in axes:
                raise RequestError(
                    f"layout rule {dim}:{axis} names mesh axis {axis!r}, which mesh "
                    f"[{mesh}] does not have; expected one of {sorted(axes)}"
                )
        try:
            cost = evaluate_layout(loaded.graph, mesh, rules, hw, loaded.outputs)
        except LayoutError as e:
            return {"valid": False, "reason": str(e), "fits": None, "cost": None}
        return {
            "valid": True,
            "reason": None,
            "fits": cost.fits,
            "cost": json_safe(cost.to_dict(), "cost"),
        }
