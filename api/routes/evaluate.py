"""``/v1/evaluate``: the cost and validity of a layout the client chose."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import ServiceDep
from api.routes import error_responses
from api.schemas import EvaluateOut, EvaluateRequest

router = APIRouter(prefix="/v1", tags=["evaluate"])


@router.post(
    "/evaluate",
    response_model=EvaluateOut,
    responses=error_responses(400, 413, 422),
    summary="Price one layout",
)
def evaluate(body: EvaluateRequest, service: ServiceDep) -> dict[str, Any]:
    """``cost_models.evaluate`` of ``layout_rules`` on ``mesh_shape``: step
    time (compute, communication per mesh axis), the collectives, peak memory
    per device.  A layout the lowering rejects (a dim that does not divide its
    mesh axis, two dims of one tensor on one axis) is ``valid: false`` with the
    reason; rules naming unknown dims or mesh axes are a 422."""
    return service.evaluate(body)
