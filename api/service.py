"""The planner service's logic, under the routes: cache, jobs, evaluation.

A plan request becomes a :class:`~api.planning.PlanSpec` with a content
hash.  A stored plan with that hash is the answer (a cache hit, no solve).
Otherwise a job is created (a row in the store), its solve goes to the
:class:`~api.workers.WorkerPool`, and when the worker answers, the plan is
stored and the job marked done.  An identical request arriving while the
first is being solved joins that job instead of solving twice, on this
replica or on another one (a unique index on unfinished jobs' request hash;
the joiner watches the other replica's job through the store).  A scale-plan
request (a :class:`~api.scale_planning.ScaleSpec`) takes the same path
without a graph: its job (``kind: "scale"``) reports ``plan_transformer``'s
progress, can be cancelled, stores a scale plan, and is stopped past
``max_time_limit_s``.  A preset named by either request is planned refitted
from the store's measurements unless the request opts out
(:mod:`api.learned`).

Every replica runs a maintenance thread: it refreshes the heartbeat of the
jobs it owns, stops its solves that another replica cancelled, and reaps
(marks failed) any replica's unfinished job whose heartbeat is older than
``stale_job_s``, so the jobs of a replica that died never stay "running".
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

from api.learned import REFITTED, LearnedProfiles
from api.metrics import Metrics
from api.planning import (
    PlanSpec,
    RequestError,
    load_graph,
    parse_hardware,
    parse_mesh,
    plan_spec,
)
from api.scale_planning import ScaleSpec, scale_record, scale_spec
from api.scale_schemas import ScalePlanRequest
from api.schemas import EvaluateRequest, PlanRequest
from api.settings import Settings
from api.store import JobRecord, PlanRecord, Store, StoreUnavailable
from api.store.base import JobStatus
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

__all__ = ["JobFinished", "JobSpec", "PlannerService", "QueueFull", "RunTooLong", "iso"]

#: What a job plans: a layout plan of a graph, or a Transformer's scale plan.
JobSpec = PlanSpec | ScaleSpec


class JobFinished(Exception):
    """A job cannot be cancelled: it finished already."""


class RunTooLong(Exception):
    """The job ran past the service's cap on one run and was stopped."""


#: Why a scale job was stopped (``max_time_limit_s``).
TOO_LONG_MESSAGE = (
    "the scale plan did not finish within {s:g} s (the service's "
    "max_time_limit_s); fix stages, tensor, micro_batches or recompute to "
    "try fewer meshes, or lower time_limit_s"
)


def profile_hint(spec: JobSpec, error: TaskInvalid) -> TaskInvalid:
    """The planner's refusal of a plan made with a preset refitted from
    measurements, saying so: the measurements, not the graph, may be what
    makes a layout "too slow" to plan."""
    if isinstance(spec, PlanSpec) and spec.profile.source == REFITTED:
        return TaskInvalid(
            f"{error} (planned with {spec.profile.text}; send "
            '"use_measurements": false to plan with the base profile)'
        )
    return error


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
        "profile": spec_info["profile"],
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


def job_kind(job: JobRecord) -> str:
    """``"scale"`` for a scale plan's job, else ``"plan"``."""
    return "scale" if job.request.get("kind") == "scale" else "plan"


def result_path(kind: str, plan_id: str) -> str:
    """Where a job's finished plan is, under /v1 (and, without it, on the
    dashboard)."""
    return f"/{'scale-plans' if kind == 'scale' else 'plans'}/{plan_id}"


def job_dict(job: JobRecord) -> dict[str, Any]:
    """``JobOut``."""
    kind = job_kind(job)
    return {
        "id": job.id,
        "kind": kind,
        "result_url": None
        if job.plan_id is None
        else "/v1" + result_path(kind, job.plan_id),
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
    """Request -> the cached ``PlanOut`` bytes, in memory: each body once,
    under its canonical request's hash (LRU, at most ``max_bytes`` of bodies),
    and the digests of the exact request bytes that asked for it as aliases
    (LRU, at most ``max_aliases``; a few dozen bytes each).

    Stored plans never change, and the same bytes mean the same request until
    new measurements change the profile a preset is planned with (then
    :attr:`epoch` changes, and with it every key of request bytes), so a
    repeated request skips parsing, hashing and the database:
    the hot path of a CI fleet asking for the same plan again and again.  The
    same request in other bytes (keys in another order, other spacing, a mesh
    written ``{"x": 2}`` instead of ``"x:2"``, a default spelled out) is
    parsed and hashed, then answered from memory too, without the database.
    """

    def __init__(self, max_bytes: int, max_aliases: int = 100_000) -> None:
        #: Salts :meth:`key`: the same bytes may ask for another plan once new
        #: measurements change the profile they are planned with
        #: (``LearnedProfiles.epoch``).
        self.epoch = b""
        self.max_bytes = max_bytes
        self.max_aliases = max_aliases
        self._bytes = 0
        self._bodies: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._aliases: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._plans: dict[str, str] = {}  # plan id -> request hash, for GET
        self._lock = threading.Lock()

    def key(self, raw: bytes) -> bytes:
        """The key of these exact request bytes under the current measurements."""
        return hashlib.sha256(self.epoch + raw).digest()

    def get(self, key: bytes) -> bytes | None:
        """The body for request bytes seen before (by :meth:`key`)."""
        with self._lock:
            request_hash = self._aliases.get(key)
            if request_hash is None:
                return None
            self._aliases.move_to_end(key)
            return self._touch(request_hash)

    def get_request(self, request_hash: str) -> bytes | None:
        """The body for a canonical request, in whatever bytes it came."""
        with self._lock:
            return self._touch(request_hash)

    def get_plan(self, plan_id: str) -> bytes | None:
        """The body of the stored plan ``plan_id`` (GET /v1/plans/{id})."""
        with self._lock:
            request_hash = self._plans.get(plan_id)
            return None if request_hash is None else self._touch(request_hash)

    def _touch(self, request_hash: str) -> bytes | None:
        body = self._bodies.get(request_hash)
        if body is not None:
            self._bodies.move_to_end(request_hash)
        return body

    def alias(self, key: bytes, request_hash: str) -> None:
        """Remembers that the bytes whose key is ``key`` ask for ``request_hash``."""
        with self._lock:
            self._alias(key, request_hash)

    def _alias(self, key: bytes, request_hash: str) -> None:
        self._aliases[key] = request_hash
        self._aliases.move_to_end(key)
        while len(self._aliases) > self.max_aliases:
            self._aliases.popitem(last=False)

    def put(
        self, key: bytes | None, request_hash: str, body: bytes, plan_id: str
    ) -> None:
        """Keeps ``body``, the cached ``PlanOut`` of plan ``plan_id``, for the
        request ``request_hash``, asked for in the bytes whose key is ``key``
        (None: by the plan's id)."""
        if len(body) > self.max_bytes // 4:
            return  # one huge plan must not flush everything else
        with self._lock:
            if request_hash not in self._bodies:
                self._bodies[request_hash] = body
                self._bytes += len(body)
                while self._bytes > self.max_bytes:
                    _, old = self._bodies.popitem(last=False)
                    self._bytes -= len(old)
            self._plans[plan_id] = request_hash
            if len(self._plans) > self.max_aliases:
                self._plans.clear()  # ids of gone bodies: cheap to relearn
            if key is not None:
                self._alias(key, request_hash)


#: Why a reaped job failed (its replica stopped sending heartbeats).
STALE_MESSAGE = (
    "the planner service replica running this job stopped before it finished "
    "(no heartbeat for {s:g} s); submit it again"
)


class PlannerService:
    """Owns the store, the worker pool and the metrics of one app."""

    def __init__(self, settings: Settings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        #: owner of this replica's jobs: unique to this start of this process
        #: (two replicas on one host, or a recreated container, never share it)
        self.replica_id = f"{settings.instance_name}/{uuid.uuid4().hex}"
        self.pool = WorkerPool(settings.workers, settings.queue_size)
        self.responses = ResponseCache(settings.response_cache_bytes)
        self.learned = LearnedProfiles(store)
        self._lock = threading.Lock()
        self._inflight: dict[str, str] = {}  # request hash -> job id
        self._futures: dict[str, concurrent.futures.Future[PlanRecord]] = {}
        self._running: set[str] = set()
        # Runs with a cap (scale plans): their timers, and those stopped by one.
        self._timers: dict[str, threading.Timer] = {}
        self._too_long: dict[str, float] = {}
        # Other replicas' jobs that requests here wait for: id -> its future.
        self._watched: dict[str, concurrent.futures.Future[PlanRecord]] = {}
        self._watch_lock = threading.Lock()
        self._stop = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintain, daemon=True, name="jobs-maintenance"
        )
        self.last_maintenance = 0.0  # time.time() of the last good round
        metrics.track(lambda: self.pool.queue_depth, lambda: self.pool.running)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> int:
        """Reaps dead replicas' jobs once, starts the workers and the
        maintenance thread.  Returns how many jobs were reaped."""
        reaped = self.reap()
        self.refresh_measurements()
        self.pool.start()
        self._maintenance.start()
        log.info("replica %s started", self.replica_id)
        return reaped

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()
        self.pool.shutdown()
        with self._watch_lock:
            watched, self._watched = dict(self._watched), {}
        for fut in watched.values():
            if not fut.done():
                fut.set_exception(TaskCancelled("the service is shutting down"))
        if self._maintenance.is_alive():
            self._maintenance.join(timeout=5)
        self.store.close()

    def reap(self) -> int:
        """Marks failed every unfinished job (of any replica) whose heartbeat
        is older than ``stale_job_s``; returns how many."""
        stale_s = self.settings.stale_job_s
        n = self.store.reap_stale_jobs(
            self.store.now() - stale_s, STALE_MESSAGE.format(s=stale_s)
        )
        if n:
            log.warning("marked %d job(s) of stopped replicas failed", n)
        return n

    def _maintain(self) -> None:
        """Heartbeats and reaping every ``heartbeat_s``; other replicas' jobs
        that requests here wait for, every 0.2 s."""
        next_beat = 0.0
        while not self._stop.wait(min(0.2, self.settings.heartbeat_s)):
            try:
                if self._watched:
                    self._poll_watched()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.heartbeat_s
                    self._beat()
                    self.reap()
                    self.refresh_measurements()
                    self.last_maintenance = time.time()
            except StoreUnavailable as e:  # busy or down: next round
                log.warning("job maintenance skipped a round: %s", e)
            except Exception:  # a bug must not stop the heartbeats
                log.exception("job maintenance failed; retrying")

    def _beat(self) -> None:
        with self._lock:
            mine = list(self._futures)  # queued or running here
        finished = self.store.heartbeat(self.replica_id, mine)
        for job_id in finished:  # cancelled elsewhere, or reaped
            if self.pool.cancel(job_id):
                log.info("stopped job %s: it finished in the store", job_id)

    def _poll_watched(self) -> None:
        with self._watch_lock:
            watched = list(self._watched.items())
        for job_id, fut in watched:
            job = self.store.get_job(job_id)
            if job is not None and not job.finished:
                continue
            with self._watch_lock:
                self._watched.pop(job_id, None)
            record = None
            if job is not None and job.status == JobStatus.DONE and job.plan_id:
                record = self.result_record(job_kind(job), job.plan_id)
            if record is not None:
                fut.set_result(record)
            elif job is not None and job.status == JobStatus.CANCELLED:
                fut.set_exception(TaskCancelled(job.error or "cancelled"))
            else:
                why = job.error if job is not None else "the job disappeared"
                fut.set_exception(TaskFailed(why or "the job failed"))

    def _watch(self, job_id: str) -> concurrent.futures.Future[PlanRecord]:
        # Its own lock: submit() calls this holding self._lock.
        with self._watch_lock:
            fut = self._watched.get(job_id)
            if fut is None:
                fut = self._watched[job_id] = concurrent.futures.Future()
            return fut

    # -- measurements ---------------------------------------------------------------------
    def refresh_measurements(self) -> None:
        """Reads the store's measurement stamps (``LearnedProfiles``); when
        they changed, request bytes answered before are parsed again."""
        if self.learned.refresh():
            self.responses.epoch = self.learned.epoch

    def spec_is_cheap(self, hardware: object, backend: str) -> bool:
        """Whether making the spec of a request with this ``hardware`` and
        ``backend`` reads nothing from the store (a refit known already)."""
        return not isinstance(hardware, str) or self.learned.warm(hardware, backend)

    # -- plans ----------------------------------------------------------------------------
    def spec(self, req: PlanRequest) -> PlanSpec:
        return plan_spec(req, self.settings, self.learned.profile)

    def scale_spec(self, req: ScalePlanRequest) -> ScaleSpec:
        return scale_spec(req, self.settings, self.learned.profile)

    def stored(self, spec: JobSpec) -> PlanRecord | None:
        """The stored plan (or scale plan) of this request, if any."""
        if isinstance(spec, ScaleSpec):
            return self.store.get_scale_plan_by_hash(spec.request_hash)
        return self.store.get_plan_by_hash(spec.request_hash)

    def result_record(self, kind: str, plan_id: str) -> PlanRecord | None:
        """A job's finished plan: a scale plan when ``kind`` is ``"scale"``."""
        if kind == "scale":
            return self.store.get_scale_plan(plan_id)
        return self.store.get_plan(plan_id)

    def answer_from_memory(self, spec: PlanSpec, key: bytes) -> bytes | None:
        """The cached ``PlanOut`` of this canonical request, if this replica
        answered it before (in any bytes); remembered under ``key`` too."""
        body = self.responses.get_request(spec.request_hash)
        if body is not None:
            self.metrics.cache_hits.inc()
            self.responses.alias(key, spec.request_hash)
        return body

    def remember(self, key: bytes, record: PlanRecord) -> bytes:
        """The cached ``PlanOut`` of a stored plan, kept in memory under the
        request's bytes (``key``), its hash and the plan's id."""
        body = plan_body(record, cached=True)
        self.responses.put(key, record.request_hash, body, record.id)
        return body

    def plan_body(self, plan_id: str) -> bytes | None:
        """GET /v1/plans/{id}: from memory, else from the store (then kept)."""
        body = self.responses.get_plan(plan_id)
        if body is None:
            record = self.store.get_plan(plan_id)
            if record is None:
                return None
            body = plan_body(record, cached=True)
            self.responses.put(None, record.request_hash, body, record.id)
        return body

    def cached(self, spec: PlanSpec) -> PlanRecord | None:
        record = self.store.get_plan_by_hash(spec.request_hash)
        (self.metrics.cache_hits if record else self.metrics.cache_misses).inc()
        return record

    def validate(self, spec: PlanSpec) -> None:
        """Loads the graph here, so that a bad one is a 422 now, not a failed job."""
        load_graph(json.loads(spec.graph_json), self.settings)

    def submit(
        self, spec: JobSpec
    ) -> tuple[JobRecord, concurrent.futures.Future[PlanRecord] | None]:
        """A job for ``spec`` (the one already solving it, here or on another
        replica, or a new one) and the future of its plan (a scale plan for a
        ``ScaleSpec``), taken before the job can finish (None only when
        joining a job that finished meanwhile).  Raises QueueFull when the
        queue is full.  A scale plan's run is stopped past
        ``max_time_limit_s`` (the future raises RunTooLong)."""
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
            if isinstance(spec, PlanSpec):
                self.store.put_graph(spec.graph_hash, spec.graph_name, spec.graph_json)
            job = self._new_job(spec)
            stored = self.store.create_job(job)
            if stored.id != job.id and self._stale(stored):
                self.reap()  # its replica died: take the request over
                stored = self.store.create_job(job)
            if stored.id != job.id:  # another replica is solving it
                return stored, self._watch(stored.id)
            # It may have been stored since this request missed the cache.
            record = self.stored(spec)
            if record is not None:
                self.store.update_job(
                    job.id,
                    status=JobStatus.DONE,
                    phase="done (cached)",
                    progress=1.0,
                    plan_id=record.id,
                )
                done: concurrent.futures.Future[PlanRecord] = (
                    concurrent.futures.Future()
                )
                done.set_result(record)
                return self.store.get_job(job.id) or job, done
            done = concurrent.futures.Future()
            cap = (
                self.settings.max_time_limit_s if isinstance(spec, ScaleSpec) else None
            )
            try:
                fut = self.pool.submit(
                    job.id,
                    spec.task(self.settings.solver_threads),
                    on_start=lambda: self._started(job.id, cap),
                    on_progress=lambda phase, frac: self._progress(job.id, phase, frac),
                )
            except QueueFull as e:
                self.store.update_job(
                    job.id, status=JobStatus.FAILED, phase="failed", error=str(e)
                )
                raise
            self._inflight[spec.request_hash] = job.id
            self._futures[job.id] = done
        fut.add_done_callback(lambda f: self._finished(job, spec, f, done))
        return job, done

    def _new_job(self, spec: JobSpec, **fields: Any) -> JobRecord:
        """A queued job of this replica for ``spec``; ``fields`` override."""
        now = self.store.now()
        values: dict[str, Any] = {
            "id": uuid.uuid4().hex[:16],
            "request_hash": spec.request_hash,
            "status": JobStatus.QUEUED,
            "phase": "queued",
            "progress": 0.0,
            "created_at": now,
            "updated_at": now,
            "instance": self.replica_id,
            "request": spec.describe(),
        }
        values.update(fields)
        return JobRecord(**values)

    def cached_job(self, spec: PlanSpec, record: PlanRecord) -> JobRecord:
        """A job row that is done already, for a request whose plan is stored
        (POST /v1/jobs), so that clients poll one way."""
        job = self._new_job(
            spec,
            id="c" + uuid.uuid4().hex[:15],
            status=JobStatus.DONE,
            phase="done (cached)",
            progress=1.0,
            plan_id=record.id,
        )
        self.store.create_job(job)
        return job

    def _stale(self, job: JobRecord) -> bool:
        return job.updated_at < self.store.now() - self.settings.stale_job_s

    def future(self, job_id: str) -> concurrent.futures.Future[PlanRecord] | None:
        """Resolves to the job's plan (or raises why not); None once finished."""
        with self._lock:
            return self._futures.get(job_id)

    def _started(self, job_id: str, cap_s: float | None = None) -> None:
        with self._lock:
            self._running.add(job_id)
            if cap_s is not None:
                timer = threading.Timer(cap_s, self._overran, (job_id, cap_s))
                timer.daemon = True
                self._timers[job_id] = timer
                timer.start()
        self._progress(job_id, "starting", 0.05, status=JobStatus.RUNNING)

    def _overran(self, job_id: str, cap_s: float) -> None:
        """A capped run went past its cap: stop it (``_finished`` says why)."""
        with self._lock:
            if job_id not in self._futures:
                return  # finished meanwhile
            self._too_long[job_id] = cap_s
        log.info("job %s ran past its cap of %g s; stopping it", job_id, cap_s)
        self.pool.cancel(job_id)

    def _progress(
        self, job_id: str, phase: str, fraction: float, status: str | None = None
    ) -> None:
        fields: dict[str, Any] = {"phase": phase, "progress": fraction}
        if status is not None:
            fields["status"] = status
        try:
            still_mine = self.store.update_job(job_id, **fields)
        except StoreUnavailable:
            return  # progress is advisory; the heartbeat keeps the job alive
        if not still_mine:  # cancelled from another replica, or reaped
            self.pool.cancel(job_id)

    def _finished(
        self,
        job: JobRecord,
        spec: JobSpec,
        fut: concurrent.futures.Future[Any],
        done: concurrent.futures.Future[PlanRecord],
    ) -> None:
        try:
            try:
                result = fut.result()
            except TaskCancelled as e:
                with self._lock:
                    cap_s = self._too_long.get(job.id)
                if cap_s is not None:
                    why = TOO_LONG_MESSAGE.format(s=cap_s)
                    self._close_job(job.id, spec, JobStatus.FAILED, why)
                    done.set_exception(RunTooLong(why))
                    return
                self._close_job(job.id, spec, JobStatus.CANCELLED, str(e))
                done.set_exception(e)
                return
            except (TaskInvalid, TaskFailed) as e:
                if isinstance(e, TaskInvalid):
                    e = profile_hint(spec, e)
                self._close_job(job.id, spec, JobStatus.FAILED, str(e))
                done.set_exception(e)
                return
            self.metrics.solve.observe(result["solve_time_s"])
            record = self._store_result(spec, result)
            self._close_job(job.id, spec, JobStatus.DONE, None, plan_id=record.id)
            done.set_result(record)
        except Exception:  # storing failed: report it, never lose the waiter
            error_id = uuid.uuid4().hex[:12]
            log.exception("finishing job %s failed [error id %s]", job.id, error_id)
            if not done.done():
                why = f"storing the plan failed (error id {error_id}); submit it again"
                try:
                    self._close_job(job.id, spec, JobStatus.FAILED, why)
                finally:
                    done.set_exception(TaskFailed(why))

    def _store_result(self, spec: JobSpec, result: dict[str, Any]) -> PlanRecord:
        """Stores a worker's result as the plan (or scale plan) of ``spec``;
        the one stored first when another replica stored it already."""
        if isinstance(spec, ScaleSpec):
            return self.store.put_scale_plan(scale_record(spec, result))
        plan = result["plan"]
        return self.store.put_plan(
            PlanRecord(
                id=spec.request_hash[:16],
                request_hash=spec.request_hash,
                created_at=time.time(),
                graph_hash=spec.graph_hash,
                summary=plan_summary(spec.describe(), plan, result["solve_time_s"]),
                plan_json=json.dumps(plan, separators=(",", ":"), allow_nan=False),
            )
        )

    def _close_job(
        self,
        job_id: str,
        spec: JobSpec,
        status: str,
        error: str | None,
        plan_id: str | None = None,
    ) -> None:
        with self._lock:
            self._running.discard(job_id)
            self._futures.pop(job_id, None)
            self._too_long.pop(job_id, None)
            timer = self._timers.pop(job_id, None)
            if timer is not None:
                timer.cancel()
            if self._inflight.get(spec.request_hash) == job_id:
                del self._inflight[spec.request_hash]
        # A no-op if the job finished in the store already (cancelled from
        # another replica, or reaped): a job finishes once.
        self.store.update_job(
            job_id,
            status=status,
            phase=status,
            progress=1.0 if status == JobStatus.DONE else 0.0,
            error=error,
            plan_id=plan_id,
        )
        self.metrics.jobs.labels(status).inc()

    def cancel(self, job_id: str) -> JobRecord | None:
        """Cancels a queued or running job, on this replica or another (whose
        maintenance thread stops the solve); None if there is no such job;
        JobFinished if it has finished."""
        job = self.store.get_job(job_id)
        if job is None:
            return None
        if job.finished:
            raise JobFinished(
                f"job {job_id} is {job.status}; only queued or running jobs can be cancelled"
            )
        fut = self.future(job_id)
        if fut is not None and self.pool.cancel(job_id):
            try:
                fut.exception(timeout=10)
            except concurrent.futures.TimeoutError:  # pragma: no cover - a hung worker
                pass
        elif not self.store.cancel_job(job_id, f"job {job_id} was cancelled"):
            latest = self.store.get_job(job_id)
            raise JobFinished(
                f"job {job_id} is {latest.status if latest else 'gone'}; only queued "
                "or running jobs can be cancelled"
            )
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
