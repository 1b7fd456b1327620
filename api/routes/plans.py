"""``/v1/plans``: plan a graph (answered from the store when cached), list, get."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import JsonBody, ServiceDep, json_request_body, parse_body
from api.errors import error_response, opaque_error
from api.routes import error_responses
from api.schemas import JobOut, PlanList, PlanOut, PlanRequest
from api.service import QueueFull, job_dict, plan_body, plan_header
from api.store.base import JobStatus
from api.workers import TaskCancelled, TaskInvalid

router = APIRouter(prefix="/v1", tags=["plans"])

JSON = "application/json"


@router.post(
    "/plans",
    response_model=PlanOut,
    responses={
        202: {"model": JobOut, "description": "Still solving: poll the job."},
        **error_responses(400, 401, 409, 413, 415, 422, 429, 503),
    },
    # The body is read by JsonBody after the token; document it as PlanRequest.
    openapi_extra=json_request_body(PlanRequest),
    summary="Plan a graph's layout",
)
async def create_plan(raw: JsonBody, service: ServiceDep) -> Response:
    """The plan for a graph on a mesh (or a device count), from the store if
    this exact request was planned before (``cached: true``), else solved now.

    The body is a ``PlanRequest``.  A solve that takes longer than
    ``sync_wait_s``, or a graph over ``sync_max_operations`` operations,
    answers 202 with the job to poll.
    """
    # Bytes seen before skip parsing and the database (ResponseCache).
    key = service.responses.key(raw)
    hit = service.responses.get(key)
    if hit is not None:
        service.metrics.cache_hits.inc()
        return Response(hit, media_type=JSON)
    body = await parse_body(PlanRequest, raw)
    # The canonical request (sorted keys, parsed mesh, defaults filled), then
    # memory, then the store: other bytes of a known request stay cheap.
    if len(raw) > 64 * 1024:
        spec = await run_in_threadpool(service.spec, body)
    else:
        spec = service.spec(body)
    hit = service.answer_from_memory(spec, key)
    if hit is not None:
        return Response(hit, media_type=JSON)
    record = await run_in_threadpool(service.cached, spec)
    if record is not None:
        return Response(service.remember(key, record), media_type=JSON)
    await run_in_threadpool(service.validate, spec)
    try:
        job, fut = await run_in_threadpool(service.submit, spec)
    except QueueFull as e:
        return error_response(429, str(e), headers={"Retry-After": "5"})
    if fut is not None and spec.num_operations <= service.settings.sync_max_operations:
        waiter = asyncio.wrap_future(fut)
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _pending = await asyncio.wait(
            {waiter}, timeout=service.settings.sync_wait_s
        )
        if done:
            try:
                record = waiter.result()
            except TaskInvalid as e:
                return error_response(422, str(e), error="planner_error")
            except TaskCancelled as e:
                return error_response(409, str(e), error="cancelled")
            except Exception as e:  # the solver or the worker failed: our side
                return opaque_error(
                    503,
                    "the solve failed for a reason that is not the request's",
                    e,
                    f"POST /v1/plans, job {job.id}",
                    error="solve_failed",
                    headers={"Retry-After": "5"},
                )
            service.remember(key, record)
            return Response(plan_body(record, cached=False), media_type=JSON)
    latest = await run_in_threadpool(service.store.get_job, job.id)
    assert latest is not None
    if latest.status == JobStatus.DONE and latest.plan_id is not None:
        # Joined an identical request's job that finished meanwhile.
        done_record = await run_in_threadpool(service.store.get_plan, latest.plan_id)
        if done_record is not None:
            return Response(plan_body(done_record, cached=True), media_type=JSON)
    return JSONResponse(
        job_dict(latest), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"}
    )


@router.get(
    "/plans",
    response_model=PlanList,
    responses=error_responses(422),
    summary="List stored plans",
)
def list_plans(
    service: ServiceDep,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=10**9),
) -> dict[str, object]:
    """Stored plans, newest first (summaries; GET one for the whole plan)."""
    records, total = service.store.list_plans(limit, offset)
    return {"plans": [plan_header(r) for r in records], "total": total}


@router.get(
    "/plans/{plan_id}",
    response_model=PlanOut,
    responses=error_responses(404, 422),
    summary="Get one plan",
)
async def get_plan(plan_id: str, service: ServiceDep) -> Response:
    # Stored plans never change: memory first, on the event loop.
    body = service.responses.get_plan(plan_id)
    if body is None:
        body = await run_in_threadpool(service.plan_body, plan_id)
    if body is None:
        return error_response(404, f"there is no plan {plan_id!r}")
    return Response(body, media_type=JSON)
