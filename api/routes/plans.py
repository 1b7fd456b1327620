"""``/v1/plans``: plan a graph (answered from the store when cached), list, get."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import JsonBody, ServiceDep, json_request_body, parse_body
from api.errors import error_response, quoted
from api.routes import error_responses
from api.routes.jobs import answer_job
from api.schemas import JobOut, PlanList, PlanOut, PlanRequest
from api.service import QueueFull, plan_body, plan_header

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
    # Off the loop when large, or when new measurements need a refit first.
    if len(raw) > 64 * 1024 or not service.spec_is_cheap(body.hardware, body.backend):
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
    wait_s = (
        service.settings.sync_wait_s
        if spec.num_operations <= service.settings.sync_max_operations
        else 0.0
    )
    out = await answer_job(service, job, fut, wait_s, "POST /v1/plans")
    if isinstance(out, Response):
        return out
    record, cached = out
    service.remember(key, record)
    return Response(plan_body(record, cached=cached), media_type=JSON)


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
        return error_response(404, f"there is no plan {quoted(plan_id)}")
    return Response(body, media_type=JSON)
