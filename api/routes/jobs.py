"""``/v1/jobs``: plans solved off the request path, with progress and cancel.

A job plans a graph's layout (``kind: "plan"``: POST /v1/plans or /v1/jobs)
or a Transformer at scale (``kind: "scale"``: POST /v1/scale-plans); both
run on the same workers, with the same progress, cancel, one job per request
across replicas, and heartbeats (:class:`api.service.PlannerService`).
:func:`answer_job` is how a POST that started (or joined) a job answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import JsonBody, ServiceDep, WriteAccess, json_request_body, parse_body
from api.errors import error_response, opaque_error, quoted
from api.routes import error_responses
from api.schemas import JobList, JobOut, PlanRequest
from api.service import (
    JobFinished,
    PlannerService,
    QueueFull,
    RunTooLong,
    job_dict,
    job_kind,
)
from api.store import JobRecord, PlanRecord
from api.store.base import JobStatus
from api.workers import TaskCancelled, TaskInvalid

router = APIRouter(prefix="/v1", tags=["jobs"])


async def answer_job(
    service: PlannerService,
    job: JobRecord,
    fut: concurrent.futures.Future[PlanRecord] | None,
    wait_s: float,
    where: str,
) -> tuple[PlanRecord, bool] | Response:
    """What a POST that submitted (or joined) ``job`` answers: the plan and
    whether it was stored before (``cached``) when the job finishes within
    ``wait_s``; a 4xx or 503 when it failed (422 ``planner_error`` for a
    request the planner rejects, 422 ``too_slow`` past the service's cap,
    409 when cancelled); else 202 with the job (``Location`` to poll)."""
    if fut is not None and wait_s > 0:
        waiter = asyncio.wrap_future(fut)
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _pending = await asyncio.wait({waiter}, timeout=wait_s)
        if done:
            try:
                return waiter.result(), False
            except RunTooLong as e:
                return error_response(422, str(e), error="too_slow")
            except TaskInvalid as e:
                return error_response(422, str(e), error="planner_error")
            except TaskCancelled as e:
                return error_response(409, str(e), error="cancelled")
            except Exception as e:  # the solver or the worker failed: our side
                return opaque_error(
                    503,
                    "the solve failed for a reason that is not the request's",
                    e,
                    f"{where}, job {job.id}",
                    error="solve_failed",
                    headers={"Retry-After": "5"},
                )
    latest = await run_in_threadpool(service.store.get_job, job.id)
    assert latest is not None
    if latest.status == JobStatus.DONE and latest.plan_id is not None:
        # Joined an identical request's job that finished meanwhile.
        record = await run_in_threadpool(
            service.result_record, job_kind(latest), latest.plan_id
        )
        if record is not None:
            return record, True
    return JSONResponse(
        job_dict(latest), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"}
    )


def _create(service: PlannerService, body: PlanRequest) -> JobRecord:
    spec = service.spec(body)
    record = service.cached(spec)
    if record is None:
        service.validate(spec)
        return service.submit(spec)[0]
    return service.cached_job(spec, record)


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobOut,
    responses=error_responses(400, 401, 413, 415, 422, 429, 503),
    openapi_extra=json_request_body(PlanRequest),
    summary="Plan a graph in the background",
)
async def create_job(raw: JsonBody, service: ServiceDep) -> JSONResponse:
    """Queues a plan request (the body of POST /v1/plans); poll GET
    /v1/jobs/{id} for progress and ``plan_id``.  429 when the queue is full.
    The token is checked before the body is read (JsonBody)."""
    body = await parse_body(PlanRequest, raw)
    try:
        job = await run_in_threadpool(_create, service, body)
    except QueueFull as e:
        return error_response(429, str(e), headers={"Retry-After": "5"})
    return JSONResponse(
        job_dict(job), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"}
    )


@router.get(
    "/jobs", response_model=JobList, responses=error_responses(422), summary="List jobs"
)
def list_jobs(
    service: ServiceDep, limit: int = Query(50, ge=1, le=500)
) -> dict[str, object]:
    return {"jobs": [job_dict(j) for j in service.store.list_jobs(limit)]}


@router.get(
    "/jobs/{job_id}",
    response_model=JobOut,
    responses=error_responses(404, 422),
    summary="A job's status, progress and plan id",
)
def get_job(job_id: str, service: ServiceDep) -> JSONResponse:
    job = service.store.get_job(job_id)
    if job is None:
        return error_response(404, f"there is no job {quoted(job_id)}")
    return JSONResponse(job_dict(job))


@router.delete(
    "/jobs/{job_id}",
    response_model=JobOut,
    responses=error_responses(401, 404, 409, 422),
    summary="Cancel a queued or running job",
)
def cancel_job(job_id: str, service: ServiceDep, _: WriteAccess) -> JSONResponse:
    try:
        job = service.cancel(job_id)
    except JobFinished as e:
        return error_response(409, str(e))
    if job is None:
        return error_response(404, f"there is no job {quoted(job_id)}")
    return JSONResponse(job_dict(job))
