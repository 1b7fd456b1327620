"""``/v1/evaluate``: the cost and validity of a layout the client chose."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import JsonBody, ServiceDep, json_request_body, parse_body, run_heavy
from api.routes import error_responses
from api.schemas import EvaluateOut, EvaluateRequest

router = APIRouter(prefix="/v1", tags=["evaluate"])


@router.post(
    "/evaluate",
    response_model=EvaluateOut,
    responses=error_responses(400, 401, 413, 415, 422, 429, 503),
    openapi_extra=json_request_body(EvaluateRequest),
    summary="Price one layout",
)
async def evaluate(raw: JsonBody, service: ServiceDep) -> dict[str, Any]:
    """``cost_models.evaluate`` of ``layout_rules`` on ``mesh_shape``: step
    time (compute, communication per mesh axis), the collectives, peak memory
    per device.  A layout the lowering rejects (a dim that does not divide its
    mesh axis, two dims of one tensor on one axis) is ``valid: false`` with the
    reason; rules naming unknown dims or mesh axes are a 422.  The body is an
    ``EvaluateRequest``; it needs an API token when the service has tokens."""
    body = await parse_body(EvaluateRequest, raw)
    result: dict[str, Any] = await run_heavy(service.evaluate, body)
    return result
