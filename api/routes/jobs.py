"""``/v1/jobs``: plans solved off the request path, with progress and cancel."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import JsonBody, ServiceDep, WriteAccess, json_request_body, parse_body
from api.errors import error_response
from api.routes import error_responses
from api.schemas import JobList, JobOut, PlanRequest
from api.service import JobFinished, PlannerService, QueueFull, job_dict
from api.store import JobRecord

router = APIRouter(prefix="/v1", tags=["jobs"])


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
        return error_response(404, f"there is no job {job_id!r}")
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
        return error_response(404, f"there is no job {job_id!r}")
    return JSONResponse(job_dict(job))
